package ocsf

import (
	"log/slog"
	"strconv"
	"time"
)

// Entity types (managed_entity.type; type_id 99, Other: OCSF names none of
// them).
const (
	EntityRoute      = "Route"
	EntityInstance   = "Sandbox instance"
	EntityRouteTable = "Route table"
)

// RouteChange is one change of an installed route (routes.Event).
type RouteChange struct {
	Time time.Time
	// Kind is the route table's event: installed, changed, withdrawn,
	// rejected, expired, stopped.
	Kind    string
	Host    string
	Port    int
	Route   RouteRef
	Streams int    // streams closed
	Reason  string // why an instance entry was rejected
}

// routeKinds maps a route event to its activity, severity, level and the
// status detail that explains it.
var routeKinds = map[string]struct {
	activity, severity int
	level              slog.Level
	detail             string
}{
	"installed": {EntityCreate, SeverityInformational, slog.LevelInfo, "installed"},
	"changed":   {EntityUpdate, SeverityInformational, slog.LevelInfo, "target changed: new installation version, old streams closed"},
	"woken":     {EntityUpdate, SeverityInformational, slog.LevelInfo, "instance woken: the sleeping route serves again, same installation version"},
	"withdrawn": {EntityDelete, SeverityInformational, slog.LevelInfo, "withdrawn by the configuration source"},
	"rejected":  {EntityDelete, SeverityMedium, slog.LevelWarn, "instance entry rejected"},
	"expired":   {EntityDelete, SeverityMedium, slog.LevelWarn, "expired: not renewed within the route freshness"},
	"stopped":   {EntityUpdate, SeverityMedium, slog.LevelWarn, "sandbox connector gone: streams closed, route reinstalled"},
	"shutdown":  {EntityDelete, SeverityInformational, slog.LevelInfo, "listener shutting down"},
}

// RouteEvent is the Entity Management (3004) record of a route change.
// Expiries, rejections and connector losses are medium (warn), the rest
// informational (info).
func RouteEvent(c *RouteChange) *Event {
	k, ok := routeKinds[c.Kind]
	if !ok {
		k.activity, k.severity, k.level, k.detail = 99, SeverityInformational, slog.LevelInfo, c.Kind
	}
	e := newEvent(ClassEntityManagement, k.activity, k.severity, StatusSuccess, c.Time, k.level)
	if k.activity == 99 {
		e.ActivityName = c.Kind
	}
	e.Message = "route " + c.Kind
	e.StatusDetail = k.detail
	if c.Reason != "" {
		e.StatusDetail += ": " + c.Reason
	}
	data := map[string]any{"port": c.Port, "workspace": c.Route.Workspace, "sandbox": c.Route.Sandbox, "service": c.Route.Service}
	if c.Streams > 0 {
		data["streams_closed"] = c.Streams
	}
	e.Entity = &Entity{
		Name: c.Host, UID: c.Host, Type: EntityRoute, TypeID: 99,
		Version: strconv.FormatUint(c.Route.InstallationVersion, 10), Data: data,
	}
	e.Unmapped = c.Route.unmapped()
	if e.Unmapped != nil {
		e.Unmapped.StreamsClosed = c.Streams
	}
	return e
}

// InstanceRejection is an instance entry of a delivered document that
// failed validation.
type InstanceRejection struct {
	Time               time.Time
	Workspace, Sandbox string
	Index              int // the entry's index in the document
	Reason             string
	Revision           string // the document's revision
}

// InstanceRejected is the Entity Management (3004) record of an instance
// entry refused by validation: a Create that failed, medium (warn).
func InstanceRejected(r *InstanceRejection) *Event {
	e := newEvent(ClassEntityManagement, EntityCreate, SeverityMedium, StatusFailure, r.Time, slog.LevelWarn)
	e.Message = "instance rejected"
	e.StatusDetail = r.Reason
	name := r.Workspace + "--" + r.Sandbox
	if r.Workspace == "" && r.Sandbox == "" {
		name = "instances[" + strconv.Itoa(r.Index) + "]"
	}
	e.Entity = &Entity{Name: name, Type: EntityInstance, TypeID: 99, Version: r.Revision}
	idx := r.Index
	e.Unmapped = &Unmapped{Workspace: r.Workspace, Sandbox: r.Sandbox, InstanceIndex: &idx, Revision: r.Revision}
	return e
}

// TableChange is a change of the whole route table.
type TableChange struct {
	Time time.Time
	// Kind is "renewed" (a delivery renewed every route; debug),
	// "changed" (a change too large to record route by route; info) or
	// "closed" (the listener stopped; info).
	Kind     string
	Domain   string
	Revision string
	Routes   int
	// Counts are the route events of a change by kind.
	Counts  map[string]int
	Streams int // streams closed
	// FreshFor is how long the routes stay valid after a renewal.
	FreshFor time.Duration
}

// TableEvent is the Entity Management (3004) record of a table change.
func TableEvent(c *TableChange) *Event {
	activity, severity, level := EntityUpdate, SeverityInformational, slog.LevelInfo
	switch c.Kind {
	case "renewed":
		level = slog.LevelDebug
	case "closed":
		activity = EntityDelete
	}
	if c.Counts["expired"]+c.Counts["rejected"]+c.Counts["stopped"] > 0 {
		severity, level = SeverityMedium, slog.LevelWarn
	}
	e := newEvent(ClassEntityManagement, activity, severity, StatusSuccess, c.Time, level)
	e.Message = "routes " + c.Kind
	data := map[string]any{"routes": c.Routes}
	for k, n := range c.Counts {
		data[k] = n
	}
	if c.Streams > 0 {
		data["streams_closed"] = c.Streams
	}
	if c.FreshFor > 0 {
		data["fresh_for_ms"] = c.FreshFor.Milliseconds()
	}
	e.StatusDetail = c.Kind
	e.Entity = &Entity{Name: c.Domain, UID: c.Domain, Type: EntityRouteTable, TypeID: 99, Version: c.Revision, Data: data}
	if c.Domain == "" {
		e.Entity.Name, e.Entity.UID = "routes", "routes"
	}
	e.Unmapped = &Unmapped{Revision: c.Revision, StreamsClosed: c.Streams}
	return e
}
