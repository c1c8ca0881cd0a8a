// Package ocsf builds the Open Cybersecurity Schema Framework (OCSF 1.8.0)
// records applistener writes beside its diagnostic log (--ocsf-json) and
// as its access log (--access-log=ocsf), and writes them as JSON lines at
// a level of their own.
//
// Three classes are used:
//
//   - HTTP Activity (4002): one record per request decision (refusals,
//     upstream failures, and, at debug, allowed requests);
//   - Network Activity (4001): TLS connections refused before or during the
//     handshake, accepted connections (debug), app connections that failed;
//   - Entity Management (3004): route installations, changes, withdrawals,
//     expiries and rejections, renewals of the route table (debug), and
//     instance entries refused by validation. A route is a managed entity
//     that the listener creates, updates and deletes; Device Config State
//     Change (5019) describes the security state of a device and has only
//     the activities Log and Collect.
//
// Records never carry query strings, cookies or authorization values: the
// builders take only a path, and strip a query from it again.
//
// Files: event.go (the record and its objects), captions.go (the schema's
// names of classes, activities, severities), http.go, network.go,
// entity.go (the builders), emitter.go (levels and the writer).
package ocsf

import (
	"log/slog"
	"time"
)

// SchemaVersion is the OCSF version the records follow (metadata.version);
// internal/ocsf/ocsftest holds this version's schema.
const SchemaVersion = "1.8.0"

// Class and category ids.
const (
	CategoryIAM     = 3
	CategoryNetwork = 4

	ClassEntityManagement = 3004
	ClassNetworkActivity  = 4001
	ClassHTTPActivity     = 4002
)

// Severity ids (severity_id).
const (
	SeverityInformational = 1
	SeverityLow           = 2
	SeverityMedium        = 3
	SeverityHigh          = 4
)

// Status ids (status_id).
const (
	StatusSuccess = 1
	StatusFailure = 2
)

// Event is one OCSF record. The builders fill the attributes of their
// class; the others stay empty and are left out of the JSON.
type Event struct {
	ActivityID   int       `json:"activity_id"`
	ActivityName string    `json:"activity_name,omitempty"`
	CategoryUID  int       `json:"category_uid"`
	CategoryName string    `json:"category_name,omitempty"`
	ClassUID     int       `json:"class_uid"`
	ClassName    string    `json:"class_name,omitempty"`
	TypeUID      int       `json:"type_uid"`
	TypeName     string    `json:"type_name,omitempty"`
	SeverityID   int       `json:"severity_id"`
	Severity     string    `json:"severity,omitempty"`
	StatusID     int       `json:"status_id"`
	Status       string    `json:"status,omitempty"`
	StatusDetail string    `json:"status_detail,omitempty"`
	Message      string    `json:"message,omitempty"`
	Time         int64     `json:"time"` // milliseconds since the epoch
	StartTime    int64     `json:"start_time,omitempty"`
	EndTime      int64     `json:"end_time,omitempty"`
	Duration     int64     `json:"duration,omitempty"` // milliseconds
	TimezoneOff  int       `json:"timezone_offset"`    // always UTC
	Metadata     Metadata  `json:"metadata"`
	SrcEndpoint  *Endpoint `json:"src_endpoint,omitempty"`
	DstEndpoint  *Endpoint `json:"dst_endpoint,omitempty"`
	HTTPRequest  *Request  `json:"http_request,omitempty"`
	HTTPResponse *Response `json:"http_response,omitempty"`
	TLS          *TLS      `json:"tls,omitempty"`
	Traffic      *Traffic  `json:"traffic,omitempty"`
	Entity       *Entity   `json:"entity,omitempty"`
	Unmapped     *Unmapped `json:"unmapped,omitempty"`

	// Level is the record's level for the emitter's filter (--ocsf-level).
	Level slog.Level `json:"-"`
}

// Metadata is the record's metadata object.
type Metadata struct {
	Product Product `json:"product"`
	Version string  `json:"version"` // the OCSF schema version
}

// Product names the software that wrote the record.
type Product struct {
	Name       string `json:"name"`
	VendorName string `json:"vendor_name"`
	Version    string `json:"version,omitempty"`
}

