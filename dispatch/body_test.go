package dispatch

import (
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

// readerKinds wraps a source the ways a connection may deliver it.
var readerKinds = []struct {
	name string
	wrap func(string) io.Reader
}{
	{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
	{"one byte", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
	{"half", func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) }},
	{"data with EOF", func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) }},
}

var bufSizes = []int{32, 16 << 10}

// short abbreviates long inputs in failure messages.
func short(s string) string {
	if len(s) > 80 {
		return s[:40] + "…" + s[len(s)-30:]
	}
	return s
}

type countingFlusher struct{ n int }

func (f *countingFlusher) flush() error { f.n++; return nil }

func TestUnitCopyChunkedValid(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", 300) // 4800 bytes
	tests := []struct {
		name    string
		in      string
		encoded string
		decoded string
	}{
		{"empty body", "0\r\n\r\n", "0\r\n\r\n", ""},
		{"one chunk", "5\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n", "hello"},
		{"extensions and trailers",
			"5;ext=1\r\nhello\r\n6;a=b;c=\"q s\"\r\n world\r\nA\r\n0123456789\r\n0;last\r\nX-Trailer: v\r\nX-Two:w\r\n\r\n",
			"5\r\nhello\r\n6\r\n world\r\na\r\n0123456789\r\n0\r\n\r\n",
			"hello world0123456789"},
		{"leading zeros and upper-case hex", "000F\r\n0123456789ABCDE\r\n00\r\n\r\n", "f\r\n0123456789ABCDE\r\n0\r\n\r\n", "0123456789ABCDE"},
		{"CRLF inside data", "4\r\n\r\n\r\n\r\n0\r\n\r\n", "4\r\n\r\n\r\n\r\n0\r\n\r\n", "\r\n\r\n"},
		{"chunk larger than the buffer", "12c0\r\n" + long + "\r\n0\r\n\r\n", "12c0\r\n" + long + "\r\n0\r\n\r\n", long},
		{"15 hex digits size line", strings.Repeat("0", 14) + "3\r\nabc\r\n0\r\n\r\n", "3\r\nabc\r\n0\r\n\r\n", "abc"},
	}
	const next = "GET /next HTTP/1.1\r\n\r\n"
	for _, tc := range tests {
		for _, rk := range readerKinds {
			for _, size := range bufSizes {
				for _, encode := range []bool{true, false} {
					if size == 32 && strings.Contains(tc.name, "15 hex") {
						continue // the 17-byte size line does not fit: buffer too small, not a chunking error
					}
					name := tc.name + "/" + rk.name
					t.Run(name, func(t *testing.T) {
						in := newInbuf(rk.wrap(tc.in+next), size)
						var out bytes.Buffer
						var f countingFlusher
						n, err := copyChunked(&out, in, encode, f.flush)
						if err != nil {
							t.Fatalf("copyChunked(encode=%v, buf=%d) = %d, %v", encode, size, n, err)
						}
						want := tc.decoded
						if encode {
							want = tc.encoded
						}
						if out.String() != want {
							t.Errorf("encode=%v buf=%d: output %q; want %q", encode, size, out.String(), want)
						}
						if n != int64(len(tc.decoded)) {
							t.Errorf("returned %d; want the decoded size %d", n, len(tc.decoded))
						}
						if f.n == 0 {
							t.Error("never flushed")
						}
						// The bytes after the body are left for the next request.
						rest, _ := io.ReadAll(in)
						if string(rest) != next {
							t.Errorf("after the body: %q; want %q", rest, next)
						}
						if encode {
							// The re-encoding is valid chunked for another decoder.
							dec, err := io.ReadAll(httputil.NewChunkedReader(strings.NewReader(out.String())))
							if err != nil || string(dec) != tc.decoded {
								t.Errorf("net/http/httputil decodes the output as %q, %v", dec, err)
							}
						}
					})
				}
			}
		}
	}
}

func TestUnitCopyChunkedRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error // nil: any error
	}{
		{"bad hex", "g\r\nx\r\n0\r\n\r\n", errBadChunk},
		{"0x prefix", "0x5\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"negative", "-1\r\n\r\n", errBadChunk},
		{"plus", "+5\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"empty size line", "\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"space before size", " 5\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"space after size", "5 \r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"space before extension", "5 ;a=b\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"tab after size", "5\t\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"16 hex digits", "1000000000000000\r\nx\r\n0\r\n\r\n", errBadChunk},
		{"16 hex digits all f", "ffffffffffffffff\r\nx\r\n0\r\n\r\n", errBadChunk},
		{"16 digits with leading zero", "0000000000000005\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"control byte in extension", "5;a=\x00\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"bare CR in size line", "5\rX\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"missing CRLF after data", "5\r\nhelloX\r\n0\r\n\r\n", errBadChunk},
		{"data longer than size", "3\r\nhello\r\n0\r\n\r\n", errBadChunk},
		{"bare LF after data", "5\r\nhello\n0\r\n\r\n", errBadChunk},
		{"bare CR after data", "5\r\nhello\r0\r\n\r\n", errBadChunk},
		{"bare LF on size line", "5\nhello\r\n0\r\n\r\n", errBadChunk},
		{"bare LF on last chunk", "0\n\r\n", errBadChunk},
		{"bare LF ending the trailers", "0\r\n\n", errBadChunk},
		{"chunk line too long", "1;" + strings.Repeat("a", 5000) + "\r\nx\r\n0\r\n\r\n", errLineTooBig},
		{"size line too long without LF", strings.Repeat("0", 5000), errLineTooBig},
		{"trailer line too long", "0\r\nX: " + strings.Repeat("a", 5000) + "\r\n\r\n", errLineTooBig},
		{"truncated in size line", "5", io.ErrUnexpectedEOF},
		{"truncated in data", "5\r\nhel", io.ErrUnexpectedEOF},
		{"truncated before last chunk", "5\r\nhello\r\n", io.ErrUnexpectedEOF},
		{"truncated in trailers", "5\r\nhello\r\n0\r\nX: y\r\n", io.ErrUnexpectedEOF},
		{"truncated before final CRLF", "0\r\n", io.ErrUnexpectedEOF},
		{"truncated after data", "5\r\nhello", nil},
		{"truncated in data CRLF", "5\r\nhello\r", nil},
		{"empty input", "", io.ErrUnexpectedEOF},
		{"trailer obs-fold", "0\r\nX: a\r\n b\r\n\r\n", errBadChunk},
		{"trailer starting with tab", "0\r\n\tX: a\r\n\r\n", errBadChunk},
		{"trailer without colon", "0\r\nNoColon\r\n\r\n", errBadChunk},
		{"trailer empty name", "0\r\n: v\r\n\r\n", errBadChunk},
		{"trailer NUL", "0\r\nX: a\x00b\r\n\r\n", errBadChunk},
		{"trailer DEL", "0\r\nX: a\x7fb\r\n\r\n", errBadChunk},
		{"too many trailers", "0\r\n" + strings.Repeat("X: y\r\n", 100) + "\r\n", errBadChunk},
	}
	for _, tc := range tests {
		for _, rk := range readerKinds {
			for _, encode := range []bool{true, false} {
				t.Run(tc.name+"/"+rk.name, func(t *testing.T) {
					in := newInbuf(rk.wrap(tc.in), 16<<10)
					var out bytes.Buffer
					n, err := copyChunked(&out, in, encode, nil)
					if err == nil {
						t.Fatalf("copyChunked(%q) accepted: %d bytes, output %q", short(tc.in), n, short(out.String()))
					}
					if tc.want != nil && !errors.Is(err, tc.want) {
						t.Errorf("copyChunked(%q) error = %v; want %v", short(tc.in), err, tc.want)
					}
					if n > int64(len(tc.in)) {
						t.Errorf("returned %d bytes from a %d-byte input", n, len(tc.in))
					}
				})
			}
		}
	}
}

// TestUnitCopyChunkedSizeNoOverflow: 15 hex digits is the largest accepted
// size; it must not wrap to a negative length.
func TestUnitCopyChunkedSizeNoOverflow(t *testing.T) {
	for _, line := range []string{"fffffffffffffff", "FFFFFFFFFFFFFFF", "800000000000000"} {
		n, ok := parseChunkSize([]byte(line))
		if !ok || n <= 0 {
			t.Errorf("parseChunkSize(%q) = %d %v", line, n, ok)
		}
	}
	in := newInbuf(strings.NewReader("fffffffffffffff\r\nabc"), 64)
	n, err := copyChunked(io.Discard, in, true, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) || n != 3 {
		t.Errorf("huge chunk, short input: %d, %v; want 3, ErrUnexpectedEOF", n, err)
	}
}

func TestUnitCopyChunkedReaderError(t *testing.T) {
	tests := []struct{ name, data string }{
		{"in size line", "5"},
		{"in data", "5\r\nhe"},
		{"in trailers", "0\r\nX: y\r\n"},
		{"between chunks", "5\r\nhello\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := newInbuf(&errAfterReader{data: []byte(tc.data), err: errMidway}, 64)
			_, err := copyChunked(io.Discard, in, true, nil)
			if !errors.Is(err, errMidway) {
				t.Errorf("error = %v; want the reader's error", err)
			}
		})
	}
	// Right after the data the error is reported as a bad chunk; any error
	// will do, as long as the copy stops.
	in := newInbuf(&errAfterReader{data: []byte("5\r\nhello"), err: errMidway}, 64)
	if _, err := copyChunked(io.Discard, in, true, nil); err == nil {
		t.Error("reader error after the data was not reported")
	}
}

