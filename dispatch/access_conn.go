package dispatch

import (
	"errors"
	"sync"
	"time"

	"github.com/applistener/applistener/accesstoken"
)

// errAccessKeyRemoved revokes what was authenticated with a key id that
// the keys file no longer holds (Server.RevokeAccessKeys).
var errAccessKeyRemoved = errors.New("access key removed")

// accessKeys returns the current access keys (nil: none configured).
func (s *Server) accessKeys() *accesstoken.KeySet {
	if s.cfg.AccessKeys == nil {
		return nil
	}
	return s.cfg.AccessKeys()
}

// authKeys are the key ids that authenticated requests of one client
// connection: a connection is revoked when one of them is removed. Most
// connections use one key; past two, any removal revokes it.
type authKeys struct {
	mu       sync.Mutex
	ids      [2]string
	n        uint8
	overflow bool
}

// add notes kid (no allocation: the ids are the key set's strings).
func (a *authKeys) add(kid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.n {
		if a.ids[i] == kid {
			return
		}
	}
	if int(a.n) < len(a.ids) {
		a.ids[a.n] = kid
		a.n++
		return
	}
	a.overflow = true
}

// uses reports whether any of removed authenticated a request here.
func (a *authKeys) uses(removed []string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == 0 {
		return false
	}
	if a.overflow {
		return true
	}
	for _, r := range removed {
		for i := range a.n {
			if a.ids[i] == r {
				return true
			}
		}
	}
	return false
}

// RevokeAccessKeys closes every client connection (HTTP/1.1 with its
// WebSocket, HTTP/2 with all of its streams) that authenticated a request
// with one of the key ids removed from the keys file: tokens signed with
// them no longer verify, and what they opened ends now. It returns the
// number of connections revoked.
func (s *Server) RevokeAccessKeys(removed []string) int {
	if len(removed) == 0 {
		return 0
	}
	var h1 []*clientConn
	var h2 []*h2Conn
	s.mu.Lock()
	for c := range s.conns {
		if c.keys.uses(removed) {
			h1 = append(h1, c)
		}
	}
	for hc := range s.h2conns {
		if hc.keys.uses(removed) {
			h2 = append(h2, hc)
		}
	}
	s.mu.Unlock()
	for _, c := range h1 {
		c.Revoke(errAccessKeyRemoved)
	}
	for _, hc := range h2 {
		hc.Revoke(errAccessKeyRemoved)
	}
	if n := len(h1) + len(h2); n > 0 {
		s.log.Info("access keys removed: connections authenticated with them closed", "key_ids", removed, "connections", n)
	}
	return len(h1) + len(h2)
}

// tokenString returns b as a string, reusing the connection's last one
// when equal: a keep-alive connection presenting the same cookie on every
// request converts it once.
func (c *clientConn) tokenString(b []byte) string {
	if len(b) > accesstoken.MaxTokenLen {
		return "" // malformed either way; never copied
	}
	if string(b) != c.lastToken {
		c.lastToken = string(b)
	}
	return c.lastToken
}

// checkAccess decides a request to a token-mode route (access.go). It
// reports whether the request goes on to the app; when not, the answer
// was written and keep says whether the connection continues.
func (c *clientConn) checkAccess(ar *accessRoute) (proceed, keep bool) {
	req := &c.req
	var in accessInput[[]byte]
	in.method, in.path, in.websocket = req.method, req.path, req.upgrade
	for i := range req.fields {
		f := &req.fields[i]
		in.field(f.name, f.value, ar.policy.Bearer)
	}
	keys := c.s.accessKeys()
	in.jwt = c.s.accessJWTFor(ar, keys)
	c.acc = decideAccess(ar, keys, &in, time.Now(), c.tokenString)
	d := &c.acc
	if d.verdict == accessAllow {
		c.rec.noteAccess(d)
		c.keys.add(d.claims.KeyID)
		return true, true
	}
	ri := accessRequestInfo{host: c.sni, port: publicPortOf(req.host), path: string(req.path)}
	if d.verdict == accessPreflight {
		ri.acrMethod, ri.acrHeaders = string(in.acrMethod), string(in.acrHeaders)
	}
	a := answerFor(ar, d, &ri)
	c.s.noteAccess(&c.rec, d, &a)
	if d.reason != "" {
		c.logDenial(a.status, "access: "+d.reason)
	}
	closeConn := req.body != bodyNone || req.close || c.s.draining.Load()
	c.out = appendAccessAnswer(c.out[:0], &a, string(req.method) == "HEAD", closeConn, c.rec.id.bytes())
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.BodyTimeout))
	if _, err := c.conn.Write(c.out); err != nil {
		return false, false
	}
	return false, !closeConn
}

