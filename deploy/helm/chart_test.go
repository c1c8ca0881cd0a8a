package helm_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// expect is what a case's rendering must show.
type expect struct {
	mode          string // dedicated | shared
	app           bool   // appListener.enabled
	domain        string
	appPort       int
	tlsSecret     string
	tlsDir        string
	healthPort    int
	adminPort     int
	source        string // gateway | routesFile
	endpoint      string // --gateway ("" for routesFile)
	tokenSecret   string
	tokenKey      string
	netns         bool
	unixRelay     string
	appService    bool // a dedicated Service with the app port
	edge          bool // the edge is deployed (and admitted to the app port)
	serviceMon    bool
	gateway       bool
	gw            gatewayExpect // with gateway
	appNamespaces []string      // NetworkPolicy peers of the app port
	appPodLabels  map[string]string
	monNamespaces []string // NetworkPolicy peers of the admin port
	replicas      int32
	preStop       int64
	sandboxCtrs   []string // extra containers beside the supervisor (dedicated)
	extraArgs     []string
}

// gatewayExpect is what the reference gateway's rendering must show.
type gatewayExpect struct {
	replicas       int32
	store          string // memory | etcd
	etcdEndpoints  string // --etcd-endpoints
	etcdPrefix     string
	etcdTLSSecret  string // Secret mounted for the etcd client files ("": none)
	etcdCAKey      string // its key behind --etcd-ca-file ("": no such flag)
	endpointPolicy string
}

func gatewayDefaults() gatewayExpect {
	return gatewayExpect{replicas: 1, store: "memory", endpointPolicy: "source"}
}

func defaults() expect {
	return expect{
		mode: "dedicated", appPort: 8443, healthPort: 5501, adminPort: 9090,
		source: "gateway", endpoint: "https://gateway:8080",
		tokenSecret: "applistener-gateway-token", tokenKey: "token",
		tlsSecret: "applistener-tls", tlsDir: "/etc/applistener/tls", domain: "apps.example.com",
		appNamespaces: []string{"ingress-nginx"}, monNamespaces: []string{"monitoring"},
		replicas: 1,
	}
}

func TestChartDefaultValues(t *testing.T) {
	r := render(t, map[string]any{})
	checkRelease(t, r, defaults())
}

func TestChartDedicatedWithAppListenerAndService(t *testing.T) {
	values := map[string]any{
		"appListener": map[string]any{
			"enabled": true,
			"domain":  "apps.corp.example",
			"tls":     map[string]any{"secretName": "wildcard-apps-corp-example", "mountPath": "/var/run/tls/app"},
		},
		"controlPlane": map[string]any{
			"gatewayEndpoint": "https://openshell-gateway.openshell.svc:8080",
			"token":           map[string]any{"secretName": "sup-token", "key": "bearer"},
			"ca":              map[string]any{"configMapName": "openshell-ca", "key": "ca.pem"},
		},
		"dedicated": map[string]any{
			"service": map[string]any{"enabled": true},
			"sandboxContainers": []any{map[string]any{
				"name": "app", "image": "registry.example/team/demo:3",
				"ports": []any{map[string]any{"name": "web", "containerPort": 8080}},
				"securityContext": map[string]any{
					"runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
					"capabilities": map[string]any{"drop": []any{"ALL"}},
				},
			}},
		},
		"networkPolicy": map[string]any{"app": map[string]any{
			"namespaces": []any{"edge", "ingress-nginx"},
			"podLabels":  map[string]any{"app.kubernetes.io/name": "edge"},
		}},
	}
	r := render(t, values)
	e := defaults()
	e.app, e.appService = true, true
	e.domain, e.tlsSecret, e.tlsDir = "apps.corp.example", "wildcard-apps-corp-example", "/var/run/tls/app"
	e.endpoint, e.tokenSecret, e.tokenKey = "https://openshell-gateway.openshell.svc:8080", "sup-token", "bearer"
	e.appNamespaces = []string{"edge", "ingress-nginx"}
	e.appPodLabels = map[string]string{"app.kubernetes.io/name": "edge"}
	e.sandboxCtrs = []string{"app"}
	checkRelease(t, r, e)

	// The CA bundle comes from the ConfigMap, projected as the file passed.
	c := supervisorContainer(t, supervisorDeployment(t, r))
	args := parseArgs(t, c.Args, "serve")
	v := volumeAt(t, supervisorDeployment(t, r), c, path.Dir(args["gateway-ca-file"]))
	if v.ConfigMap == nil || v.ConfigMap.Name != "openshell-ca" || !projects(v.ConfigMap.Items, "ca.pem", path.Base(args["gateway-ca-file"])) {
		t.Errorf("--gateway-ca-file=%s is not the key ca.pem of ConfigMap openshell-ca: %+v", args["gateway-ca-file"], v.VolumeSource)
	}
}

func TestChartSharedWithNetnsServiceMonitorAndGateway(t *testing.T) {
	values := map[string]any{
		"mode":        "shared",
		"appListener": map[string]any{"enabled": true, "domain": "apps.example.com"},
		"controlPlane": map[string]any{
			"ca": map[string]any{"secretName": "applistener-gateway-ca"},
		},
		"shared": map[string]any{
			"replicas":       3,
			"netnsConnector": true,
			"unixRelay":      map[string]any{"hostPath": "/run/sbx"},
		},
		"serviceMonitor":      map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}},
		"preStopSleepSeconds": 5,
		"extraArgs":           []any{"--app-idle-timeout=300s", "--default-max-streams=512"},
		"gateway": map[string]any{
			"enabled": true,
			"config": map[string]any{"inline": map[string]any{"supervisors": map[string]any{
				"rel-applistener-0": map[string]any{"revision": "r1", "instances": []any{}},
			}}},
			"tokens": map[string]any{"inline": map[string]any{"tokens": []any{
				map[string]any{"token": "t-demo", "supervisor": "rel-applistener-0"},
				map[string]any{"token": "t-discovery", "workspaces": []any{"team"}},
			}}},
		},
	}
	r := render(t, values)
	e := defaults()
	e.mode, e.app, e.netns, e.unixRelay = "shared", true, true, "/run/sbx"
	e.serviceMon, e.gateway, e.replicas, e.preStop = true, true, 3, 5
	e.gw = gatewayDefaults()
	e.endpoint = "https://rel-applistener-gateway.sbx.svc:8080"
	e.extraArgs = []string{"--app-idle-timeout=300s", "--default-max-streams=512"}
	checkRelease(t, r, e)
}

// gatewayValues enables the reference gateway with inline tokens and the
// gateway values given.
func gatewayValues(gw map[string]any) map[string]any {
	g := map[string]any{
		"enabled": true,
		"tokens": map[string]any{"inline": map[string]any{"tokens": []any{
			map[string]any{"token": "t-pool", "pool": "hosts"},
			map[string]any{"token": "t-admin", "admin": true},
		}}},
	}
	for k, v := range gw {
		g[k] = v
	}
	return map[string]any{
		"mode":         "shared",
		"appListener":  map[string]any{"enabled": true, "domain": "apps.example.com"},
		"controlPlane": map[string]any{"ca": map[string]any{"secretName": "applistener-gateway-ca"}},
		"gateway":      g,
	}
}