type failWriter struct {
	after int // bytes accepted before failing
	n     int
}

var errWrite = errors.New("client went away")

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n+len(p) > w.after {
		k := w.after - w.n
		w.n = w.after
		return k, errWrite
	}
	w.n += len(p)
	return len(p), nil
}

func TestUnitCopyChunkedWriterError(t *testing.T) {
	body := "5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"
	for _, after := range []int{0, 2, 4, 9, 12, 18, 24} {
		for _, encode := range []bool{true, false} {
			in := newInbuf(strings.NewReader(body), 64)
			w := &failWriter{after: after}
			_, err := copyChunked(w, in, encode, nil)
			total := 25
			if !encode {
				total = 10
			}
			if after < total && !errors.Is(err, errWrite) {
				t.Errorf("writer fails after %d bytes (encode=%v): error %v", after, encode, err)
			}
		}
	}
	in := newInbuf(strings.NewReader(body), 64)
	flushErr := errors.New("flush failed")
	if _, err := copyChunked(io.Discard, in, true, func() error { return flushErr }); !errors.Is(err, flushErr) {
		t.Errorf("flush error = %v; want %v", err, flushErr)
	}
}

func TestUnitCopyN(t *testing.T) {
	const src = "0123456789NEXT"
	for _, rk := range readerKinds {
		for _, size := range []int{4, 16 << 10} {
			t.Run(rk.name, func(t *testing.T) {
				in := newInbuf(rk.wrap(src), size)
				var out bytes.Buffer
				var f countingFlusher
				n, err := copyN(&out, in, 10, f.flush)
				if err != nil || n != 10 || out.String() != "0123456789" {
					t.Fatalf("copyN = %d, %v, %q", n, err, out.String())
				}
				rest, _ := io.ReadAll(in)
				if string(rest) != "NEXT" {
					t.Errorf("left %q; want NEXT", rest)
				}
				// Flushed only when nothing more is buffered: here the
				// next request is, so the caller's final flush does it.
				if size == 4 && rk.name == "one byte" && f.n == 0 {
					t.Error("never flushed")
				}
			})
		}
	}
	// Zero bytes: nothing read.
	in := newInbuf(iotest.ErrReader(errMidway), 16)
	if n, err := copyN(io.Discard, in, 0, nil); n != 0 || err != nil {
		t.Errorf("copyN(0) = %d, %v", n, err)
	}
	// Short source.
	in = newInbuf(iotest.OneByteReader(strings.NewReader("abc")), 16)
	var out bytes.Buffer
	if n, err := copyN(&out, in, 10, nil); n != 3 || !errors.Is(err, io.ErrUnexpectedEOF) || out.String() != "abc" {
		t.Errorf("short copyN = %d, %v, %q; want 3, ErrUnexpectedEOF", n, err, out.String())
	}
	// Reader error midway.
	in = newInbuf(&errAfterReader{data: []byte("abcd"), err: errMidway}, 16)
	if n, err := copyN(io.Discard, in, 10, nil); n != 4 || !errors.Is(err, errMidway) {
		t.Errorf("copyN with a failing reader = %d, %v", n, err)
	}
	// Writer error.
	in = newInbuf(strings.NewReader("abcdefgh"), 16)
	if n, err := copyN(&failWriter{after: 3}, in, 8, nil); n != 3 || !errors.Is(err, errWrite) {
		t.Errorf("copyN with a failing writer = %d, %v", n, err)
	}
	// Buffered bytes are served before reading.
	in = newInbuf(iotest.ErrReader(errMidway), 16)
	in.acquire()
	in.w = copy(in.buf, "buffered")
	out.Reset()
	if n, err := copyN(&out, in, 8, nil); n != 8 || err != nil || out.String() != "buffered" {
		t.Errorf("copyN from the buffer = %d, %v, %q", n, err, out.String())
	}
}

