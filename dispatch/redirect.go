package dispatch

import (
	"strconv"

	"github.com/applistener/applistener/internal/httpgrammar"
)

// Redirects to the app's own loopback origin. By default the app sees
// "Host: 127.0.0.1:PORT" (what dev servers accept), so a framework that
// builds absolute URLs from the Host it was given answers a login with
// "Location: http://127.0.0.1:PORT/home", which would send the browser to
// its own machine. As nginx's "proxy_redirect default" does, the Location
// and Content-Location values and the URL of a Refresh value that point at
// that origin (http://127.0.0.1:PORT, http://localhost:PORT or the
// connector's own loopback host; without the port when it is 80; the host
// in any case) become https://<public host>, with the port the client
// named, keeping path, query and fragment. Relative values and other
// origins are left alone, and with Config.PreserveHost (the app saw the
// public Host) nothing is rewritten. HTTP/1.1 and HTTP/2 responses go
// through the same function (exchange.readHead).

// rewriteRedirects rewrites the redirect fields of resp that point at the
// app's loopback origin to https://sni[:publicPort]. It allocates only for
// a value it rewrites.
func (s *Server) rewriteRedirects(resp *response, pool *backendPool, sni string, publicPort int) {
	if s.cfg.PreserveHost {
		return
	}
	for i := range resp.fields {
		f := &resp.fields[i]
		start := 0
		switch len(f.name) {
		case 7:
			if !httpgrammar.EqualFold(f.name, "refresh") {
				continue
			}
			if start = refreshURLStart(f.value); start < 0 {
				continue
			}
		case 8:
			if !httpgrammar.EqualFold(f.name, "location") {
				continue
			}
		case 16:
			if !httpgrammar.EqualFold(f.name, "content-location") {
				continue
			}
		default:
			continue
		}
		n := loopbackOriginLen(f.value[start:], pool.hostHeader, pool.port)
		if n == 0 {
			continue
		}
		f.value = publicURL(f.value, start, start+n, sni, publicPort)
	}
}

// publicURL returns v with v[from:to] (the loopback origin) replaced by
// https://sni, plus ":port" when port is not 0.
func publicURL(v []byte, from, to int, sni string, port int) []byte {
	out := make([]byte, 0, len(v)-(to-from)+len("https://:65535")+len(sni))
	out = append(out, v[:from]...)
	out = append(out, "https://"...)
	out = append(out, sni...)
	if port != 0 {
		out = append(out, ':')
		out = strconv.AppendInt(out, int64(port), 10)
	}
	return append(out, v[to:]...)
}

// loopbackOriginLen returns the length of the prefix of v that is the
// app's own origin as the app saw it, "http://" and an authority, or 0
// when v does not start with it. The authority's host is 127.0.0.1,
// localhost or the host of hostHeader (the Host sent to the app), in any
// case; its port is port, or absent (or empty) when port is 80. What
// follows must start a path, a query or a fragment, or be nothing.
func loopbackOriginLen(v []byte, hostHeader string, port int) int {
	const scheme = "http://"
	if len(v) < len(scheme) || !httpgrammar.EqualFold(v[:len(scheme)], scheme) {
		return 0
	}
	end := len(scheme)
	for end < len(v) && v[end] != '/' && v[end] != '?' && v[end] != '#' {
		end++
	}
	auth := v[len(scheme):end]
	host := auth
	hasPort := false
	var portPart []byte
	for i := len(auth) - 1; i >= 0 && auth[i] != ']'; i-- {
		if auth[i] == ':' {
			host, portPart, hasPort = auth[:i], auth[i+1:], true
			break
		}
	}
	switch {
	case hasPort && len(portPart) > 0:
		if p, ok := parsePort(portPart); !ok || p != port {
			return 0
		}
	case port != 80:
		return 0
	}
	appHost := hostHeader
	for i := len(hostHeader) - 1; i >= 0; i-- {
		if hostHeader[i] == ':' {
			appHost = hostHeader[:i]
			break
		}
		if hostHeader[i] == ']' {
			break
		}
	}
	if !httpgrammar.EqualFold(host, "127.0.0.1") && !httpgrammar.EqualFold(host, "localhost") && !httpgrammar.EqualFold(host, appHost) {
		return 0
	}
	return end
}

// parsePort parses 1 to 5 decimal digits.
func parsePort(p []byte) (int, bool) {
	if len(p) == 0 || len(p) > 5 {
		return 0, false
	}
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// hostPort returns the port of a Host value (0 when it names none, or
// names 443, the default of https).
func hostPort(host []byte) int {
	for i := len(host) - 1; i >= 0 && host[i] != ']'; i-- {
		if host[i] == ':' {
			p, ok := parsePort(host[i+1:])
			if !ok || p == 443 {
				return 0
			}
			return p
		}
	}
	return 0
}

// refreshURLStart returns where the URL of a Refresh value starts
// ("5; url=/next", "0;URL='http://…'", "0, http://…", as browsers read
// it: the delay, ';' or ',', an optional "url=", an optional quote), or -1
// when it names none.
func refreshURLStart(v []byte) int {
	i := skipWS(v, 0)
	for i < len(v) && (('0' <= v[i] && v[i] <= '9') || v[i] == '.') {
		i++
	}
	i = skipWS(v, i)
	if i >= len(v) || (v[i] != ';' && v[i] != ',') {
		return -1
	}
	i = skipWS(v, i+1)
	if i+3 <= len(v) && httpgrammar.EqualFold(v[i:i+3], "url") {
		if j := skipWS(v, i+3); j < len(v) && v[j] == '=' {
			i = skipWS(v, j+1)
		}
	}
	if i < len(v) && (v[i] == '\'' || v[i] == '"') {
		i++
	}
	if i >= len(v) {
		return -1
	}
	return i
}

func skipWS(v []byte, i int) int {
	for i < len(v) && httpgrammar.IsOWS(v[i]) {
		i++
	}
	return i
}
