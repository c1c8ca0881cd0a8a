package k8stest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	chartPath = "../helm/applistener"
	release   = "rel"
)

// configurations are the three installs: a dedicated supervisor behind an
// external gateway, shared hosts with the reference gateway (memory) and
// the edge, and shared hosts with three gateway replicas on etcd.
func configurations() map[string]map[string]any {
	shared := func(gateway map[string]any) map[string]any {
		g := map[string]any{
			"enabled": true,
			"tokens": map[string]any{"inline": map[string]any{"tokens": []any{
				map[string]any{"token": "t-pool", "pool": "hosts"},
				map[string]any{"token": "t-edge", "workspaces": []any{"team"}},
			}}},
		}
		for k, v := range gateway {
			g[k] = v
		}
		return map[string]any{
			"mode":         "shared",
			"appListener":  map[string]any{"enabled": true, "domain": "apps.example.com", "requireProxyProtocol": []any{"10.244.0.0/16"}},
			"controlPlane": map[string]any{"ca": map[string]any{"secretName": "gateway-ca"}},
			"gateway":      g,
			"edge":         map[string]any{"enabled": true, "replicas": 2, "workspaces": []any{"team"}, "token": map[string]any{"value": "t-edge"}},
		}
	}
	return map[string]map[string]any{
		"dedicated": {
			"mode":         "dedicated",
			"appListener":  map[string]any{"enabled": true, "domain": "apps.example.com"},
			"controlPlane": map[string]any{"gatewayEndpoint": "https://gateway.control.svc:8080"},
			"dedicated":    map[string]any{"service": map[string]any{"enabled": true}},
		},
		"shared": shared(nil),
		"gateway-on-etcd": shared(map[string]any{
			"replicas": 3, "store": "etcd",
			"etcd": map[string]any{
				"endpoints": []any{"https://etcd-0.etcd.platform.svc:2379", "https://etcd-1.etcd.platform.svc:2379"},
				"tls":       map[string]any{"secretName": "etcd-client"},
			},
		}),
	}
}

