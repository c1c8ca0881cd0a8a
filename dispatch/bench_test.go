package dispatch

import (
	"bytes"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/applistener/applistener/routes"
)

// benchBrowserHead is a realistic browser navigation request: 13 fields.
func benchBrowserHead() []byte {
	return head(
		"GET /dashboard/projects?tab=recent&page=2 HTTP/1.1",
		"Host: "+testHost,
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
		"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
		"Accept-Language: en-US,en;q=0.5",
		"Accept-Encoding: gzip, deflate, br, zstd",
		"Referer: https://"+testHost+"/dashboard",
		"Connection: keep-alive",
		"Cookie: session=3f9a1c2b7d6e4f50a1b2c3d4e5f60718; theme=dark; _ga=GA1.1.123456789.1700000000",
		"Upgrade-Insecure-Requests: 1",
		"Sec-Fetch-Dest: document",
		"Sec-Fetch-Mode: navigate",
		"Sec-Fetch-Site: same-origin",
		"Priority: u=0, i",
	)
}

func benchForwardInfo() *forwardInfo {
	return &forwardInfo{
		client:      netip.MustParseAddr("203.0.113.7"),
		publicHost:  testHost,
		backendHost: "127.0.0.1:8080",
		publicPort:  8443,
		requestID:   []byte("0af7651916cd43dd8448eb211c80319c"),
	}
}

func BenchmarkParseRequestHead(b *testing.B) {
	h := benchBrowserHead()
	var r request
	b.ReportAllocs()
	b.SetBytes(int64(len(h)))
	for b.Loop() {
		if err := parseRequestHead(&r, h, DefaultMaxHeaderFields); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendRequestHead(b *testing.B) {
	h := benchBrowserHead()
	var r request
	if err := parseRequestHead(&r, h, DefaultMaxHeaderFields); err != nil {
		b.Fatal(err)
	}
	fi := benchForwardInfo()
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		dst = appendRequestHead(dst[:0], &r, fi)
	}
	b.SetBytes(int64(len(dst)))
}

func BenchmarkAppendRequestHeadTrusted(b *testing.B) {
	h := bytes.Replace(benchBrowserHead(), []byte("Priority"), []byte("X-Forwarded-For: 198.51.100.1\r\nForwarded: for=198.51.100.1\r\nPriority"), 1)
	var r request
	if err := parseRequestHead(&r, h, DefaultMaxHeaderFields); err != nil {
		b.Fatal(err)
	}
	fi := benchForwardInfo()
	fi.trusted = true
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		dst = appendRequestHead(dst[:0], &r, fi)
	}
}

func BenchmarkParseAndForward(b *testing.B) {
	h := benchBrowserHead()
	var r request
	fi := benchForwardInfo()
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		if err := parseRequestHead(&r, h, DefaultMaxHeaderFields); err != nil {
			b.Fatal(err)
		}
		if !routes.HostMatches(r.host, testHost) {
			b.Fatal("host")
		}
		dst = appendRequestHead(dst[:0], &r, fi)
	}
}

func BenchmarkHostMatches(b *testing.B) {
	h := []byte("Team--Demo--Web.Apps.Test:8443")
	b.ReportAllocs()
	for b.Loop() {
		if !routes.HostMatches(h, testHost) {
			b.Fatal("no match")
		}
	}
}

func BenchmarkParseResponseHead(b *testing.B) {
	h := head(
		"HTTP/1.1 200 OK",
		"Content-Type: text/html; charset=utf-8",
		"Content-Length: 5120",
		"Cache-Control: no-cache",
		"Date: Sat, 29 Nov 2025 09:00:00 GMT",
		"Set-Cookie: session=abc; Path=/; HttpOnly; Secure",
		"Vary: Accept-Encoding",
		"Connection: keep-alive",
		"Keep-Alive: timeout=5",
	)
	var r response
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		if err := parseResponseHead(&r, h, false, 200); err != nil {
			b.Fatal(err)
		}
		dst = appendResponseHead(dst[:0], &r, r.body, false, false, nil)
	}
}

func BenchmarkCopyChunked(b *testing.B) {
	var sb strings.Builder
	for range 64 {
		sb.WriteString("400\r\n")
		sb.WriteString(strings.Repeat("x", 0x400))
		sb.WriteString("\r\n")
	}
	sb.WriteString("0\r\n\r\n")
	body := sb.String()
	rd := strings.NewReader(body)
	pool := newTestPool(16 << 10)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rd.Reset(body)
		in := inbuf{src: rd, pool: pool}
		if _, err := copyChunked(io.Discard, &in, true, nil); err != nil {
			b.Fatal(err)
		}
		in.release()
	}
}
