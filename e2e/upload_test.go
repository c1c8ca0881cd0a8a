package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Large uploads stream through the listener: the app gets every byte
// (checksum), and the listener's resident memory stays bounded whatever
// the body's size. Measured on the real binary (not race-built) from
// /proc/<pid>/status, over HTTP/1.1 and HTTP/2.

const (
	// uploadAlways is the size uploaded on every run ...
	uploadAlways = 128 << 20
	// ... and uploadBig the size with APPLISTENER_E2E_BIG_UPLOAD=1: about
	// 10 s per protocol, 23 s for both, on a busy 2-core machine under
	// -race, too slow for every run of make test.
	uploadBig = 1 << 30
	// uploadRSSBound bounds the listener's resident memory growth.
	uploadRSSBound = 32 << 20
)

// uploadSink answers a POST with the SHA-256 and the length of the body
// it read to the end.
func uploadSink() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = fmt.Fprintf(w, "%s %d", hex.EncodeToString(h.Sum(nil)), n)
	}))
}

// randomBody yields n deterministic pseudo-random bytes (never held in
// memory), hashing them into sum as they are read.
type randomBody struct {
	left int64
	rng  *rand.ChaCha8
	sum  io.Writer
}

func newRandomBody(n int64, sum io.Writer) *randomBody {
	return &randomBody{left: n, rng: rand.NewChaCha8([32]byte{1, 2, 3}), sum: sum}
}

func (b *randomBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, _ := b.rng.Read(p)
	_, _ = b.sum.Write(p[:n])
	b.left -= int64(n)
	return n, nil
}

// procMemory returns VmRSS and VmHWM (peak) of pid, in bytes.
func procMemory(t testing.TB, pid int) (rss, hwm int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/status: %s: %v", pid, sc.Text(), err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if rss == 0 || hwm == 0 {
		t.Fatalf("/proc/%d/status: no VmRSS or VmHWM", pid)
	}
	return rss, hwm
}

// resetPeak resets VmHWM to the current RSS (Linux: clear_refs 5); false
// when the kernel refuses.
func resetPeak(pid int) bool {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) == nil
}

// uploadClient returns a client speaking proto ("h1" or "h2") to the
// listener with the given SNI, without an overall time limit.
func (p *proc) uploadClient(t testing.TB, sni, proto string) *http.Client {
	var protocols http.Protocols
	if proto == "h2" {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetHTTP1(true)
	}
	tr := &http.Transport{
		Protocols:          &protocols,
		DialContext:        p.dial,
		TLSClientConfig:    tlsConfig(sni),
		DisableCompression: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestLargeUploadStreamsWithBoundedMemory: an upload of uploadAlways bytes
// (uploadBig with APPLISTENER_E2E_BIG_UPLOAD=1) reaches the app byte for
// byte over HTTP/1.1 and HTTP/2, while the listener's peak resident memory
// grows by less than uploadRSSBound.
func TestLargeUploadStreamsWithBoundedMemory(t *testing.T) {
	size := int64(uploadAlways)
	if os.Getenv("APPLISTENER_E2E_BIG_UPLOAD") == "1" {
		size = uploadBig
	}
	app := uploadSink()
	t.Cleanup(app.Close)
	port := app.Listener.Addr().(*net.TCPAddr).Port
	p := startProc(t, routesDoc(service{Name: "web", Port: port, Revision: 1}))
	pid := p.cmd.Process.Pid
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			c := p.uploadClient(t, hostWeb, proto)
			upload := func(n int64) (sent, got string, d time.Duration) {
				t.Helper()
				h := sha256.New()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, "POST", "https://"+hostWeb+"/upload", newRandomBody(n, h))
				if err != nil {
					t.Fatal(err)
				}
				req.ContentLength = n
				start := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("upload of %d bytes: %v", n, err)
				}
				body, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("upload of %d bytes: %d %q %v", n, resp.StatusCode, body, err)
				}
				if want := map[string]int{"h1": 1, "h2": 2}[proto]; resp.ProtoMajor != want {
					t.Fatalf("upload over %s; want %s", resp.Proto, proto)
				}
				return fmt.Sprintf("%s %d", hex.EncodeToString(h.Sum(nil)), n), string(body), time.Since(start)
			}
			// Warm up: the connection, its buffers and the app connection
			// exist before the measurement starts.
			if sent, got, _ := upload(1 << 20); got != sent {
				t.Fatalf("warm-up upload: the app got %q; sent %q", got, sent)
			}
			rssBefore, hwmBefore := procMemory(t, pid)
			exact := resetPeak(pid)
			if exact {
				rssBefore, hwmBefore = procMemory(t, pid)
			}
			sent, got, d := upload(size)
			if got != sent {
				t.Fatalf("the app got %q; sent %q", got, sent)
			}
			rssAfter, hwmAfter := procMemory(t, pid)
			// Without a peak reset, the peak since start-up may predate
			// the upload: measuring from the RSS before overstates the
			// growth, never understates it.
			growth := hwmAfter - rssBefore
			t.Logf("%s: %d MiB uploaded in %v (%.0f MiB/s); listener VmRSS %d -> %d MiB, VmHWM %d -> %d MiB (peak reset: %v), growth %.1f MiB",
				proto, size>>20, d.Round(time.Millisecond), float64(size>>20)/d.Seconds(),
				rssBefore>>20, rssAfter>>20, hwmBefore>>20, hwmAfter>>20, exact, float64(growth)/(1<<20))
			if growth >= uploadRSSBound {
				t.Errorf("the listener's resident memory grew by %.1f MiB during a %d MiB upload; want less than %d MiB",
					float64(growth)/(1<<20), size>>20, uploadRSSBound>>20)
			}
		})
	}
}
