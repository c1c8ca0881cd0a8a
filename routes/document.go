package routes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/applistener/applistener/internal/fairshare"
)

// MaxDocumentBytes is the largest configuration document ParseDocument
// accepts.
const MaxDocumentBytes = 8 << 20

// Limits on the contents of one instance entry.
const (
	// MaxServices is the largest number of services of one instance.
	MaxServices = 64
	// MaxStreamsLimit is the largest accepted limits.max_streams.
	MaxStreamsLimit = 1_000_000
	// MaxWeight is the largest accepted limits.weight.
	MaxWeight = fairshare.MaxWeight
	// MaxIdleTimeoutSeconds is the largest accepted limits.idle_timeout_seconds (one day).
	MaxIdleTimeoutSeconds = 86400
	// MaxStartGraceSeconds is the largest accepted
	// services[].start_grace_seconds (five minutes).
	MaxStartGraceSeconds = 300
	// MaxGenerationLen is the longest accepted generation.
	MaxGenerationLen = 64
	// maxUnixPathLen is the size of sun_path on Linux: the longest Unix
	// socket path once "{port}" is replaced by a 5-digit port.
	maxUnixPathLen = 108
	// maxNetnsPathLen is PATH_MAX on Linux, less the terminating NUL.
	maxNetnsPathLen = 4095
	// maxReasonLen bounds RejectedInstance.Reason.
	maxReasonLen = 300
	// maxLogNameLen bounds RejectedInstance.Workspace and .Sandbox.
	maxLogNameLen = 64
)

// Connector types.
const (
	// ConnectorTCP dials the loopback address in Host, in the supervisor's
	// own network namespace.
	ConnectorTCP = "tcp"
	// ConnectorNetns enters the network namespace at Path and dials its
	// loopback.
	ConnectorNetns = "netns"
	// ConnectorUnix dials the Unix socket at Path, with every "{port}"
	// replaced by the service port.
	ConnectorUnix = "unix"
)

// Service protocols: how the listener speaks to a service's app.
const (
	// ProtocolHTTP1 is HTTP/1.1, the default. ParseDocument normalizes it
	// to "" (an omitted "protocol").
	ProtocolHTTP1 = "http1"
	// ProtocolH2C is HTTP/2 with prior knowledge over plain TCP (gRPC
	// servers, h2c apps): requests are forwarded as HTTP/2 streams with
	// their trailers.
	ProtocolH2C = "h2c"
)

// PortPlaceholder is the text in a unix connector's path that is replaced by
// the service port.
const PortPlaceholder = "{port}"

// DefaultConnectorHost is the host of a tcp connector that names none, and
// the address "localhost" is normalized to.
const DefaultConnectorHost = "127.0.0.1"

// Document is a parsed configuration document: the complete desired state of
// one supervisor. Instances holds the entries that passed validation and
// Rejected those that did not; together they account for every entry of the
// document's "instances" array.
type Document struct {
	// Revision is the top-level "revision" (may be empty).
	Revision string
	// Instances are the entries that passed validation, in document order,
	// normalized (see ParseDocument).
	Instances []InstanceSpec
	// Rejected are the entries that failed validation, in document order.
	Rejected []RejectedInstance
}

// InstanceKey identifies a sandbox instance: a workspace and a sandbox.
type InstanceKey struct {
	Workspace string
	Sandbox   string
}

// String returns "workspace/sandbox".
func (k InstanceKey) String() string {
	return k.Workspace + "/" + k.Sandbox
}

// InstanceSpec is one validated instance entry of a configuration document.
type InstanceSpec struct {
	// Workspace and Sandbox identify the instance (see ValidName).
	Workspace string `json:"workspace"`
	Sandbox   string `json:"sandbox"`
	// Generation changes when the sandbox is recreated: up to 64 printable
	// ASCII characters without spaces, possibly empty.
	Generation string `json:"generation"`
	// Connector says how to reach the instance's loopback ports.
	Connector ConnectorSpec `json:"connector"`
	// Limits are the per-instance limits.
	Limits Limits `json:"limits"`
	// Services are the routed ports of the instance: 1 to 64, with distinct
	// names.
	Services []ServiceSpec `json:"services"`
	// State is "" (StateActive, which ParseDocument normalizes to "") or
	// StateSleeping. A change of state is a change of target: the
	// instance's routes are reinstalled.
	State string `json:"state,omitempty"`
}