// TestChartGatewayReplicasOnEtcd: N gateway replicas on the platform's
// etcd, with client certificates from a Secret: every replica gets the
// etcd flags, the files come from that Secret, the replicas roll one at a
// time, prefer different nodes and keep a disruption budget; endpoints are
// checked against the advertisement's source address.
func TestChartGatewayReplicasOnEtcd(t *testing.T) {
	r := render(t, gatewayValues(map[string]any{
		"replicas": 3,
		"store":    "etcd",
		"etcd": map[string]any{
			"endpoints": []any{"https://etcd-0.etcd.platform.svc:2379", "https://etcd-1.etcd.platform.svc:2379", "https://etcd-2.etcd.platform.svc:2379"},
			"prefix":    "/apps-prod/",
			"tls":       map[string]any{"secretName": "applistener-etcd-client"},
		},
	}))
	e := defaults()
	e.mode, e.app, e.gateway, e.replicas = "shared", true, true, 2
	e.endpoint = "https://rel-applistener-gateway.sbx.svc:8080"
	e.gw = gatewayExpect{
		replicas: 3, store: "etcd",
		etcdEndpoints: "https://etcd-0.etcd.platform.svc:2379,https://etcd-1.etcd.platform.svc:2379,https://etcd-2.etcd.platform.svc:2379",
		etcdPrefix:    "/apps-prod/", etcdTLSSecret: "applistener-etcd-client", etcdCAKey: "ca.crt",
		endpointPolicy: "source",
	}
	checkRelease(t, r, e)
}

// TestChartGatewayEtcdPlainAndCIDRPolicy: etcd without client certificates
// (no TLS flags, no volume), a CIDR endpoint policy, a session TTL, and
// explicit affinity replacing the default anti-affinity.
func TestChartGatewayEtcdPlainAndCIDRPolicy(t *testing.T) {
	r := render(t, gatewayValues(map[string]any{
		"replicas":          2,
		"store":             "etcd",
		"etcd":              map[string]any{"endpoints": []any{"http://etcd.platform.svc:2379"}, "dialTimeout": "3s"},
		"endpointPolicy":    "cidr:10.0.0.0/8,fd00::/8",
		"sessionTTL":        "20s",
		"idleGrace":         "10m",
		"strictSupervisors": true,
		"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "pool", "operator": "In", "values": []any{"control"}}}}},
		}}},
	}))
	e := defaults()
	e.mode, e.app, e.gateway, e.replicas = "shared", true, true, 2
	e.endpoint = "https://rel-applistener-gateway.sbx.svc:8080"
	e.gw = gatewayExpect{replicas: 2, store: "etcd", etcdEndpoints: "http://etcd.platform.svc:2379",
		etcdPrefix: "/applistener/", endpointPolicy: "cidr:10.0.0.0/8,fd00::/8"}
	checkRelease(t, r, e)
	d := gatewayDeployment(t, r)
	args := parseArgs(t, d.Spec.Template.Spec.Containers[0].Args, "gateway")
	if args["session-ttl"] != "20s" || args["etcd-dial-timeout"] != "3s" {
		t.Errorf("--session-ttl=%q --etcd-dial-timeout=%q, want 20s and 3s", args["session-ttl"], args["etcd-dial-timeout"])
	}
	if v, ok := args["strict-supervisors"]; args["idle-grace"] != "10m" || !ok || v != "" {
		t.Errorf("--idle-grace=%q --strict-supervisors=%q (present %v), want 10m and the bare flag", args["idle-grace"], v, ok)
	}
	aff := d.Spec.Template.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.PodAntiAffinity != nil {
		t.Errorf("gateway affinity %+v: want exactly the given node affinity", aff)
	}
}

func TestChartSharedNonRootWithMetricsService(t *testing.T) {
	values := map[string]any{
		"mode": "shared",
		"appListener": map[string]any{"enabled": true, "domain": "apps.example.com",
			"trustedProxies": []any{"10.0.0.0/8", "fd00::/8"}, "requireProxyProtocol": []any{"10.42.0.0/16"}},
		"metricsService": map[string]any{"enabled": true},
	}
	r := render(t, values)
	e := defaults()
	e.mode, e.app, e.replicas = "shared", true, 2
	checkRelease(t, r, e)
	args := parseArgs(t, supervisorContainer(t, supervisorDeployment(t, r)).Args, "serve")
	if args["trusted-proxies"] != "10.0.0.0/8,fd00::/8" {
		t.Errorf("--trusted-proxies=%q", args["trusted-proxies"])
	}
	if args["require-proxy-protocol"] != "10.42.0.0/16" {
		t.Errorf("--require-proxy-protocol=%q", args["require-proxy-protocol"])
	}
}

func TestChartRoutesFileSource(t *testing.T) {
	values := map[string]any{
		"controlPlane": map[string]any{"source": "routesFile", "routesFile": map[string]any{"configMapName": "demo-routes"}},
		"supervisorId": "ignored-without-gateway",
	}
	r := render(t, values)
	e := defaults()
	e.source, e.endpoint = "routesFile", ""
	checkRelease(t, r, e)
	d := supervisorDeployment(t, r)
	c := supervisorContainer(t, d)
	args := parseArgs(t, c.Args, "serve")
	v := volumeAt(t, d, c, path.Dir(args["routes-file"]))
	if v.ConfigMap == nil || v.ConfigMap.Name != "demo-routes" || !projects(v.ConfigMap.Items, "routes.json", path.Base(args["routes-file"])) {
		t.Errorf("--routes-file=%s is not the key routes.json of ConfigMap demo-routes: %+v", args["routes-file"], v.VolumeSource)
	}
}

func TestChartFixedSupervisorID(t *testing.T) {
	r := render(t, map[string]any{"supervisorId": "team-demo"})
	args := parseArgs(t, supervisorContainer(t, supervisorDeployment(t, r)).Args, "serve")
	if args["supervisor-id"] != "team-demo" {
		t.Errorf("--supervisor-id=%q, want team-demo", args["supervisor-id"])
	}
}

