// Package buckets holds the histogram bucket bounds of every applistener
// metric: round values in a 1-2.5-5 progression (0.0001, 0.00025, 0.0005,
// 0.001, ... 1, 2.5, 5, 10, 25, 50 seconds), so that a dashboard or an
// alert can name a bound (le="0.25") and every histogram of the project
// shares the bounds it has in common with the others.
package buckets

import (
	"fmt"
	"strconv"
)

// mantissas of the progression within one decade.
var mantissas = [...]string{"1", "2.5", "5"}

// Seconds returns the bounds of the progression from lo to hi, both
// included; lo and hi must be values of the progression (a programming
// error panics, caught by the package's tests and every caller's).
func Seconds(lo, hi float64) []float64 {
	var out []float64
	for e := -6; e <= 3; e++ {
		for _, m := range mantissas {
			v, err := strconv.ParseFloat(fmt.Sprintf("%se%d", m, e), 64)
			if err != nil {
				panic(err)
			}
			if v >= lo && v <= hi {
				out = append(out, v)
			}
		}
	}
	if len(out) == 0 || out[0] != lo || out[len(out)-1] != hi {
		panic(fmt.Sprintf("buckets.Seconds(%v, %v): bounds must be values of the 1-2.5-5 progression", lo, hi))
	}
	return out
}

// IsRound reports whether v is a value of the progression (what every
// bucket bound of the project is).
func IsRound(v float64) bool {
	for e := -6; e <= 3; e++ {
		for _, m := range mantissas {
			if r, _ := strconv.ParseFloat(fmt.Sprintf("%se%d", m, e), 64); r == v {
				return true
			}
		}
	}
	return false
}

// Latency is the bounds of request and app latencies: 100 µs (a proxied
// request on loopback takes a few hundred) to 50 s (app timeouts are a
// minute by default). 18 bounds.
var Latency = Seconds(0.0001, 50)

// Handshake is the bounds of TLS handshakes: 100 µs to 10 s (the
// handshake timeout's default). 16 bounds.
var Handshake = Seconds(0.0001, 10)

// Revocation is the bounds of the time from a route's revocation to its
// last stream's close: 500 µs to 1 s (the target is 100 ms).
var Revocation = Seconds(0.0005, 1)
