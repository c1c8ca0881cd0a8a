//go:build race

package dispatch

// raceEnabled: the race detector drops a quarter of sync.Pool's items, so
// that a verification's pooled MAC state is sometimes made anew; exact
// allocation counts hold only without it.
const raceEnabled = true