// TestChartRefusesContradictions: values that would deploy something wrong
// make `helm template` fail with a message naming the problem.
func TestChartRefusesContradictions(t *testing.T) {
	cases := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"shared app Service", map[string]any{"mode": "shared", "appListener": map[string]any{"enabled": true}, "dedicated": map[string]any{"service": map[string]any{"enabled": true}}}, "no application Service"},
		{"dedicated Service without listener", map[string]any{"dedicated": map[string]any{"service": map[string]any{"enabled": true}}}, "needs appListener.enabled"},
		{"netns in dedicated mode", map[string]any{"shared": map[string]any{"netnsConnector": true}}, "mode=shared only"},
		{"upper-case domain", map[string]any{"appListener": map[string]any{"enabled": true, "domain": "Apps.Example.com"}}, "lower-case DNS name"},
		{"no TLS Secret", map[string]any{"appListener": map[string]any{"enabled": true, "tls": map[string]any{"secretName": ""}}}, "appListener.tls.secretName"},
		{"grace not above drain", map[string]any{"drainTimeoutSeconds": 30, "terminationGracePeriodSeconds": 30}, "must exceed"},
		{"fixed id on many hosts", map[string]any{"mode": "shared", "supervisorId": "x"}, "needs one supervisor"},
		{"routes file without ConfigMap", map[string]any{"controlPlane": map[string]any{"source": "routesFile"}}, "routesFile.configMapName"},
		{"unknown mode", map[string]any{"mode": "edge"}, "mode"},
		{"typo in values", map[string]any{"appListner": map[string]any{"enabled": true}}, "appListner"},
		{"gateway without TLS", map[string]any{"gateway": map[string]any{"enabled": true, "tls": map[string]any{"secretName": ""}}}, "gateway.tls.secretName"},
		{"gateway without CA", map[string]any{"gateway": map[string]any{"enabled": true}}, "controlPlane.ca"},
		{"CA from two places", map[string]any{"controlPlane": map[string]any{"ca": map[string]any{"secretName": "a", "configMapName": "b"}}}, "not both"},
		{"gateway replicas on memory", gatewayValues(map[string]any{"replicas": 2}), "needs gateway.store=etcd"},
		{"etcd without endpoints", gatewayValues(map[string]any{"store": "etcd"}), "gateway.etcd.endpoints is required"},
		{"etcd endpoint without scheme", gatewayValues(map[string]any{"store": "etcd", "etcd": map[string]any{"endpoints": []any{"etcd:2379"}}}), "/gateway/etcd/endpoints/0"},
		{"etcd client certificates over http", gatewayValues(map[string]any{"store": "etcd", "etcd": map[string]any{
			"endpoints": []any{"http://etcd:2379"}, "tls": map[string]any{"secretName": "etcd-client"}}}), "plain http"},
		{"etcd prefix without slashes", gatewayValues(map[string]any{"store": "etcd", "etcd": map[string]any{
			"endpoints": []any{"https://etcd:2379"}, "prefix": "applistener"}}), "/gateway/etcd/prefix"},
		{"unknown store", gatewayValues(map[string]any{"store": "redis"}), "/gateway/store"},
		{"unknown endpoint policy", gatewayValues(map[string]any{"endpointPolicy": "trust-me"}), "gateway.endpointPolicy"},
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
}

// ---------------------------------------------------------------------------
// Checks shared by every case.
// ---------------------------------------------------------------------------

