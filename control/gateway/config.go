package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/applistener/applistener/control/internal/ndjson"
	"github.com/applistener/applistener/control/internal/pollfile"
	"github.com/applistener/applistener/routes"
)

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

var (
	emptyGatewayETag = documentETag([]byte(emptyDocument), "")
	emptyPoolETag    = documentETag([]byte(emptyPoolDocument), "empty")
)

// loadConfigFile reads and parses the configuration file. The identity
// is taken before the read, so a change during the read is seen next time.
func loadConfigFile(path string) (pollfile.Identity, map[string]document, error) {
	id, _ := pollfile.Stat(path)
	data, err := pollfile.ReadLimited(path, MaxConfigBytes)
	if err != nil {
		return id, nil, fmt.Errorf("config file: %w", err)
	}
	docs, err := parseConfigFile(data)
	if err != nil {
		return id, nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return id, docs, nil
}

// parseConfigFile parses {"supervisors": {"<id>": {...}, ...}}: the top
// level has exactly the key "supervisors", ids are distinct and valid, and
// every section is a JSON object of at most routes.MaxDocumentBytes once
// compacted (with its newline). Sections are not validated further: the
// supervisor does that.
//
// The file is validated and compacted by one pass of json.Compact; the
// result is then read member by member with encoding/json's Decoder, which
// hands over the keys in order, so a repeated key is refused (decoding into
// a map would silently keep the last one). No hand-written scanner is
// needed here (routes.ParseDocument has one because it validates a large
// document one entry at a time and steps aside between entries, on the
// data plane's processor): this file is read only when it changes, and the
// reload that reads it spends more time parsing its sections for the
// discovery grants (discoveryGrants) than reading it.
func parseConfigFile(data []byte) (map[string]document, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	var buf bytes.Buffer
	buf.Grow(len(data))
	if err := json.Compact(&buf, data); err != nil {
		return nil, jsonSyntaxError(data)
	}
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	var docs map[string]document
	err := objectMembers(dec, "top level must be a JSON object", func(key string) error {
		if key != "supervisors" {
			return fmt.Errorf("unknown top-level key %q (want only \"supervisors\")", key)
		}
		if docs != nil {
			return errors.New(`"supervisors" appears twice`)
		}
		var err error
		docs, err = parseSupervisors(dec)
		return err
	})
	if err != nil {
		return nil, err
	}
	if docs == nil {
		return nil, errors.New(`missing "supervisors"`)
	}
	return docs, nil
}

// parseSupervisors parses the "supervisors" object that dec is at.
func parseSupervisors(dec *json.Decoder) (map[string]document, error) {
	docs := make(map[string]document)
	err := objectMembers(dec, `"supervisors" must be a JSON object`, func(sup string) error {
		if err := validSupervisorID(sup); err != nil {
			return fmt.Errorf("supervisors: %w", err)
		}
		if _, dup := docs[sup]; dup {
			return fmt.Errorf("supervisors: %q appears twice", sup)
		}
		var value json.RawMessage // compact, and a copy of its own
		if err := dec.Decode(&value); err != nil {
			return fmt.Errorf("supervisors[%q]: %w", sup, err)
		}
		if value[0] != '{' {
			return fmt.Errorf("supervisors[%q]: the configuration document must be a JSON object", sup)
		}
		if len(value)+1 > routes.MaxDocumentBytes {
			return fmt.Errorf("supervisors[%q]: the configuration document is %d bytes, larger than a supervisor accepts (%d)",
				sup, len(value), routes.MaxDocumentBytes-1)
		}
		docs[sup] = newDocument([]byte(value), 0)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return docs, nil
}

// jsonSyntaxError explains why data is not valid JSON, with the line and
// column of the error when known. (json.Compact's errors carry no offset.)
func jsonSyntaxError(data []byte) error {
	err := json.Unmarshal(data, new(json.RawMessage))
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	// Offset counts the offending byte.
	off := min(int(se.Offset), len(data))
	line := 1 + bytes.Count(data[:off], ndjson.Newline)
	col := max(1, off-bytes.LastIndexByte(data[:off], '\n')-1)
	return fmt.Errorf("not valid JSON at line %d, column %d: %w", line, col, err)
}

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
