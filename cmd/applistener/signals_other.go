//go:build !unix

package main

import "os"

// reopenSignals: none outside Unix (no SIGUSR1); log files are reopened
// only by a restart there.
var reopenSignals []os.Signal