func checkRelease(t *testing.T, r *rendered, e expect) {
	t.Helper()
	d := supervisorDeployment(t, r)
	c := supervisorContainer(t, d)
	pod := d.Spec.Template
	podLabels := labels.Set(pod.Labels)

	// The Deployment selects its own Pods; replicas per topology.
	mustSelect(t, "supervisor Deployment", d.Spec.Selector, podLabels)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != e.replicas {
		t.Errorf("supervisor replicas = %v, want %d", d.Spec.Replicas, e.replicas)
	}
	if e.mode == "dedicated" && d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("dedicated strategy %q, want Recreate (never two supervisors for one sandbox)", d.Spec.Strategy.Type)
	}
	var names []string
	for _, ct := range pod.Spec.Containers {
		names = append(names, ct.Name)
	}
	if want := append([]string{"supervisor"}, e.sandboxCtrs...); !slices.Equal(names, want) {
		t.Errorf("containers %q, want %q", names, want)
	}

	// Every flag is one `applistener serve` accepts.
	serveFlags := acceptedFlags(t, "serve")
	args := parseArgs(t, c.Args, "serve")
	for _, name := range sortedKeys(args) {
		if !serveFlags[name] {
			t.Errorf("the supervisor gets --%s, which `applistener serve` does not accept", name)
		}
	}
	for _, a := range e.extraArgs {
		if !slices.Contains(c.Args, a) {
			t.Errorf("extra argument %q missing from %q", a, c.Args)
		}
	}
	if args["mode"] != e.mode {
		t.Errorf("--mode=%q, want %q", args["mode"], e.mode)
	}
	ports := containerPorts(t, c)

	// Health: --address is the named port "health", which the readiness
	// probe (tcpSocket) targets. Liveness and startup are process health,
	// GET /healthz on the admin port, and never the session-gated health
	// port: a gateway outage must not restart supervisors (issue 25).
	healthPort := hostPortOf(t, "address", args["address"])
	if healthPort != e.healthPort || ports["health"] != healthPort {
		t.Errorf("--address port %d, container port health %d, want both %d", healthPort, ports["health"], e.healthPort)
	}
	switch p := c.ReadinessProbe; {
	case p == nil:
		t.Errorf("no readiness probe")
	case p.TCPSocket == nil || p.HTTPGet != nil || p.Exec != nil || p.GRPC != nil:
		t.Errorf("readiness probe is not (only) a tcpSocket probe: %+v", p.ProbeHandler)
	case resolvePort(t, p.TCPSocket.Port, ports) != healthPort:
		t.Errorf("readiness probe targets port %s (= %d), want the health port %d", p.TCPSocket.Port.String(), resolvePort(t, p.TCPSocket.Port, ports), healthPort)
	}
	adminPortArg := hostPortOf(t, "admin-address", args["admin-address"])
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "startup": c.StartupProbe} {
		switch {
		case p == nil:
			t.Errorf("no %s probe", name)
		case p.HTTPGet == nil || p.TCPSocket != nil || p.Exec != nil || p.GRPC != nil:
			t.Errorf("%s probe is not (only) an httpGet probe: %+v", name, p.ProbeHandler)
		case p.HTTPGet.Path != "/healthz":
			t.Errorf("%s probe GETs %s, want /healthz (process health)", name, p.HTTPGet.Path)
		case resolvePort(t, p.HTTPGet.Port, ports) != adminPortArg:
			t.Errorf("%s probe targets port %s (= %d), want the admin port %d", name, p.HTTPGet.Port.String(), resolvePort(t, p.HTTPGet.Port, ports), adminPortArg)
		}
	}
	if c.LivenessProbe != nil && c.ReadinessProbe != nil {
		live := c.LivenessProbe.PeriodSeconds * c.LivenessProbe.FailureThreshold
		ready := c.ReadinessProbe.PeriodSeconds * c.ReadinessProbe.FailureThreshold
		if live < 60 || live <= ready {
			t.Errorf("liveness budget %ds must be at least 60s and above readiness %ds", live, ready)
		}
	}
	adminPort := hostPortOf(t, "admin-address", args["admin-address"])
	if !strings.HasPrefix(args["admin-address"], "0.0.0.0:") || adminPort != e.adminPort || ports["admin"] != adminPort {
		t.Errorf("--admin-address=%s, container port admin %d, want 0.0.0.0:%d", args["admin-address"], ports["admin"], e.adminPort)
	}

	// Drain: the grace period outlasts the preStop sleep plus --drain-timeout.
	drain, err := time.ParseDuration(args["drain-timeout"])
	if err != nil {
		t.Fatalf("--drain-timeout=%q: %v", args["drain-timeout"], err)
	}
	var sleep int64
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if c.Lifecycle.PreStop.Sleep == nil {
			t.Errorf("preStop is not a sleep action (the image has no shell): %+v", c.Lifecycle.PreStop)
		} else {
			sleep = c.Lifecycle.PreStop.Sleep.Seconds
		}
	}
	if sleep != e.preStop {
		t.Errorf("preStop sleep %ds, want %ds", sleep, e.preStop)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= drain+time.Duration(sleep)*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v must exceed preStop %ds + --drain-timeout %s", g, sleep, drain)
	}

	// Configuration source.
	switch e.source {
	case "gateway":
		if args["gateway"] != e.endpoint {
			t.Errorf("--gateway=%q, want %q", args["gateway"], e.endpoint)
		}
		if _, ok := args["routes-file"]; ok {
			t.Error("--routes-file given together with --gateway")
		}
		if args["supervisor-id"] != "$(POD_NAME)" {
			t.Errorf("--supervisor-id=%q, want $(POD_NAME)", args["supervisor-id"])
		}
		mustFieldRef(t, c, "POD_NAME", "metadata.name")
		tf := args["gateway-token-file"]
		v := volumeAt(t, d, c, path.Dir(tf))
		if v.Secret == nil || v.Secret.SecretName != e.tokenSecret || !projects(v.Secret.Items, e.tokenKey, path.Base(tf)) {
			t.Errorf("--gateway-token-file=%s is not key %q of Secret %q: %+v", tf, e.tokenKey, e.tokenSecret, v.VolumeSource)
		}
	case "routesFile":
		for _, f := range []string{"gateway", "gateway-token-file", "gateway-ca-file", "supervisor-id"} {
			if _, ok := args[f]; ok {
				t.Errorf("--%s given with a routes file", f)
			}
		}
	}

	// The app listener and everything about it only when enabled.
	if e.app {
		if _, ok := args["app-listener"]; !ok {
			t.Error("--app-listener missing")
		}
		if args["app-domain"] != e.domain {
			t.Errorf("--app-domain=%q, want %q", args["app-domain"], e.domain)
		}
		ap := hostPortOf(t, "app-address", args["app-address"])
		if ap != e.appPort || ports["app"] != ap {
			t.Errorf("--app-address port %d, container port app %d, want %d", ap, ports["app"], e.appPort)
		}
		dir := args["app-tls-dir"]
		if dir != e.tlsDir {
			t.Errorf("--app-tls-dir=%q, want %q", dir, e.tlsDir)
		}
		m, v := mountAt(t, d, c, dir)
		switch {
		case m == nil:
			t.Errorf("nothing is mounted at --app-tls-dir=%s", dir)
		case m.SubPath != "" || m.SubPathExpr != "":
			t.Errorf("the TLS Secret is mounted with subPath %q: Kubernetes never updates those, certificate renewals would be missed", m.SubPath)
		case v.Secret == nil || v.Secret.SecretName != e.tlsSecret:
			t.Errorf("the volume at --app-tls-dir is %+v, want Secret %q", v.VolumeSource, e.tlsSecret)
		case len(v.Secret.Items) > 0 && (!projects(v.Secret.Items, "tls.crt", "tls.crt") || !projects(v.Secret.Items, "tls.key", "tls.key")):
			t.Errorf("the TLS volume projects %+v, not tls.crt and tls.key", v.Secret.Items)
		}
		if args["advertise-address"] != "$(POD_IP)" {
			t.Errorf("--advertise-address=%q, want $(POD_IP)", args["advertise-address"])
		}
		mustFieldRef(t, c, "POD_IP", "status.podIP")
	} else {
		for _, name := range sortedKeys(args) {
			if strings.HasPrefix(name, "app-") || name == "advertise-address" || name == "trusted-proxies" || name == "require-proxy-protocol" {
				t.Errorf("--%s rendered although appListener.enabled is false", name)
			}
		}
		if _, ok := ports["app"]; ok {
			t.Error("container port app declared although the app listener is off")
		}
		for _, cp := range c.Ports {
			if int(cp.ContainerPort) == e.appPort {
				t.Errorf("container port %d declared although the app listener is off", e.appPort)
			}
		}
		if m, _ := mountAt(t, d, c, e.tlsDir); m != nil {
			t.Errorf("the TLS Secret is mounted although the app listener is off")
		}
	}

	checkSecurity(t, d, c, e)
	checkServices(t, r, d, ports, e)
	checkNetworkPolicy(t, r, d, ports, e)

	// PodDisruptionBudget over the supervisors (and one over the gateway
	// replicas when there are several).
	// (The edge's own, with several edge replicas, is TestChartEdge's.)
	var supPDBs, gwPDBs []*policyv1.PodDisruptionBudget
	for _, p := range r.PDBs {
		switch p.Labels["app.kubernetes.io/component"] {
		case "supervisor":
			supPDBs = append(supPDBs, p)
		case "gateway":
			gwPDBs = append(gwPDBs, p)
		}
	}
	if len(supPDBs) != 1 {
		t.Fatalf("%d supervisor PodDisruptionBudgets, want 1", len(supPDBs))
	}
	if want := map[bool]int{true: 1, false: 0}[e.gateway && e.gw.replicas > 1]; len(gwPDBs) != want {
		t.Errorf("%d gateway PodDisruptionBudgets, want %d", len(gwPDBs), want)
	}
	pdb := supPDBs[0]
	mustSelect(t, "PodDisruptionBudget", pdb.Spec.Selector, podLabels)
	if pdb.Spec.MaxUnavailable == nil || (pdb.Spec.MaxUnavailable.Type == intstr.Int && pdb.Spec.MaxUnavailable.IntVal < 1) {
		t.Errorf("PodDisruptionBudget maxUnavailable %v would block node drains", pdb.Spec.MaxUnavailable)
	}

	// ServiceMonitor.
	if got := len(r.ServiceMonitors); got != map[bool]int{true: 1, false: 0}[e.serviceMon] {
		t.Errorf("%d ServiceMonitors, serviceMonitor.enabled=%v", got, e.serviceMon)
	}
	for _, sm := range r.ServiceMonitors {
		checkServiceMonitor(t, r, sm, e)
	}

	if e.gateway {
		checkGateway(t, r, e)
	} else {
		for _, dep := range r.Deployments {
			if dep.Labels["app.kubernetes.io/component"] == "gateway" {
				t.Error("a gateway Deployment rendered although gateway.enabled is false")
			}
		}
	}

	// Every Deployment: non-root containers on a read-only root unless the
	// netns exception applies (checked above for the supervisor), no API token.
	for _, dep := range r.Deployments {
		if dep.Spec.Template.Spec.AutomountServiceAccountToken == nil || *dep.Spec.Template.Spec.AutomountServiceAccountToken {
			t.Errorf("%s mounts a service account token; applistener never calls the API server", dep.Name)
		}
		if dep == d {
			continue
		}
		for _, ct := range dep.Spec.Template.Spec.Containers {
			checkNonRoot(t, dep.Name+"/"+ct.Name, dep.Spec.Template.Spec.SecurityContext, ct.SecurityContext)
		}
	}
	checkVolumeReferences(t, r)
}