// accessForwarding sets what fi does for a token-mode route: the consumed
// credentials removed, the subject as X-Forwarded-User, the path without
// _al_token.
func (c *clientConn) accessForwarding(fi *forwardInfo, ar *accessRoute) {
	if ar == nil {
		return
	}
	c.accFwd = accessForward{bearer: ar.policy.Bearer, user: c.acc.claims.Subject}
	fi.access = &c.accFwd
	if _, ok := queryParam(c.req.path, accessQueryParam); ok {
		fi.path = []byte(withoutQueryParam(string(c.req.path), accessQueryParam))
	}
}

// checkAccess decides an HTTP/2 request to a token-mode route; it reports
// whether the request goes on (else the answer was written).
func (st *h2Stream) checkAccess(ar *accessRoute) bool {
	es := st.es
	var in accessInput[string]
	in.method, in.path, in.websocket = es.Method, es.Path, es.Protocol != ""
	for i := range es.Header {
		f := &es.Header[i]
		in.field(f.Name, f.Value, ar.policy.Bearer)
	}
	keys := st.s.accessKeys()
	in.jwt = st.s.accessJWTFor(ar, keys)
	st.acc = decideAccess(ar, keys, &in, time.Now(), identityString)
	d := &st.acc
	if d.verdict == accessAllow {
		st.rec.noteAccess(d)
		st.hc.keys.add(d.claims.KeyID)
		return true
	}
	ri := accessRequestInfo{host: st.hc.sni, port: publicPortOf(st.host), path: es.Path}
	if d.verdict == accessPreflight {
		ri.acrMethod, ri.acrHeaders = in.acrMethod, in.acrHeaders
	}
	a := answerFor(ar, d, &ri)
	st.s.noteAccess(&st.rec, d, &a)
	if d.reason != "" {
		st.logDenial(a.status, "access: "+d.reason)
	}
	st.ended = writeH2AccessAnswer(es, &a, es.Method == "HEAD", st.rec.id.bytes()) == nil
	return false
}

func identityString(s string) string { return s }

// accessForwarding is clientConn.accessForwarding for an HTTP/2 stream;
// it returns the path the app is sent.
func (st *h2Stream) accessForwarding(fi *forwardInfo, ar *accessRoute) string {
	path := st.es.Path
	if ar == nil {
		return path
	}
	st.accFwd = accessForward{bearer: ar.policy.Bearer, user: st.acc.claims.Subject}
	fi.access = &st.accFwd
	if _, ok := queryParam(path, accessQueryParam); ok {
		path = withoutQueryParam(path, accessQueryParam)
		fi.path = []byte(path)
	}
	return path
}

// addAccessCORS adds Access-Control-Allow-Origin and -Credentials for an
// allowed origin to an app's response that set no
// Access-Control-Allow-Origin itself.
func addAccessCORS(resp *response, origin []byte) {
	if origin == nil {
		return
	}
	for i := range resp.fields {
		if equalFoldDash(resp.fields[i].name, "access-control-allow-origin") {
			return
		}
	}
	resp.fields = append(resp.fields,
		headField{name: hdrACAO, value: origin},
		headField{name: hdrACAC, value: valTrue})
}

var (
	hdrACAO = []byte("Access-Control-Allow-Origin")
	hdrACAC = []byte("Access-Control-Allow-Credentials")
	valTrue = []byte("true")
)
