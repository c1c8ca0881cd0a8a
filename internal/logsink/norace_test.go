//go:build !race

package logsink

// raceEnabled: see race_test.go.
const raceEnabled = false
