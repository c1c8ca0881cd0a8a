package helm_test

import (
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestChartDefaultInstallSaysWhatToSet: `helm template` (so `helm install`)
// with no values at all fails at render time with one line naming the value
// to set, instead of rendering a placeholder gateway URL.
func TestChartDefaultInstallSaysWhatToSet(t *testing.T) {
	out, err := helmTemplateFiles(t)
	if err == nil {
		t.Fatalf("helm template with the defaults succeeded; want a one-line error\n%s", out)
	}
	msg := err.Error()
	_, helmMsg, _ := strings.Cut(msg, "Error: ")
	helmMsg, _, _ = strings.Cut(helmMsg, "\n\nUse --debug flag") // Helm's own trailer
	if helmMsg == "" || strings.Contains(strings.TrimSpace(helmMsg), "\n") {
		t.Errorf("the error is not one line: %q", msg)
	}
	for _, want := range []string{"set controlPlane.gatewayEndpoint", "gateway.enabled=true"} {
		if !strings.Contains(helmMsg, want) {
			t.Errorf("error %q does not say %q", helmMsg, want)
		}
	}
}

// edgeValues: the reference gateway, shared hosts requiring PROXY headers
// from the Pod CIDR, and the edge with an inline workspace token.
func edgeValues(edge map[string]any) map[string]any {
	v := gatewayValues(nil)
	v["appListener"] = map[string]any{"enabled": true, "domain": "apps.example.com", "requireProxyProtocol": []any{"10.244.0.0/16"}}
	e := map[string]any{"enabled": true, "workspaces": []any{"team", "ops"}, "token": map[string]any{"value": "t-edge"}}
	maps.Copy(e, edge)
	v["edge"] = e
	return v
}

// TestChartEdge: the edge's Deployment runs `applistener edge` with flags the
// binary accepts, pointed at this release's gateway with its CA and a token
// file from the rendered Secret; its Service targets the TLS port; its
// NetworkPolicy admits any source to that port and the monitoring namespace
// to admin; the supervisors' policy admits it to the app port and the
// gateway's to its HTTPS port (discovery).
func TestChartEdge(t *testing.T) {
	r := render(t, edgeValues(map[string]any{"replicas": 3, "drainTimeoutSeconds": 120}))
	e := defaults()
	e.mode, e.app, e.gateway, e.edge, e.replicas = "shared", true, true, true, 2
	e.gw = gatewayDefaults()
	e.endpoint = "https://rel-applistener-gateway.sbx.svc:8080"
	checkRelease(t, r, e)

	d := componentDeployment(t, r, "edge")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("edge replicas = %v, want 3", d.Spec.Replicas)
	}
	if !maps.Equal(d.Spec.Template.Labels, edgeLabels) {
		t.Errorf("edge Pod labels %v, want %v", d.Spec.Template.Labels, edgeLabels)
	}
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 130 {
		t.Errorf("edge terminationGracePeriodSeconds = %v, want the 120 s drain + 10", g)
	}
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("edge Pod has %d containers", len(d.Spec.Template.Spec.Containers))
	}
	c := &d.Spec.Template.Spec.Containers[0]
	args := parseArgs(t, c.Args, "edge")
	accepted := acceptedFlags(t, "edge")
	for _, f := range sortedKeys(args) {
		if !accepted[f] {
			t.Errorf("edge flag --%s is not accepted by `applistener edge`", f)
		}
	}
	want := map[string]string{
		"address":            "0.0.0.0:8443",
		"admin-address":      "0.0.0.0:9090",
		"gateway":            e.endpoint,
		"workspace":          "team,ops",
		"proxy-protocol":     "v2",
		"drain-timeout":      "120s",
		"gateway-ca-file":    "/var/run/applistener/gateway-ca/ca.crt",
		"gateway-token-file": "/var/run/applistener/edge-token/token",
	}
	for k, v := range want {
		if args[k] != v {
			t.Errorf("edge --%s=%q, want %q", k, args[k], v)
		}
	}
	checkSecurity(t, d, c, e)
	ports := containerPorts(t, c)
	if v := volumeAt(t, d, c, path.Dir(args["gateway-token-file"])); v.Secret == nil || v.Secret.SecretName != "rel-applistener-edge-token" || !projects(v.Secret.Items, "token", "token") {
		t.Errorf("--gateway-token-file is not the key token of Secret rel-applistener-edge-token: %+v", v.VolumeSource)
	}
	if v := volumeAt(t, d, c, path.Dir(args["gateway-ca-file"])); v.Secret == nil || v.Secret.SecretName != "applistener-gateway-ca" {
		t.Errorf("--gateway-ca-file is not from Secret applistener-gateway-ca: %+v", v.VolumeSource)
	}
	var secret bool
	for _, s := range r.Secrets {
		if s.Name == "rel-applistener-edge-token" {
			secret = s.StringData["token"] == "t-edge"
		}
	}
	if !secret {
		t.Error("no Secret rel-applistener-edge-token with the edge's token")
	}
	for _, p := range []string{"readiness", "liveness"} {
		probe := c.ReadinessProbe
		if p == "liveness" {
			probe = c.LivenessProbe
		}
		if probe == nil || probe.HTTPGet == nil || resolvePort(t, probe.HTTPGet.Port, ports) != 9090 {
			t.Errorf("edge %s probe %+v is not an HTTP probe of the admin port", p, probe)
		}
	}

	// Service: the TLS port, selecting exactly the edge Pods.
	var svc bool
	for _, s := range r.Services {
		if s.Labels["app.kubernetes.io/component"] != "edge" {
			continue
		}
		svc = true
		if !maps.Equal(s.Spec.Selector, edgeLabels) || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 443 || resolvePort(t, s.Spec.Ports[0].TargetPort, ports) != 8443 {
			t.Errorf("edge Service %s: selector %v ports %+v; want the edge Pods, 443 → 8443", s.Name, s.Spec.Selector, s.Spec.Ports)
		}
	}
	if !svc {
		t.Error("no edge Service")
	}

	// The edge's own NetworkPolicy.
	np := policySelecting(t, r, d)
	peers, ok := admittedPeers(t, np, 8443, ports)
	var every []string
	for _, p := range peers {
		switch {
		case p.IPBlock != nil && len(p.IPBlock.Except) == 0:
			every = append(every, p.IPBlock.CIDR)
		case p.IPBlock == nil && p.PodSelector == nil && p.NamespaceSelector != nil && len(p.NamespaceSelector.MatchLabels)+len(p.NamespaceSelector.MatchExpressions) == 0:
			every = append(every, "every namespace")
		}
	}
	slices.Sort(every)
	if !ok || !slices.Equal(every, []string{"0.0.0.0/0", "::/0", "every namespace"}) {
		t.Errorf("%s: TLS port admits %+v (covered %t); want every source (all namespaces, 0.0.0.0/0, ::/0)", np.Name, peers, ok)
	}
	peers, _ = admittedPeers(t, np, 9090, ports)
	if got := namespacePeers(t, "edge admin port", peers, nil); !slices.Equal(got, []string{"monitoring"}) {
		t.Errorf("%s: admin port admitted from %v, want [monitoring]", np.Name, got)
	}

	// The gateway admits the edge (discovery).
	gw := componentDeployment(t, r, "gateway")
	gnp := policySelecting(t, r, gw)
	gpeers, _ := admittedPeers(t, gnp, 8080, containerPorts(t, &gw.Spec.Template.Spec.Containers[0]))
	if !slices.ContainsFunc(gpeers, func(p networkingv1.NetworkPolicyPeer) bool {
		return p.NamespaceSelector == nil && p.PodSelector != nil && maps.Equal(p.PodSelector.MatchLabels, edgeLabels)
	}) {
		t.Errorf("%s: the gateway's port does not admit this release's edge: %+v", gnp.Name, gpeers)
	}

	// More than one replica: a disruption budget.
	if pdb := r.PDBs; !slices.ContainsFunc(pdb, func(p *policyv1.PodDisruptionBudget) bool { return p.Name == "rel-applistener-edge" }) {
		t.Error("no PodDisruptionBudget for the 3 edge replicas")
	}
}

