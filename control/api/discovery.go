package api

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/applistener/applistener/routes"
)

// MaxDiscoverySnapshotBytes is the largest snapshot (one line) a client
// reads and a gateway serves; a gateway whose snapshot would be larger
// answers 503 rather than a truncated set.
const MaxDiscoverySnapshotBytes = 32 << 20

// RouteEndpoint is where a discovered route's traffic goes: the owning
// supervisor's advertised address (the Pod IP) and app listener port.
// Consumers connect there and keep the route's hostname as the TLS SNI and
// the HTTP Host.
type RouteEndpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// String returns "host:port" ("[v6]:port" for an IPv6 address).
func (e RouteEndpoint) String() string {
	if strings.IndexByte(e.Host, ':') >= 0 {
		return fmt.Sprintf("[%s]:%d", e.Host, e.Port)
	}
	return fmt.Sprintf("%s:%d", e.Host, e.Port)
}

// ServiceRoute is one published route of a discovery snapshot: an accepted
// installation of a supervisor, still unexpired and still granted to that
// supervisor by the gateway's configuration. Name is the sandbox route's
// service name ("" for the unnamed service), not a Kubernetes Service.
// Hostname is what clients send as SNI and Host: readable
// (workspace--sandbox--name.domain) when that fits in one DNS label,
// otherwise a hashed label (see routes.Label); Workspace, Sandbox and Name
// are always the readable parts.
type ServiceRoute struct {
	Hostname            string        `json:"hostname"`
	Workspace           string        `json:"workspace"`
	Sandbox             string        `json:"sandbox"`
	Name                string        `json:"name"`
	Supervisor          string        `json:"supervisor"`
	InstallationVersion uint64        `json:"installation_version"`
	DeclarationRevision int64         `json:"declaration_revision"`
	ExpiresAt           time.Time     `json:"expires_at"`
	Endpoint            RouteEndpoint `json:"endpoint"`
	// Protocol is "h2c" when the app speaks HTTP/2 with prior knowledge
	// (gRPC): its clients, and a proxy in front, must reach the listener
	// over HTTP/2 (TLS with ALPN h2). Omitted for HTTP/1.1 apps.
	Protocol string `json:"protocol,omitempty"`
	// Access is "token" when the service is private (its requests need an
	// access token, routes.AccessToken), omitted when it is public.
	Access string `json:"access,omitempty"`
}

// RouteSnapshot is the complete set of published routes of one workspace:
// the answer of GET /v1/workspaces/{ws}/service-routes and each line of its
// watch stream. Revision is a decimal counter that increases whenever the
// set changes. Routes are sorted by hostname.
type RouteSnapshot struct {
	Workspace string         `json:"workspace"`
	Revision  string         `json:"revision"`
	Routes    []ServiceRoute `json:"routes"`
}

// Unexpired returns a copy of s without the routes whose ExpiresAt is not
// after now. Consumers must drop a route at its expires_at even when the
// watch is silent; this is the helper for that. A nil s gives nil.
func (s *RouteSnapshot) Unexpired(now time.Time) *RouteSnapshot {
	if s == nil {
		return nil
	}
	out := &RouteSnapshot{Workspace: s.Workspace, Revision: s.Revision, Routes: make([]ServiceRoute, 0, len(s.Routes))}
	for _, r := range s.Routes {
		if now.Before(r.ExpiresAt) {
			out.Routes = append(out.Routes, r)
		}
	}
	return out
}

// NextExpiry returns the earliest ExpiresAt of s's routes, or the zero time
// when s has none.
func (s *RouteSnapshot) NextExpiry() time.Time {
	var next time.Time
	if s == nil {
		return next
	}
	for _, r := range s.Routes {
		if next.IsZero() || r.ExpiresAt.Before(next) {
			next = r.ExpiresAt
		}
	}
	return next
}

// Lookup returns the route whose hostname is host, or nil.
func (s *RouteSnapshot) Lookup(host string) *ServiceRoute {
	if s == nil {
		return nil
	}
	i, ok := slices.BinarySearchFunc(s.Routes, host, func(r ServiceRoute, h string) int { return strings.Compare(r.Hostname, h) })
	if !ok {
		return nil
	}
	return &s.Routes[i]
}

