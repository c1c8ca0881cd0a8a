package dispatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/routes"
)

// WatchConnectors checks, every interval until ctx ends, that the network
// namespace of every netns route and the socket directory of every unix
// route still exist. When one disappears, its instance is stopped: its streams are closed and new requests get the
// connector's own error (502), exactly as an instance stop. It does not
// stop the same instance twice for the same disappearance.
func WatchConnectors(ctx context.Context, table *routes.Table, interval time.Duration, logger *slog.Logger) {
	if interval <= 0 {
		interval = time.Second
	}
	down := map[routes.InstanceKey]string{} // instance -> namespace path found gone
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		seen := map[routes.InstanceKey]bool{}
		for r := range table.Snapshot().All() {
			if seen[r.Instance.Key] {
				continue
			}
			var err error
			switch r.Connector.Type {
			case "netns":
				err = connector.NetNS{Path: r.Connector.Path}.Alive()
			case "unix":
				err = connector.Unix{PathTemplate: r.Connector.Path}.Alive()
			default:
				continue
			}
			seen[r.Instance.Key] = true
			key := r.Instance.Key
			switch {
			case err != nil && down[key] != r.Connector.Path:
				down[key] = r.Connector.Path
				n := table.StopInstance(key)
				logger.Warn("sandbox connector gone: instance stopped", "class_uid", 4001,
					"instance", key.String(), "path", r.Connector.Path, "streams_closed", n, "err", err)
			case err == nil && down[key] != "":
				delete(down, key)
				logger.Info("sandbox connector back", "instance", key.String(), "path", r.Connector.Path)
			}
		}
		for key := range down {
			if !seen[key] {
				delete(down, key)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
