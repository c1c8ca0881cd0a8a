package dispatch

import (
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
)

// Access log formats (Config.AccessLog).
const (
	AccessLogOff  = "off"
	AccessLogText = "text"
	AccessLogJSON = "json"
	// AccessLogOCSF writes each line as an OCSF HTTP Activity record
	// (class 4002, ocsf.go).
	AccessLogOCSF = "ocsf"
)

// Access log rate bound defaults: per instance (Config.AccessLogRate,
// AccessLogBurst) and for the whole process (Config.AccessLogTotalRate,
// AccessLogTotalBurst).
const (
	DefaultAccessLogRate       = 100
	DefaultAccessLogBurst      = 200
	DefaultAccessLogTotalRate  = 10000
	DefaultAccessLogTotalBurst = 20000
)

// Protocols of an access-log record (the protocol label of
// applistener_request_duration_seconds).
const (
	protoH1 = iota
	protoH2
	protoWS
	numProtos
)

var protoNames = [numProtos]string{"h1", "h2", "ws"}

// Outcomes of a request (the outcome label).
const (
	outcomeOK            = iota // the app's response was relayed whole
	outcomeDenied               // the listener answered itself (4xx, 503)
	outcomeUpstreamError        // the app failed: the listener answered 502 or 504
	outcomeAborted              // the client or the app went away mid-way
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "denied", "upstream_error", "aborted"}

// statusClientClosed is the status logged for a request that got no answer
// because the client went away (nginx's convention).
const statusClientClosed = 499

// accessRecord is what is known of one request (or WebSocket) when it ends.
// Method and path are either byte slices into the request head (HTTP/1.1,
// valid until the next request) or strings.
type accessRecord struct {
	open      bool // a request is being handled (HTTP/1.1)
	wsOpened  bool // upgraded counted the WebSocket open in its instance
	proto     uint8
	overH2    bool // a WebSocket over HTTP/2 (extended CONNECT)
	outcome   uint8
	parsed    bool // method and path are known
	status    int
	start     time.Time
	mb, pb    []byte
	ms, ps    string
	reason    string
	bytesIn   int64
	bytesOut  int64
	connect   time.Duration // -1: no app connection was made
	firstByte time.Duration // -1: no response head arrived
}

// begin resets r for a request of proto starting now.
func (r *accessRecord) begin(proto uint8) {
	*r = accessRecord{open: true, proto: proto, start: time.Now(), connect: -1, firstByte: -1}
}

// upgraded records that the request became a WebSocket of inst (status
// 101, or 200 for an extended CONNECT), whose seconds the instance's usage
// counts while it is open.
func (r *accessRecord) upgraded(status int, inst *routes.Instance) {
	r.proto, r.status, r.outcome = protoWS, status, outcomeOK
	inst.WebSocketOpened(r.start)
	r.wsOpened = true
}

// denied records the listener's own answer d.
func (r *accessRecord) denied(d denial) {
	r.status, r.reason = d.status, d.reason
	r.outcome = outcomeDenied
	if d.status == 502 || d.status == 504 {
		r.outcome = outcomeUpstreamError
	}
}

// timings copies the upstream timings of x and the bytes it relayed.
func (r *accessRecord) timings(x *exchange) {
	r.connect, r.firstByte, r.bytesOut = x.connectDur, x.firstByteDur, x.bytesOut
}

// accessLog writes one line per request through the log writer, bounded per
// instance by a token bucket and for the whole process by total.
type accessLog struct {
	w        io.Writer
	json     bool
	ocsf     *ocsf.Emitter // non-nil: lines are OCSF records (its metadata)
	instance rateBound     // the bound of each instance (each has a copy in buckets)
	total    rateBound     // lines of every instance together
	dropped  prometheus.Counter

	buckets   sync.Map // *routes.Instance → *rateBound
	nBuckets  atomic.Int64
	lastPrune atomic.Int64 // unix nanoseconds
	bufs      sync.Pool    // *[]byte
}

