package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/applistener/applistener/control/api"
)

// The store's records of supervisors (store.go's ads/ and sessions/ keys):
// as stored (JSON) and as the view holds them, with the validation of an
// advertisement's entries.

// advertisement is the last installations body of one supervisor,
// as the view holds it (decoded from its advertisementRecord).
type advertisement struct {
	received      time.Time
	body          []byte            // compact JSON object
	installations []json.RawMessage // the "installations" entries
	routes        []advertisedRoute // the valid entries
	rejected      string            // why the others were left out, for logs
	// session is the session that made it ("" for a supervisor that sends
	// none); it is published only while that session is current.
	session string
	// digest is the SHA-256 of the token that made it (the credential
	// epoch): it is published only while that token still grants the
	// supervisor.
	digest [sha256.Size]byte
	// source is the address the advertisement came from, for the endpoint
	// policy.
	source string
	modRev int64
}

// advertisementRecord is the stored value of ads/<supervisor>.
type advertisementRecord struct {
	Session  string    `json:"session,omitempty"`
	Token    string    `json:"token_sha256"`
	Source   string    `json:"source"`
	Received time.Time `json:"received"`
	// Since is, per hostname, when the gateway first saw the installation
	// (Unix nanoseconds): the incumbent of a contested hostname is the
	// oldest, on every replica alike.
	Since map[string]int64 `json:"since,omitempty"`
	// Body is the installations body as received, compacted.
	Body json.RawMessage `json:"body"`
}

// decodeAdvertisement decodes a stored advertisement of supervisor sup.
func decodeAdvertisement(sup string, value []byte, modRev int64) (advertisement, error) {
	var rec advertisementRecord
	if err := json.Unmarshal(value, &rec); err != nil {
		return advertisement{}, fmt.Errorf("advertisement record: %w", err)
	}
	adv, _, err := parseInstallations(rec.Body)
	if err != nil {
		return advertisement{}, err
	}
	d, err := hex.DecodeString(rec.Token)
	if err != nil || len(d) != sha256.Size {
		return advertisement{}, errors.New("advertisement record: bad token_sha256")
	}
	copy(adv.digest[:], d)
	adv.received, adv.session, adv.source, adv.modRev = rec.Received, rec.Session, rec.Source, modRev
	var rejected []string
	adv.routes, rejected = parseAdvertisedRoutes(sup, adv.installations, rec.Received)
	adv.rejected = strings.Join(rejected, "; ")
	for i := range adv.routes {
		if ns, ok := rec.Since[adv.routes[i].Hostname]; ok {
			adv.routes[i].since = time.Unix(0, ns)
		}
	}
	return adv, nil
}

// advertisedRoute is one valid advertised installation.
type advertisedRoute struct {
	api.ServiceRoute
	// generation is the instance generation the supervisor installed ("" from
	// supervisors that send none).
	generation string
	// since is when the gateway first saw this installation (supervisor,
	// hostname, installation_version, endpoint); renewals keep it.
	since time.Time
}

// advertisedEntry is an installations entry as received. Required fields
// are pointers so that a missing one is told from a zero value. Unknown
// fields are ignored.
type advertisedEntry struct {
	Hostname            *string            `json:"hostname"`
	Workspace           *string            `json:"workspace"`
	Sandbox             *string            `json:"sandbox"`
	Name                *string            `json:"name"`
	InstallationVersion *uint64            `json:"installation_version"`
	DeclarationRevision *int64             `json:"declaration_revision"`
	ExpiresAt           *time.Time         `json:"expires_at"`
	Endpoint            *api.RouteEndpoint `json:"endpoint"`
	Generation          string             `json:"generation"`
	Protocol            string             `json:"protocol"`
	Access              string             `json:"access"`
}