func supervisorDeployment(t *testing.T, r *rendered) *appsv1.Deployment {
	t.Helper()
	var found []*appsv1.Deployment
	for _, d := range r.Deployments {
		if d.Labels["app.kubernetes.io/component"] == "supervisor" {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d supervisor Deployments, want 1", len(found))
	}
	return found[0]
}

func supervisorContainer(t *testing.T, d *appsv1.Deployment) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == "supervisor" {
			return c
		}
	}
	t.Fatalf("%s has no container named supervisor", d.Name)
	return nil
}

func containerPorts(t *testing.T, c *corev1.Container) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, p := range c.Ports {
		if p.Name == "" {
			t.Errorf("container %s: unnamed port %d", c.Name, p.ContainerPort)
		}
		if _, dup := m[p.Name]; dup {
			t.Errorf("container %s: port name %q twice", c.Name, p.Name)
		}
		if p.Protocol != corev1.ProtocolTCP {
			t.Errorf("container %s: port %s protocol %q", c.Name, p.Name, p.Protocol)
		}
		m[p.Name] = int(p.ContainerPort)
	}
	return m
}

// resolvePort turns a named or numbered port into a number.
func resolvePort(t *testing.T, p intstr.IntOrString, ports map[string]int) int {
	t.Helper()
	if p.Type == intstr.Int {
		return int(p.IntVal)
	}
	n, ok := ports[p.StrVal]
	if !ok {
		t.Errorf("port name %q is not a container port (%v)", p.StrVal, ports)
	}
	return n
}

func hostPortOf(t *testing.T, flagName, v string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(v)
	if err != nil {
		t.Errorf("--%s=%q: %v", flagName, v, err)
		return 0
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Errorf("--%s=%q: port %v", flagName, v, err)
	}
	return n
}

func mustFieldRef(t *testing.T, c *corev1.Container, name, fieldPath string) {
	t.Helper()
	for _, ev := range c.Env {
		if ev.Name == name {
			if ev.Value != "" || ev.ValueFrom == nil || ev.ValueFrom.FieldRef == nil || ev.ValueFrom.FieldRef.FieldPath != fieldPath {
				t.Errorf("env %s is %+v, want the Downward API fieldRef %s", name, ev, fieldPath)
			}
			return
		}
	}
	t.Errorf("env %s (fieldRef %s) missing; $(%s) in args would stay literal", name, fieldPath, name)
}

func mustSelect(t *testing.T, what string, sel *metav1.LabelSelector, set labels.Set) {
	t.Helper()
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		t.Errorf("%s has an empty selector", what)
		return
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("%s selector: %v", what, err)
		return
	}
	if !s.Matches(set) {
		t.Errorf("%s selector %s does not match the supervisor Pod labels %v", what, s, set)
	}
}

// mountAt returns the container's mount at dir and its Pod volume.
func mountAt(t *testing.T, d *appsv1.Deployment, c *corev1.Container, dir string) (*corev1.VolumeMount, *corev1.Volume) {
	t.Helper()
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		if path.Clean(m.MountPath) != path.Clean(dir) {
			continue
		}
		for j := range d.Spec.Template.Spec.Volumes {
			if v := &d.Spec.Template.Spec.Volumes[j]; v.Name == m.Name {
				if !m.ReadOnly {
					t.Errorf("mount %s at %s is not read-only", m.Name, m.MountPath)
				}
				return m, v
			}
		}
		t.Errorf("mount %s names no volume", m.Name)
		return m, nil
	}
	return nil, nil
}

func volumeAt(t *testing.T, d *appsv1.Deployment, c *corev1.Container, dir string) *corev1.Volume {
	t.Helper()
	_, v := mountAt(t, d, c, dir)
	if v == nil {
		t.Fatalf("nothing is mounted at %s in %s/%s", dir, d.Name, c.Name)
	}
	return v
}

// projects reports whether items put key at file (no items: every key is
// its own file name).
func projects(items []corev1.KeyToPath, key, file string) bool {
	if len(items) == 0 {
		return key == file
	}
	for _, it := range items {
		if it.Key == key && it.Path == file {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Security context.
// ---------------------------------------------------------------------------

func effective[T any](pod, ctr *T) *T {
	if ctr != nil {
		return ctr
	}
	return pod
}

func checkNonRoot(t *testing.T, what string, psc *corev1.PodSecurityContext, sc *corev1.SecurityContext) {
	t.Helper()
	if sc == nil {
		t.Errorf("%s: no container securityContext", what)
		return
	}
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	nonRoot := effective(psc.RunAsNonRoot, sc.RunAsNonRoot)
	user := effective(psc.RunAsUser, sc.RunAsUser)
	if nonRoot == nil || !*nonRoot || user == nil || *user == 0 {
		t.Errorf("%s: runAsNonRoot=%v runAsUser=%v, want non-root with a numeric uid", what, ptrStr(nonRoot), ptrStr(user))
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: root filesystem is writable", what)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", what)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: privileged", what)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("%s: capabilities %+v, want drop [ALL] and nothing added", what, sc.Capabilities)
	}
	if prof := effective(psc.SeccompProfile, sc.SeccompProfile); prof == nil || prof.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: seccomp profile %+v, want RuntimeDefault", what, prof)
	}
}

func ptrStr[T any](p *T) string {
	if p == nil {
		return "<unset>"
	}
	return fmt.Sprint(*p)
}

func checkSecurity(t *testing.T, d *appsv1.Deployment, c *corev1.Container, e expect) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if !e.netns {
		checkNonRoot(t, "supervisor", spec.SecurityContext, c.SecurityContext)
		for _, v := range spec.Volumes {
			if v.HostPath != nil && v.HostPath.Path != e.unixRelay {
				t.Errorf("hostPath volume %s (%s) without netns connectors", v.Name, v.HostPath.Path)
			}
		}
		return
	}
	// netns connectors: setns(2) needs CAP_SYS_ADMIN, and Kubernetes only
	// makes added capabilities effective for uid 0 (no ambient capabilities).
	// Exactly that one capability, nothing else, read-only root.
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("netns: no capabilities in the supervisor's securityContext")
	}
	if !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYS_ADMIN"}) || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("netns: capabilities %+v, want add [SYS_ADMIN] and drop [ALL]", sc.Capabilities)
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot {
		t.Errorf("netns: runAsUser=%s runAsNonRoot=%s; a non-zero uid would not get CAP_SYS_ADMIN", ptrStr(sc.RunAsUser), ptrStr(sc.RunAsNonRoot))
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		t.Error("netns: allowPrivilegeEscalation=false with CAP_SYS_ADMIN is rejected by the API server")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("netns: privileged")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("netns: root filesystem is writable")
	}
	m, v := mountAt(t, d, c, "/run/netns")
	switch {
	case m == nil || v == nil:
		t.Error("netns: /run/netns is not mounted")
	case v.HostPath == nil || v.HostPath.Path != "/run/netns":
		t.Errorf("netns: the volume at /run/netns is %+v, want hostPath /run/netns", v.VolumeSource)
	case m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer:
		t.Error("netns: /run/netns without HostToContainer propagation: namespaces created later would be invisible")
	}
	if e.unixRelay != "" {
		if m, v := mountAt(t, d, c, e.unixRelay); m == nil || v == nil || v.HostPath == nil || v.HostPath.Path != e.unixRelay {
			t.Errorf("unix relay directory %s is not mounted from the host", e.unixRelay)
		}
	}
}