// pruneAbove is the number of instance buckets beyond which idle ones (full
// again for a minute) are forgotten.
const pruneAbove = 1024

func newAccessLog(cfg *Config, dropped prometheus.Counter) *accessLog {
	if cfg.AccessLogWriter == nil {
		return nil
	}
	l := &accessLog{w: cfg.AccessLogWriter, dropped: dropped}
	switch cfg.AccessLog {
	case AccessLogText:
	case AccessLogJSON:
		l.json = true
	case AccessLogOCSF:
		l.ocsf = cfg.OCSF
		if l.ocsf == nil {
			l.ocsf = ocsf.NewEmitter(nil, ocsf.LevelOff, ocsf.DefaultProduct)
		}
	default:
		return nil
	}
	rate, burst := cfg.AccessLogRate, cfg.AccessLogBurst
	if rate == 0 {
		rate = DefaultAccessLogRate
	}
	if burst <= 0 {
		burst = int(max(1, 2*rate))
	}
	l.instance.init(rate, burst)
	total, totalBurst := cfg.AccessLogTotalRate, cfg.AccessLogTotalBurst
	if total == 0 {
		total = DefaultAccessLogTotalRate
	}
	if totalBurst <= 0 {
		totalBurst = int(max(1, 2*total))
	}
	l.total.init(total, totalBurst)
	l.bufs.New = func() any { b := make([]byte, 0, 512); return &b }
	return l
}

// allow takes a token from inst's bucket, then one from the process's.
func (l *accessLog) allow(inst *routes.Instance, now int64) bool {
	return l.allowInstance(inst, now) && l.total.allow(now)
}

// allowInstance takes a token from inst's bucket.
func (l *accessLog) allowInstance(inst *routes.Instance, now int64) bool {
	if l.instance.interval == 0 {
		return true
	}
	v, ok := l.buckets.Load(inst)
	if !ok {
		var loaded bool
		v, loaded = l.buckets.LoadOrStore(inst, &rateBound{interval: l.instance.interval, window: l.instance.window})
		if !loaded && l.nBuckets.Add(1) > pruneAbove {
			l.prune(now)
		}
	}
	return v.(*rateBound).allow(now)
}

// prune forgets buckets idle for a minute (at most once a minute): a bucket
// that would be full again is the same as none.
func (l *accessLog) prune(now int64) {
	const idle = int64(time.Minute)
	last := l.lastPrune.Load()
	if now-last < idle || !l.lastPrune.CompareAndSwap(last, now) {
		return
	}
	l.buckets.Range(func(k, v any) bool {
		if now-v.(*rateBound).tat.Load() > idle {
			l.buckets.Delete(k)
			l.nBuckets.Add(-1)
		}
		return true
	})
}

// connInfo is what a client connection contributes to its requests' lines.
type connInfo struct {
	route  *routes.Route
	sni    string
	peer   netip.Addr
	tlsVer uint16
	// For the OCSF records' endpoints: the client's address (a permitted
	// PROXY header's source) and the connection (nil in some tests).
	client netip.AddrPort
	raw    net.Conn
}

// tlsVersionOf returns the negotiated TLS version of conn (0 when it is
// not a TLS connection).
func tlsVersionOf(conn any) uint16 {
	if tc, ok := conn.(*tls.Conn); ok {
		return tc.ConnectionState().Version
	}
	return 0
}