// Key returns the instance's workspace and sandbox.
func (s *InstanceSpec) Key() InstanceKey {
	return InstanceKey{Workspace: s.Workspace, Sandbox: s.Sandbox}
}

// ConnectorSpec says how the supervisor reaches an instance.
type ConnectorSpec struct {
	// Type is ConnectorTCP, ConnectorNetns or ConnectorUnix.
	Type string `json:"type"`
	// Host is the loopback IP address of a tcp connector, in canonical form.
	Host string `json:"host,omitempty"`
	// Path is the network namespace file of a netns connector, or the socket
	// path template (containing PortPlaceholder) of a unix connector.
	Path string `json:"path,omitempty"`
}

// Limits are per-instance limits.
type Limits struct {
	// MaxStreams is the most concurrent streams of the instance; 0 means the
	// supervisor's default.
	MaxStreams int `json:"max_streams,omitempty"`
	// IdleTimeoutSeconds closes the instance's client connections and
	// WebSockets after this long without traffic; 0 means the supervisor's
	// default (no limit for WebSockets).
	IdleTimeoutSeconds int `json:"idle_timeout_seconds,omitempty"`
	// Weight is the instance's share under fair admission when the
	// listener is busy (1 to MaxWeight; 0 means 1): weight 3 is admitted
	// three times per round of a weight-1 instance's once.
	Weight int `json:"weight,omitempty"`
	// RequestsPerSecond is the instance's request rate limit (ratelimit.go):
	// requests beyond it are answered 429; 0 means unlimited.
	RequestsPerSecond int `json:"requests_per_second,omitempty"`
	// RequestsBurst is how many requests may arrive at once on top of the
	// rate; 0 means max(1, requests_per_second). Only with a rate.
	RequestsBurst int `json:"requests_burst,omitempty"`
	// BytesPerSecond is the instance's byte rate limit, shared by both
	// directions of all its requests and WebSockets: relaying pauses
	// beyond it (never cut); 0 means unlimited.
	BytesPerSecond int64 `json:"bytes_per_second,omitempty"`
	// BytesBurst is how many bytes may be relayed at once on top of the
	// rate; 0 means max(64 KiB, bytes_per_second) (at most MaxBytesBurst).
	// Only with a rate.
	BytesBurst int64 `json:"bytes_burst,omitempty"`
}

// ServiceSpec is one routed port of an instance.
type ServiceSpec struct {
	// Name is the service name; "" is the unnamed (default) service.
	Name string `json:"name"`
	// Port is the loopback port of the app, 1 to 65535.
	Port int `json:"port"`
	// Revision is the declaration revision (≥ 0).
	Revision int64 `json:"revision"`
	// StartGraceSeconds is how long a request waits for an app that
	// refuses connections (not listening yet) before it is answered 502:
	// 0 to MaxStartGraceSeconds; 0 answers at once. nil (absent): the
	// supervisor's --app-start-grace.
	StartGraceSeconds *int `json:"start_grace_seconds,omitempty"`
	// Protocol is how the app is spoken to: "" (or ProtocolHTTP1, which
	// ParseDocument normalizes to "") for HTTP/1.1, ProtocolH2C for HTTP/2
	// with prior knowledge.
	Protocol string `json:"protocol,omitempty"`
	// Access is the service's access policy; nil (absent) is public.
	Access *AccessPolicy `json:"access,omitempty"`
	// Wake is which requests for the sleeping instance wake it, and how
	// long they are held; nil (absent) is the defaults (WakeNavigation,
	// DefaultWakeHoldSeconds).
	Wake *WakePolicy `json:"wake,omitempty"`
}

