//go:build !linux

package dispatch

// quickAck is a no-op outside Linux, whose TCP_QUICKACK it uses.
type quickAck struct{}

func (q *quickAck) init(any) {}

func (q *quickAck) now() {}
