//go:build race

package logsink

// raceEnabled: the race detector randomises the order in which ready
// goroutines run (a goroutine started or woken takes the processor's next
// place only half the time), so tests of that order run without it (the
// Makefile's unit target runs them in a pass of their own).
const raceEnabled = true