// RejectedInstance is an instance entry that failed validation. Its routes
// are withdrawn at once.
type RejectedInstance struct {
	// Index is the entry's position in "instances".
	Index int
	// Workspace and Sandbox are as found in the entry, possibly empty or
	// invalid, cut to 64 bytes; for logs only.
	Workspace string
	Sandbox   string
	// Reason is one line saying why the entry was rejected: its first
	// problem, and how many more there are.
	Reason string
	// Problems are every problem found in the entry, in the order they
	// were found (at most maxProblems), each with its JSON path inside the
	// entry.
	Problems []Problem
}

// Problem is one thing wrong with an instance entry.
type Problem struct {
	// Path is the JSON path of the offending value inside the entry, e.g.
	// "services[0].port" or "limits.max_streamz"; "" for the entry as a
	// whole.
	Path string
	// Msg says what is wrong, in one line.
	Msg string
}

// String is "PATH: MSG" ("MSG" for the entry as a whole).
func (p Problem) String() string {
	if p.Path == "" {
		return p.Msg
	}
	return p.Path + ": " + p.Msg
}

// parseOptions change what ParseDocument accepts.
// None exist at the moment; the parameter stays so that one can be added
// without touching every parse path.
type parseOptions struct{}

// maxProblems bounds the problems kept for one entry.
const maxProblems = 32

// ParseDocument decodes and validates a configuration document.
//
// It returns an error, and the caller applies nothing, when the document is
// larger than MaxDocumentBytes, is not valid UTF-8 or JSON, has data after
// the top-level object, or when the top level is not an object whose keys are
// exactly "instances" (an array, required) and "revision" (a string,
// optional), each at most once.
//
// Each entry of "instances" is then decoded strictly on its own: unknown,
// duplicated or non-lower-case field names (also in nested objects) and
// values of the wrong type reject the entry. A decoded entry is validated and
// normalized: a missing connector becomes tcp to 127.0.0.1, a tcp host
// "localhost" becomes 127.0.0.1 and IPv6 loopback addresses are written
// canonically. An entry that fails goes to Rejected with a one-line reason;
// when two or more entries name the same workspace/sandbox, all of them are
// rejected.
//
// A service whose access policy has mode "token" is valid here; a listener
// without access keys refuses its instance when installing it
// (Options.AccessTokens).
func ParseDocument(data []byte) (*Document, error) {
	return parseDocument(data, parseOptions{})
}

// parseDocument is ParseDocument with options.
func parseDocument(data []byte, opts parseOptions) (*Document, error) {
	y := newYielder()
	defer y.close()
	revision, entries, err := parseTopLevel(data, y)
	if err != nil {
		return nil, err
	}
	doc := &Document{Revision: revision}
	if len(entries) == 0 {
		return doc, nil
	}

	type result struct {
		key      InstanceKey
		spec     InstanceSpec
		reason   string // "" when valid
		problems []Problem
	}
	results := make([]result, len(entries))
	counts := make(map[InstanceKey]int, len(entries))
	for i, raw := range entries {
		y.step()
		r := &results[i]
		spec, problems := parseInstance(raw, opts)
		if len(problems) > 0 {
			r.problems = problems
			r.reason = summary(problems)
			r.key = lenientKey(raw)
		} else {
			r.spec = spec
			r.key = spec.Key()
		}
		if r.key != (InstanceKey{}) {
			counts[r.key]++
		}
	}
	doc.Instances = make([]InstanceSpec, 0, len(results))
	for i := range results {
		y.step()
		r := &results[i]
		if r.reason == "" && counts[r.key] > 1 {
			r.reason = oneLine("duplicate instance " + r.key.String())
			r.problems = []Problem{{Msg: r.reason}}
		}
		if r.reason == "" {
			doc.Instances = append(doc.Instances, r.spec)
			continue
		}
		doc.Rejected = append(doc.Rejected, RejectedInstance{
			Index:     i,
			Workspace: cutString(r.key.Workspace, maxLogNameLen),
			Sandbox:   cutString(r.key.Sandbox, maxLogNameLen),
			Reason:    r.reason,
			Problems:  r.problems,
		})
	}
	return doc, nil
}

