package gateway

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/applistener/applistener/routes"
)

// The state every request reads: the configuration documents and the
// tokens (an immutable stateSnapshot, replaced whole), and what is derived
// from them (grants, entity tags).

// stateSnapshot is one immutable generation of the gateway's documents
// (the store's, as the view last saw them) and tokens (the tokens file's).
type stateSnapshot struct {
	docs   map[string]document
	tokens []tokenGrant
	// grants are, per supervisor, the services its document declares, with
	// the generation of their instance: what discovery may publish from its
	// advertisements.
	grants map[string]map[grantKey]string
}

// tokenGrant is one entry of the tokens file. Only the SHA-256 digest of
// the token is kept. Exactly one of supervisor, workspaces, admin and pool
// is set.
type tokenGrant struct {
	digest     [sha256.Size]byte
	supervisor string
	workspaces []string
	// admin tokens use the write API (instances, pool members).
	admin bool
	// pool tokens may open sessions for any supervisor id that no
	// supervisor token names and that no other pool has bound.
	pool string
}

// lookupDigest returns the token whose digest is d, or nil. It compares d
// with every token in constant time.
func (s *stateSnapshot) lookupDigest(d [sha256.Size]byte) *tokenGrant {
	var found *tokenGrant
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(d[:], s.tokens[i].digest[:]) == 1 {
			found = &s.tokens[i]
		}
	}
	return found
}

// tokenIndex maps token digests to tokens, for checks that do not answer a
// request (the credential epoch of stored advertisements): no constant-time
// comparison is needed there.
func (s *stateSnapshot) tokenIndex() map[[sha256.Size]byte]*tokenGrant {
	m := make(map[[sha256.Size]byte]*tokenGrant, len(s.tokens))
	for i := range s.tokens {
		m[s.tokens[i].digest] = &s.tokens[i]
	}
	return m
}

// namesSupervisor reports whether a supervisor token names sup: such an id
// belongs to that token, and no pool token may claim it.
func (s *stateSnapshot) namesSupervisor(sup string) bool {
	for i := range s.tokens {
		if s.tokens[i].supervisor == sup {
			return true
		}
	}
	return false
}

// grantsSupervisor reports whether token t may act as supervisor sup, whose
// pool binding is bound ("" when none): a supervisor token for sup, or the
// token of the pool sup is bound to (an unbound id is granted to no pool
// here; binding it is authorize's job).
func (s *stateSnapshot) grantsSupervisor(t *tokenGrant, sup, bound string) bool {
	switch {
	case t == nil:
		return false
	case t.supervisor != "":
		return t.supervisor == sup
	case t.pool != "":
		return bound == t.pool && !s.namesSupervisor(sup)
	}
	return false
}

// document is one supervisor's configuration document.
type document struct {
	body   []byte // compact JSON, no newline
	etag   string // quoted entity tag
	modRev int64  // the store's revision of it; 0 when not stored
}

// newDocument returns the document whose body (compact JSON) is
// stored at revision modRev.
func newDocument(body []byte, modRev int64) document {
	return document{body: body, etag: documentETag(body, documentRevision(body)), modRev: modRev}
}

// documentFor returns the document of supervisor sup; pool members without
// a stored document get emptyPoolDocument, supervisors with a token of
// their own emptyDocument.
func (s *stateSnapshot) documentFor(sup string, pool bool) document {
	if d, ok := s.docs[sup]; ok {
		return d
	}
	if pool {
		return document{body: []byte(emptyPoolDocument), etag: emptyPoolETag}
	}
	return document{body: []byte(emptyDocument), etag: emptyGatewayETag}
}

// documentRevision returns the top-level "revision" of a document when it
// is a string, else "".
func documentRevision(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	var rev string
	_ = objectMembers(dec, "", func(key string) error {
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return err
		}
		if key == "revision" && value[0] == '"' {
			if err := json.Unmarshal(value, &rev); err != nil {
				rev = ""
			}
			return errors.New("found") // stop: a later duplicate is not looked at
		}
		return nil
	})
	return rev
}

