package ocsf

import (
	"crypto/tls"
	"log/slog"
	"net/netip"
	"strings"
	"time"
)

// Outcome is what the listener decided for a request.
type Outcome uint8

// Outcomes of a request.
const (
	// Allowed: the request reached the app and its answer was relayed.
	Allowed Outcome = iota
	// Denied: the listener answered itself (421, 503, 4xx).
	Denied
	// UpstreamError: the app failed; the listener answered 502 or 504.
	UpstreamError
	// Aborted: the client or the app went away before the answer ended.
	Aborted
)

// Level is the emitter level of a request record with this outcome:
// refusals at info, upstream failures at warn, allowed and aborted
// requests at debug (the access log has one line for each of them).
func (o Outcome) Level() slog.Level {
	switch o {
	case Denied:
		return slog.LevelInfo
	case UpstreamError:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// HTTP is what is known of one request when the listener decided it (or,
// for an allowed request, when it ended).
type HTTP struct {
	Start, End time.Time
	// Method and Path are the request's, Path without its query (a query
	// is stripped again here). Method "" when the request line was not
	// read.
	Method, Path string
	// Host is the public hostname (the SNI the route was found by).
	Host string
	// Version is the HTTP version: "1.1" or "2".
	Version string
	// Status is the answer's status code; 0 when there was none.
	Status  int
	Outcome Outcome
	// Reason is the listener's reason for its own answer.
	Reason     string
	Src, Dst   netip.AddrPort
	TLSVersion uint16
	// BytesIn were read from the client (request body or WebSocket
	// frames), BytesOut written to it.
	BytesIn, BytesOut int64
	// Connect and FirstByte are the app connection's times; negative:
	// none was made, no response head arrived.
	Connect, FirstByte time.Duration
	Route              RouteRef
	Protocol           string // h1, h2 or ws
	// RequestID is the request's id (http_request.uid): the X-Request-Id
	// the app and the client saw.
	RequestID string
	// UserAgent and Referrer are the client's (the referrer without its
	// query: it is stripped again here); "" when it sent none.
	UserAgent, Referrer string
	// Wake is how a request for a sleeping instance fared (woken,
	// timeout, overflow, refused, not_woken, ...; "" when the instance
	// was not sleeping) and WakeHeld how long it was held.
	Wake     string
	WakeHeld time.Duration
}

// HTTPActivity is the HTTP Activity (4002) record of h.
func HTTPActivity(h *HTTP) *Event {
	severity, status, msg := SeverityInformational, StatusSuccess, "request allowed"
	switch h.Outcome {
	case Denied:
		severity, status, msg = SeverityLow, StatusFailure, "request denied"
	case UpstreamError:
		severity, status, msg = SeverityMedium, StatusFailure, "request failed upstream"
	case Aborted:
		status, msg = StatusFailure, "request aborted"
	}
	method := strings.ToUpper(h.Method)
	activity := httpActivity(method)
	e := newEvent(ClassHTTPActivity, activity, severity, status, h.End, h.Outcome.Level())
	if activity == 99 {
		e.ActivityName = method
	}
	e.Message = msg
	e.StatusDetail = h.Reason
	if h.Outcome == Aborted && h.Reason == "" {
		e.StatusDetail = "the client or the app went away before the answer ended"
	}
	if !h.Start.IsZero() {
		e.StartTime = h.Start.UnixMilli()
		e.EndTime = e.Time
		e.Duration = h.End.Sub(h.Start).Milliseconds()
	}
	e.SrcEndpoint = endpointOf(h.Src, "")
	e.DstEndpoint = endpointOf(h.Dst, h.Host)
	if method != "" || h.RequestID != "" {
		req := &Request{Version: h.Version, UID: h.RequestID, UserAgent: h.UserAgent, Referrer: pathOnly(h.Referrer)}
		if httpRequestMethods[method] {
			req.HTTPMethod = method
		}
		if method != "" {
			path := pathOnly(h.Path)
			req.URL = &URL{Scheme: "https", Hostname: h.Host, Path: path}
			if h.Host != "" && strings.HasPrefix(path, "/") {
				req.URL.URLString = "https://" + h.Host + path
			}
		}
		e.HTTPRequest = req
	}
	if h.Status > 0 && (h.Outcome != Aborted || h.Status != 499) {
		e.HTTPResponse = &Response{Code: h.Status}
		if h.FirstByte >= 0 {
			e.HTTPResponse.Latency = int(h.FirstByte.Milliseconds())
		}
	}
	if e.HTTPRequest == nil && e.HTTPResponse == nil {
		// The class needs one of them: a request refused before its
		// request line was read.
		e.HTTPResponse = &Response{Code: h.Status}
	}
	if v := TLSVersionName(h.TLSVersion); v != "" {
		e.TLS = &TLS{Version: v, SNI: h.Host}
	}
	e.Traffic = &Traffic{Bytes: h.BytesIn + h.BytesOut, BytesIn: h.BytesOut, BytesOut: h.BytesIn}
	u := h.Route.unmapped()
	if u == nil {
		u = &Unmapped{}
	}
	u.Protocol = h.Protocol
	if h.Connect >= 0 {
		ms := h.Connect.Milliseconds()
		u.UpstreamConnectMs = &ms
	}
	if h.Wake != "" {
		ms := h.WakeHeld.Milliseconds()
		u.Wake, u.WakeHeldMs = h.Wake, &ms
	}
	e.Unmapped = u
	return e
}

// endpointOf is a network endpoint of ap and hostname; nil when neither is
// known.
func endpointOf(ap netip.AddrPort, hostname string) *Endpoint {
	if !ap.IsValid() && hostname == "" {
		return nil
	}
	ep := &Endpoint{Hostname: hostname}
	if ap.IsValid() {
		ep.IP = ap.Addr().Unmap().String()
		ep.Port = int(ap.Port())
	}
	return ep
}

// pathOnly is p without its query string or fragment.
func pathOnly(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		return p[:i]
	}
	return p
}

// TLSVersionName is the TLS version as OCSF writes it ("1.3"), "" when
// unknown.
func TLSVersionName(v uint16) string {
	switch v {
	case tls.VersionTLS13:
		return "1.3"
	case tls.VersionTLS12:
		return "1.2"
	case tls.VersionTLS11:
		return "1.1"
	case tls.VersionTLS10:
		return "1.0"
	}
	return ""
}