// parseTopLevel checks the document's top level and returns its revision and
// its instance entries (sub-slices of data). It validates the JSON one value
// at a time (each entry on its own) rather than the whole document at once,
// stepping aside through y between entries, so that a large document never
// holds the processor for long; the document is accepted only if it is one
// valid JSON value, exactly as json.Valid would decide, and an invalid one
// is reported by invalidJSON before any other error.
func parseTopLevel(data []byte, y *yielder) (string, [][]byte, error) {
	if len(data) > MaxDocumentBytes {
		return "", nil, fmt.Errorf("document: %d bytes, larger than the limit of %d", len(data), MaxDocumentBytes)
	}
	if !utf8.Valid(data) {
		return "", nil, errors.New("document: not valid UTF-8")
	}
	s := keyScanner{data: data}
	s.skipSpace()
	if s.peek() != '{' {
		if !json.Valid(data) {
			return "", nil, invalidJSON(data)
		}
		return "", nil, errors.New("document: top level must be a JSON object")
	}
	s.pos++
	var (
		revision     string
		entries      [][]byte
		seenRevision bool
		seenEntries  bool
		semantic     error // the first error other than invalid JSON
	)
	// value consumes one JSON value nested in enclosing objects and arrays
	// and reports whether it is valid, within encoding/json's nesting
	// limit for the whole document.
	value := func(enclosing int) ([]byte, bool) {
		start := s.pos
		deepest := s.skipValue()
		v := data[start:s.pos]
		return v, len(v) > 0 && enclosing+deepest <= maxJSONDepth && json.Valid(v)
	}
	fail := func(err error) {
		if semantic == nil {
			semantic = err
		}
	}
	s.skipSpace()
	if s.peek() == '}' {
		s.pos++
	} else {
		for {
			s.skipSpace()
			if s.peek() != '"' {
				return "", nil, invalidJSON(data)
			}
			quoted := s.pos
			start, end, err := s.str()
			if err != nil || !json.Valid(data[quoted:s.pos]) {
				return "", nil, invalidJSON(data)
			}
			key := string(data[start:end])
			s.skipSpace()
			if s.peek() != ':' {
				return "", nil, invalidJSON(data)
			}
			s.pos++
			s.skipSpace()
			switch {
			case key == "instances" && !seenEntries && s.peek() == '[':
				seenEntries = true
				s.pos++
				s.skipSpace()
				if s.peek() == ']' {
					s.pos++
					break
				}
				for {
					s.skipSpace()
					v, ok := value(2) // the top-level object, the instances array
					if !ok {
						return "", nil, invalidJSON(data)
					}
					entries = append(entries, v)
					y.step()
					s.skipSpace()
					if s.peek() == ',' {
						s.pos++
						continue
					}
					if s.peek() != ']' {
						return "", nil, invalidJSON(data)
					}
					s.pos++
					break
				}
			default:
				isString := s.peek() == '"'
				v, ok := value(1) // the top-level object
				if !ok {
					return "", nil, invalidJSON(data)
				}
				switch key {
				case "instances":
					if seenEntries {
						fail(errors.New(`document: duplicate field "instances"`))
					} else {
						seenEntries = true
						fail(errors.New(`document: "instances" must be an array`))
					}
				case "revision":
					switch {
					case seenRevision:
						fail(errors.New(`document: duplicate field "revision"`))
					case !isString:
						fail(errors.New(`document: "revision" must be a string`))
					default:
						if err := json.Unmarshal(v, &revision); err != nil {
							fail(fmt.Errorf("document: revision: %w", err))
						}
					}
					seenRevision = true
				default:
					fail(fmt.Errorf("document: unknown field %s", quoteShort(key)))
				}
			}
			s.skipSpace()
			if s.peek() == ',' {
				s.pos++
				continue
			}
			if s.peek() != '}' {
				return "", nil, invalidJSON(data)
			}
			s.pos++
			break
		}
	}
	s.skipSpace()
	if s.pos != len(data) {
		return "", nil, invalidJSON(data)
	}
	if semantic != nil {
		return "", nil, semantic
	}
	if !seenEntries {
		return "", nil, errors.New(`document: "instances" is missing`)
	}
	return revision, entries, nil
}

