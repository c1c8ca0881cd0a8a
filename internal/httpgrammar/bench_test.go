package httpgrammar

import "testing"

var (
	benchName  = []byte("X-Forwarded-Proto")
	benchValue = []byte("Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0")
	benchSink  bool
)

func BenchmarkIsToken(b *testing.B) {
	b.SetBytes(int64(len(benchName)))
	for b.Loop() {
		benchSink = IsToken(benchName)
	}
}

func BenchmarkValidFieldValue(b *testing.B) {
	b.SetBytes(int64(len(benchValue)))
	for b.Loop() {
		benchSink = ValidFieldValue(benchValue)
	}
}

// BenchmarkEqualFold: the parsers' pattern, a name against lower-case
// constants: most differ in length, one in content, one matches.
func BenchmarkEqualFold(b *testing.B) {
	for b.Loop() {
		benchSink = EqualFold(benchName, "host") || EqualFold(benchName, "content-length") ||
			EqualFold(benchName, "x-forwarded-prot0") || EqualFold(benchName, "x-forwarded-proto")
	}
}
