package main

import (
	"math"
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram (HDR-like): 64 linear sub-buckets
// per power of two, so every recorded value is kept to within 1.6 %.
// Values are nanoseconds; the exact maximum is kept aside.
type hist struct {
	counts [58 * 64]uint64
	n      uint64
	sum    float64
	max    int64
}

func bucketOf(v uint64) int {
	if v < 64 {
		return int(v)
	}
	e := bits.Len64(v) - 7
	return (e+1)*64 + int(v>>uint(e)) - 64
}

// bucketValue is the midpoint of bucket i.
func bucketValue(i int) float64 {
	if i < 64 {
		return float64(i)
	}
	e := i/64 - 1
	m := uint64(i%64 + 64)
	lo := m << uint(e)
	return float64(lo) + float64(uint64(1)<<uint(e))/2
}

func (h *hist) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	h.n++
	h.sum += float64(d)
	if int64(d) > h.max {
		h.max = int64(d)
	}
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

// quantile returns the q-quantile in nanoseconds.
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	var acc uint64
	for i, c := range h.counts {
		acc += c
		if acc >= rank {
			v := bucketValue(i)
			if v > float64(h.max) {
				v = float64(h.max)
			}
			return v
		}
	}
	return float64(h.max)
}

// summary renders the usual figures in milliseconds.
func (h *hist) summary(out map[string]any) {
	ms := func(ns float64) float64 { return math.Round(ns/1e3) / 1e3 }
	out["samples"] = h.n
	if h.n > 0 {
		out["mean_ms"] = ms(h.sum / float64(h.n))
	}
	out["p50_ms"] = ms(h.quantile(0.50))
	out["p90_ms"] = ms(h.quantile(0.90))
	out["p99_ms"] = ms(h.quantile(0.99))
	out["p999_ms"] = ms(h.quantile(0.999))
	out["max_ms"] = ms(float64(h.max))
}