// parseAdvertisedRoutes validates the entries of supervisor sup's
// advertisement received at now. Invalid entries are left out and
// described in rejected (one line each).
func parseAdvertisedRoutes(sup string, entries []json.RawMessage, now time.Time) (out []advertisedRoute, rejected []string) {
	seen := make(map[string]bool, len(entries))
	for i, raw := range entries {
		var e advertisedEntry
		if err := json.Unmarshal(raw, &e); err != nil {
			rejected = append(rejected, fmt.Sprintf("installations[%d]: %v", i, err))
			continue
		}
		var missing []string
		for _, f := range []struct {
			name string
			ok   bool
		}{
			{"hostname", e.Hostname != nil}, {"workspace", e.Workspace != nil}, {"sandbox", e.Sandbox != nil},
			{"installation_version", e.InstallationVersion != nil}, {"expires_at", e.ExpiresAt != nil},
			{"endpoint", e.Endpoint != nil},
		} {
			if !f.ok {
				missing = append(missing, f.name)
			}
		}
		if len(missing) > 0 {
			rejected = append(rejected, fmt.Sprintf("installations[%d]: missing %s", i, strings.Join(missing, ", ")))
			continue
		}
		r := api.ServiceRoute{
			Hostname:            *e.Hostname,
			Workspace:           *e.Workspace,
			Sandbox:             *e.Sandbox,
			Supervisor:          sup,
			InstallationVersion: *e.InstallationVersion,
			ExpiresAt:           e.ExpiresAt.UTC(),
			Endpoint:            *e.Endpoint,
			Protocol:            e.Protocol,
			Access:              e.Access,
		}
		if e.Name != nil {
			r.Name = *e.Name
		}
		if e.DeclarationRevision != nil {
			r.DeclarationRevision = *e.DeclarationRevision
		}
		if err := api.CheckRoute(&r, r.Workspace); err != nil {
			rejected = append(rejected, fmt.Sprintf("installations[%d]: %v", i, err))
			continue
		}
		if r.DeclarationRevision < 0 {
			rejected = append(rejected, fmt.Sprintf("installations[%d]: negative declaration_revision", i))
			continue
		}
		if seen[r.Hostname] {
			rejected = append(rejected, fmt.Sprintf("installations[%d]: hostname %s advertised twice", i, r.Hostname))
			continue
		}
		seen[r.Hostname] = true
		if limit := now.Add(MaxAdvertisedLifetime); r.ExpiresAt.After(limit) {
			r.ExpiresAt = limit.UTC().Truncate(time.Millisecond)
		}
		out = append(out, advertisedRoute{ServiceRoute: r, generation: e.Generation, since: now})
	}
	return out, rejected
}

// MaxAdvertisedLifetime caps an advertisement's expires_at at its receipt
// plus this much: a supervisor that dies cannot leave a route published for
// longer, whatever it claimed.
const MaxAdvertisedLifetime = 10 * time.Minute

// sessionRecord is the stored value of sessions/<supervisor>.
type sessionRecord struct {
	Session string    `json:"session"`
	Since   time.Time `json:"since"`
	Source  string    `json:"source,omitempty"`
	// Order orders the sessions of one supervisor: a session of a lower
	// order is superseded (see above). 0 in records written before orders.
	Order     int64 `json:"order,omitempty"`
	Withdrawn bool  `json:"withdrawn,omitempty"`
}

// sessionView is a session record as the view holds it.
type sessionView struct {
	rec    sessionRecord
	modRev int64
}

// holds reports whether the session is live (not withdrawn).
func (s sessionView) holds() bool { return !s.rec.Withdrawn }

// validSessionID reports whether s is a session id: "" (none) or 32
// lower-case hexadecimal characters.
func validSessionID(s string) bool {
	if s == "" {
		return true
	}
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// decodeSession decodes a stored session record.
func decodeSession(value []byte, modRev int64) (sessionView, error) {
	var rec sessionRecord
	if err := json.Unmarshal(value, &rec); err != nil {
		return sessionView{}, fmt.Errorf("session record: %w", err)
	}
	return sessionView{rec: rec, modRev: modRev}, nil
}
