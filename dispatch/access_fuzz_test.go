package dispatch

import (
	"strings"
	"testing"
	"time"
)

// FuzzAccessCredentials feeds arbitrary field values and targets to the
// credential extraction and the decision: the HTTP/1.1 (bytes) and HTTP/2
// (strings) forms decide alike, nothing but the valid token authenticates, and what
// the forwarding removes is gone (no token cookie crumb, no _al_token
// parameter, no token subprotocol is left for the app).
//
// The token and the clock are fixed, far ahead: with a token minted at the
// time of the run, an input kept in the fuzz cache by an earlier run carries
// an older token of the same key that is still valid, and was taken for
// one that authenticated without the valid token (the seed e71f45c1b9708e59
// is such an input). Every token minted at a real time has expired by then.
func FuzzAccessCredentials(f *testing.F) {
	now := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	ar, ks, tok := accessRouteAt(f, true, now)
	for _, s := range []struct{ name, value, path string }{
		{"cookie", "a=b; " + accessCookie + "=" + tok, "/"},
		{"cookie", accessCookie + `="` + tok[:20] + `"; ` + accessCookie + "=x", "/?a=1"},
		{"authorization", "Bearer " + tok[:len(tok)-1], "/"},
		{"x-applistener-token", "v1.k1.AAAA.BBBB", "/p?_al_token=" + tok},
		{"sec-websocket-protocol", "chat, " + accessSubprotocol + "x, " + accessSubprotocol, "/ws"},
		{"origin", accOrigin, "/?_al_token=&_al_token=1&x=_al_token"},
		{"cookie", ";;;" + accessCookie + ";" + accessCookie + "=;", "/?#_al_token=1"},
	} {
		f.Add(s.name, s.value, s.path)
	}
	f.Fuzz(func(t *testing.T, name, value, path string) {
		var c clientConn
		var ib accessInput[[]byte]
		var is accessInput[string]
		ib.method, ib.path = []byte("GET"), []byte(path)
		is.method, is.path = "GET", path
		ib.field([]byte(name), []byte(value), true)
		is.field(strings.ToLower(name), value, true)
		db := decideAccess(ar, ks, &ib, now, c.tokenString)
		ds := decideAccess(ar, ks, &is, now, identityString)
		if db.verdict != ds.verdict || db.reason != ds.reason || db.source != ds.source {
			t.Fatalf("bytes %+v, strings %+v", db, ds)
		}
		if (db.verdict == accessAllow || db.verdict == accessExchange) && !strings.Contains(value+path, tok) {
			t.Fatalf("input without the valid token authenticated: %+v", db)
		}
		if out, drop := (&accessForward{bearer: true}).rewriteField([]byte("Cookie"), []byte(value)); !drop {
			if _, ok := cookieValue(out, accessCookie); ok {
				t.Fatalf("cookie %q left the token crumb in %q", value, out)
			}
		}
		if out, drop := (&accessForward{}).rewriteField([]byte("Sec-WebSocket-Protocol"), []byte(value)); !drop {
			if _, ok := subprotocolToken(out); ok {
				t.Fatalf("subprotocols %q left a token entry in %q", value, out)
			}
		}
		if _, ok := queryParam(withoutQueryParam(path, accessQueryParam), accessQueryParam); ok {
			t.Fatalf("path %q keeps _al_token after removal", path)
		}
	})
}