// ---------------------------------------------------------------------------
// Services and NetworkPolicy.
// ---------------------------------------------------------------------------

func checkServices(t *testing.T, r *rendered, d *appsv1.Deployment, ports map[string]int, e expect) {
	t.Helper()
	podLabels := labels.Set(d.Spec.Template.Labels)
	var appServices, metrics int
	for _, s := range r.Services {
		for _, p := range s.Spec.Ports {
			if int(p.Port) == e.appPort && e.mode == "shared" {
				t.Errorf("shared mode: Service %s exposes port %d", s.Name, e.appPort)
			}
		}
		if s.Spec.Selector == nil || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			continue // not a supervisor Service (e.g. the gateway's)
		}
		var targets []int
		for _, p := range s.Spec.Ports {
			targets = append(targets, resolvePort(t, p.TargetPort, ports))
		}
		switch {
		case slices.Equal(targets, []int{e.appPort}):
			appServices++
			if e.mode != "dedicated" || !e.app {
				t.Errorf("Service %s carries the app port (mode %s, app listener %v)", s.Name, e.mode, e.app)
			}
			if s.Spec.ClusterIP == corev1.ClusterIPNone {
				t.Errorf("the dedicated app Service %s is headless", s.Name)
			}
		case slices.Equal(targets, []int{e.adminPort}):
			metrics++
			if s.Spec.ClusterIP != corev1.ClusterIPNone || !s.Spec.PublishNotReadyAddresses {
				t.Errorf("metrics Service %s: clusterIP %q publishNotReadyAddresses %v, want headless and publishing not-ready Pods", s.Name, s.Spec.ClusterIP, s.Spec.PublishNotReadyAddresses)
			}
		default:
			t.Errorf("Service %s selects the supervisors with target ports %v: only [app] (dedicated) or [admin] (metrics) are allowed", s.Name, targets)
		}
	}
	if want := map[bool]int{true: 1, false: 0}[e.appService]; appServices != want {
		t.Errorf("%d app Services, want %d", appServices, want)
	}
	if e.serviceMon && metrics != 1 {
		t.Errorf("%d headless metrics Services with a ServiceMonitor, want 1", metrics)
	}
}

// checkRules fails on rules that admit every port, every source or a range.
func checkRules(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	for i, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 0 {
			t.Errorf("%s: ingress rule %d names no port (it admits every port)", np.Name, i)
		}
		if len(rule.From) == 0 {
			t.Errorf("%s: ingress rule %d names no source (it admits everyone)", np.Name, i)
		}
		for _, p := range rule.Ports {
			if p.Port == nil || p.EndPort != nil {
				t.Errorf("%s: ingress rule %d admits no single port: %+v", np.Name, i, p)
			}
		}
	}
}

// admittedPeers returns the peers of the policy's rules that cover port.
func admittedPeers(t *testing.T, np *networkingv1.NetworkPolicy, port int, ports map[string]int) ([]networkingv1.NetworkPolicyPeer, bool) {
	t.Helper()
	var peers []networkingv1.NetworkPolicyPeer
	covered := false
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port != nil && resolvePort(t, *p.Port, ports) == port {
				covered = true
				peers = append(peers, rule.From...)
			}
		}
	}
	return peers, covered
}

// namespacePeers checks that every peer is "namespace named N (and Pods
// labelled L)" and returns the namespace names.
func namespacePeers(t *testing.T, what string, peers []networkingv1.NetworkPolicyPeer, podLabels map[string]string) []string {
	t.Helper()
	var names []string
	for _, p := range peers {
		if p.IPBlock != nil || p.NamespaceSelector == nil || len(p.NamespaceSelector.MatchExpressions) != 0 {
			t.Errorf("%s: peer %+v is not a namespace-by-name selector", what, p)
			continue
		}
		n := p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]
		if n == "" || len(p.NamespaceSelector.MatchLabels) != 1 {
			t.Errorf("%s: peer namespaceSelector %v does not name one namespace", what, p.NamespaceSelector.MatchLabels)
		}
		var got map[string]string
		if p.PodSelector != nil {
			got = p.PodSelector.MatchLabels
		}
		if len(podLabels) > 0 || len(got) > 0 {
			if !reflect.DeepEqual(got, podLabels) {
				t.Errorf("%s: peer in namespace %s admits Pods %v, want %v", what, n, got, podLabels)
			}
		}
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func checkNetworkPolicy(t *testing.T, r *rendered, d *appsv1.Deployment, ports map[string]int, e expect) {
	t.Helper()
	podLabels := labels.Set(d.Spec.Template.Labels)
	var np *networkingv1.NetworkPolicy
	for _, p := range r.NetworkPolicies {
		s, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Empty() && s.Matches(podLabels) {
			if np != nil {
				t.Errorf("two NetworkPolicies select the supervisors: %s and %s", np.Name, p.Name)
			}
			np = p
		}
	}
	if np == nil {
		t.Fatal("no NetworkPolicy selects the supervisor Pod template labels")
	}
	for _, p := range r.NetworkPolicies {
		checkRules(t, p)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("%s: policyTypes %v lacks Ingress", np.Name, np.Spec.PolicyTypes)
	}

	// Health: from every Pod in the cluster (kubelet probes come from the
	// node, which NetworkPolicy always admits).
	peers, ok := admittedPeers(t, np, e.healthPort, ports)
	if !ok || len(peers) != 1 || peers[0].NamespaceSelector == nil || len(peers[0].NamespaceSelector.MatchLabels)+len(peers[0].NamespaceSelector.MatchExpressions) != 0 || peers[0].PodSelector != nil || peers[0].IPBlock != nil {
		t.Errorf("%s: health port %d admits %+v, want every Pod of the cluster (namespaceSelector: {})", np.Name, e.healthPort, peers)
	}

	// Admin: the monitoring namespace only.
	peers, ok = admittedPeers(t, np, e.adminPort, ports)
	if got := namespacePeers(t, "admin port", peers, nil); !ok || !slices.Equal(got, e.monNamespaces) {
		t.Errorf("%s: admin port %d admitted from namespaces %v, want %v", np.Name, e.adminPort, got, e.monNamespaces)
	}

	// App: the configured ingress namespaces / Pods only, and only when on.
	peers, ok = admittedPeers(t, np, e.appPort, ports)
	if e.app {
		peers = checkEdgePeer(t, np.Name+" app port", peers, e.edge)
		got := namespacePeers(t, "app port", peers, e.appPodLabels)
		if !ok || !slices.Equal(got, e.appNamespaces) {
			t.Errorf("%s: app port %d admitted from namespaces %v, want %v", np.Name, e.appPort, got, e.appNamespaces)
		}
	} else if ok {
		t.Errorf("%s: app port %d admitted although the app listener is off", np.Name, e.appPort)
	}

	// Nothing else.
	for i, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port == nil {
				continue
			}
			if n := resolvePort(t, *p.Port, ports); n != e.healthPort && n != e.adminPort && n != e.appPort {
				t.Errorf("%s: rule %d admits port %d", np.Name, i, n)
			}
		}
	}
}

