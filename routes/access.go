package routes

import (
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Access policy modes.
const (
	// AccessPublic serves every request (the default: no policy).
	AccessPublic = "public"
	// AccessToken serves only requests with an access token of the
	// service's sandbox (package accesstoken), enforced by the data plane
	// (package dispatch). A table without access keys refuses such an
	// instance (Options.AccessTokens).
	AccessToken = "token"
)

// Limits of an access policy.
const (
	// MaxAccessGeneration is the largest access.generation: the largest
	// integer every JSON implementation holds exactly (2^53 - 1).
	MaxAccessGeneration = 1<<53 - 1
	// MaxCORSOrigins is the most access.cors_origins of one service.
	MaxCORSOrigins = 32
	// maxAccessURLLen bounds access.login_url and each CORS origin.
	maxAccessURLLen = 2048
)

// AccessPolicy is a service's access policy ("access" in the document).
type AccessPolicy struct {
	// Mode is AccessPublic or AccessToken; required when "access" is
	// present.
	Mode string `json:"mode"`
	// Generation is raised to revoke every token (and stream) authorised
	// under an older one: 0 to MaxAccessGeneration.
	Generation int64 `json:"generation,omitempty"`
	// LoginURL is where a browser navigation without a credential is sent
	// (with ?return_to=): an absolute https URL (http for localhost),
	// without user information or fragment. "": a small 401 page instead.
	LoginURL string `json:"login_url,omitempty"`
	// CORSOrigins are the exact origins (scheme://host[:port], lower case,
	// no default port, no path) whose page scripts may call the service:
	// their preflights are answered and their denials readable.
	CORSOrigins []string `json:"cors_origins,omitempty"`
	// Bearer accepts "Authorization: Bearer <token>" (and removes it);
	// otherwise the app's own Authorization header passes untouched.
	Bearer bool `json:"bearer,omitempty"`
	// Embed lets the service be framed by other sites: its cookie is
	// SameSite=None and Partitioned.
	Embed bool `json:"embed,omitempty"`
}

// IsPublic reports whether the policy serves every request: nil (absent)
// or mode public.
func (p *AccessPolicy) IsPublic() bool { return p == nil || p.Mode == AccessPublic }

// Equal reports whether p and q are the same policy. A nil policy equals a
// public one with nothing else set.
func (p *AccessPolicy) Equal(q *AccessPolicy) bool {
	a, b := p.orDefault(), q.orDefault()
	return a.Mode == b.Mode && a.Generation == b.Generation && a.LoginURL == b.LoginURL &&
		a.Bearer == b.Bearer && a.Embed == b.Embed && slices.Equal(a.CORSOrigins, b.CORSOrigins)
}

// Clone returns a deep copy of p (nil for nil).
func (p *AccessPolicy) Clone() *AccessPolicy {
	if p == nil {
		return nil
	}
	c := *p
	c.CORSOrigins = slices.Clone(p.CORSOrigins)
	return &c
}

// orDefault is p, or the public policy for nil.
func (p *AccessPolicy) orDefault() *AccessPolicy {
	if p == nil {
		return &AccessPolicy{Mode: AccessPublic}
	}
	return p
}

// validate adds the policy's problems to ps; at is the JSON path of
// "access" and what names the service.
func (p *AccessPolicy) validate(ps *problemList, at, what string) {
	switch p.Mode {
	case AccessPublic:
	case AccessToken:
	case "":
		ps.add(at+".mode", "%s: access.mode is required (public or token)", what)
	default:
		ps.add(at+".mode", "%s: access mode %s not supported (use public or token)", what, quoteShort(p.Mode))
	}
	if p.Generation < 0 || p.Generation > MaxAccessGeneration {
		ps.add(at+".generation", "%s: access generation %d out of range 0..%d", what, p.Generation, int64(MaxAccessGeneration))
	}
	if p.LoginURL != "" {
		if err := checkLoginURL(p.LoginURL); err != "" {
			ps.add(at+".login_url", "%s: login_url %s %s", what, quoteShort(p.LoginURL), err)
		}
	}
	if len(p.CORSOrigins) > MaxCORSOrigins {
		ps.add(at+".cors_origins", "%s: %d CORS origins, more than %d", what, len(p.CORSOrigins), MaxCORSOrigins)
		return
	}
	for i, o := range p.CORSOrigins {
		path := at + ".cors_origins[" + strconv.Itoa(i) + "]"
		if err := checkOrigin(o); err != "" {
			ps.add(path, "%s: CORS origin %s %s", what, quoteShort(o), err)
			continue
		}
		if slices.Contains(p.CORSOrigins[:i], o) {
			ps.add(path, "%s: duplicate CORS origin %s", what, quoteShort(o))
		}
	}
}

// checkLoginURL returns why u is not a valid login_url, or "".
func checkLoginURL(u string) string {
	if len(u) > maxAccessURLLen {
		return "is longer than " + strconv.Itoa(maxAccessURLLen) + " characters"
	}
	if strings.ContainsFunc(u, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "contains a space or control character"
	}
	pu, err := url.Parse(u)
	if err != nil || pu.Opaque != "" {
		return "is not a URL"
	}
	if why := checkSchemeHost(pu); why != "" {
		return why
	}
	switch {
	case pu.User != nil:
		return "must not contain user information"
	case pu.Fragment != "" || strings.Contains(u, "#"):
		return "must not contain a fragment (return_to is added to its query)"
	}
	return ""
}

// checkOrigin returns why o is not an exact, canonical origin, or "".
// Browsers send Origin as scheme://host[:port] in lower case without a
// default port; a policy origin is compared with it byte for byte.
func checkOrigin(o string) string {
	switch {
	case o == "*" || o == "null":
		return "is not allowed (list exact origins)"
	case len(o) > maxAccessURLLen:
		return "is longer than " + strconv.Itoa(maxAccessURLLen) + " characters"
	case strings.ContainsFunc(o, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == '*' }):
		return "contains a space, control, non-ASCII or wildcard character (list exact origins)"
	}
	pu, err := url.Parse(o)
	if err != nil || pu.Opaque != "" {
		return "is not an origin (scheme://host[:port])"
	}
	if why := checkSchemeHost(pu); why != "" {
		return why
	}
	if pu.User != nil || pu.Path != "" || pu.RawQuery != "" || pu.Fragment != "" || strings.ContainsAny(o, "?#") {
		return "is not an origin: scheme://host[:port] only, without a path, query or trailing slash"
	}
	canonical := pu.Scheme + "://" + strings.ToLower(pu.Host)
	if port := pu.Port(); port == "443" && pu.Scheme == "https" || port == "80" && pu.Scheme == "http" {
		canonical = pu.Scheme + "://" + strings.ToLower(strings.TrimSuffix(pu.Host, ":"+port))
	}
	if canonical != o {
		return "is not as browsers send it (want " + quoteShort(canonical) + ")"
	}
	return ""
}

// checkSchemeHost accepts https with a host, and http for a loopback host
// (a developer's machine).
func checkSchemeHost(u *url.URL) string {
	host := u.Hostname()
	if host == "" {
		return "has no host (want an absolute https URL)"
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "has an invalid port"
		}
	}
	switch u.Scheme {
	case "https":
		return ""
	case "http":
		if isLoopbackHost(host) {
			return ""
		}
		return "must be https (http only for localhost)"
	default:
		return "must be https (http only for localhost)"
	}
}

// isLoopbackHost reports whether host is localhost or a loopback address.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
