//go:build !race

package accesstoken

// raceEnabled: see race_test.go.
const raceEnabled = false
