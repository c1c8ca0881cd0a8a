//go:build !linux

package sock

// QuickAck does nothing outside Linux, whose TCP_QUICKACK it uses.
type QuickAck struct{}

// Init does nothing.
func (q *QuickAck) Init(any) {}

// Now does nothing.
func (q *QuickAck) Now() {}
