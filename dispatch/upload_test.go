package dispatch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// Slow uploads: the app's response-head timeout starts only once the
// request body has been sent, and a long upload is bounded per write, not
// as a whole, on HTTP/1.1 and HTTP/2.

const (
	slowPieces = 16                     // the client sends one piece ...
	slowPiece  = 8 << 10                // ... of 8 KiB ...
	slowEvery  = 100 * time.Millisecond // ... every 100 ms: 1.6 s in all
	// slowHeadTimeout and slowBodyTimeout are well below the upload's
	// duration; slowBodyTimeout is well above the pause between pieces.
	slowHeadTimeout = 300 * time.Millisecond
	slowBodyTimeout = time.Second
)

// pacedReader yields n pieces of size bytes, one every interval.
type pacedReader struct {
	n, size  int
	interval time.Duration
	sent     int
	left     int // bytes of the current piece not yet read
}

func (r *pacedReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		if r.sent == r.n {
			return 0, io.EOF
		}
		<-time.After(r.interval) // pacing the sender, not waiting for a condition
		r.sent++
		r.left = r.size
	}
	m := min(len(p), r.left)
	for i := range m {
		p[i] = byte(r.sent*31 + (r.size-r.left+i)*7)
	}
	r.left -= m
	return m, nil
}

// pacedSum is the SHA-256 of everything a pacedReader yields.
func pacedSum(n, size int) string {
	h := sha256.New()
	_, _ = io.Copy(h, &pacedReader{n: n, size: size})
	return hex.EncodeToString(h.Sum(nil))
}

// uploadApp answers /upload with the SHA-256 and length of the body it
// read to the end; /stall reads the body and never answers (until stop).
func uploadApp(stop <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/stall" {
			select {
			case <-stop:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = fmt.Fprintf(w, "%s %d", hex.EncodeToString(h.Sum(nil)), n)
	})
}

// TestSlowUploadAnsweredAfterTheHeadTimeout: an app reads an upload that
// takes longer than both the response-head timeout and the body timeout
// (each piece arrives well within the body timeout), then answers: the
// client gets the answer, with the body intact. A request whose body is
// all sent still gets 504 once the head timeout passes.
func TestSlowUploadAnsweredAfterTheHeadTimeout(t *testing.T) {
	h2Verify(t)
	stop := make(chan struct{})
	p := newAppProxy(t, Config{ResponseHeaderTimeout: slowHeadTimeout, BodyTimeout: slowBodyTimeout}, uploadApp(stop))
	t.Cleanup(func() { close(stop) })
	want := fmt.Sprintf("%s %d", pacedSum(slowPieces, slowPiece), slowPieces*slowPiece)
	for _, proto := range protocols {
		for _, sized := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/sized=%v", proto, sized), func(t *testing.T) {
				t.Parallel()
				req, err := http.NewRequest("POST", "https://"+testHost+"/upload",
					&pacedReader{n: slowPieces, size: slowPiece, interval: slowEvery})
				if err != nil {
					t.Fatal(err)
				}
				if sized {
					req.ContentLength = slowPieces * slowPiece
				}
				start := time.Now()
				resp, err := p.client(proto).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				checkProto(t, resp, proto)
				if resp.StatusCode != 200 || string(body) != want {
					t.Fatalf("after %v: %d %q; want 200 %q", time.Since(start), resp.StatusCode, body, want)
				}
				if d := time.Since(start); d < slowBodyTimeout+slowHeadTimeout {
					t.Fatalf("the upload took %v; the test needs it longer than the timeouts", d)
				}
			})
		}
	}
	for _, proto := range protocols {
		t.Run(proto+"/stalled", func(t *testing.T) {
			req, err := http.NewRequest("POST", "https://"+testHost+"/stall",
				&pacedReader{n: 3, size: slowPiece, interval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := p.client(proto).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusGatewayTimeout {
				t.Fatalf("an app that never answers: %d %q; want 504", resp.StatusCode, body)
			}
		})
	}
}
