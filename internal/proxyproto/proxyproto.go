// Package proxyproto encodes and decodes the binary header of the PROXY
// protocol version 2 (HAProxy's "PROXY protocol" specification, section
// 2.2): what a TCP proxy sends first on a connection so that the server
// learns the original client's address. The edge writes one before the
// ClientHello it replays to a supervisor (Append); the application
// listener reads one from its trusted proxies (Read).
//
// Decoding is strict: the 12-byte signature, version 2, a LOCAL or PROXY
// command, a defined address family whose addresses fit the declared
// length, and well-formed TLVs (each exactly inside the header; at most one
// PP2_TYPE_AUTHORITY, a host name of 1 to 255 printable bytes; at most one
// PP2_TYPE_CRC32C, which must match). A PROXY command must carry TCP over
// IPv4 or IPv6. The text format of version 1 is not accepted (IsV1 only
// recognises it, so that a caller can refuse it by name).
package proxyproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/netip"
)

// Signature is the 12-byte preamble of every version 2 header.
const Signature = "\r\n\r\n\x00\r\nQUIT\n"

// v1Prefix starts a version 1 (text) header.
const v1Prefix = "PROXY "

const (
	// fixedLen is the signature, the version/command byte, the family
	// byte and the 16-bit length.
	fixedLen = 16
	// MaxHeaderLen is the largest header Read accepts by default: the
	// fixed part plus addresses and TLVs. Ours is at most 16+36+3+255;
	// the rest leaves room for other senders' TLVs (cloud load balancers
	// add a few dozen bytes).
	MaxHeaderLen = 4096

	version2 = 0x20

	famUnspec     = 0x00
	famTCP4       = 0x11
	famUDP4       = 0x12
	famTCP6       = 0x21
	famUDP6       = 0x22
	famUnixStream = 0x31
	famUnixDgram  = 0x32

	tlvHeaderLen = 3
	// TLV types used here.
	tlvAuthority = 0x02
	tlvCRC32C    = 0x03

	// MaxAuthorityLen bounds PP2_TYPE_AUTHORITY (a host name).
	MaxAuthorityLen = 255
)

// Command is the command of a version 2 header.
type Command uint8

const (
	// Local: the connection was made by the proxy itself (a health check);
	// the receiver keeps the connection's own addresses.
	Local Command = 0x0
	// Proxy: the connection is relayed for the client in Source.
	Proxy Command = 0x1
)

// String returns "local" or "proxy" (the metric label value).
func (c Command) String() string {
	if c == Local {
		return "local"
	}
	return "proxy"
}

// Header is a version 2 header.
type Header struct {
	// Command is Local or Proxy.
	Command Command
	// Source and Destination are the client's address and the address
	// it connected to (TCP over IPv4 or IPv6; decoded IPv4-mapped IPv6
	// addresses are IPv4). Both are zero for Local.
	Source, Destination netip.AddrPort
	// Authority is the PP2_TYPE_AUTHORITY TLV: the host name the client
	// asked for (the TLS SNI), "" when absent.
	Authority string
}