// TestChartOnAPIServer installs the chart in each configuration on a real
// API server and checks server-side validation, rollout on the fake nodes,
// EndpointSlices, disruption budgets, NetworkPolicies and the
// ServiceAccount's permissions; the shared install is upgraded and rolled
// back; a broken value is refused.
func TestChartOnAPIServer(t *testing.T) {
	c := startCluster(t)
	ch, err := loader.Load(chartPath)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	for _, name := range []string{"dedicated", "shared", "gateway-on-etcd"} {
		values := configurations()[name]
		t.Run(name, func(t *testing.T) {
			ns := "sbx-" + name
			c.namespace(t, ns)
			t.Cleanup(func() {
				if t.Failed() {
					c.describe(t, ns)
				}
			})
			// A client-only dry run replaces its configuration's Kubernetes
			// client with a printer: it gets a configuration of its own.
			objs := c.strictDryRun(t, c.helm(t, ns), ch, ns, values)
			h := c.helm(t, ns)
			start := time.Now()
			inst := action.NewInstall(h)
			inst.ReleaseName, inst.Namespace = release, ns
			inst.Wait, inst.Timeout = true, 4*time.Minute
			if _, err := inst.Run(ch, values); err != nil {
				t.Fatalf("helm install: %v", err)
			}
			t.Logf("installed %d objects, every Deployment ready, in %v", len(objs), time.Since(start).Round(time.Millisecond))
			c.checkAlive(t)
			c.checkDeployments(t, ns)
			c.checkEndpointSlices(t, ns)
			c.checkPDBs(t, ns)
			c.checkNetworkPolicies(t, ns, objs)
			c.checkServiceAccount(t, ns, release+"-applistener")
			if name == "shared" {
				c.upgradeAndRollback(t, h, ch, ns, values)
			}
		})
	}
	t.Run("schema refuses several gateway replicas on the memory store", func(t *testing.T) {
		ns := "sbx-broken"
		c.namespace(t, ns)
		values := configurations()["shared"]
		values["gateway"].(map[string]any)["replicas"] = 2
		inst := action.NewInstall(c.helm(t, ns))
		inst.ReleaseName, inst.Namespace = release, ns
		_, err := inst.Run(ch, values)
		if err == nil || !strings.Contains(err.Error(), "needs gateway.store=etcd") {
			t.Fatalf("helm install with gateway.replicas=2 on the memory store: %v; want the chart's refusal", err)
		}
		deps, err := c.client.AppsV1().Deployments(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(deps.Items) != 0 {
			t.Errorf("after the refused install: %d Deployments (%v), want none", len(deps.Items), err)
		}
	})
}

// namespace creates ns enforcing the "restricted" Pod Security level, so
// admission checks the chart's security contexts.
func (c *cluster) namespace(t *testing.T, ns string) {
	t.Helper()
	_, err := c.client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
}

// helm is a Helm action configuration for ns, as `helm --namespace ns`.
func (c *cluster) helm(t *testing.T, ns string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &c.kubeconfig, &ns
	h := new(action.Configuration)
	if err := h.Init(flags, ns, "secret", func(format string, v ...any) { t.Logf("helm: "+format, v...) }); err != nil {
		t.Fatalf("helm configuration: %v", err)
	}
	return h
}

// strictDryRun renders the chart (helm install --dry-run) and sends each
// object to the API server as a server-side dry-run create with strict field
// validation: unknown or duplicate fields and every validation and admission
// error fail the test.
func (c *cluster) strictDryRun(t *testing.T, h *action.Configuration, ch *chart.Chart, ns string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	inst := action.NewInstall(h)
	inst.ReleaseName, inst.Namespace, inst.DryRun, inst.ClientOnly = release, ns, true, true
	rel, err := inst.Run(ch, values)
	if err != nil {
		t.Fatalf("rendering: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.client.Discovery()))
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(rel.Manifest)), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding the manifest: %v", err)
		}
		if len(u.Object) == 0 {
			continue
		}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: not served by the API server: %v", gvk, u.GetName(), err)
		}
		_, err = dyn.Resource(m.Resource).Namespace(u.GetNamespace()).Create(context.Background(), u,
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		if err != nil {
			t.Errorf("server-side validation of %s %s: %v", gvk.Kind, u.GetName(), err)
		}
		objs = append(objs, u)
	}
	if t.Failed() {
		t.FailNow()
	}
	return objs
}

// checkDeployments: each Deployment is Available with every replica ready
// and updated, its Pods are spread over the fake nodes' IPs, mount no API
// token, and have a grace period that covers the drain.
func (c *cluster) checkDeployments(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	deps, err := c.client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(deps.Items) == 0 {
		t.Fatalf("listing Deployments: %d, %v", len(deps.Items), err)
	}
	for _, d := range deps.Items {
		want := *d.Spec.Replicas
		if !available(&d) || d.Status.ReadyReplicas != want || d.Status.UpdatedReplicas != want {
			t.Errorf("Deployment %s: available=%t ready %d updated %d of %d", d.Name, available(&d), d.Status.ReadyReplicas, d.Status.UpdatedReplicas, want)
		}
		spec := d.Spec.Template.Spec
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("Deployment %s mounts a service account token", d.Name)
		}
		if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds < 15 {
			t.Errorf("Deployment %s: terminationGracePeriodSeconds %v", d.Name, spec.TerminationGracePeriodSeconds)
		}
	}
}

