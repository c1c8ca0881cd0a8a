package accesstoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"time"
)

// Limits of tokens and keys.
const (
	// MaxTokenLen is the longest token Verify decodes; a longer one is
	// ErrMalformed at once. The longest token Mint can produce is shorter.
	MaxTokenLen = 1024
	// MaxKeyIDLen is the longest key id: 1 to 64 of [A-Za-z0-9_-].
	MaxKeyIDLen = 64
	// MinSecretLen is the shortest key secret, in bytes.
	MinSecretLen = 32
	// MaxSecretLen is the longest key secret, in bytes.
	MaxSecretLen = 512
	// MaxSubjectLen is the longest subject: printable ASCII without spaces.
	MaxSubjectLen = 255
	// MaxNameLen is the longest workspace, sandbox or service name.
	MaxNameLen = 63
	// MaxLifetime is the longest a token can be valid (expiry less issue
	// time), wherever it is carried.
	MaxLifetime = 30 * 24 * time.Hour
	// MaxURLLifetime is the longest lifetime of a token carried in a URL
	// (?_al_token=): verify those with Request.MaxLifetime set to it.
	MaxURLLifetime = 24 * time.Hour
)

// version is the first part of every token.
const version = "v1"

// flagService marks a token bound to one service (bit 0 of the flags byte).
const flagService = 1

// maxPayloadLen is the longest payload: flags, three 10-byte varints and
// four length-prefixed strings.
const maxPayloadLen = 1 + 3*binary.MaxVarintLen64 + 3*(1+MaxNameLen) + 1 + MaxSubjectLen

// macB64Len is the length of the encoded MAC.
var macB64Len = base64.RawURLEncoding.EncodedLen(sha256.Size)

// maxUnixSeconds bounds the times of a token (the end of year 9999).
const maxUnixSeconds = 253402300799

// Errors of Verify. They never contain the token.
var (
	// ErrMalformed is a token that is not one: too long, wrong shape,
	// invalid characters or encoding.
	ErrMalformed = errors.New("accesstoken: malformed token")
	// ErrUnknownKey is a token signed with a key id the key set lacks.
	ErrUnknownKey = errors.New("accesstoken: unknown key id")
	// ErrBadSignature is a token whose MAC does not match its key.
	ErrBadSignature = errors.New("accesstoken: bad signature")
	// ErrExpired is a token past its expiry.
	ErrExpired = errors.New("accesstoken: token expired")
	// ErrLifetime is a token valid for longer than the request allows
	// (Request.MaxLifetime, or MaxLifetime).
	ErrLifetime = errors.New("accesstoken: token lifetime too long")
	// ErrWrongScope is a valid token for another workspace, sandbox or
	// service.
	ErrWrongScope = errors.New("accesstoken: token is for another sandbox or service")
	// ErrRevoked is a token of a policy generation older than the
	// service's.
	ErrRevoked = errors.New("accesstoken: token generation revoked")
	// ErrNotYetValid is a token issued later than now by more than
	// MaxClockSkew: minted by a clock far ahead, or forged with a
	// leaked key to outlive a rotation window.
	ErrNotYetValid = errors.New("accesstoken: token issued in the future")
)

// MaxClockSkew is how far a token's issue time may be ahead of the
// verifier's clock (the platform that mints and the listener that
// verifies run on different hosts).
const MaxClockSkew = time.Minute

// Key is one HMAC key: an id (carried in the tokens it signs) and a secret.
type Key struct {
	ID     string
	Secret []byte
}

// Claims are what a token says.
type Claims struct {
	// KeyID is the id of the signing key. Mint ignores it (its keyID
	// argument decides).
	KeyID string
	// Workspace and Sandbox name the sandbox the token opens.
	Workspace, Sandbox string
	// Service is the one service the token opens ("" is the unnamed
	// service) unless AllServices is set, when it must be "".
	Service string
	// AllServices makes the token open every service of the sandbox. It
	// must be asked for: the zero Claims open one service only.
	AllServices bool
	// Subject names the user (optional): printable ASCII without spaces,
	// at most MaxSubjectLen bytes.
	Subject string
	// Generation is the access policy generation the token was minted
	// under; a service whose policy generation is higher refuses it.
	Generation uint64
	// IssuedAt is when the token was minted (Mint: now when zero) and
	// Expires when it stops being valid (required, after IssuedAt, at
	// most MaxLifetime later). Both are kept to the second: Mint
	// truncates IssuedAt down and rounds Expires up.
	IssuedAt, Expires time.Time
}

