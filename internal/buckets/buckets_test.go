package buckets

import (
	"slices"
	"testing"
)

func TestSeconds(t *testing.T) {
	want := []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50}
	if got := Seconds(0.0001, 50); !slices.Equal(got, want) {
		t.Errorf("Seconds(0.0001, 50) = %v\nwant %v", got, want)
	}
	if !slices.Equal(Latency, want) || !slices.Equal(Handshake, want[:16]) || !slices.Equal(Revocation, want[2:13]) {
		t.Errorf("Latency %v, Handshake %v, Revocation %v", Latency, Handshake, Revocation)
	}
	for _, v := range want {
		if !IsRound(v) {
			t.Errorf("IsRound(%v) = false", v)
		}
	}
	for _, v := range []float64{0.0003, 30, 0.00012, 1.01} {
		if IsRound(v) {
			t.Errorf("IsRound(%v) = true", v)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Seconds(0.0003, 1) did not panic")
		}
	}()
	Seconds(0.0003, 1)
}
