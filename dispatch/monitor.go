package dispatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/routes"
)

// WatchConnectors checks, every interval until ctx ends, that the network
// namespace of every netns route still exists. When one disappears, its
// instance is stopped: its streams are closed and new requests get the
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
		for _, r := range table.Snapshot().Routes() {
			if r.Connector.Type != "netns" || seen[r.Instance.Key] {
				continue
			}
			seen[r.Instance.Key] = true
			key := r.Instance.Key
			err := connector.NetNS{Path: r.Connector.Path}.Alive()
			switch {
			case err != nil && down[key] != r.Connector.Path:
				down[key] = r.Connector.Path
				n := table.StopInstance(key)
				logger.Warn("sandbox network namespace gone: instance stopped", "class_uid", 4001,
					"instance", key.String(), "path", r.Connector.Path, "streams_closed", n, "err", err)
			case err == nil && down[key] != "":
				delete(down, key)
				logger.Info("sandbox network namespace back", "instance", key.String(), "path", r.Connector.Path)
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
