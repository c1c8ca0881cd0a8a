package h2engine

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// chunkReader hands out data in the given chunk sizes and notes the reads
// made while the readBuf had no buffer.
type chunkReader struct {
	t      *testing.T
	b      *readBuf
	data   []byte
	sizes  []int
	waits  int // reads made with no buffer held
	others int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	if r.b.buf == nil {
		if len(p) != waitReadSize {
			r.t.Fatalf("a read of %d bytes with no buffer held", len(p))
		}
		r.waits++
	} else {
		r.others++
	}
	n := len(r.data)
	if len(r.sizes) > 0 {
		n, r.sizes = min(n, r.sizes[0]), r.sizes[1:]
	}
	n = copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// TestReadBufReleasedWhenEmpty: reads, peeks and discards see the bytes
// in order, whatever the chunks they arrive in; the buffer goes back to
// the pool whenever nothing is buffered, and a read that may wait for the
// client is made without one.
func TestReadBufReleasedWhenEmpty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 200<<10)
	for i := range data {
		data[i] = byte(rng.IntN(256))
	}
	var sizes []int
	for range 2000 {
		sizes = append(sizes, 1+rng.IntN(3000))
	}
	var b readBuf
	src := &chunkReader{t: t, b: &b, data: data, sizes: sizes}
	b.src = src
	var got []byte
	for len(got) < len(data) {
		switch want := min(1+rng.IntN(readBufferSize), len(data)-len(got)); rng.IntN(3) {
		case 0:
			p, err := b.Peek(want)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, p...)
			b.Discard(want)
		default:
			p := make([]byte, want)
			n, err := io.ReadFull(&b, p)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, p[:n]...)
		}
		if b.Buffered() == 0 && b.buf != nil {
			t.Fatal("nothing buffered, and the buffer is still held")
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the bytes read differ from those sent")
	}
	if src.waits == 0 || src.others == 0 {
		t.Fatalf("reads without a buffer %d, with one %d", src.waits, src.others)
	}
	if _, err := b.Read(make([]byte, 10)); !errors.Is(err, io.EOF) {
		t.Fatalf("read at the end: %v", err)
	}
	if _, err := b.Peek(10); !errors.Is(err, io.EOF) {
		t.Fatalf("peek at the end: %v", err)
	}
	if b.buf != nil {
		t.Fatal("buffer held at the end")
	}
}