// Lifetime is Expires less IssuedAt.
func (c *Claims) Lifetime() time.Duration { return c.Expires.Sub(c.IssuedAt) }

// Request is what a token is checked against: the route a request is for,
// its access policy generation, the time, and the longest lifetime the
// way the token arrived allows.
type Request struct {
	Workspace, Sandbox, Service string
	// Generation is the service's access policy generation.
	Generation uint64
	// Now is the time of the check; zero means time.Now() (never "no
	// expiry check").
	Now time.Time
	// MaxLifetime bounds Claims.Lifetime: MaxURLLifetime for a token
	// carried in a URL; 0 means MaxLifetime.
	MaxLifetime time.Duration
}

// KeySet is an immutable set of keys, by id. It is safe for concurrent use.
type KeySet struct {
	keys     map[string]*key
	ids      []string // sorted
	first    string   // the first key given to NewKeySet (the keys file's first)
	subjects subjectCache
}

// key is one key of a set, with a pool of MAC states so that Verify
// allocates nothing.
type key struct {
	id     string
	secret []byte
	pool   sync.Pool // of *macState
}

// macState is the scratch space of one verification.
type macState struct {
	h       hash.Hash
	text    [MaxTokenLen]byte
	payload [maxPayloadLen]byte
	sum     [sha256.Size]byte
	mac     [sha256.Size]byte
}

func (k *key) state() *macState {
	if st, ok := k.pool.Get().(*macState); ok {
		return st
	}
	return &macState{h: hmac.New(sha256.New, k.secret)}
}

// NewKeySet checks keys (ids valid and distinct, secrets of MinSecretLen to
// MaxSecretLen bytes) and returns a set holding copies of them. An empty
// set is valid: it verifies nothing.
func NewKeySet(keys ...Key) (*KeySet, error) {
	ks := &KeySet{keys: make(map[string]*key, len(keys))}
	for i, k := range keys {
		if err := CheckKeyID(k.ID); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		if n := len(k.Secret); n < MinSecretLen || n > MaxSecretLen {
			return nil, fmt.Errorf("key %q: secret of %d bytes (want %d to %d)", k.ID, n, MinSecretLen, MaxSecretLen)
		}
		if _, dup := ks.keys[k.ID]; dup {
			return nil, fmt.Errorf("key %q: duplicate key id", k.ID)
		}
		ks.keys[k.ID] = &key{id: k.ID, secret: slices.Clone(k.Secret)}
		ks.ids = append(ks.ids, k.ID)
		if i == 0 {
			ks.first = k.ID
		}
	}
	slices.Sort(ks.ids)
	return ks, nil
}

// IDs returns the key ids of the set, sorted. A nil set has none.
func (ks *KeySet) IDs() []string {
	if ks == nil {
		return nil
	}
	return slices.Clone(ks.ids)
}

// First returns the id of the first key given to NewKeySet (the keys
// file's first): the key the listener mints its own tokens with. "" for an
// empty or nil set.
func (ks *KeySet) First() string {
	if ks == nil {
		return ""
	}
	return ks.first
}

// Has reports whether the set holds a key with this id.
func (ks *KeySet) Has(id string) bool {
	if ks == nil {
		return false
	}
	_, ok := ks.keys[id]
	return ok
}

// Removed returns the ids of old's keys that ks does not verify the same
// way: ids no longer present and ids whose secret changed. Tokens signed
// under them no longer verify, so whatever they authenticated must end.
// Either set may be nil (no keys).
func (ks *KeySet) Removed(old *KeySet) []string {
	if old == nil {
		return nil
	}
	var out []string
	for _, id := range old.ids {
		if !ks.Has(id) || !hmac.Equal(ks.keys[id].secret, old.keys[id].secret) {
			out = append(out, id)
		}
	}
	return out
}

