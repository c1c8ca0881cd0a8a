package dispatch

import (
	"errors"
	"os"
	"time"
)

// parkAfter is how long a WebSocket direction may wait for its next
// message while holding a pooled buffer; after that it gives the buffer
// back and parks on the socket's readiness instead, so an idle WebSocket
// holds no read buffers (a busy one pays no extra system calls).
const parkAfter = 50 * time.Millisecond

// isDeadline reports whether err is a read deadline expiring.
func isDeadline(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