// EqualRoutes reports whether a and b publish the same routes.
func EqualRoutes(a, b []ServiceRoute) bool {
	return slices.EqualFunc(a, b, func(x, y ServiceRoute) bool {
		return x.Hostname == y.Hostname && x.Workspace == y.Workspace && x.Sandbox == y.Sandbox &&
			x.Name == y.Name && x.Supervisor == y.Supervisor && x.InstallationVersion == y.InstallationVersion &&
			x.DeclarationRevision == y.DeclarationRevision && x.ExpiresAt.Equal(y.ExpiresAt) && x.Endpoint == y.Endpoint &&
			x.Protocol == y.Protocol && x.Access == y.Access
	})
}

// CheckRoute validates a route of workspace ws: the hostname is normalized,
// it is exactly the hostname of the route's workspace, sandbox and service
// under its domain (readable, or the hashed label when the readable one does
// not fit; see routes.Hostname), the workspace is ws, and the endpoint is
// usable. The gateway applies it to advertisements and the client to
// snapshots, so that a route can never send a host of another workspace
// anywhere.
func CheckRoute(r *ServiceRoute, ws string) error {
	if r.Workspace != ws {
		return fmt.Errorf("route %.80q: workspace %.40q, want %q", r.Hostname, r.Workspace, ws)
	}
	if h, ok := routes.NormalizeHost(r.Hostname); !ok || h != r.Hostname {
		return fmt.Errorf("hostname %.80q: not a normalized (lower-case) host name", r.Hostname)
	}
	dot := strings.IndexByte(r.Hostname, '.')
	if dot < 0 {
		return fmt.Errorf("hostname %.80q: no domain", r.Hostname)
	}
	domain := r.Hostname[dot+1:]
	if err := routes.ValidDomain(domain); err != nil {
		return fmt.Errorf("hostname %.80q: %w", r.Hostname, err)
	}
	if _, err := routes.ParseHostname(r.Hostname, domain); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	if err := checkNames(r); err != nil {
		return fmt.Errorf("route %.80q: %w", r.Hostname, err)
	}
	if want := routes.Hostname(r.Workspace, r.Sandbox, r.Name, domain); r.Hostname != want {
		return fmt.Errorf("hostname %.80q does not name workspace %.40q, sandbox %.40q, service %.40q (that is %.80q)",
			r.Hostname, r.Workspace, r.Sandbox, r.Name, want)
	}
	if err := checkEndpoint(r.Endpoint); err != nil {
		return fmt.Errorf("route %.80q: %w", r.Hostname, err)
	}
	if r.ExpiresAt.IsZero() {
		return fmt.Errorf("route %.80q: no expires_at", r.Hostname)
	}
	if r.Protocol != "" && r.Protocol != routes.ProtocolH2C {
		return fmt.Errorf("route %.80q: protocol %.20q, want %q or none", r.Hostname, r.Protocol, routes.ProtocolH2C)
	}
	if r.Access != "" && r.Access != routes.AccessToken {
		return fmt.Errorf("route %.80q: access %.20q, want %q or none", r.Hostname, r.Access, routes.AccessToken)
	}
	return nil
}

// checkNames checks the route's workspace, sandbox and service names.
func checkNames(r *ServiceRoute) error {
	if err := routes.ValidName(r.Workspace); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if err := routes.ValidName(r.Sandbox); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if r.Name != "" {
		if err := routes.ValidName(r.Name); err != nil {
			return fmt.Errorf("service: %w", err)
		}
	}
	return nil
}

// checkEndpoint checks an endpoint: a host of at most 253 characters made of
// letters, digits, '.', '-', ':' (an IP address or a DNS name), and a port
// from 1 to 65535.
func checkEndpoint(e RouteEndpoint) error {
	if e.Host == "" || len(e.Host) > 253 {
		return fmt.Errorf("endpoint host %.80q: empty or too long", e.Host)
	}
	for i := 0; i < len(e.Host); i++ {
		c := e.Host[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == ':' {
			continue
		}
		return fmt.Errorf("endpoint host %.80q: character %q not allowed", e.Host, c)
	}
	if e.Port < 1 || e.Port > 65535 {
		return fmt.Errorf("endpoint port %d: want 1 to 65535", e.Port)
	}
	return nil
}
