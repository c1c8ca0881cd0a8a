package dispatch

import (
	"bytes"
	"context"
	"log/slog"

	"github.com/applistener/applistener/internal/httpgrammar"
)

// App cookies are host-only by default. Every sandbox of an app domain is
// a sibling name under it, and a browser sends a cookie set with
// "Domain=<app domain>" to all of them: one sandbox could plant (toss) or
// fix a session cookie in another. An app's Set-Cookie keeps its Domain
// attribute only when it names exactly the request's own host; any other
// Domain is removed (the browser then scopes the cookie to the host that
// set it). Config.PassCookieDomain turns this off for platforms whose app
// domain is on the Public Suffix List, where browsers refuse such cookies
// themselves.

// scopeCookies removes Domain attributes that name more than host from
// every Set-Cookie field of resp (HTTP/1.1 and HTTP/2 alike), counting
// them and logging once per route.
func (s *Server) scopeCookies(resp *response, host string, pool *backendPool) {
	if s.cfg.PassCookieDomain {
		return
	}
	removed := 0
	for i := range resp.fields {
		f := &resp.fields[i]
		if !httpgrammar.EqualFold(f.name, "set-cookie") {
			continue
		}
		if v, n := hostOnlyCookie(f.value, host); n > 0 {
			f.value = v
			removed += n
		}
	}
	if removed == 0 {
		return
	}
	s.m.cookieDomains.Add(float64(removed))
	if pool.cookieWarned.CompareAndSwap(false, true) {
		s.log.LogAttrs(context.Background(), slog.LevelWarn,
			"app set a cookie for a wider domain; its Domain attribute was removed (logged once per route)",
			slog.String("host", host))
	}
}

// hostOnlyCookie returns the Set-Cookie value v without the Domain
// attributes that name something other than host (a leading dot and case
// ignored), and how many it removed. v is returned unchanged, without
// allocating, when none is removed.
func hostOnlyCookie(v []byte, host string) ([]byte, int) {
	// The first segment is name=value; attributes follow, each after ';'.
	first := bytes.IndexByte(v, ';')
	if first < 0 {
		return v, 0
	}
	var out []byte
	removed := 0
	start := first // start of the current attribute (at its ';')
	for start < len(v) {
		end := len(v)
		if j := bytes.IndexByte(v[start+1:], ';'); j >= 0 {
			end = start + 1 + j
		}
		attr := v[start:end] // ";..." segment
		if foreignDomain(attr[1:], host) {
			if out == nil {
				out = append(make([]byte, 0, len(v)), v[:start]...)
			}
			removed++
		} else if out != nil {
			out = append(out, attr...)
		}
		start = end
	}
	if removed == 0 {
		return v, 0
	}
	return out, removed
}

// foreignDomain reports whether the cookie attribute a is a Domain
// attribute whose value is not host.
func foreignDomain(a []byte, host string) bool {
	a = httpgrammar.TrimOWS(a)
	name, value, ok := bytes.Cut(a, []byte("="))
	if !ok {
		// A bare "Domain" is ignored by browsers (RFC 6265 §5.2.3 needs a
		// value); drop it too, so no reading of it can widen the scope.
		return httpgrammar.EqualFold(httpgrammar.TrimOWS(a), "domain")
	}
	if !httpgrammar.EqualFold(httpgrammar.TrimOWS(name), "domain") {
		return false
	}
	value = httpgrammar.TrimOWS(value)
	if len(value) > 0 && value[0] == '.' {
		value = value[1:]
	}
	return !httpgrammar.EqualFold(value, host)
}
