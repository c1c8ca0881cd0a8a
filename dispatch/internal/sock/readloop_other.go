//go:build !unix

package sock

import (
	"errors"
	"syscall"
)

// ReadLoopAvailable reports whether ReadLoop can be used here.
const ReadLoopAvailable = false

// errNoReadLoop is ReadLoop's error outside Unix.
var errNoReadLoop = errors.New("sock: raw event-loop reads are Unix-only")

// ReadLoop is Unix-only; callers check ReadLoopAvailable first.
func ReadLoop(syscall.RawConn, []byte, func([]byte) (bool, error)) (stop bool, werr, rerr error) {
	return false, nil, errNoReadLoop
}