// maxJSONDepth is encoding/json's limit on nested objects and arrays.
const maxJSONDepth = 10000

// invalidJSON explains why data is not one valid JSON value: a
// *SyntaxError with the line and column where the reading stopped.
func invalidJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		offset := dec.InputOffset()
		var se *json.SyntaxError
		if errors.As(err, &se) {
			offset = se.Offset
		} else if err == io.EOF || err == io.ErrUnexpectedEOF {
			offset = int64(len(data)) + 1 // just past the end
		}
		return newSyntaxError(data, offset, jsonErr(err).Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		rest := data[dec.InputOffset():]
		extra := len(rest) - len(bytes.TrimLeft(rest, " \t\r\n"))
		return newSyntaxError(data, dec.InputOffset()+int64(extra)+1, "data after the top-level object")
	}
	return errors.New("document: invalid JSON") // not reached: json.Valid and Decoder agree
}

// CheckJSON returns nil when data is one valid JSON value, and otherwise a
// *SyntaxError saying where it is not (for files that embed documents).
func CheckJSON(data []byte) error {
	if json.Valid(data) {
		return nil
	}
	return invalidJSON(data)
}

// SyntaxError is a document that is not valid JSON, with the place where
// reading it stopped.
type SyntaxError struct {
	// Line and Column (1-based; the column counts bytes) of the byte the
	// error was found at.
	Line, Column int
	// Msg says what was wrong, without the position.
	Msg string
}

// Error is "document: line L, column C: MSG".
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("document: line %d, column %d: %s", e.Line, e.Column, e.Msg)
}

// newSyntaxError locates byte offset (the count of bytes read, as
// encoding/json reports it) in data.
func newSyntaxError(data []byte, offset int64, msg string) *SyntaxError {
	// encoding/json's offset counts the byte at fault: point at it.
	at := min(max(offset-1, 0), int64(len(data)))
	before := data[:at]
	line := bytes.Count(before, []byte{'\n'}) + 1
	col := int(at) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return &SyntaxError{Line: line, Column: col, Msg: strings.TrimPrefix(msg, "json: ")}
}

// jsonErr turns an unexpected end of input into a readable error.
func jsonErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errors.New("unexpected end of JSON input")
	}
	return err
}

