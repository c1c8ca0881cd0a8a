package routes

import (
	"log/slog"
	"time"

	"github.com/applistener/applistener/internal/ocsf"
)

// OCSF records of the route table (Options.OCSF): an Entity Management
// record per route event (installed: Create; changed, stopped: Update;
// withdrawn, rejected, expired: Delete), and records of the whole table
// (renewed at debug, closed, and a summary of a change too large to record
// route by route, whose route records are then at debug).

func (t *Table) ocsfEvents(events []Event) {
	em := t.opts.OCSF
	if len(events) == 0 || !em.Enabled(slog.LevelDebug) && !em.Enabled(slog.LevelInfo) && !em.Enabled(slog.LevelWarn) {
		return
	}
	now := time.Now()
	large := len(events) > maxEventLines
	if large {
		counts := map[string]int{}
		streams := 0
		for _, e := range events {
			counts[e.Kind]++
			streams += e.Streams
		}
		em.Emit(ocsf.TableEvent(&ocsf.TableChange{
			Time: now, Kind: "changed", Domain: t.opts.Domain, Revision: t.snap.Load().Revision,
			Routes: t.snap.Load().Len(), Counts: counts, Streams: streams,
		}))
		if !em.Enabled(slog.LevelDebug) {
			return
		}
	}
	for _, e := range events {
		rec := ocsf.RouteEvent(&ocsf.RouteChange{
			Time: now, Kind: e.Kind, Host: e.Host, Port: e.Port, Streams: e.Streams, Reason: e.Reason,
			Route: ocsf.RouteRef{Workspace: e.Workspace, Sandbox: e.Sandbox, Service: e.Service, InstallationVersion: e.Version},
		})
		if large {
			rec.Level = slog.LevelDebug
		}
		em.Emit(rec)
	}
}

// ocsfTable records a change of the whole table: "renewed" or "closed".
func (t *Table) ocsfTable(kind string, routes, streams int) {
	em := t.opts.OCSF
	if em == nil {
		return
	}
	rec := ocsf.TableEvent(&ocsf.TableChange{
		Time: time.Now(), Kind: kind, Domain: t.opts.Domain, Revision: t.snap.Load().Revision,
		Routes: routes, Streams: streams, FreshFor: t.opts.Freshness,
	})
	if kind == "closed" {
		rec.Entity.Data = map[string]any{"routes": routes, "streams_closed": streams}
	}
	em.Emit(rec)
}

// routeEvent is the event kind of route r.
func routeEvent(kind string, r *Route) Event {
	return Event{Kind: kind, Host: r.Host, Port: r.Port, Version: r.InstallationVersion,
		Workspace: r.Workspace, Sandbox: r.Sandbox, Service: r.Service}
}