// Endpoint is a network_endpoint object.
type Endpoint struct {
	IP       string `json:"ip,omitempty"`
	Port     int    `json:"port,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	Name     string `json:"name,omitempty"`
	SvcName  string `json:"svc_name,omitempty"`
}

// Request is an http_request object.
type Request struct {
	HTTPMethod string `json:"http_method,omitempty"`
	URL        *URL   `json:"url,omitempty"`
	Version    string `json:"version,omitempty"`
	// UID is the request's id (X-Request-Id).
	UID       string `json:"uid,omitempty"`
	UserAgent string `json:"user_agent,omitempty"`
	Referrer  string `json:"referrer,omitempty"`
}

// URL is a url object, without query string.
type URL struct {
	URLString string `json:"url_string,omitempty"`
	Scheme    string `json:"scheme,omitempty"`
	Hostname  string `json:"hostname,omitempty"`
	Path      string `json:"path"`
}

// Response is an http_response object.
type Response struct {
	Code    int `json:"code"`
	Latency int `json:"latency,omitempty"` // milliseconds to the app's response head
}

// TLS is a tls object.
type TLS struct {
	Version string `json:"version"`
	SNI     string `json:"sni,omitempty"`
}

// Traffic is a network_traffic object. In OCSF, bytes_out flow from the
// source (the client) to the destination and bytes_in back.
type Traffic struct {
	Bytes    int64 `json:"bytes"`
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
}

// Entity is a managed_entity object: a route, an instance entry, or the
// route table.
type Entity struct {
	Name    string `json:"name,omitempty"`
	UID     string `json:"uid,omitempty"`
	Type    string `json:"type,omitempty"`
	TypeID  int    `json:"type_id"`
	Version string `json:"version,omitempty"`
	Data    any    `json:"data,omitempty"`
}

// Unmapped holds what OCSF has no attribute for: the route's owner and the
// listener's own details.
type Unmapped struct {
	Workspace           string `json:"workspace,omitempty"`
	Sandbox             string `json:"sandbox,omitempty"`
	Service             string `json:"service,omitempty"` // absent: the unnamed service
	InstallationVersion uint64 `json:"installation_version,omitempty"`
	Protocol            string `json:"protocol,omitempty"` // h1, h2, ws
	UpstreamConnectMs   *int64 `json:"upstream_connect_ms,omitempty"`
	StreamsClosed       int    `json:"streams_closed,omitempty"`
	InstanceIndex       *int   `json:"instance_index,omitempty"`
	Revision            string `json:"revision,omitempty"`
	// Wake and WakeHeldMs: how a request for a sleeping instance fared
	// and how long it was held (HTTP Activity).
	Wake       string `json:"wake,omitempty"`
	WakeHeldMs *int64 `json:"wake_held_ms,omitempty"`
}

// RouteRef names the route a record is about.
type RouteRef struct {
	Workspace, Sandbox, Service string
	InstallationVersion         uint64
}

func (r RouteRef) unmapped() *Unmapped {
	if r.Workspace == "" && r.Sandbox == "" {
		return nil
	}
	return &Unmapped{Workspace: r.Workspace, Sandbox: r.Sandbox, Service: r.Service, InstallationVersion: r.InstallationVersion}
}

// newEvent fills the class, activity, severity and status attributes and
// their captions.
func newEvent(class, activity, severity, status int, t time.Time, level slog.Level) *Event {
	cl := classes[class]
	e := &Event{
		ActivityID:   activity,
		ActivityName: cl.activities[activity],
		CategoryUID:  cl.category,
		CategoryName: categoryNames[cl.category],
		ClassUID:     class,
		ClassName:    cl.name,
		TypeUID:      class*100 + activity,
		SeverityID:   severity,
		Severity:     severityNames[severity],
		StatusID:     status,
		Status:       statusNames[status],
		Time:         millis(t),
		Level:        level,
	}
	if e.ActivityName != "" {
		e.TypeName = cl.name + ": " + e.ActivityName
	}
	return e
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UnixMilli()
}