// parseInstance decodes one instance entry strictly, validates it and
// returns it normalized, or every problem found in it.
func parseInstance(raw []byte, opts parseOptions) (InstanceSpec, []Problem) {
	var spec InstanceSpec
	if first := firstByte(raw); first != '{' {
		return spec, []Problem{{Msg: fmt.Sprintf("entry is %s, not an object", jsonKind(first))}}
	}
	if err := checkKeys(raw); err != nil {
		return spec, []Problem{{Msg: err.Error()}}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	strictErr := dec.Decode(&spec)
	if strictErr == nil {
		if _, err := dec.Token(); err != io.EOF {
			return InstanceSpec{}, []Problem{{Msg: "invalid entry: data after the object"}}
		}
		var ps problemList
		spec.validate(&ps, opts)
		if len(ps) > 0 {
			return InstanceSpec{}, ps
		}
		return spec, nil
	}
	// The strict decode stops at the first unknown field or wrong type:
	// find all of them, then validate what a lenient decode gives,
	// leaving out problems of values that could not be decoded.
	ps := schemaProblems(raw, instanceSpecType)
	if len(ps) == 0 { // not expected: the schema walk and the decoder agree
		return InstanceSpec{}, []Problem{{Msg: "invalid entry: " + strings.TrimPrefix(jsonErr(strictErr).Error(), "json: ")}}
	}
	spec = InstanceSpec{}
	_ = json.Unmarshal(raw, &spec) // keeps every value of the right type
	var semantic problemList
	spec.validate(&semantic, opts)
	for _, p := range semantic {
		if !ps.covers(p.Path) {
			ps.add(p.Path, "%s", p.Msg)
		}
	}
	return InstanceSpec{}, ps
}

// validate checks a decoded entry, normalizes its connector, and adds
// every problem found to ps.
func (s *InstanceSpec) validate(ps *problemList, opts parseOptions) {
	if err := ValidName(s.Workspace); err != nil {
		ps.add("workspace", "%v", err)
	}
	if err := ValidName(s.Sandbox); err != nil {
		ps.add("sandbox", "%v", err)
	}
	if len(s.Generation) > MaxGenerationLen {
		ps.add("generation", "longer than %d characters", MaxGenerationLen)
	} else {
		for i := 0; i < len(s.Generation); i++ {
			if c := s.Generation[i]; c <= ' ' || c >= 0x7f {
				ps.add("generation", "%s not allowed (use printable ASCII without spaces)", describeByte(c))
				break
			}
		}
	}
	if c, field, err := normalizeConnector(s.Connector); err != nil {
		ps.add(joinPath("connector", field), "%v", err)
	} else {
		s.Connector = c
	}
	if s.Limits.IdleTimeoutSeconds < 0 || s.Limits.IdleTimeoutSeconds > MaxIdleTimeoutSeconds {
		ps.add("limits.idle_timeout_seconds", "%d out of range 0..%d", s.Limits.IdleTimeoutSeconds, MaxIdleTimeoutSeconds)
	}
	if s.Limits.MaxStreams < 0 || s.Limits.MaxStreams > MaxStreamsLimit {
		ps.add("limits.max_streams", "%d out of range 0..%d", s.Limits.MaxStreams, MaxStreamsLimit)
	}
	if s.Limits.Weight < 0 || s.Limits.Weight > MaxWeight {
		ps.add("limits.weight", "%d out of range 1..%d", s.Limits.Weight, MaxWeight)
	}
	s.Limits.validateRates(ps) // ratelimit.go
	s.validateState(ps)
	if len(s.Services) == 0 {
		ps.add("services", "at least one service is required")
	}
	if len(s.Services) > MaxServices {
		ps.add("services", "%d services, more than %d", len(s.Services), MaxServices)
	}
	for i := range s.Services {
		svc := &s.Services[i]
		at := "services[" + strconv.Itoa(i) + "]"
		what := "unnamed service"
		if svc.Name != "" {
			what = "service " + quoteShort(svc.Name)
			if err := ValidName(svc.Name); err != nil {
				ps.add(at+".name", "%v", err)
			}
		}
		for j := 0; j < i; j++ {
			if s.Services[j].Name == svc.Name {
				if svc.Name == "" {
					ps.add(at+".name", "more than one unnamed service")
				} else {
					ps.add(at+".name", "duplicate %s", what)
				}
				break
			}
		}
		if svc.Port < 1 || svc.Port > 65535 {
			ps.add(at+".port", "%s: port %d out of range 1..65535", what, svc.Port)
		}
		if svc.Revision < 0 {
			ps.add(at+".revision", "%s: revision %d is negative", what, svc.Revision)
		}
		if g := svc.StartGraceSeconds; g != nil && (*g < 0 || *g > MaxStartGraceSeconds) {
			ps.add(at+".start_grace_seconds", "%s: start_grace_seconds %d out of range 0..%d", what, *g, MaxStartGraceSeconds)
		}
		switch svc.Protocol {
		case "", ProtocolH2C:
		case ProtocolHTTP1:
			svc.Protocol = ""
		default:
			ps.add(at+".protocol", "%s: protocol %s not supported (use http1 or h2c)", what, quoteShort(svc.Protocol))
		}
		if svc.Access != nil {
			svc.Access.validate(ps, at+".access", what)
		}
		if svc.Wake != nil {
			svc.Wake.validate(ps, at+".wake", what)
		}
	}
}

// normalizeConnector validates a connector and returns it in canonical form,
// or the field at fault ("type", "host", "path" or "" for the connector
// as a whole) and why.
func normalizeConnector(c ConnectorSpec) (ConnectorSpec, string, error) {
	switch c.Type {
	case "":
		if c.Host != "" || c.Path != "" {
			return c, "type", errors.New(`"type" is missing (use tcp, netns or unix)`)
		}
		return ConnectorSpec{Type: ConnectorTCP, Host: DefaultConnectorHost}, "", nil
	case ConnectorTCP:
		if c.Path != "" {
			return c, "path", errors.New("tcp connector takes no path")
		}
		switch c.Host {
		case "", "localhost":
			c.Host = DefaultConnectorHost
			return c, "", nil
		}
		ip, err := netip.ParseAddr(c.Host)
		if err != nil || ip.Zone() != "" || ip.Is4In6() {
			return c, "host", fmt.Errorf("tcp host %s is not an IP address or localhost", quoteShort(c.Host))
		}
		if !ip.IsLoopback() {
			return c, "host", fmt.Errorf("tcp host %s is not a loopback address", quoteShort(c.Host))
		}
		c.Host = ip.String()
		return c, "", nil
	case ConnectorNetns:
		if c.Host != "" {
			return c, "host", errors.New("netns connector takes no host")
		}
		if err := checkPath(c.Path, maxNetnsPathLen); err != nil {
			return c, "path", fmt.Errorf("netns %w", err)
		}
		return c, "", nil
	case ConnectorUnix:
		if c.Host != "" {
			return c, "host", errors.New("unix connector takes no host")
		}
		n := strings.Count(c.Path, PortPlaceholder)
		if n == 0 {
			return c, "path", fmt.Errorf("unix path %s does not contain %s", quoteShort(c.Path), PortPlaceholder)
		}
		// The longest socket path is the one with 5-digit ports.
		maxLen := maxUnixPathLen + n*(len(PortPlaceholder)-5)
		if err := checkPath(c.Path, maxLen); err != nil {
			return c, "path", fmt.Errorf("unix %w", err)
		}
		return c, "", nil
	default:
		return c, "type", fmt.Errorf("type %s not supported (use tcp, netns or unix)", quoteShort(c.Type))
	}
}

// checkPath checks a connector path: absolute, clean, without control
// characters and at most maxLen bytes.
func checkPath(p string, maxLen int) error {
	switch {
	case p == "":
		return errors.New("path is missing")
	case !filepath.IsAbs(p):
		return fmt.Errorf("path %s is not absolute", quoteShort(p))
	case filepath.Clean(p) != p:
		return fmt.Errorf("path %s is not clean (want %s)", quoteShort(p), quoteShort(filepath.Clean(p)))
	case len(p) > maxLen:
		return fmt.Errorf("path %s is too long", quoteShort(p))
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < ' ' || c == 0x7f {
			return fmt.Errorf("path %s contains a control character", quoteShort(p))
		}
	}
	return nil
}

// lenientKey makes a best effort to read the workspace and sandbox of an
// entry that failed validation, for logs and duplicate detection.
func lenientKey(raw []byte) InstanceKey {
	if firstByte(raw) != '{' {
		return InstanceKey{}
	}
	var k struct {
		Workspace any `json:"workspace"`
		Sandbox   any `json:"sandbox"`
	}
	_ = json.Unmarshal(raw, &k) // fields decoded before an error are kept
	ws, _ := k.Workspace.(string)
	sb, _ := k.Sandbox.(string)
	return InstanceKey{Workspace: ws, Sandbox: sb}
}

// firstByte returns the first non-space byte of a JSON value, or 0.
func firstByte(raw []byte) byte {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c
	}
	return 0
}