// edgeLabels are the edge Pods' labels (release "rel").
var edgeLabels = map[string]string{
	"app.kubernetes.io/name": "applistener", "app.kubernetes.io/instance": releaseName, "app.kubernetes.io/component": "edge",
}

// checkEdgePeer checks that peers hold exactly one peer for this release's
// edge Pods (in the release namespace) when edge is on, and none otherwise;
// it returns the other peers.
func checkEdgePeer(t *testing.T, what string, peers []networkingv1.NetworkPolicyPeer, edge bool) []networkingv1.NetworkPolicyPeer {
	t.Helper()
	var rest []networkingv1.NetworkPolicyPeer
	n := 0
	for _, p := range peers {
		if p.NamespaceSelector == nil && p.IPBlock == nil && p.PodSelector != nil && p.PodSelector.MatchLabels["app.kubernetes.io/component"] == "edge" {
			if !reflect.DeepEqual(p.PodSelector.MatchLabels, edgeLabels) || len(p.PodSelector.MatchExpressions) != 0 {
				t.Errorf("%s: edge peer selects %v, want %v", what, p.PodSelector.MatchLabels, edgeLabels)
			}
			n++
			continue
		}
		rest = append(rest, p)
	}
	if want := map[bool]int{true: 1, false: 0}[edge]; n != want {
		t.Errorf("%s: %d peers for this release's edge, want %d", what, n, want)
	}
	return rest
}

// ---------------------------------------------------------------------------
// ServiceMonitor, gateway, references.
// ---------------------------------------------------------------------------

func checkServiceMonitor(t *testing.T, r *rendered, sm *serviceMonitor, e expect) {
	t.Helper()
	if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Kind != "ServiceMonitor" {
		t.Errorf("ServiceMonitor type %s %s", sm.APIVersion, sm.Kind)
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor namespaces %v, want [%s]", sm.Spec.NamespaceSelector.MatchNames, namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatalf("ServiceMonitor selector: %v", err)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("ServiceMonitor endpoints %+v, want port admin path /metrics", sm.Spec.Endpoints)
	}
	if _, err := time.ParseDuration(sm.Spec.Endpoints[0].Interval); err != nil {
		t.Errorf("ServiceMonitor interval: %v", err)
	}
	selected := map[string]bool{}
	for _, s := range r.Services {
		if !sel.Matches(labels.Set(s.Labels)) {
			continue
		}
		selected[s.Labels["app.kubernetes.io/component"]] = true
		hasAdmin := false
		for _, p := range s.Spec.Ports {
			hasAdmin = hasAdmin || p.Name == "admin"
			if int(p.Port) == e.appPort && p.Name != "admin" {
				t.Errorf("ServiceMonitor selects Service %s which carries the app port", s.Name)
			}
		}
		if !hasAdmin {
			t.Errorf("ServiceMonitor selects Service %s without an admin port", s.Name)
		}
	}
	if !selected["supervisor-metrics"] || e.gateway != selected["gateway"] {
		t.Errorf("ServiceMonitor selects components %v (gateway enabled: %v)", selected, e.gateway)
	}
}

func gatewayDeployment(t *testing.T, r *rendered) *appsv1.Deployment {
	t.Helper()
	var d *appsv1.Deployment
	for _, dep := range r.Deployments {
		if dep.Labels["app.kubernetes.io/component"] == "gateway" {
			d = dep
		}
	}
	if d == nil || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatal("no gateway Deployment with one container")
	}
	return d
}

func checkGateway(t *testing.T, r *rendered, e expect) {
	t.Helper()
	d := gatewayDeployment(t, r)
	c := &d.Spec.Template.Spec.Containers[0]
	gwFlags := acceptedFlags(t, "gateway")
	args := parseArgs(t, c.Args, "gateway")
	for _, name := range sortedKeys(args) {
		if !gwFlags[name] {
			t.Errorf("the gateway gets --%s, which `applistener gateway` does not accept", name)
		}
	}
	ports := containerPorts(t, c)
	gp := hostPortOf(t, "address", args["address"])
	if ports["https"] != gp {
		t.Errorf("gateway --address port %d, container port https %d", gp, ports["https"])
	}
	// Off loopback the gateway serves only TLS: --tls-dir must be a Secret.
	if v := volumeAt(t, d, c, args["tls-dir"]); v.Secret == nil {
		t.Errorf("gateway --tls-dir=%s is not a Secret volume", args["tls-dir"])
	}
	for _, f := range []string{"config", "tokens"} {
		v := volumeAt(t, d, c, path.Dir(args[f]))
		var rendered bool
		switch {
		case v.ConfigMap != nil:
			for _, cm := range r.ConfigMaps {
				rendered = rendered || (cm.Name == v.ConfigMap.Name && cm.Data[path.Base(args[f])] != "")
			}
		case v.Secret != nil:
			for _, s := range r.Secrets {
				rendered = rendered || (s.Name == v.Secret.SecretName && s.StringData[path.Base(args[f])] != "")
			}
		}
		if !rendered {
			t.Errorf("gateway --%s=%s: no rendered ConfigMap/Secret holds it (%+v)", f, args[f], v.VolumeSource)
		}
	}
	if f := args["tokens"]; strings.Contains(f, "config") {
		t.Errorf("gateway tokens at %s: tokens must come from a Secret", f)
	}
	if v := volumeAt(t, d, c, path.Dir(args["tokens"])); v.Secret == nil {
		t.Error("gateway tokens are not mounted from a Secret")
	}
	checkGatewayStore(t, r, d, c, args, e.gw)
	// The supervisors' endpoint is this Service.
	var svc *corev1.Service
	for _, s := range r.Services {
		if s.Labels["app.kubernetes.io/component"] == "gateway" {
			svc = s
		}
	}
	if svc == nil {
		t.Fatal("no gateway Service")
	}
	mustSelect(t, "gateway Service", &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, d.Spec.Template.Labels)
	var https int32
	for _, p := range svc.Spec.Ports {
		if resolvePort(t, p.TargetPort, ports) == gp {
			https = p.Port
		}
	}
	if want := "https://" + svc.Name + "." + namespace + ".svc:" + strconv.Itoa(int(https)); e.endpoint != want {
		t.Errorf("supervisors use %s, the gateway Service is %s", e.endpoint, want)
	}
	// Its NetworkPolicy admits the supervisors.
	sup := supervisorDeployment(t, r)
	admitted := false
	for _, np := range r.NetworkPolicies {
		s, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if s.Empty() || !s.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		peers, _ := admittedPeers(t, np, gp, ports)
		for _, p := range peers {
			if p.PodSelector == nil {
				continue
			}
			ps, _ := metav1.LabelSelectorAsSelector(p.PodSelector)
			admitted = admitted || ps.Matches(labels.Set(sup.Spec.Template.Labels))
		}
	}
	if !admitted {
		t.Error("no NetworkPolicy admits the supervisors to the gateway's port")
	}
}