type zeroReader struct{}

func (zeroReader) Read([]byte) (int, error) { return 0, nil }

func TestUnitCopyUntilEOF(t *testing.T) {
	src := strings.Repeat("body bytes ", 100)
	for _, rk := range readerKinds {
		t.Run(rk.name, func(t *testing.T) {
			in := newInbuf(rk.wrap(src), 64)
			var out bytes.Buffer
			var f countingFlusher
			n, err := copyUntilEOF(&out, in, f.flush)
			if err != nil || n != int64(len(src)) || out.String() != src {
				t.Errorf("copyUntilEOF = %d, %v (%d bytes out)", n, err, out.Len())
			}
			if f.n == 0 {
				t.Error("never flushed")
			}
		})
	}
	in := newInbuf(&errAfterReader{data: []byte("abc"), err: errMidway}, 64)
	if n, err := copyUntilEOF(io.Discard, in, nil); n != 3 || !errors.Is(err, errMidway) {
		t.Errorf("copyUntilEOF with a failing reader = %d, %v", n, err)
	}
	in = newInbuf(strings.NewReader("abcdef"), 64)
	if _, err := copyUntilEOF(&failWriter{after: 2}, in, nil); !errors.Is(err, errWrite) {
		t.Errorf("copyUntilEOF with a failing writer: %v", err)
	}
	// A reader that never makes progress must not spin forever.
	done := make(chan error, 1)
	go func() {
		_, err := copyUntilEOF(io.Discard, newInbuf(zeroReader{}, 64), nil)
		done <- err
	}()
	if err := <-done; !errors.Is(err, io.ErrNoProgress) {
		t.Errorf("zero reader: %v; want ErrNoProgress", err)
	}
}

func TestUnitReadLine(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		max   int
		lines []string
		err   error
	}{
		{"lines", "a\r\nbc\r\n\r\n", 10, []string{"a", "bc", ""}, io.ErrUnexpectedEOF},
		{"bare CR kept inside", "a\rb\r\n", 10, []string{"a\rb"}, io.ErrUnexpectedEOF},
		{"bare LF", "a\nb\r\n", 10, nil, errBadChunk},
		{"LF first", "\n", 10, nil, errBadChunk},
		{"too long", "abcdefghijkl\r\n", 10, nil, errLineTooBig},
		{"exactly max", "abcdefghi\r\n", 10, []string{"abcdefghi"}, io.ErrUnexpectedEOF},
		{"unterminated", "abc", 10, nil, io.ErrUnexpectedEOF},
		{"empty", "", 10, nil, io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		for _, rk := range readerKinds {
			t.Run(tc.name+"/"+rk.name, func(t *testing.T) {
				in := newInbuf(rk.wrap(tc.in), 32)
				var got []string
				var err error
				for {
					var line []byte
					line, err = in.readLine(tc.max)
					if err != nil {
						break
					}
					got = append(got, string(line))
				}
				if strings.Join(got, "|") != strings.Join(tc.lines, "|") || len(got) != len(tc.lines) {
					t.Errorf("lines = %q; want %q", got, tc.lines)
				}
				if !errors.Is(err, tc.err) {
					t.Errorf("error = %v; want %v", err, tc.err)
				}
			})
		}
	}
}