// jsonKind names the kind of JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case 0:
		return "empty"
	default:
		return "a number"
	}
}

// oneLine makes s safe as a one-line log field: control characters become
// spaces and the text is cut to maxReasonLen bytes.
func oneLine(s string) string {
	s = cutString(s, maxReasonLen)
	if strings.IndexFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f || r == '\u2028' || r == '\u2029' || r == '\u0085' }) < 0 {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f || r == '\u2028' || r == '\u2029' || r == '\u0085' {
			return ' '
		}
		return r
	}, s)
}

// cutString cuts s to at most n bytes without splitting a UTF-8 sequence.
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// maxKeyDepth bounds the nesting checkKeys follows; the schema needs 4
// (services[].access.cors_origins[]).
const maxKeyDepth = 16

// maxObjectKeys bounds the fields of one object; the schema needs 6.
const maxObjectKeys = 16

// checkKeys walks a JSON value (already known to be valid JSON) and reports
// an object field name that is not made of [a-z0-9_] only, or that appears
// twice in one object. encoding/json matches field names case-insensitively
// (with Unicode folding) and lets a repeated field silently replace the
// earlier one; both would let a document mean something other than it says.
func checkKeys(data []byte) error {
	s := keyScanner{data: data}
	if err := s.value(0); err != nil {
		return err
	}
	return nil
}

