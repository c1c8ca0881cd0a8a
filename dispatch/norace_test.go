//go:build !race

package dispatch

// raceEnabled: see race_test.go.
const raceEnabled = false
