package routes

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/applistener/applistener/internal/httpgrammar"
)

// MaxNameLen is the maximum length of a workspace, sandbox or service name:
// one DNS label. Names whose readable label ("workspace--sandbox--service")
// would not fit in one label get a hashed label instead (see Label).
const MaxNameLen = 63

// maxLabelLen is the maximum length of one DNS label.
const maxLabelLen = 63

// HashedLabelPrefix starts every hashed label (see Label).
const HashedLabelPrefix = "h-"

// hashedLabelLen is the length of a hashed label: the prefix and the 52
// characters of a SHA-256 digest in unpadded base32.
const hashedLabelLen = len(HashedLabelPrefix) + 52

// maxDomainLen is the maximum length of a DNS name in text form without the
// trailing dot.
const maxDomainLen = 253

// Errors returned (wrapped) by ParseHostname; test with errors.Is.
var (
	// ErrOtherDomain means the host is not a single label under the domain.
	ErrOtherDomain = errors.New("not a hostname of this domain")
	// ErrHostParts means the first label does not split into 2 or 3 names.
	ErrHostParts = errors.New("first label must be workspace--sandbox or workspace--sandbox--service")
	// ErrHostName means one of the names in the first label is invalid.
	ErrHostName = errors.New("invalid name in hostname")
)

// NormalizeHost brings a TLS server name or an HTTP Host header value into
// the form routes are matched against: lower case, without a ":port" suffix
// (1 to 5 digits) and without one trailing dot.
//
// It reports ok=false for an empty result, for any byte outside printable
// ASCII or any whitespace, for a malformed port suffix, for a colon left in
// the name, and for a name that still ends with a dot after one was removed
// (so the result is always a fixed point: NormalizeHost(out) returns out).
//
// An IPv6 literal in brackets ("[::1]:8443") keeps its brackets and is only
// lower-cased ("[::1]"); it never matches a route.
//
// NormalizeHost does not allocate unless the input contains an upper-case
// letter: otherwise it returns the input or a substring of it.
func NormalizeHost(host string) (string, bool) {
	h, ok := trimHost(host)
	if !ok {
		return "", false
	}
	return httpgrammar.ToLower(h), true
}

// HostMatches reports whether host, a Host header value or a request
// target's authority, names exactly name, a normalized hostname (see
// NormalizeHost): the same rules, with ASCII case ignored. It does not
// allocate. An empty name never matches.
func HostMatches[S ~string | ~[]byte](host S, name string) bool {
	h, ok := trimHost(host)
	return ok && httpgrammar.EqualFold(h, name)
}

// trimHost is NormalizeHost without the lower-casing: the host with its
// port and one trailing dot removed, and whether it is valid.
func trimHost[S ~string | ~[]byte](host S) (h S, ok bool) {
	if len(host) == 0 {
		return h, false
	}
	h = host
	bracketed := h[0] == '['
	if bracketed {
		end := indexByte(h, ']')
		if end < 2 { // no ']' or "[]"
			return h, false
		}
		if rest := h[end+1:]; len(rest) != 0 && !isPortSuffix(rest) {
			return h, false
		}
		h = h[:end+1]
	} else {
		if i := lastIndexByte(h, ':'); i >= 0 {
			if !isPortSuffix(h[i:]) {
				return h, false
			}
			h = h[:i]
		}
		if len(h) != 0 && h[len(h)-1] == '.' {
			h = h[:len(h)-1]
		}
		if len(h) == 0 || h[len(h)-1] == '.' {
			return h, false
		}
	}
	if !httpgrammar.IsVisible(h) || (!bracketed && indexByte(h, ':') >= 0) {
		return h, false
	}
	return h, true
}

