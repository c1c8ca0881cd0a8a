//go:build !linux

package dispatch

// idleProbe is a no-op outside Linux: idle app connections are retired by
// the pool's idle timeout only, and one closed by the app meanwhile fails
// the request that reuses it (502), never replays it.
type idleProbe struct{}

func (p *idleProbe) init(any) {}

func (p *idleProbe) usable() bool { return true }