// TestChartEdgeRefusals: the edge without what it needs fails at render time.
func TestChartEdgeRefusals(t *testing.T) {
	noProxy := edgeValues(nil)
	noProxy["appListener"] = map[string]any{"enabled": true}
	noListener := edgeValues(nil)
	noListener["appListener"] = map[string]any{"enabled": false}
	cases := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"no workspaces", edgeValues(map[string]any{"workspaces": []any{}}), "edge.workspaces is required"},
		{"no token", edgeValues(map[string]any{"token": map[string]any{"value": ""}}), "edge.token.existingSecret"},
		{"two tokens", edgeValues(map[string]any{"token": map[string]any{"value": "a", "existingSecret": "b"}}), "not both"},
		{"PROXY v2 not admitted", noProxy, "appListener.requireProxyProtocol"},
		{"no app listener", noListener, "needs appListener.enabled"},
		{"unknown proxy protocol", edgeValues(map[string]any{"proxyProtocol": "v1"}), "/edge/proxyProtocol"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := helmTemplate(t, tc.values)
			if err == nil {
				t.Fatalf("helm template succeeded; want an error containing %q\n%s", tc.want, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	// proxyProtocol off needs no PROXY admission.
	off := edgeValues(map[string]any{"proxyProtocol": "off"})
	off["appListener"] = map[string]any{"enabled": true}
	r := render(t, off)
	if args := parseArgs(t, componentDeployment(t, r, "edge").Spec.Template.Spec.Containers[0].Args, "edge"); args["proxy-protocol"] != "off" {
		t.Errorf("--proxy-protocol=%q, want off", args["proxy-protocol"])
	}
}

// componentDeployment is the one Deployment of a component.
func componentDeployment(t *testing.T, r *rendered, component string) *appsv1.Deployment {
	t.Helper()
	var found []*appsv1.Deployment
	for _, d := range r.Deployments {
		if d.Labels["app.kubernetes.io/component"] == component {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s Deployments, want 1", len(found), component)
	}
	return found[0]
}

// policySelecting is the one NetworkPolicy that selects d's Pods.
func policySelecting(t *testing.T, r *rendered, d *appsv1.Deployment) *networkingv1.NetworkPolicy {
	t.Helper()
	var np *networkingv1.NetworkPolicy
	for _, p := range r.NetworkPolicies {
		s, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Empty() && s.Matches(labels.Set(d.Spec.Template.Labels)) {
			if np != nil {
				t.Fatalf("two NetworkPolicies select %s: %s and %s", d.Name, np.Name, p.Name)
			}
			np = p
		}
	}
	if np == nil {
		t.Fatalf("no NetworkPolicy selects %s", d.Name)
	}
	return np
}
