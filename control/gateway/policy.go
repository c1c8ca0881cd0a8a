package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/applistener/applistener/control/api"
)

// Endpoint trust: which endpoints an advertisement may send traffic to.
// A supervisor that could advertise any endpoint could send a workspace's
// traffic anywhere; --endpoint-policy narrows it:
//
//	any                          every endpoint (the reference default)
//	source                       the endpoint host is the IP address the advertisement came from
//	cidr:10.0.0.0/8,fd00::/8     the endpoint host is an IP address inside one of the prefixes
//
// X-Forwarded-For is never trusted: the source is the connection's peer.
// A refused endpoint is logged (once per supervisor and endpoint), counted
// and never published; the other routes of the advertisement are.

// Endpoint policy names.
const (
	EndpointPolicyAny    = "any"
	EndpointPolicySource = "source"
	endpointPolicyCIDR   = "cidr:"
)

// maxPolicyWarnings bounds the set of (supervisor, endpoint) pairs already
// warned about; it is cleared when full.
const maxPolicyWarnings = 10000

// endpointPolicy is a parsed --endpoint-policy.
type endpointPolicy struct {
	source   bool
	prefixes []netip.Prefix // cidr: the allowed prefixes; nil with source or any
}

// ParseEndpointPolicy checks an --endpoint-policy value: "any", "source" or
// "cidr:" followed by a comma-separated list of CIDR prefixes.
func ParseEndpointPolicy(s string) error {
	_, err := parseEndpointPolicy(s)
	return err
}

func parseEndpointPolicy(s string) (endpointPolicy, error) {
	switch {
	case s == "" || s == EndpointPolicyAny:
		return endpointPolicy{}, nil
	case s == EndpointPolicySource:
		return endpointPolicy{source: true}, nil
	case strings.HasPrefix(s, endpointPolicyCIDR):
		var p endpointPolicy
		for part := range strings.SplitSeq(strings.TrimPrefix(s, endpointPolicyCIDR), ",") {
			pfx, err := netip.ParsePrefix(strings.TrimSpace(part))
			if err != nil {
				return endpointPolicy{}, fmt.Errorf("endpoint policy: %w", err)
			}
			p.prefixes = append(p.prefixes, pfx.Masked())
		}
		return p, nil
	}
	return endpointPolicy{}, errors.New(`endpoint policy: want "any", "source" or "cidr:PREFIX[,PREFIX...]"`)
}

// String returns the policy as --endpoint-policy spells it.
func (p endpointPolicy) String() string {
	switch {
	case p.source:
		return EndpointPolicySource
	case p.prefixes != nil:
		parts := make([]string, len(p.prefixes))
		for i, pfx := range p.prefixes {
			parts[i] = pfx.String()
		}
		return endpointPolicyCIDR + strings.Join(parts, ",")
	}
	return EndpointPolicyAny
}

// allows reports whether an advertisement received from source may publish
// an endpoint on host.
func (p endpointPolicy) allows(source, host string) bool {
	if !p.source && p.prefixes == nil {
		return true
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false // a DNS name cannot be checked
	}
	addr = addr.Unmap()
	if p.source {
		src, err := netip.ParseAddr(source)
		return err == nil && src.Unmap() == addr
	}
	for _, pfx := range p.prefixes {
		if pfx.Contains(addr) {
			return true
		}
	}
	return false
}

// refuseEndpointLocked counts an endpoint refused by the policy and warns
// about it once per supervisor and endpoint. g.mu is held.
func (g *Gateway) refuseEndpointLocked(sup, source string, ep api.RouteEndpoint) {
	g.m.endpointRefused.Inc()
	key := sup + "|" + ep.String()
	if _, seen := g.policyWarned[key]; seen {
		return
	}
	if len(g.policyWarned) >= maxPolicyWarnings {
		clear(g.policyWarned)
	}
	g.policyWarned[key] = struct{}{}
	g.log.Warn("advertised endpoint refused by the endpoint policy; its routes are not published",
		"supervisor", sup, "endpoint", ep.String(), "source", source, "policy", g.policy.String())
}