// CheckKeyID returns an error unless id is 1 to MaxKeyIDLen characters of
// [A-Za-z0-9_-].
func CheckKeyID(id string) error {
	if id == "" || len(id) > MaxKeyIDLen {
		return fmt.Errorf("key id must be 1 to %d characters", MaxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		if !isKeyIDChar(id[i]) {
			return fmt.Errorf("key id %q: character %q not allowed (use A-Z a-z 0-9 _ -)", id, id[i])
		}
	}
	return nil
}

func isKeyIDChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func isB64Char(c byte) bool { return isKeyIDChar(c) } // the base64url alphabet is the same set

// checkName returns an error unless s is a valid workspace, sandbox or
// service name: 1 to 63 of [a-z0-9-], starting and ending with a letter
// or digit, without "--" (the hostname rules).
func checkName(what, s string) error {
	if s == "" || len(s) > MaxNameLen {
		return fmt.Errorf("%s must be 1 to %d characters", what, MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-':
			if i == 0 || i == len(s)-1 || s[i-1] == '-' {
				return fmt.Errorf("%s %q: a name starts and ends with a letter or digit and never contains \"--\"", what, s)
			}
		default:
			return fmt.Errorf("%s %q: character %q not allowed (use a-z 0-9 -)", what, s, c)
		}
	}
	return nil
}

// checkSubject returns an error unless s is a valid subject.
func checkSubject(s string) error {
	if len(s) > MaxSubjectLen {
		return fmt.Errorf("subject longer than %d bytes", MaxSubjectLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("subject: byte %#02x not allowed (use printable ASCII without spaces)", c)
		}
	}
	return nil
}

// Mint returns a token for c signed with the key keyID. It refuses claims
// without an expiry, with an expiry not after the issue time or more than
// MaxLifetime later, with invalid names or subject, or with AllServices
// and a service.
func (ks *KeySet) Mint(keyID string, c Claims) (string, error) {
	if !ks.Has(keyID) {
		return "", fmt.Errorf("accesstoken: mint: %w %q", ErrUnknownKey, keyID)
	}
	k := ks.keys[keyID]
	payload, err := encodeClaims(&c)
	if err != nil {
		return "", fmt.Errorf("accesstoken: mint: %w", err)
	}
	var b strings.Builder
	b.Grow(len(version) + 1 + len(k.id) + 1 + base64.RawURLEncoding.EncodedLen(len(payload)) + 1 + macB64Len)
	b.WriteString(version)
	b.WriteByte('.')
	b.WriteString(k.id)
	b.WriteByte('.')
	enc := base64.RawURLEncoding.AppendEncode(nil, payload)
	b.Write(enc)
	h := hmac.New(sha256.New, k.secret)
	h.Write([]byte(b.String()))
	b.WriteByte('.')
	b.Write(base64.RawURLEncoding.AppendEncode(nil, h.Sum(nil)))
	return b.String(), nil
}

// encodeClaims checks c and returns its payload.
func encodeClaims(c *Claims) ([]byte, error) {
	if err := checkName("workspace", c.Workspace); err != nil {
		return nil, err
	}
	if err := checkName("sandbox", c.Sandbox); err != nil {
		return nil, err
	}
	var flags byte
	switch {
	case c.AllServices && c.Service != "":
		return nil, errors.New("a token for all services names no service")
	case c.AllServices:
	case c.Service == "":
		flags = flagService // the unnamed service
	default:
		if err := checkName("service", c.Service); err != nil {
			return nil, err
		}
		flags = flagService
	}
	if err := checkSubject(c.Subject); err != nil {
		return nil, err
	}
	if c.Expires.IsZero() {
		return nil, errors.New("an expiry is required")
	}
	iat := c.IssuedAt
	if iat.IsZero() {
		iat = time.Now()
	}
	iatSec := iat.Unix()
	expSec := c.Expires.Unix()
	if c.Expires.Nanosecond() != 0 {
		expSec++ // round the expiry up, so a token never expires early
	}
	switch {
	case iatSec < 0 || iatSec > maxUnixSeconds || expSec > maxUnixSeconds:
		return nil, errors.New("issue time or expiry out of range (1970 to 9999)")
	case expSec <= iatSec:
		return nil, errors.New("the expiry must be after the issue time")
	case time.Duration(expSec-iatSec)*time.Second > MaxLifetime:
		return nil, fmt.Errorf("lifetime %s longer than %s", time.Duration(expSec-iatSec)*time.Second, MaxLifetime)
	}
	p := make([]byte, 0, maxPayloadLen)
	p = append(p, flags)
	p = binary.AppendUvarint(p, uint64(iatSec))
	p = binary.AppendUvarint(p, uint64(expSec))
	p = binary.AppendUvarint(p, c.Generation)
	for _, s := range []string{c.Workspace, c.Sandbox, c.Service, c.Subject} {
		p = append(p, byte(len(s)))
		p = append(p, s...)
	}
	return p, nil
}

// Verify checks token against req (not nil) and returns its claims. The
// strings of the claims are req's own (the scope matched), the key's id and
// an interned subject, so that on the warm path nothing is allocated. A nil
// set verifies nothing (ErrUnknownKey for a well-formed token).
func (ks *KeySet) Verify(token string, req *Request) (Claims, error) {
	// Shape first, before any decoding: v1.<kid>.<payload>.<mac>, bounded,
	// every character from the base64url alphabet or a dot.
	if len(token) > MaxTokenLen || len(token) < len(version)+3+1+2+macB64Len ||
		token[:len(version)] != version || token[len(version)] != '.' {
		return Claims{}, ErrMalformed
	}
	rest := token[len(version)+1:]
	kidEnd := strings.IndexByte(rest, '.')
	if kidEnd < 1 || kidEnd > MaxKeyIDLen {
		return Claims{}, ErrMalformed
	}
	kid := rest[:kidEnd]
	macDot := len(token) - macB64Len - 1
	payStart := len(version) + 1 + kidEnd + 1
	if token[macDot] != '.' || macDot <= payStart {
		return Claims{}, ErrMalformed
	}
	for i := len(version) + 1; i < len(token); i++ {
		if c := token[i]; !isB64Char(c) && i != payStart-1 && i != macDot {
			return Claims{}, ErrMalformed
		}
	}
	if macDot-payStart > base64.RawURLEncoding.EncodedLen(maxPayloadLen) {
		return Claims{}, ErrMalformed
	}
	if ks == nil {
		return Claims{}, ErrUnknownKey
	}
	k, ok := ks.keys[kid]
	if !ok {
		return Claims{}, ErrUnknownKey
	}
	st := k.state()
	defer k.pool.Put(st)
	n := copy(st.text[:], token)
	text := st.text[:n]
	if _, err := base64.RawURLEncoding.Strict().Decode(st.mac[:], text[macDot+1:]); err != nil {
		return Claims{}, ErrMalformed
	}
	st.h.Reset()
	st.h.Write(text[:macDot])
	if !hmac.Equal(st.h.Sum(st.sum[:0]), st.mac[:]) {
		return Claims{}, ErrBadSignature
	}
	pn, err := base64.RawURLEncoding.Strict().Decode(st.payload[:], text[payStart:macDot])
	if err != nil {
		return Claims{}, ErrMalformed
	}
	p, ok := decodePayload(st.payload[:pn])
	if !ok {
		return Claims{}, ErrMalformed
	}
	nowT := req.Now
	if nowT.IsZero() {
		nowT = time.Now()
	}
	now := nowT.Unix()
	if now >= int64(p.exp) {
		return Claims{}, ErrExpired
	}
	if int64(p.iat) > now+int64(MaxClockSkew/time.Second) {
		return Claims{}, ErrNotYetValid
	}
	maxLife := req.MaxLifetime
	if maxLife <= 0 || maxLife > MaxLifetime {
		maxLife = MaxLifetime
	}
	// Both the lifetime it was minted with and what is left of it.
	limit := int64(maxLife / time.Second)
	if int64(p.exp-p.iat) > limit || int64(p.exp)-now > limit {
		return Claims{}, ErrLifetime
	}
	if string(p.workspace) != req.Workspace || string(p.sandbox) != req.Sandbox ||
		p.flags&flagService != 0 && string(p.service) != req.Service {
		return Claims{}, ErrWrongScope
	}
	if p.generation < req.Generation {
		return Claims{}, ErrRevoked
	}
	c := Claims{
		KeyID:      k.id,
		Workspace:  req.Workspace,
		Sandbox:    req.Sandbox,
		Generation: p.generation,
		IssuedAt:   time.Unix(int64(p.iat), 0),
		Expires:    time.Unix(int64(p.exp), 0),
	}
	if p.flags&flagService != 0 {
		c.Service = req.Service
	} else {
		c.AllServices = true
	}
	if len(p.subject) > 0 {
		c.Subject = ks.subjects.intern(p.subject)
	}
	return c, nil
}

// payload is a decoded payload; its strings point into the decoded bytes.
type payload struct {
	flags                                byte
	iat, exp, generation                 uint64
	workspace, sandbox, service, subject []byte
}

// decodePayload decodes and checks a payload; ok is false unless it is
// exactly what encodeClaims produces for valid claims.
func decodePayload(b []byte) (p payload, ok bool) {
	if len(b) < 1 || b[0]&^flagService != 0 {
		return p, false
	}
	p.flags = b[0]
	b = b[1:]
	var nums [3]uint64
	for i := range nums {
		v, n := binary.Uvarint(b)
		if n <= 0 || n != uvarintLen(v) {
			return p, false
		}
		nums[i] = v
		b = b[n:]
	}
	p.iat, p.exp, p.generation = nums[0], nums[1], nums[2]
	if p.exp > maxUnixSeconds || p.exp <= p.iat {
		return p, false
	}
	var strs [4][]byte
	for i := range strs {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return p, false
		}
		strs[i] = b[1 : 1+int(b[0])]
		b = b[1+int(b[0]):]
	}
	if len(b) != 0 {
		return p, false
	}
	p.workspace, p.sandbox, p.service, p.subject = strs[0], strs[1], strs[2], strs[3]
	if !validNameBytes(p.workspace) || !validNameBytes(p.sandbox) || !validSubjectBytes(p.subject) {
		return p, false
	}
	if len(p.service) > 0 && (p.flags&flagService == 0 || !validNameBytes(p.service)) {
		return p, false
	}
	return p, true
}

// uvarintLen is the length of the minimal uvarint encoding of v.
func uvarintLen(v uint64) int {
	return max(1, (bits.Len64(v)+6)/7)
}

// validNameBytes is checkName without the error (and its allocation).
func validNameBytes(s []byte) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-':
			if i == 0 || i == len(s)-1 || s[i-1] == '-' {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// validSubjectBytes is checkSubject without the error.
func validSubjectBytes(s []byte) bool {
	for _, c := range s {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return len(s) <= MaxSubjectLen
}

// maxSubjects bounds the interned subjects of a key set; the cache starts
// over when it is full.
const maxSubjects = 4096

// subjectCache interns the subjects of verified tokens so that verifying
// the same user's token again allocates nothing. Only subjects of tokens
// whose MAC verified reach it.
type subjectCache struct {
	mu sync.RWMutex
	m  map[string]string
}

func (c *subjectCache) intern(b []byte) string {
	c.mu.RLock()
	s, ok := c.m[string(b)]
	c.mu.RUnlock()
	if ok {
		return s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[string(b)]; ok {
		return s
	}
	if c.m == nil || len(c.m) >= maxSubjects {
		c.m = make(map[string]string)
	}
	s = string(b)
	c.m[s] = s
	return s
}
