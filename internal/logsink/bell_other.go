//go:build !unix

package logsink

import "errors"

func newPipeBell() (waker, error) { return nil, errors.New("logsink: no pipe bell on this system") }