var (
	// ErrNotProxy: the input does not start with the version 2 signature.
	ErrNotProxy = errors.New("proxyproto: not a PROXY protocol v2 header")
	// ErrMalformed: the header violates the specification or is of a kind
	// this package refuses (see the package doc); it wraps a reason.
	ErrMalformed = errors.New("proxyproto: malformed PROXY protocol v2 header")
	// ErrTooLarge: the declared header length exceeds the limit.
	ErrTooLarge = errors.New("proxyproto: PROXY protocol v2 header too large")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// IsV2 reports whether b, however short, is consistent with the start of a
// version 2 header (a prefix of the signature, or the whole of it).
func IsV2(b []byte) bool {
	n := min(len(b), len(Signature))
	return n > 0 && string(b[:n]) == Signature[:n]
}

// IsV1 reports whether b, however short, is consistent with the start of a
// version 1 (text) header, "PROXY ".
func IsV1(b []byte) bool {
	n := min(len(b), len(v1Prefix))
	return n > 0 && string(b[:n]) == v1Prefix[:n]
}

// Append appends h in the version 2 binary format to dst. A Proxy header
// needs valid Source and Destination addresses; when one is IPv4 and the
// other IPv6, both are sent as IPv6 (IPv4-mapped). IPv4-mapped IPv6
// addresses on both sides are sent as IPv4. A Local header carries no
// addresses. Authority, when not empty, is sent as PP2_TYPE_AUTHORITY.
func (h *Header) Append(dst []byte) ([]byte, error) {
	if len(h.Authority) > MaxAuthorityLen || !validAuthority(h.Authority) {
		return dst, fmt.Errorf("proxyproto: authority %q: not 1 to %d printable bytes", h.Authority, MaxAuthorityLen)
	}
	var fam byte
	var addrs []byte
	var buf [36]byte
	switch h.Command {
	case Local:
		fam = famUnspec
	case Proxy:
		if !h.Source.IsValid() || !h.Destination.IsValid() {
			return dst, errors.New("proxyproto: a PROXY header needs a source and a destination address")
		}
		src, dstA := h.Source.Addr().Unmap(), h.Destination.Addr().Unmap()
		if src.Is4() && dstA.Is4() {
			fam = famTCP4
			s4, d4 := src.As4(), dstA.As4()
			copy(buf[0:4], s4[:])
			copy(buf[4:8], d4[:])
			binary.BigEndian.PutUint16(buf[8:], h.Source.Port())
			binary.BigEndian.PutUint16(buf[10:], h.Destination.Port())
			addrs = buf[:12]
		} else {
			fam = famTCP6
			s16, d16 := src.As16(), dstA.As16()
			copy(buf[0:16], s16[:])
			copy(buf[16:32], d16[:])
			binary.BigEndian.PutUint16(buf[32:], h.Source.Port())
			binary.BigEndian.PutUint16(buf[34:], h.Destination.Port())
			addrs = buf[:36]
		}
	default:
		return dst, fmt.Errorf("proxyproto: unknown command %d", h.Command)
	}
	n := len(addrs)
	if h.Authority != "" {
		n += tlvHeaderLen + len(h.Authority)
	}
	dst = append(dst, Signature...)
	dst = append(dst, version2|byte(h.Command), fam, byte(n>>8), byte(n))
	dst = append(dst, addrs...)
	if h.Authority != "" {
		dst = append(dst, tlvAuthority, byte(len(h.Authority)>>8), byte(len(h.Authority)))
		dst = append(dst, h.Authority...)
	}
	return dst, nil
}

// Read reads exactly one version 2 header from r (nothing beyond it) and
// decodes it. maxLen bounds the whole header (<= 0: MaxHeaderLen); a
// longer declared length is ErrTooLarge and its body is not read.
//
// Errors: ErrNotProxy when the first 12 bytes are not the signature,
// ErrTooLarge, ErrMalformed (wrapped with the reason), io.EOF when r ends
// before the first byte, io.ErrUnexpectedEOF when it ends inside the
// header, and any other read error as r returned it.
func Read(r io.Reader, maxLen int) (Header, error) {
	if maxLen <= 0 {
		maxLen = MaxHeaderLen
	}
	var fixed [fixedLen]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return Header{}, err
	}
	n, err := checkFixed(fixed[:], maxLen)
	if err != nil {
		return Header{}, err
	}
	b := make([]byte, fixedLen+n)
	copy(b, fixed[:])
	if _, err := io.ReadFull(r, b[fixedLen:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Header{}, err
	}
	h, _, err := Parse(b)
	return h, err
}

// checkFixed validates the fixed 16 bytes and returns the declared length
// of the rest.
func checkFixed(b []byte, maxLen int) (int, error) {
	if string(b[:len(Signature)]) != Signature {
		return 0, ErrNotProxy
	}
	if b[12]&0xf0 != version2 {
		return 0, malformed("version %d", b[12]>>4)
	}
	if cmd := Command(b[12] & 0x0f); cmd != Local && cmd != Proxy {
		return 0, malformed("command %d", cmd)
	}
	n := int(binary.BigEndian.Uint16(b[14:16]))
	if fixedLen+n > maxLen {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, fixedLen+n, maxLen)
	}
	return n, nil
}