func available(d *appsv1.Deployment) bool {
	for _, cond := range d.Status.Conditions {
		if cond.Type == appsv1.DeploymentAvailable {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// checkEndpointSlices: every Service with a selector gets EndpointSlices
// whose ready endpoints are exactly its Pods.
func (c *cluster) checkEndpointSlices(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	svcs, err := c.client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range svcs.Items {
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector})})
		if err != nil || len(pods.Items) == 0 {
			t.Errorf("Service %s selects %d Pods (%v)", svc.Name, len(pods.Items), err)
			continue
		}
		var want []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				want = append(want, p.Status.PodIP)
			}
		}
		slices.Sort(want)
		var got []string
		waitFor(t, "EndpointSlices of Service "+svc.Name, 60*time.Second, func() (bool, string) {
			slicesList, err := c.client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
			if err != nil {
				return false, err.Error()
			}
			got = got[:0]
			for _, s := range slicesList.Items {
				for _, ep := range s.Endpoints {
					if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
						got = append(got, ep.Addresses...)
					}
				}
			}
			slices.Sort(got)
			return slices.Equal(got, want), fmt.Sprintf("ready endpoints %v, Pod IPs %v", got, want)
		})
	}
}

// checkPDBs: each PodDisruptionBudget sees all its Pods healthy and allows
// exactly its maxUnavailable disruptions (the chart documents 1).
func (c *cluster) checkPDBs(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	pdbs, err := c.client.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pdbs.Items) == 0 {
		t.Fatalf("PodDisruptionBudgets: %d (%v), want at least the supervisors'", len(pdbs.Items), err)
	}
	for _, p := range pdbs.Items {
		name := p.Name
		waitFor(t, "PodDisruptionBudget "+name, 60*time.Second, func() (bool, string) {
			cur, err := c.client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			st := cur.Status
			ok := st.ObservedGeneration == cur.Generation && st.ExpectedPods > 0 && st.CurrentHealthy == st.ExpectedPods &&
				cur.Spec.MaxUnavailable != nil && st.DisruptionsAllowed == int32(min(cur.Spec.MaxUnavailable.IntValue(), int(st.ExpectedPods)))
			return ok, fmt.Sprintf("maxUnavailable %v, status %+v", cur.Spec.MaxUnavailable, st)
		})
	}
}

// checkNetworkPolicies: every rendered NetworkPolicy was admitted and is
// stored as rendered (its pod selector selects the Deployment it is for).
func (c *cluster) checkNetworkPolicies(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	var want []string
	for _, o := range objs {
		if o.GetKind() == "NetworkPolicy" {
			want = append(want, o.GetName())
		}
	}
	nps, err := c.client.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, np := range nps.Items {
		got = append(got, np.Name)
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(&np.Spec.PodSelector)})
		if err != nil || len(pods.Items) == 0 {
			t.Errorf("NetworkPolicy %s selects no Pod (%v)", np.Name, err)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("NetworkPolicies stored %v, rendered %v", got, want)
	}
}

// saRequests are what the README promises of the chart's ServiceAccount:
// applistener never talks to the API server, so it may do none of these.
var saRequests = []authzv1.ResourceAttributes{
	{Verb: "get", Resource: "secrets"}, {Verb: "list", Resource: "secrets"}, {Verb: "watch", Resource: "secrets"},
	{Verb: "get", Resource: "configmaps"}, {Verb: "list", Resource: "configmaps"},
	{Verb: "list", Resource: "pods"}, {Verb: "create", Resource: "pods"}, {Verb: "create", Resource: "pods", Subresource: "exec"},
	{Verb: "delete", Resource: "pods"}, {Verb: "list", Resource: "services"}, {Verb: "list", Resource: "endpoints"},
	{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"},
	{Verb: "patch", Group: "apps", Resource: "deployments"}, {Verb: "update", Group: "apps", Resource: "deployments", Subresource: "scale"},
	{Verb: "create", Group: "coordination.k8s.io", Resource: "leases"},
	{Verb: "create", Resource: "serviceaccounts", Subresource: "token"},
	{Verb: "list", Group: "networking.k8s.io", Resource: "networkpolicies"},
	{Verb: "create", Resource: "events"},
	{Verb: "list", Resource: "nodes", Namespace: "-"}, {Verb: "list", Resource: "namespaces", Namespace: "-"},
	{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews", Namespace: "-"},
	{Verb: "*", Group: "*", Resource: "*"},
}

// checkServiceAccount: a SubjectAccessReview matrix for the chart's
// ServiceAccount denies every request above, in its namespace and another,
// while the same reviews for the admin are allowed (so a denial means RBAC
// said no, not that the review was malformed).
func (c *cluster) checkServiceAccount(t *testing.T, ns, sa string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{}); err != nil {
		t.Fatalf("ServiceAccount %s: %v", sa, err)
	}
	user := "system:serviceaccount:" + ns + ":" + sa
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	for _, inNS := range []string{ns, "default"} {
		for _, ra := range saRequests {
			ra := ra
			switch ra.Namespace {
			case "-":
				ra.Namespace = ""
			default:
				ra.Namespace = inNS
			}
			what := fmt.Sprintf("%s %s/%s/%s in %q", ra.Verb, ra.Group, ra.Resource, ra.Subresource, ra.Namespace)
			if c.allowed(t, user, groups, ra) {
				t.Errorf("ServiceAccount %s may %s; the chart promises it may do nothing", sa, what)
			}
			if !c.allowed(t, "k8stest-admin", []string{"system:masters", "system:authenticated"}, ra) {
				t.Errorf("the admin may not %s: the review matrix is broken", what)
			}
		}
	}
}

func (c *cluster) allowed(t *testing.T, user string, groups []string, ra authzv1.ResourceAttributes) bool {
	t.Helper()
	sar, err := c.client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &ra},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return sar.Status.Allowed
}

