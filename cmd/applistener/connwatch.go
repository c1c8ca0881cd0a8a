package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/applistener/applistener/connector"
	"github.com/applistener/applistener/dispatch"
	"github.com/applistener/applistener/routes"
)

// watchConnectors checks, every interval until ctx ends, that the target of
// every route whose connector reports liveness (a netns route's namespace,
// a unix route's socket directory) still exists. When one disappears, its
// instance is stopped: its streams are closed and new requests get the
// connector's own error (502), exactly as an instance stop. It does not
// stop the same instance twice for the same disappearance.
func watchConnectors(ctx context.Context, table *routes.Table, interval time.Duration, logger *slog.Logger) {
	if interval <= 0 {
		interval = time.Second
	}
	down := map[routes.InstanceKey]string{} // instance -> connector path found gone
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		seen := map[routes.InstanceKey]bool{}
		for r := range table.Snapshot().All() {
			key := r.Instance.Key
			if seen[key] {
				continue
			}
			conn, err := dispatch.NewConnector(r.Connector)
			if err != nil {
				continue
			}
			live, ok := conn.(connector.Liveness)
			if !ok {
				continue
			}
			seen[key] = true
			err = live.Alive()
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