func indexByte[S ~string | ~[]byte](s S, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

func lastIndexByte[S ~string | ~[]byte](s S, c byte) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// isPortSuffix reports whether s is ":" followed by 1 to 5 ASCII digits.
func isPortSuffix[S ~string | ~[]byte](s S) bool {
	if len(s) < 2 || len(s) > 6 || s[0] != ':' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ValidName checks a workspace, sandbox or service name: 1 to MaxNameLen
// characters from [a-z0-9-], starting and ending with a letter or digit, and
// never containing "--" (the separator of hostname parts). The error names
// the rule that failed.
func ValidName(s string) error {
	if s == "" {
		return errors.New("name is empty")
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("name %s: longer than %d characters", quoteShort(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isNameByte(c) {
			return fmt.Errorf("name %s: %s not allowed (use [a-z0-9-])", quoteShort(s), describeByte(c))
		}
	}
	if s[0] == '-' {
		return fmt.Errorf("name %s: must start with a letter or digit", quoteShort(s))
	}
	if s[len(s)-1] == '-' {
		return fmt.Errorf("name %s: must end with a letter or digit", quoteShort(s))
	}
	if strings.Contains(s, "--") {
		return fmt.Errorf("name %s: must not contain \"--\"", quoteShort(s))
	}
	return nil
}

// isNameByte reports whether c may appear in a name or a domain label.
func isNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-'
}

// describeByte names a byte for an error message: 'T' for printable ASCII,
// byte 0xc3 otherwise.
func describeByte(c byte) string {
	if c > ' ' && c < 0x7f {
		return "character " + strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// quoteShort quotes s for an error message, cut to a bounded length so that
// hostile input cannot produce huge log lines.
func quoteShort(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:max]) + "..."
}

// ValidDomain checks the domain under which routes are published: a lower-case
// DNS name of at least two labels, each 1 to 63 characters from [a-z0-9-] not
// starting or ending with '-', at most 253 characters in all, without a
// trailing dot (callers normalize first), and not an IP address. A last label
// made only of digits is refused too: resolvers may read "10.1" as an IPv4
// address.
func ValidDomain(domain string) error {
	if domain == "" {
		return errors.New("domain is empty")
	}
	if len(domain) > maxDomainLen {
		return fmt.Errorf("domain %s: longer than %d characters", quoteShort(domain), maxDomainLen)
	}
	if domain[len(domain)-1] == '.' {
		return fmt.Errorf("domain %s: must not end with a dot", quoteShort(domain))
	}
	if _, err := netip.ParseAddr(domain); err == nil {
		return fmt.Errorf("domain %s: is an IP address", quoteShort(domain))
	}
	labels := 0
	numeric := true // of the current label
	start := 0
	for i := 0; i <= len(domain); i++ {
		if i < len(domain) && domain[i] != '.' {
			c := domain[i]
			if !isNameByte(c) {
				if 'A' <= c && c <= 'Z' {
					return fmt.Errorf("domain %s: %s not allowed (domain must be lower case)", quoteShort(domain), describeByte(c))
				}
				return fmt.Errorf("domain %s: %s not allowed (use [a-z0-9-] and dots)", quoteShort(domain), describeByte(c))
			}
			if c < '0' || c > '9' {
				numeric = false
			}
			continue
		}
		label := domain[start:i]
		switch {
		case label == "":
			return fmt.Errorf("domain %s: empty label", quoteShort(domain))
		case len(label) > maxLabelLen:
			return fmt.Errorf("domain %s: label longer than %d characters", quoteShort(domain), maxLabelLen)
		case label[0] == '-' || label[len(label)-1] == '-':
			return fmt.Errorf("domain %s: label %s starts or ends with '-'", quoteShort(domain), quoteShort(label))
		}
		labels++
		if i == len(domain) && numeric {
			return fmt.Errorf("domain %s: last label must not be all digits", quoteShort(domain))
		}
		numeric = true
		start = i + 1
	}
	if labels < 2 {
		return fmt.Errorf("domain %s: must have at least two labels", quoteShort(domain))
	}
	return nil
}

// Hostname returns the public hostname of a service: its label (see Label),
// a dot and domain. It does not validate its arguments.
func Hostname(workspace, sandbox, service, domain string) string {
	if readableLen(workspace, sandbox, service) <= maxLabelLen {
		if service == "" {
			return workspace + "--" + sandbox + "." + domain
		}
		return workspace + "--" + sandbox + "--" + service + "." + domain
	}
	var buf [hashedLabelLen]byte
	return string(appendHashedLabel(buf[:0], workspace, sandbox, service)) + "." + domain
}

// Label returns the first label of a service's hostname. It is readable,
// "workspace--sandbox--service" ("workspace--sandbox" for the unnamed
// service, service == ""), when that fits in one DNS label (63
// characters); otherwise it is the hashed label:
//
//	"h-" + base32(SHA-256(workspace + "/" + sandbox + "/" + service))
//
// with the standard base32 alphabet (RFC 4648) in lower case and without
// padding: 54 characters. The unnamed service hashes "workspace/sandbox/".
// A readable label always contains "--" and a hashed one never does, so the
// two kinds can never collide. Label does not validate its arguments.
func Label(workspace, sandbox, service string) string {
	if readableLen(workspace, sandbox, service) <= maxLabelLen {
		if service == "" {
			return workspace + "--" + sandbox
		}
		return workspace + "--" + sandbox + "--" + service
	}
	return HashedLabel(workspace, sandbox, service)
}

// HashedLabel returns the hashed label of a service (see Label), whether or
// not its readable label would fit.
func HashedLabel(workspace, sandbox, service string) string {
	var buf [hashedLabelLen]byte
	return string(appendHashedLabel(buf[:0], workspace, sandbox, service))
}

// readableLen is the length of the readable label of a service.
func readableLen(workspace, sandbox, service string) int {
	n := len(workspace) + 2 + len(sandbox)
	if service != "" {
		n += 2 + len(service)
	}
	return n
}

// base32Lower is the RFC 4648 base32 alphabet in lower case.
const base32Lower = "abcdefghijklmnopqrstuvwxyz234567"

// appendHashedLabel appends the hashed label of a service to b.
func appendHashedLabel(b []byte, workspace, sandbox, service string) []byte {
	var stack [3*MaxNameLen + 2]byte // valid names fit: no allocation
	in := append(stack[:0], workspace...)
	in = append(in, '/')
	in = append(in, sandbox...)
	in = append(in, '/')
	in = append(in, service...)
	sum := sha256.Sum256(in)
	b = append(b, HashedLabelPrefix...)
	// Unpadded base32: 5 bits per character, most significant first; the
	// last character holds the final bit followed by four zero bits.
	var acc uint
	bits := 0
	for _, c := range sum {
		acc = acc<<8 | uint(c)
		bits += 8
		for bits >= 5 {
			bits -= 5
			b = append(b, base32Lower[(acc>>uint(bits))&31])
		}
	}
	if bits > 0 {
		b = append(b, base32Lower[(acc<<uint(5-bits))&31])
	}
	return b
}

// IsHashedLabel reports whether label has the form of a hashed label: the
// prefix "h-" and 52 characters of unpadded lower-case base32 that encode
// 256 bits (so the last one is 'a' or 'q': its four low bits are zero).
// No readable label is a hashed one: readable labels contain "--".
func IsHashedLabel(label string) bool {
	if len(label) != hashedLabelLen || label[:len(HashedLabelPrefix)] != HashedLabelPrefix {
		return false
	}
	for i := len(HashedLabelPrefix); i < len(label); i++ {
		if c := label[i]; strings.IndexByte(base32Lower, c) < 0 {
			return false
		}
	}
	last := label[len(label)-1]
	return last == 'a' || last == 'q'
}

// HostParts are the names encoded in a hostname. Service is "" for the
// unnamed (default) service. A hashed label names no parts: Hashed is true
// and the names are empty (the hash cannot be reversed; compare with
// Hostname of the names instead).
type HostParts struct {
	Workspace string
	Sandbox   string
	Service   string
	Hashed    bool
}

// ParseHostname splits a normalized hostname (see NormalizeHost) into its
// names. The host must be exactly one label followed by "." and domain.
// That label is either a hashed label (see IsHashedLabel; the result has
// Hashed set and no names) or a readable one that splits on "--" into
// workspace and sandbox, or workspace, sandbox and service, each a valid
// name (see ValidName). Errors wrap ErrOtherDomain, ErrHostParts or
// ErrHostName. The result's strings are substrings of host; a successful
// parse does not allocate.
func ParseHostname(host, domain string) (HostParts, error) {
	if len(host) <= len(domain)+1 || host[len(host)-len(domain)-1] != '.' || host[len(host)-len(domain):] != domain {
		return HostParts{}, fmt.Errorf("host %s: %w %s", quoteShort(host), ErrOtherDomain, quoteShort(domain))
	}
	label := host[:len(host)-len(domain)-1]
	if strings.IndexByte(label, '.') >= 0 {
		return HostParts{}, fmt.Errorf("host %s: %w %s (more than one label before the domain)", quoteShort(host), ErrOtherDomain, quoteShort(domain))
	}
	if len(label) > maxLabelLen {
		return HostParts{}, fmt.Errorf("host %s: %w (first label longer than %d characters)", quoteShort(host), ErrHostParts, maxLabelLen)
	}
	if IsHashedLabel(label) {
		return HostParts{Hashed: true}, nil
	}
	var p HostParts
	ws, rest, ok := strings.Cut(label, "--")
	if !ok {
		return HostParts{}, fmt.Errorf("host %s: %w (found 1 part)", quoteShort(host), ErrHostParts)
	}
	p.Workspace = ws
	p.Sandbox, p.Service, ok = strings.Cut(rest, "--")
	if ok {
		if strings.Contains(p.Service, "--") {
			n := 3 + strings.Count(p.Service, "--")
			return HostParts{}, fmt.Errorf("host %s: %w (found %d parts)", quoteShort(host), ErrHostParts, n)
		}
		if err := ValidName(p.Service); err != nil {
			return HostParts{}, fmt.Errorf("host %s: %w: service %w", quoteShort(host), ErrHostName, err)
		}
	}
	if err := ValidName(p.Workspace); err != nil {
		return HostParts{}, fmt.Errorf("host %s: %w: workspace %w", quoteShort(host), ErrHostName, err)
	}
	if err := ValidName(p.Sandbox); err != nil {
		return HostParts{}, fmt.Errorf("host %s: %w: sandbox %w", quoteShort(host), ErrHostName, err)
	}
	return p, nil
}