// checkGatewayStore checks the gateway's replicas, store, etcd flags and
// files, endpoint policy, rollout, spreading and disruption budget.
func checkGatewayStore(t *testing.T, r *rendered, d *appsv1.Deployment, c *corev1.Container, args map[string]string, g gatewayExpect) {
	t.Helper()
	if d.Spec.Replicas == nil || *d.Spec.Replicas != g.replicas {
		t.Errorf("gateway replicas = %v, want %d", d.Spec.Replicas, g.replicas)
	}
	if args["store"] != g.store {
		t.Errorf("gateway --store=%q, want %q", args["store"], g.store)
	}
	if args["endpoint-policy"] != g.endpointPolicy {
		t.Errorf("gateway --endpoint-policy=%q, want %q", args["endpoint-policy"], g.endpointPolicy)
	}
	etcdFlags := []string{"etcd-endpoints", "etcd-prefix", "etcd-ca-file", "etcd-cert-file", "etcd-key-file", "etcd-dial-timeout"}
	if g.store != "etcd" {
		// One in-memory replica, replaced (never two with split state).
		for _, f := range etcdFlags {
			if _, ok := args[f]; ok {
				t.Errorf("gateway with the memory store gets --%s", f)
			}
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("memory-store gateway strategy %q, want Recreate", d.Spec.Strategy.Type)
		}
		return
	}
	if args["etcd-endpoints"] != g.etcdEndpoints || args["etcd-prefix"] != g.etcdPrefix {
		t.Errorf("gateway --etcd-endpoints=%q --etcd-prefix=%q, want %q and %q", args["etcd-endpoints"], args["etcd-prefix"], g.etcdEndpoints, g.etcdPrefix)
	}
	// Rolling, never below the wanted number of ready replicas.
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("etcd-store gateway strategy %+v, want RollingUpdate with maxUnavailable 0", d.Spec.Strategy)
	}
	// The client certificate, key and CA come from the one Secret.
	files := map[string]string{"etcd-cert-file": "tls.crt", "etcd-key-file": "tls.key"}
	if g.etcdCAKey != "" {
		files["etcd-ca-file"] = g.etcdCAKey
	}
	if g.etcdTLSSecret == "" {
		files = nil
	}
	for _, f := range []string{"etcd-ca-file", "etcd-cert-file", "etcd-key-file"} {
		key, want := files[f]
		v, have := args[f]
		switch {
		case want != have:
			t.Errorf("gateway --%s given: %v, want %v", f, have, want)
		case want:
			vol := volumeAt(t, d, c, path.Dir(v))
			if vol.Secret == nil || vol.Secret.SecretName != g.etcdTLSSecret || path.Base(v) != key {
				t.Errorf("gateway --%s=%s is not key %s of Secret %s: %+v", f, v, key, g.etcdTLSSecret, vol.VolumeSource)
			}
		}
	}
	// Several replicas: spread over nodes unless affinity is given, and a
	// disruption budget that lets a node drain.
	if g.replicas > 1 {
		var pdb *policyv1.PodDisruptionBudget
		for _, p := range r.PDBs {
			if p.Labels["app.kubernetes.io/component"] == "gateway" {
				pdb = p
			}
		}
		if pdb == nil {
			t.Fatal("no PodDisruptionBudget over the gateway replicas")
		}
		mustSelect(t, "gateway PodDisruptionBudget", pdb.Spec.Selector, d.Spec.Template.Labels)
		sup := supervisorDeployment(t, r)
		if s, _ := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); s.Matches(labels.Set(sup.Spec.Template.Labels)) {
			t.Error("the gateway PodDisruptionBudget also selects supervisors")
		}
		if mu := pdb.Spec.MaxUnavailable; mu == nil || (mu.Type == intstr.Int && (mu.IntVal < 1 || mu.IntVal >= g.replicas)) {
			t.Errorf("gateway PodDisruptionBudget maxUnavailable %v: want at least 1 and fewer than %d", mu, g.replicas)
		}
		if aff := d.Spec.Template.Spec.Affinity; aff == nil {
			t.Error("several gateway replicas without any affinity")
		} else if aff.NodeAffinity == nil {
			pa := aff.PodAntiAffinity
			if pa == nil || len(pa.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
				t.Fatalf("gateway anti-affinity %+v: want one preferred term", pa)
			}
			term := pa.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
			if term.TopologyKey != "kubernetes.io/hostname" {
				t.Errorf("gateway anti-affinity on %q, want kubernetes.io/hostname", term.TopologyKey)
			}
			mustSelect(t, "gateway anti-affinity", term.LabelSelector, d.Spec.Template.Labels)
		}
	}
}

// checkVolumeReferences: a key projected from a Secret/ConfigMap that this
// release renders must exist in it.
func checkVolumeReferences(t *testing.T, r *rendered) {
	t.Helper()
	for _, d := range r.Deployments {
		for _, v := range d.Spec.Template.Spec.Volumes {
			switch {
			case v.ConfigMap != nil:
				for _, cm := range r.ConfigMaps {
					if cm.Name != v.ConfigMap.Name {
						continue
					}
					for _, it := range v.ConfigMap.Items {
						if _, ok := cm.Data[it.Key]; !ok {
							t.Errorf("%s: volume %s projects key %s missing from ConfigMap %s", d.Name, v.Name, it.Key, cm.Name)
						}
					}
				}
			case v.Secret != nil:
				for _, s := range r.Secrets {
					if s.Name != v.Secret.SecretName {
						continue
					}
					for _, it := range v.Secret.Items {
						if _, ok := s.StringData[it.Key]; !ok {
							if _, ok := s.Data[it.Key]; !ok {
								t.Errorf("%s: volume %s projects key %s missing from Secret %s", d.Name, v.Name, it.Key, s.Name)
							}
						}
					}
				}
			}
		}
	}
}

// TestChartLint: `helm lint --strict` (Chart.yaml, values.schema.json,
// template warnings) passes.
func TestChartLint(t *testing.T) {
	helm := helmBinary(t)
	cmd := exec.Command(helm, "lint", "--strict", chartDir, "--set", "controlPlane.gatewayEndpoint=https://gateway:8080")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
}
