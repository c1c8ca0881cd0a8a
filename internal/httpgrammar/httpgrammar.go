// Package httpgrammar holds the byte-level grammar of HTTP fields that
// HTTP/1.1, HTTP/2 and the HTTP/2 engine share (RFC 9110 §5.1, §5.5, §5.6),
// and the one ASCII case fold they compare names and tokens with, in the
// spirit of x/net's httpguts.
//
// Every function takes a string or a byte slice, does not allocate (but
// ToLower, which returns a new string only when it must) and reads each
// byte once through one 256-entry class table: the parsers call them on
// every field of every request.
//
// The fold is ASCII's only: 'A'-'Z' fold to 'a'-'z' and no other byte
// changes. Unlike strings.EqualFold, it never folds a non-ASCII rune onto
// an ASCII letter (U+212A KELVIN SIGN onto 'k', U+017F LATIN SMALL LETTER
// LONG S onto 's'), so a name or token that is not ASCII never equals one
// that is.
package httpgrammar

// Byte classes, as bits of class.
const (
	// tchar (RFC 9110 §5.6.2): ALPHA, DIGIT and "!#$%&'*+-.^_`|~".
	classToken uint8 = 1 << iota
	// tchar but an upper-case letter: the bytes of an HTTP/2 field name
	// (RFC 9113 §8.2.1).
	classLowerToken
	// field-vchar (VCHAR / obs-text), SP or HTAB (RFC 9110 §5.5): every
	// byte but the CTLs other than HTAB, and DEL.
	classFieldValue
	// VCHAR (RFC 5234 B.1): visible ASCII, %x21-7E.
	classVisible
)

// class holds the classes of each byte.
var class = func() (t [256]uint8) {
	for c := 0; c < 256; c++ {
		if (c >= 0x20 || c == '\t') && c != 0x7f {
			t[c] |= classFieldValue
		}
		if c > 0x20 && c < 0x7f {
			t[c] |= classVisible
		}
	}
	mark := func(c byte) {
		t[c] |= classToken
		if c < 'A' || c > 'Z' {
			t[c] |= classLowerToken
		}
	}
	for c := byte('a'); c <= 'z'; c++ {
		mark(c)
		mark(c - 'a' + 'A')
	}
	for c := byte('0'); c <= '9'; c++ {
		mark(c)
	}
	for _, c := range []byte("!#$%&'*+-.^_`|~") {
		mark(c)
	}
	return t
}()

// IsTokenByte reports whether c is a tchar (RFC 9110 §5.6.2).
func IsTokenByte(c byte) bool { return class[c]&classToken != 0 }

// IsToken reports whether p is a token (RFC 9110 §5.6.2): one or more
// tchar. Methods, HTTP/1.1 field names and connection options are tokens.
func IsToken[T ~string | ~[]byte](p T) bool {
	return len(p) > 0 && all(p, classToken)
}

// IsLowerToken reports whether p is a token without upper-case letters,
// as an HTTP/2 field name must be (RFC 9113 §8.2.1).
func IsLowerToken[T ~string | ~[]byte](p T) bool {
	return len(p) > 0 && all(p, classLowerToken)
}

// IsFieldValueByte reports whether c may stand in a field value: a
// field-vchar (VCHAR or obs-text), SP or HTAB (RFC 9110 §5.5). It refuses
// the other CTLs (NUL, CR and LF among them) and DEL.
func IsFieldValueByte(c byte) bool { return class[c]&classFieldValue != 0 }

// ValidFieldValue reports whether every byte of p is a field-value byte
// (IsFieldValueByte); an empty value is valid. Whitespace at either end
// is the caller's to trim (HTTP/1.1) or refuse (HTTP/2).
func ValidFieldValue[T ~string | ~[]byte](p T) bool {
	return all(p, classFieldValue)
}

// IsVisible reports whether p is one or more VCHAR, visible ASCII
// (%x21-7E): no space, no control byte, no DEL, no obs-text. A request
// target must be.
func IsVisible[T ~string | ~[]byte](p T) bool {
	return len(p) > 0 && all(p, classVisible)
}

// all reports whether every byte of p has the class bit.
func all[T ~string | ~[]byte](p T, bit uint8) bool {
	for i := 0; i < len(p); i++ {
		if class[p[i]]&bit == 0 {
			return false
		}
	}
	return true
}

// IsOWS reports whether c is a byte of OWS, SP or HTAB (RFC 9110 §5.6.3).
func IsOWS(c byte) bool { return c == ' ' || c == '\t' }

// TrimOWS returns p without the OWS at either end.
func TrimOWS[T ~string | ~[]byte](p T) T {
	for len(p) > 0 && IsOWS(p[0]) {
		p = p[1:]
	}
	for len(p) > 0 && IsOWS(p[len(p)-1]) {
		p = p[:len(p)-1]
	}
	return p
}

// lower maps each byte to itself, but 'A'-'Z' to 'a'-'z'.
var lower = func() (t [256]byte) {
	for c := range t {
		t[c] = byte(c)
		if 'A' <= c && c <= 'Z' {
			t[c] += 'a' - 'A'
		}
	}
	return t
}()

// Lower returns c with an ASCII upper-case letter folded to lower case;
// every other byte is returned as it is.
func Lower(c byte) byte { return lower[c] }

// EqualFold reports whether a and b are equal, ASCII case aside (Lower on
// each byte). Non-ASCII bytes must be equal exactly.
func EqualFold[A, B ~string | ~[]byte](a A, b B) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lower[a[i]] != lower[b[i]] {
			return false
		}
	}
	return true
}

// HasPrefixFold reports whether p begins with prefix, ASCII case aside.
func HasPrefixFold[A, B ~string | ~[]byte](p A, prefix B) bool {
	return len(p) >= len(prefix) && EqualFold(p[:len(prefix)], prefix)
}

// ToLower returns s with its ASCII upper-case letters folded to lower
// case, and s itself when it holds none.
func ToLower(s string) string {
	i := 0
	for i < len(s) && (s[i] < 'A' || s[i] > 'Z') {
		i++
	}
	if i == len(s) {
		return s
	}
	b := make([]byte, len(s))
	copy(b, s[:i])
	for ; i < len(s); i++ {
		b[i] = Lower(s[i])
	}
	return string(b)
}
