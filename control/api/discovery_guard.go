package api

import (
	"context"

	"github.com/applistener/applistener/internal/panicguard"
)

// guardedWatchOnce is watchOnce behind panicguard (DiscoveryWatch): a
// panic (in the stream's handling or in fn) ends that one stream as a
// failure, which Watch retries after its backoff, keeping what fn was
// given before.
func (c *DiscoveryClient) guardedWatchOnce(ctx context.Context, ws string, fn func(*RouteSnapshot)) (endpoint string, got bool, err error) {
	endpoint = c.endpoints.Current()
	err = panicguard.Call(c.logger(), panicguard.DiscoveryWatch, ws, func() error {
		var werr error
		endpoint, got, werr = c.watchOnce(ctx, ws, fn)
		return werr
	}, "workspace", ws, "gateway", endpoint)
	return endpoint, got, err
}