// documentETag is `"<revision>"` when the revision is non-empty and made of
// entity-tag characters only, else `"sha256:<first 16 hex digits>"` of the
// document.
func documentETag(body []byte, revision string) string {
	if revision != "" && validETagChars(revision) {
		return `"` + revision + `"`
	}
	sum := sha256.Sum256(body)
	return `"sha256:` + hex.EncodeToString(sum[:8]) + `"`
}

// validETagChars reports whether s is made of the ASCII entity-tag
// characters (RFC 9110 §8.8.3: %x21 / %x23-7E; obs-text is left out because
// clients treat it inconsistently).
func validETagChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c == '"' || c > 0x7e {
			return false
		}
	}
	return true
}

// validSupervisorID checks a supervisor id: 1 to MaxSupervisorIDLen
// characters from [A-Za-z0-9._:~-] (it is a URL path segment).
func validSupervisorID(s string) error {
	if s == "" {
		return errors.New("empty supervisor id")
	}
	if len(s) > MaxSupervisorIDLen {
		return fmt.Errorf("supervisor id %.40q…: longer than %d characters", s, MaxSupervisorIDLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:~-", c) >= 0 {
			continue
		}
		return fmt.Errorf("supervisor id %q: character %q not allowed (use [A-Za-z0-9._:~-])", s, c)
	}
	return nil
}

// grantKey is one service a supervisor's configuration section declares.
type grantKey struct {
	workspace, sandbox, name string
}

// discoveryGrants returns, per supervisor, the services its document
// declares in valid instances, with their instance's generation. A document
// that does not parse grants nothing (its supervisor does not apply it
// either).
func discoveryGrants(docs map[string]document) map[string]map[grantKey]string {
	grants := make(map[string]map[grantKey]string, len(docs))
	for sup, d := range docs {
		if set := documentGrants(d.body); set != nil {
			grants[sup] = set
		}
	}
	return grants
}

// documentGrants returns the services a document declares in valid
// instances, with their instance's generation, or nil when it does not
// parse.
func documentGrants(body []byte) map[grantKey]string {
	doc, err := routes.ParseDocument(body)
	if err != nil {
		return nil
	}
	set := make(map[grantKey]string)
	for _, inst := range doc.Instances {
		for _, svc := range inst.Services {
			set[grantKey{inst.Workspace, inst.Sandbox, svc.Name}] = inst.Generation
		}
	}
	return set
}

// grantsWorkspace reports whether the token with digest d is a workspace
// token granted ws.
func (s *stateSnapshot) grantsWorkspace(d [sha256.Size]byte, ws string) bool {
	t := s.lookupDigest(d)
	return t != nil && t.supervisor == "" && slices.Contains(t.workspaces, ws)
}

// emptyDocument is served to a supervisor that has a token but no
// stored document: no document means no routes.
const emptyDocument = `{"revision":"","instances":[]}`

// emptyPoolDocument is served to a pool member that has no stored document.
const emptyPoolDocument = `{"revision":"empty","instances":[]}`

// The entity tags of the documents served when none is stored.
var (
	emptyGatewayETag = documentETag([]byte(emptyDocument), "")
	emptyPoolETag    = documentETag([]byte(emptyPoolDocument), "empty")
)

// MaxSupervisorIDLen is the longest supervisor id.
const MaxSupervisorIDLen = 253

// objectMembers reads the object that dec is at and calls fn with the key
// of each member, in order; fn reads the member's value from dec. It stops
// at the first error. dec must be reading valid JSON; when its next value is
// not an object the error is notObject.
func objectMembers(dec *json.Decoder, notObject string, fn func(key string) error) error {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return errors.New(notObject)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("key: %w", err)
		}
		key, _ := t.(string)
		if err := fn(key); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	return err
}