// keyScanner is the state of checkKeys.
type keyScanner struct {
	data []byte
	pos  int
}

var errBadJSON = errors.New("invalid JSON")

func (s *keyScanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\r', '\n':
			s.pos++
		default:
			return
		}
	}
}

func (s *keyScanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *keyScanner) value(depth int) error {
	if depth > maxKeyDepth {
		return errors.New("invalid entry: nested too deeply")
	}
	s.skipSpace()
	switch s.peek() {
	case '{':
		return s.object(depth)
	case '[':
		s.pos++
		s.skipSpace()
		if s.peek() == ']' {
			s.pos++
			return nil
		}
		for {
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.skipSpace()
			switch s.peek() {
			case ',':
				s.pos++
			case ']':
				s.pos++
				return nil
			default:
				return errBadJSON
			}
		}
	case '"':
		_, _, err := s.str()
		return err
	case 0:
		return errBadJSON
	default: // number, true, false, null
		for s.pos < len(s.data) {
			switch s.data[s.pos] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return nil
			}
			s.pos++
		}
		return nil
	}
}

func (s *keyScanner) object(depth int) error {
	s.pos++ // '{'
	var spans [maxObjectKeys][2]int
	n := 0
	s.skipSpace()
	if s.peek() == '}' {
		s.pos++
		return nil
	}
	for {
		s.skipSpace()
		if s.peek() != '"' {
			return errBadJSON
		}
		start, end, err := s.str()
		if err != nil {
			return err
		}
		key := s.data[start:end]
		for _, c := range key {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
				return fmt.Errorf("invalid entry: field name %s not allowed (field names are lower case)", quoteShort(string(key)))
			}
		}
		for _, sp := range spans[:n] {
			if bytes.Equal(s.data[sp[0]:sp[1]], key) {
				return fmt.Errorf("invalid entry: duplicate field %s", quoteShort(string(key)))
			}
		}
		if n == len(spans) {
			return fmt.Errorf("invalid entry: object with more than %d fields", maxObjectKeys)
		}
		spans[n] = [2]int{start, end}
		n++
		s.skipSpace()
		if s.peek() != ':' {
			return errBadJSON
		}
		s.pos++
		if err := s.value(depth + 1); err != nil {
			return err
		}
		s.skipSpace()
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return nil
		default:
			return errBadJSON
		}
	}
}

// skipValue consumes one JSON value (with no key checks) starting at the
// current position, which must not be white space.
// skipValue consumes one value and returns the deepest nesting of objects
// and arrays inside it (0 for a scalar).
func (s *keyScanner) skipValue() (deepest int) {
	depth := 0
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case '"':
			_, _, _ = s.str()
			if depth == 0 {
				return deepest
			}
			continue
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			if depth == 0 {
				return deepest // the end of the enclosing value: a scalar ended
			}
			depth--
			if depth == 0 {
				s.pos++
				return deepest
			}
		case ',', ':', ' ', '\t', '\r', '\n':
			if depth == 0 {
				return deepest
			}
		}
		s.pos++
	}
	return deepest
}

// str consumes a string starting at the opening quote and returns the span
// of its raw contents.
func (s *keyScanner) str() (start, end int, err error) {
	s.pos++ // opening quote
	start = s.pos
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case '\\':
			s.pos = min(s.pos+2, len(s.data)) // a trailing backslash ends the input
		case '"':
			end = s.pos
			s.pos++
			return start, end, nil
		default:
			s.pos++
		}
	}
	return 0, 0, errBadJSON
}
