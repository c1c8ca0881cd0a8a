//go:build race

package accesstoken

// raceEnabled: the race detector drops a quarter of sync.Pool's items, so
// pooled paths allocate under -race.
const raceEnabled = true