func TestUnitInbuf(t *testing.T) {
	pool := newTestPool(8)
	in := &inbuf{src: strings.NewReader("0123456789"), pool: pool}
	if err := in.fill(); err != nil || string(in.bytes()) != "01234567" {
		t.Fatalf("fill = %v, %q", err, in.bytes())
	}
	if err := in.fill(); !errors.Is(err, errBufferFull) {
		t.Errorf("fill on a full buffer = %v; want errBufferFull", err)
	}
	in.r = 5
	if err := in.fill(); err != nil || string(in.bytes()) != "56789" {
		t.Errorf("fill after consuming = %v, %q", err, in.bytes())
	}
	// release keeps a buffer that holds unread bytes.
	in.release()
	if in.buf == nil {
		t.Fatal("release dropped unread bytes")
	}
	p := make([]byte, 3)
	if n, _ := in.Read(p); string(p[:n]) != "567" {
		t.Errorf("Read = %q", p[:n])
	}
	rest, _ := io.ReadAll(in)
	if string(rest) != "89" {
		t.Errorf("rest = %q", rest)
	}
	in.release()
	if in.buf != nil || in.buffered() != 0 {
		t.Error("release kept an empty buffer")
	}
	if err := in.fill(); !errors.Is(err, io.EOF) {
		t.Errorf("fill at EOF = %v", err)
	}
}

// TestUnitInbufParkAllocs: a keep-alive connection gives its read buffer
// back to the pool every time it goes idle (server.readHead, backendPool.put)
// and takes one again for the next request. DESIGN.md "Performance
// principles": buffers come from pools, no per-request allocations. Putting
// a freshly taken address of a slice header (&buf) into the pool allocates
// on every park.
func TestUnitInbufParkAllocs(t *testing.T) {
	in := &inbuf{pool: newTestPool(1024)}
	in.acquire()
	in.release()
	allocs := testing.AllocsPerRun(100, func() {
		in.acquire()
		in.release()
	})
	if allocs != 0 {
		t.Errorf("acquire+release allocates %.0f time(s) per cycle; want 0", allocs)
	}
}

// TestUnitInbufEnlarge: enlarge keeps the buffered bytes, reads into the
// larger buffer, and release gives it back to the big pool (not to the
// small one); a second enlarge is a no-op.
func TestUnitInbufEnlarge(t *testing.T) {
	var smallGets, bigGets int
	small := &sync.Pool{New: func() any { smallGets++; b := make([]byte, 8); return &b }}
	big := &sync.Pool{New: func() any { bigGets++; b := make([]byte, 64); return &b }}
	in := &inbuf{src: strings.NewReader("0123456789abcdefghijklmnopqrstuvwxyz"), pool: small}
	if err := in.fill(); err != nil {
		t.Fatal(err)
	}
	in.r = 3 // "3456789" still buffered
	in.enlarge(big)
	if len(in.buf) != 64 || string(in.bytes()) != "34567" || bigGets != 1 {
		t.Fatalf("after enlarge: len %d, buffered %q, big gets %d", len(in.buf), in.bytes(), bigGets)
	}
	in.enlarge(big)
	if bigGets != 1 {
		t.Fatal("second enlarge took another buffer")
	}
	if err := in.fill(); err != nil {
		t.Fatal(err)
	}
	if got := string(in.bytes()); got != "3456789abcdefghijklmnopqrstuvwxyz" {
		t.Fatalf("after a fill into the large buffer: %q", got)
	}
	in.r = in.w
	bp := in.bufp
	in.release()
	if in.buf != nil || in.bufp != nil || in.big != nil {
		t.Fatal("release kept the buffer")
	}
	// The large buffer went back to big: the small pool never saw it.
	for range 3 {
		if p := small.Get().(*[]byte); p == bp {
			t.Fatal("the large buffer went back to the small pool")
		}
	}
}
