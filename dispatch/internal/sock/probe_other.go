//go:build !linux

package sock

// IdleProbe reports every connection usable outside Linux: idle connections
// are then retired by their pool's idle timeout only.
type IdleProbe struct{}

// Init does nothing.
func (p *IdleProbe) Init(any) {}

// Usable reports true.
func (p *IdleProbe) Usable() bool { return true }