// endRequest counts the request in its instance's usage, observes the
// request's histograms and writes its access-log line.
func (s *Server) endRequest(r *accessRecord, ci *connInfo) {
	r.open = false
	if r.wsOpened {
		r.wsOpened = false
		ci.route.Instance.WebSocketClosed(r.start)
	}
	if s.noObserve {
		return
	}
	end := time.Now()
	d := end.Sub(r.start)
	var ws time.Duration
	if r.proto == protoWS {
		ws = d
	}
	ci.route.Instance.CountEnded(r.bytesIn, r.bytesOut, ws, end)
	if r.status == 0 {
		r.status = statusClientClosed
		r.outcome = outcomeAborted
	}
	s.m.reqDuration[r.proto][r.outcome].Observe(d.Seconds())
	if r.connect >= 0 {
		s.m.upstreamConnect.Observe(r.connect.Seconds())
	}
	if r.firstByte >= 0 {
		s.m.upstreamFirstByte.Observe(r.firstByte.Seconds())
	}
	// The OCSF record of the request (--ocsf-json at its level), unless
	// the access log writes it (--access-log=ocsf): one record each.
	emit := s.cfg.OCSF.Enabled(ocsfOutcomes[r.outcome].Level())
	if l := s.alog; l != nil {
		if !l.allow(ci.route.Instance, end.UnixNano()) {
			l.dropped.Inc()
		} else {
			bp := l.bufs.Get().(*[]byte)
			if l.ocsf != nil {
				*bp = l.ocsf.Append((*bp)[:0], ocsfHTTP(r, ci, end))
				emit = false
			} else {
				*bp = l.appendLine((*bp)[:0], r, ci, end, d)
			}
			_, _ = l.w.Write(*bp)
			if cap(*bp) <= 64<<10 {
				l.bufs.Put(bp)
			}
		}
	}
	if emit {
		s.cfg.OCSF.Emit(ocsfHTTP(r, ci, end))
	}
}

// appendLine formats one access-log line.
func (l *accessLog) appendLine(b []byte, r *accessRecord, ci *connInfo, end time.Time, d time.Duration) []byte {
	f := fieldWriter{b: b, json: l.json}
	if f.json {
		f.b = append(f.b, '{')
	}
	f.key("time")
	if f.json {
		f.b = append(f.b, '"')
	}
	f.b = appendTime(f.b, end)
	if f.json {
		f.b = append(f.b, '"')
	}
	f.str("level", "INFO")
	f.str("msg", "access")
	f.str("protocol", protoNames[r.proto])
	if r.proto == protoWS {
		// How the client opened it: an HTTP/1.1 upgrade or an HTTP/2
		// extended CONNECT.
		if r.overH2 {
			f.str("transport", "h2")
		} else {
			f.str("transport", "h1")
		}
	}
	rt := ci.route
	f.str("workspace", rt.Workspace)
	f.str("sandbox", rt.Sandbox)
	f.str("service", rt.Service)
	f.str("host", ci.sni)
	switch {
	case !r.parsed:
		f.str("method", "")
		f.str("path", "")
	case r.mb != nil:
		f.bytes("method", r.mb)
		f.bytes("path", pathPart(r.pb))
	default:
		f.str("method", r.ms)
		f.str("path", pathPart(r.ps))
	}
	f.num("status", int64(r.status))
	f.num("bytes_in", r.bytesIn)
	f.num("bytes_out", r.bytesOut)
	f.secs("duration", d)
	if r.connect >= 0 {
		f.secs("upstream_connect", r.connect)
	}
	if r.firstByte >= 0 {
		f.secs("upstream_first_byte", r.firstByte)
	}
	f.str("tls", ocsf.TLSVersionName(ci.tlsVer))
	if ci.peer.IsValid() {
		f.key("client")
		if f.json {
			f.b = append(f.b, '"')
		}
		f.b = ci.peer.AppendTo(f.b)
		if f.json {
			f.b = append(f.b, '"')
		}
	} else {
		f.str("client", "")
	}
	if r.reason != "" {
		f.str("reason", r.reason)
	}
	f.num("installation_version", int64(rt.InstallationVersion))
	if f.json {
		f.b = append(f.b, '}')
	}
	return append(f.b, '\n')
}

// pathPart is p without its query string or fragment: logs never carry
// them.
func pathPart[T string | []byte](p T) T {
	for i := 0; i < len(p); i++ {
		if p[i] == '?' || p[i] == '#' {
			return p[:i]
		}
	}
	return p
}

// fieldWriter appends key/value pairs as logfmt (key=value, values quoted
// when needed) or as the members of a JSON object.
type fieldWriter struct {
	b     []byte
	json  bool
	first bool
}

