package proxyproto

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// haproxyBin returns HAProxy's path, or skips the test without it (fails
// it under CI: scripts/test-deps.sh installs it).
func haproxyBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("haproxy")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("haproxy unavailable under CI: %v", err)
		}
		t.Skipf("haproxy unavailable: %v", err)
	}
	return p
}

func freePort(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// startHAProxy runs HAProxy in the foreground with cfg until the test ends
// and waits until addr accepts connections.
func startHAProxy(t *testing.T, cfg, addr string) {
	t.Helper()
	bin := haproxyBin(t)
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-db", "-f", path)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("haproxy output:\n%s", out.String())
		}
	})
	testutil.Eventually(t, 10*time.Second, "haproxy listening on "+addr, func() bool {
		select {
		case <-done:
			t.Fatalf("haproxy exited:\n%s", out.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
}

// TestHAProxyDecodesAppend: HAProxy (accept-proxy) reads the headers
// Append writes, IPv4 and IPv6, authority included.
func TestHAProxyDecodesAppend(t *testing.T) {
	addr := freePort(t, "127.0.0.1")
	startHAProxy(t, fmt.Sprintf(`defaults
  mode http
  timeout connect 2s
  timeout client 5s
  timeout server 5s
frontend fe
  bind %s accept-proxy
  http-request return status 200 content-type text/plain lf-string "%%[src]:%%[src_port] %%[dst]:%%[dst_port] authority=%%[fc_pp_authority]"
`, addr), addr)
	for _, tc := range []struct {
		h    Header
		want string
	}{
		{Header{Command: Proxy, Source: ap("203.0.113.7:40000"), Destination: ap("10.0.0.1:8443"), Authority: "team--demo--web.apps.test"},
			"203.0.113.7:40000 10.0.0.1:8443 authority=team--demo--web.apps.test"},
		{Header{Command: Proxy, Source: ap("[2001:db8::7]:40001"), Destination: ap("[2001:db8::1]:443")},
			"2001:db8::7:40001 2001:db8::1:443 authority="},
	} {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		b, err := tc.h.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(append(b, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"...)); err != nil {
			t.Fatal(err)
		}
		resp, err := io.ReadAll(c)
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if _, body, _ := strings.Cut(string(resp), "\r\n\r\n"); !strings.HasPrefix(string(resp), "HTTP/1.1 200") || body != tc.want {
			t.Errorf("HAProxy read %+v as %q, want %q", tc.h, resp, tc.want)
		}
	}
}

// TestReadDecodesHAProxy: Read decodes the header HAProxy's send-proxy-v2
// writes with a CRC32C (verified) and a unique-id TLV (skipped), and leaves
// the client's first bytes unread.
func TestReadDecodesHAProxy(t *testing.T) {
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := freePort(t, "127.0.0.2")
	startHAProxy(t, fmt.Sprintf(`defaults
  mode tcp
  timeout connect 2s
  timeout client 5s
  timeout server 5s
frontend fe
  bind %s
  unique-id-format %%{+X}o\ %%ci:%%cp_%%fi:%%fp_%%Ts_%%rt:%%pid
  default_backend be
backend be
  server s %s send-proxy-v2 proxy-v2-options crc32c,unique-id
`, front, backend.Addr()), front)
	type result struct {
		h     Header
		err   error
		first string
	}
	results := make(chan result, 4)
	var wg sync.WaitGroup
	defer func() {
		_ = backend.Close()
		wg.Wait()
	}()
	wg.Go(func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			h, err := Read(c, 0)
			first, _ := bufio.NewReader(c).ReadString('\n')
			_ = c.Close()
			results <- result{h, err, first}
		}
	})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	want := Header{Command: Proxy, Source: netip.MustParseAddrPort(c.LocalAddr().String()), Destination: netip.MustParseAddrPort(front)}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-results:
			if r.err == nil && r.h.Source.Addr() != want.Source.Addr() {
				continue // the readiness probe, from 127.0.0.1
			}
			if r.err != nil || r.h != want || r.first != "hello\n" {
				t.Fatalf("Read of HAProxy's header: %+v, %v, then %q; want %+v, then %q", r.h, r.err, r.first, want, "hello\n")
			}
			return
		case <-deadline:
			t.Fatal("no connection from HAProxy")
		}
	}
}
