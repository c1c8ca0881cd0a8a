package dispatch

import (
	"io"
	"testing"
)

// chunkReader returns its chunks one per Read, then EOF: an app whose
// response arrives in several reads.
type chunkReader struct{ chunks []string }

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if r.chunks[0] == "" {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

// TestUnitCopyWholeFlushesNotAfterLastByte: copyN flushes whenever the
// app's bytes run out; copyWhole, which copies a whole response body, does
// so only while more is to come, never after the last byte. The caller ends
// the response right after, and a flush there cost a write(2) of its own
// (over HTTP/2: the body's frames, then the END_STREAM frame separately).
func TestUnitCopyWholeFlushesNotAfterLastByte(t *testing.T) {
	for _, tc := range []struct {
		name      string
		chunks    []string
		whole, cN int // flushes by copyWhole and by copyN
	}{
		{"in one read", []string{"hello world"}, 0, 1},
		{"in two reads", []string{"hello ", "world"}, 1, 2},
		{"in three reads", []string{"he", "llo ", "world"}, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []struct {
				name string
				copy func(io.Writer, *inbuf, int64, func() error) (int64, error)
				want int
			}{{"copyWhole", copyWhole, tc.whole}, {"copyN", copyN, tc.cN}} {
				var out writerFunc
				var got string
				out = func(p []byte) (int, error) { got += string(p); return len(p), nil }
				flushes := 0
				in := newInbuf(&chunkReader{chunks: append([]string(nil), tc.chunks...)}, 64)
				n, err := v.copy(out, in, 11, func() error { flushes++; return nil })
				if err != nil || n != 11 || got != "hello world" {
					t.Fatalf("%s: %d bytes %q, %v", v.name, n, got, err)
				}
				if flushes != v.want {
					t.Errorf("%s: %d flushes; want %d", v.name, flushes, v.want)
				}
			}
		})
	}
}

// writerFunc is an io.Writer made of a function.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