func (f *fieldWriter) key(k string) {
	if f.json {
		if f.first {
			f.b = append(f.b, ',')
		}
		f.b = append(f.b, '"')
		f.b = append(f.b, k...)
		f.b = append(f.b, '"', ':')
	} else {
		if f.first {
			f.b = append(f.b, ' ')
		}
		f.b = append(f.b, k...)
		f.b = append(f.b, '=')
	}
	f.first = true
}

func (f *fieldWriter) str(k, v string) {
	f.key(k)
	f.b = appendValue(f.b, v, f.json)
}

func (f *fieldWriter) bytes(k string, v []byte) {
	f.key(k)
	f.b = appendValue(f.b, v, f.json)
}

func (f *fieldWriter) num(k string, v int64) {
	f.key(k)
	f.b = strconv.AppendInt(f.b, v, 10)
}

// secs appends d in seconds with microsecond precision (0.000512).
func (f *fieldWriter) secs(k string, d time.Duration) {
	f.key(k)
	us := max(d.Microseconds(), 0)
	f.b = strconv.AppendInt(f.b, us/1e6, 10)
	f.b = append(f.b, '.')
	f.b = appendDigits(f.b, int(us%1e6), 6)
}

// appendTime appends t in UTC as RFC 3339 with microseconds
// (2026-12-01T15:04:05.123456Z), without time.Format's layout parsing; the
// part up to the second is formatted once per second (secondCache).
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	sec := t.Unix()
	c := lastSecond.Load()
	if c == nil || c.sec != sec {
		c = &secondPrefix{sec: sec}
		y, mo, d := t.Date()
		h, mi, s := t.Clock()
		p := c.text[:0]
		p = appendDigits(p, y, 4)
		p = append(p, '-')
		p = appendDigits(p, int(mo), 2)
		p = append(p, '-')
		p = appendDigits(p, d, 2)
		p = append(p, 'T')
		p = appendDigits(p, h, 2)
		p = append(p, ':')
		p = appendDigits(p, mi, 2)
		p = append(p, ':')
		p = appendDigits(p, s, 2)
		c.n = len(p)
		lastSecond.Store(c)
	}
	b = append(b, c.text[:c.n]...)
	b = append(b, '.')
	b = appendDigits(b, t.Nanosecond()/1000, 6)
	return append(b, 'Z')
}

// secondPrefix is "2026-12-01T15:04:05" for the Unix second sec.
type secondPrefix struct {
	sec  int64
	n    int
	text [24]byte
}

// lastSecond is the prefix of the last second appendTime formatted.
var lastSecond atomic.Pointer[secondPrefix]

// appendDigits appends v (0 <= v < 10^width) zero-padded to width digits.
func appendDigits(b []byte, v, width int) []byte {
	var buf [8]byte
	for i := width - 1; i >= 0; i-- {
		buf[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, buf[:width]...)
}

const hexDigits = "0123456789abcdef"

// appendValue appends v as a JSON string, or as a logfmt value: bare when
// it holds only printable ASCII other than space, '"', '=' and '\',
// quoted otherwise. Control bytes and invalid UTF-8 are escaped.
func appendValue[T string | []byte](b []byte, v T, json bool) []byte {
	if !json && len(v) > 0 && bareValue(v) {
		return append(b, v...)
	}
	b = append(b, '"')
	if plainJSON(v) {
		b = append(b, v...)
		return append(b, '"')
	}
	for i := 0; i < len(v); {
		c := v[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := decodeRune(v[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, v[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

func decodeRune[T string | []byte](v T) (rune, int) {
	switch s := any(v).(type) {
	case string:
		return utf8.DecodeRuneInString(s)
	case []byte:
		return utf8.DecodeRune(s)
	}
	return utf8.RuneError, 1
}

// plainJSON reports whether v goes into a JSON string as it is: printable
// ASCII without '"' or '\'.
func plainJSON[T string | []byte](v T) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func bareValue[T string | []byte](v T) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= ' ' || c >= 0x7f || c == '"' || c == '=' || c == '\\' {
			return false
		}
	}
	return true
}