// upgradeAndRollback: `helm upgrade` with a changed value rolls the Pods
// (new ReplicaSets, the old ones scaled to zero, every Pod with the new
// argument); `helm rollback 1` rolls them back.
func (c *cluster) upgradeAndRollback(t *testing.T, h *action.Configuration, ch *chart.Chart, ns string, values map[string]any) {
	t.Helper()
	before := c.podArgs(t, ns)
	up := action.NewUpgrade(h)
	up.Namespace, up.Wait, up.Timeout = ns, true, 8*time.Minute
	changed := map[string]any{}
	for k, v := range values {
		changed[k] = v
	}
	changed["logLevel"] = "debug"
	if _, err := up.Run(release, ch, changed); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	c.waitRolled(t, ns, "--log-level=debug", before)
	c.checkDeployments(t, ns)

	upgraded := c.podArgs(t, ns)
	rb := action.NewRollback(h)
	rb.Version, rb.Wait, rb.Timeout = 1, true, 8*time.Minute
	if err := rb.Run(release); err != nil {
		t.Fatalf("helm rollback: %v", err)
	}
	c.waitRolled(t, ns, "--log-level=info", upgraded)
	c.checkDeployments(t, ns)
	hist, err := action.NewHistory(h).Run(release)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(hist); n != 3 || hist[n-1].Version != 3 || hist[n-1].Info.Status != "deployed" {
		t.Errorf("history after the rollback: %d revisions, last %+v", n, hist[n-1].Info)
	}
}

// podArgs maps each live Pod's name to its first container's arguments.
func (c *cluster) podArgs(t *testing.T, ns string) map[string]string {
	t.Helper()
	pods, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = strings.Join(p.Spec.Containers[0].Args, " ")
		}
	}
	return out
}

// waitRolled waits until no Pod of before is left, every live Pod carries
// arg, and each Deployment has as many Pods as replicas.
func (c *cluster) waitRolled(t *testing.T, ns, arg string, before map[string]string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, "Pods rolled to "+arg, 8*time.Minute, func() (bool, string) {
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		deps, err := c.client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var total int32
		for _, d := range deps.Items {
			total += *d.Spec.Replicas
		}
		n := int32(0)
		for _, p := range pods.Items {
			if _, old := before[p.Name]; old {
				return false, "old Pod " + p.Name + " still there"
			}
			if !strings.Contains(strings.Join(p.Spec.Containers[0].Args, " "), arg) {
				return false, "Pod " + p.Name + " lacks " + arg
			}
			n++
		}
		return n == total, fmt.Sprintf("%d Pods, %d replicas", n, total)
	})
}
