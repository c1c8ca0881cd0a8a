package dispatch

import (
	"net/netip"
	"strings"
	"testing"
)

// aliasNames are every framing and hop-by-hop field name and Host: the
// names whose meaning the listener owns.
var aliasNames = []string{"Content-Length", "Transfer-Encoding", "Connection", "Upgrade", "Keep-Alive", "TE",
	"Trailer", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Host", "Proxy"}

var aliasValues = []string{"5", "chunked", "0", "close", "websocket", "Upgrade", "trailers", "gzip, chunked", " 5 ", "keep-alive, Content-Length"}

// aliasHead builds a request head from prog: each pair of bytes adds one
// field whose name is one of aliasNames, spelled with mixed case, '_' for
// '-', surrounding whitespace or on an obs-fold continuation line, as the
// bits of the pair choose.
func aliasHead(prog []byte) string {
	var b strings.Builder
	b.WriteString("POST /p HTTP/1.1\r\nHost: " + testHost + "\r\n")
	for i := 0; i+1 < len(prog) && i < 40; i += 2 {
		sel, bits := prog[i], prog[i+1]
		name := []byte(aliasNames[int(sel)%len(aliasNames)])
		for j := range name {
			if bits&1 != 0 && name[j] == '-' {
				name[j] = '_'
			}
			if (bits>>1)&1 != 0 && j%2 == 0 && 'A' <= name[j] && name[j] <= 'Z' {
				name[j] += 'a' - 'A'
			}
			if (bits>>2)&1 != 0 && 'a' <= name[j] && name[j] <= 'z' {
				name[j] -= 'a' - 'A'
			}
		}
		value := aliasValues[int(sel>>4)%len(aliasValues)]
		switch (bits >> 3) & 7 {
		case 1:
			b.WriteString(" " + string(name) + ": " + value + "\r\n") // leading whitespace (obs-fold)
		case 2:
			b.WriteString(string(name) + " : " + value + "\r\n") // whitespace before the colon
		case 3:
			b.WriteString("X: a\r\n\t" + string(name) + ": " + value + "\r\n") // continuation line
		case 4:
			b.WriteString(string(name) + ":\t" + value + "\t\r\n")
		default:
			b.WriteString(string(name) + ": " + value + "\r\n")
		}
	}
	b.WriteString("\r\n")
	return b.String()
}

// FuzzFramingAliases: for heads full of framing and hop-by-hop names in
// every spelling, the listener either refuses the request or forwards a
// head that a CGI/WSGI server (names case-folded, '_' read as '-') reads
// with exactly the listener's framing: one Host, at most one framing field
// and it is the listener's, and no hop-by-hop or Proxy-* field (Connection
// and Upgrade only for a WebSocket upgrade; no Proxy, the httpoxy field).
func FuzzFramingAliases(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1}, false)
	f.Add([]byte{0, 0, 1, 1}, true)
	f.Add([]byte{1, 0, 0, 1}, false)
	f.Add([]byte{2, 1, 3, 1, 4, 1, 5, 1, 6, 1, 7, 1, 8, 1, 9, 1, 10, 1}, true)
	f.Add([]byte{0, 8, 1, 16, 0, 24, 1, 32}, false)
	f.Fuzz(func(t *testing.T, prog []byte, allow bool) {
		h := aliasHead(prog)
		var r request
		if err := parseRequestHead(&r, []byte(h), 100); err != nil {
			return // refused
		}
		fi := &forwardInfo{client: netip.MustParseAddr("203.0.113.9"), publicHost: testHost,
			backendHost: "127.0.0.1:8080", allowUnderscore: allow}
		out := string(appendRequestHead(nil, &r, fi))
		counts := map[string]int{}
		for _, line := range strings.Split(strings.TrimSuffix(out, "\r\n\r\n"), "\r\n")[1:] {
			name, _, ok := strings.Cut(line, ":")
			if !ok {
				t.Fatalf("malformed forwarded line %q", line)
			}
			counts[strings.ToLower(strings.ReplaceAll(name, "_", "-"))]++
		}
		if counts["host"] != 1 {
			t.Fatalf("%d Host fields (CGI reading) forwarded for %q:\n%s", counts["host"], h, out)
		}
		framing := counts["content-length"] + counts["transfer-encoding"]
		want := 0
		if r.body != bodyNone || r.zeroLength {
			want = 1
		}
		if framing != want {
			t.Fatalf("%d framing fields (CGI reading), want %d, for %q:\n%s", framing, want, h, out)
		}
		for name, n := range counts {
			hop := name == "keep-alive" || name == "te" || name == "trailer" || name == "proxy" ||
				name == "proxy-connection" || name == "proxy-authorization" || name == "proxy-authenticate"
			if (name == "connection" || name == "upgrade") && !r.upgrade {
				hop = true
			}
			if hop && n > 0 {
				t.Fatalf("hop-by-hop %s (CGI reading) forwarded for %q:\n%s", name, h, out)
			}
		}
		if !allow && strings.Contains(out[:strings.Index(out, "\r\n\r\n")], "_") {
			for _, line := range strings.Split(out, "\r\n")[1:] {
				if name, _, _ := strings.Cut(line, ":"); strings.Contains(name, "_") {
					t.Fatalf("field %q with '_' forwarded by default", name)
				}
			}
		}
	})
}