// addrLen is the length of the address block of each defined family.
func addrLen(fam byte) (int, bool) {
	switch fam {
	case famUnspec:
		return 0, true
	case famTCP4, famUDP4:
		return 12, true
	case famTCP6, famUDP6:
		return 36, true
	case famUnixStream, famUnixDgram:
		return 216, true
	}
	return 0, false
}

// Parse decodes the version 2 header at the start of b and returns it
// with its length in bytes. It applies no size limit beyond the format's
// own (64 KiB); the errors are those of Read, with io.ErrUnexpectedEOF
// when b ends inside the header.
func Parse(b []byte) (Header, int, error) {
	if len(b) < fixedLen {
		if !IsV2(b) {
			return Header{}, 0, ErrNotProxy
		}
		return Header{}, 0, io.ErrUnexpectedEOF
	}
	n, err := checkFixed(b, fixedLen+0xffff)
	if err != nil {
		return Header{}, 0, err
	}
	total := fixedLen + n
	if len(b) < total {
		return Header{}, 0, io.ErrUnexpectedEOF
	}
	cmd, fam := Command(b[12]&0x0f), b[13]
	al, ok := addrLen(fam)
	if !ok {
		return Header{}, 0, malformed("address family/protocol 0x%02x", fam)
	}
	if n < al {
		return Header{}, 0, malformed("length %d shorter than the addresses (%d)", n, al)
	}
	h := Header{Command: cmd}
	body := b[fixedLen:total]
	if cmd == Proxy {
		switch fam {
		case famTCP4:
			h.Source = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[0:4])), binary.BigEndian.Uint16(body[8:10]))
			h.Destination = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[4:8])), binary.BigEndian.Uint16(body[10:12]))
		case famTCP6:
			// IPv4-mapped addresses are returned as IPv4.
			h.Source = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[0:16])).Unmap(), binary.BigEndian.Uint16(body[32:34]))
			h.Destination = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[16:32])).Unmap(), binary.BigEndian.Uint16(body[34:36]))
		default:
			// UNSPEC, UDP and UNIX: nothing this TCP listener can use as
			// a client address.
			return Header{}, 0, malformed("PROXY command with address family/protocol 0x%02x (want TCP4 or TCP6)", fam)
		}
	}
	if err := parseTLVs(&h, b[:total], fixedLen+al); err != nil {
		return Header{}, 0, err
	}
	return h, total, nil
}

// parseTLVs checks the TLVs of hdr (the whole header) from offset at on.
func parseTLVs(h *Header, hdr []byte, at int) error {
	var sawAuthority, sawCRC bool
	for at < len(hdr) {
		if len(hdr)-at < tlvHeaderLen {
			return malformed("truncated TLV header")
		}
		typ, l := hdr[at], int(binary.BigEndian.Uint16(hdr[at+1:at+3]))
		v := at + tlvHeaderLen
		if l > len(hdr)-v {
			return malformed("TLV 0x%02x of %d bytes overruns the header", typ, l)
		}
		val := hdr[v : v+l]
		switch typ {
		case tlvAuthority:
			if sawAuthority {
				return malformed("two authority TLVs")
			}
			sawAuthority = true
			if l == 0 || l > MaxAuthorityLen || !validAuthority(string(val)) {
				return malformed("authority TLV is not 1 to %d printable bytes", MaxAuthorityLen)
			}
			h.Authority = string(val)
		case tlvCRC32C:
			if sawCRC {
				return malformed("two CRC32C TLVs")
			}
			sawCRC = true
			if l != 4 {
				return malformed("CRC32C TLV of %d bytes", l)
			}
			if !crcMatches(hdr, v) {
				return malformed("CRC32C mismatch")
			}
		}
		// Other types (ALPN, unique id, SSL, NETNS, NOOP, custom) are
		// skipped, as the specification requires of unknown ones.
		at = v + l
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcMatches checks the CRC32C at hdr[at:at+4]: the checksum of the whole
// header with those four bytes zeroed.
func crcMatches(hdr []byte, at int) bool {
	want := binary.BigEndian.Uint32(hdr[at : at+4])
	c := bytes.Clone(hdr)
	clear(c[at : at+4])
	return crc32.Checksum(c, castagnoli) == want
}

// validAuthority: printable ASCII without spaces (a host name, possibly
// with a port); "" is valid (absent).
func validAuthority(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
