//go:build !linux

package sock

import "errors"

// errNoHangupWatch is OpenHangupWatch's error outside Linux.
var errNoHangupWatch = errors.New("sock: hang-up watch (epoll) is not available on this system")

// HangupWatch is Linux-only: OpenHangupWatch fails elsewhere, and callers
// probe each connection instead (IdleProbe).
type HangupWatch struct{}

// OpenHangupWatch fails outside Linux.
func OpenHangupWatch() (*HangupWatch, error) { return nil, errNoHangupWatch }

// Add fails: nothing can be watched.
func (w *HangupWatch) Add(int, uint64) error { return errNoHangupWatch }

// Poll has nothing to report.
func (w *HangupWatch) Poll(func(uint64)) error { return nil }

// Close has nothing to close.
func (w *HangupWatch) Close() error { return nil }
