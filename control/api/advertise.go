package api

import "time"

// AdvertisedEndpoint is where a route's traffic goes: the supervisor's
// advertised address (the Pod IP) and its app listener port.
type AdvertisedEndpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// AdvertisedRoute is one installed route as supervisors advertise it and
// as GET /v1/installations shows it. Hostname is the route's hostname
// (readable or hashed, see routes.Hostname), beside its readable parts.
type AdvertisedRoute struct {
	Hostname            string             `json:"hostname"`
	Workspace           string             `json:"workspace"`
	Sandbox             string             `json:"sandbox"`
	Name                string             `json:"name"` // "" for the unnamed service
	InstallationVersion uint64             `json:"installation_version"`
	DeclarationRevision int64              `json:"declaration_revision"`
	ExpiresAt           time.Time          `json:"expires_at"`
	Endpoint            AdvertisedEndpoint `json:"endpoint"`
	// Generation is the instance's generation from the configuration
	// document the route was installed from; the gateway publishes the
	// route only while it equals the generation its own document grants.
	Generation string `json:"generation,omitempty"`
	// Protocol is how the supervisor speaks to the route's app: "h2c"
	// (HTTP/2, gRPC) or omitted for HTTP/1.1 (see routes.ServiceSpec).
	Protocol string `json:"protocol,omitempty"`
	// Access is the route's access mode: "token" for a private service
	// (requests need an access token), omitted for a public one. Never a
	// secret.
	Access string `json:"access,omitempty"`
}

// InstallationSet is the body of PUT /v1/supervisors/{id}/installations
// and of GET /v1/installations.
type InstallationSet struct {
	Installations []AdvertisedRoute `json:"installations"`
	// Session is the advertising supervisor's session id (32 lowercase hex
	// characters, constant for the life of its process; see
	// supervisor.NewSessionID). Empty from supervisors that predate
	// sessions.
	Session string `json:"session,omitempty"`
}
