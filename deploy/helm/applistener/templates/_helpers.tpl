{{/*
Helpers of the applistener chart. deploy/helm/chart_test.go renders the chart with
Helm itself and decodes every object strictly into the Kubernetes API types.
*/}}

{{- define "applistener.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "applistener.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if eq .Release.Name $name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "applistener.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "applistener.labels" -}}
helm.sh/chart: {{ include "applistener.chart" . }}
app.kubernetes.io/name: {{ include "applistener.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of the supervisor Pods. */}}
{{- define "applistener.supervisorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "applistener.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: supervisor
{{- end }}

{{/* Selector labels of the reference gateway Pods. */}}
{{- define "applistener.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ include "applistener.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The image: by digest when image.digest is set (a release's chart), else by tag. */}}
{{/* Selector labels of the edge Pods. */}}
{{- define "applistener.edgeSelectorLabels" -}}
app.kubernetes.io/name: {{ include "applistener.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: edge
{{- end }}

{{- define "applistener.edgeName" -}}
{{- printf "%s-edge" (include "applistener.fullname" .) }}
{{- end }}

{{/* The Secret with the edge's workspace token. */}}
{{- define "applistener.edgeTokenSecret" -}}
{{- if .Values.edge.token.value }}
{{- printf "%s-token" (include "applistener.edgeName" .) }}
{{- else }}
{{- .Values.edge.token.existingSecret }}
{{- end }}
{{- end }}

{{- define "applistener.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "applistener.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "applistener.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "applistener.gatewayName" -}}
{{- printf "%s-gateway" (include "applistener.fullname" .) }}
{{- end }}

{{/* The gateway URL the supervisors use. */}}
{{- define "applistener.gatewayEndpoint" -}}
{{- if .Values.gateway.enabled }}
{{- printf "https://%s.%s.svc:%d" (include "applistener.gatewayName" .) .Release.Namespace (int .Values.gateway.port) }}
{{- else }}
{{- required "controlPlane.gatewayEndpoint is required when controlPlane.source is gateway" .Values.controlPlane.gatewayEndpoint }}
{{- end }}
{{- end }}

{{/* Whether the headless metrics Service exists. */}}
{{- define "applistener.metricsService" -}}
{{- if or .Values.metricsService.enabled .Values.serviceMonitor.enabled }}true{{ end }}
{{- end }}

{{/* NetworkPolicy peers for {namespaces, podLabels}: one peer per namespace (with
the Pod labels ANDed in), or one Pod-label peer in the release namespace. Renders
nothing when both are empty: the caller then omits the rule (an empty "from"
would admit every source). */}}
{{- define "applistener.peers" -}}
{{- $labels := .podLabels | default dict }}
{{- if .namespaces }}
{{- range .namespaces }}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ . | quote }}
  {{- with $labels }}
  podSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
  {{- end }}
{{- end }}
{{- else if $labels }}
- podSelector:
    matchLabels:
      {{- toYaml $labels | nindent 6 }}
{{- end }}
{{- end }}

{{/* Checks values that the schema cannot express; fails with one line. */}}
{{- define "applistener.validate" -}}
{{- $v := .Values }}
{{- if not (has $v.mode (list "dedicated" "shared")) }}
{{- fail (printf "mode must be dedicated or shared, not %q" $v.mode) }}
{{- end }}
{{- if not (has $v.controlPlane.source (list "gateway" "routesFile")) }}
{{- fail (printf "controlPlane.source must be gateway or routesFile, not %q" $v.controlPlane.source) }}
{{- end }}
{{- if $v.appListener.enabled }}
{{- if not (regexMatch "^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$" ($v.appListener.domain | default "")) }}
{{- fail (printf "appListener.domain %q must be a lower-case DNS name such as apps.example.com" $v.appListener.domain) }}
{{- end }}
{{- $_ := required "appListener.tls.secretName is required when appListener.enabled" $v.appListener.tls.secretName }}
{{- end }}
{{- if eq $v.mode "shared" }}
{{- if $v.dedicated.service.enabled }}
{{- fail "dedicated.service.enabled applies to mode=dedicated only: shared hosts have no application Service (callers connect to the owning Pod IP from discovery)" }}
{{- end }}
{{- if $v.dedicated.sandboxContainers }}
{{- fail "dedicated.sandboxContainers applies to mode=dedicated only" }}
{{- end }}
{{- if and $v.supervisorId (ne (int $v.shared.replicas) 1) }}
{{- fail "supervisorId (a fixed id) needs one supervisor: use it with mode=dedicated, or leave it empty so that each shared host is known by its Pod name" }}
{{- end }}
{{- else }}
{{- if $v.shared.netnsConnector }}
{{- fail "shared.netnsConnector applies to mode=shared only (a dedicated supervisor shares its sandbox's network namespace)" }}
{{- end }}
{{- if and $v.dedicated.service.enabled (not $v.appListener.enabled) }}
{{- fail "dedicated.service.enabled needs appListener.enabled: the Service exposes only the app port" }}
{{- end }}
{{- end }}
{{- if and (eq $v.controlPlane.source "gateway") (not $v.gateway.enabled) (not $v.controlPlane.gatewayEndpoint) }}
{{- fail "set controlPlane.gatewayEndpoint to your gateway's URL (and create the Secret controlPlane.token.secretName with the supervisors' token), or gateway.enabled=true for the reference gateway, or controlPlane.source=routesFile" }}
{{- end }}
{{- if eq $v.controlPlane.source "gateway" }}
{{- $_ := required "controlPlane.token.secretName is required when controlPlane.source is gateway" $v.controlPlane.token.secretName }}
{{- if and $v.controlPlane.ca.secretName $v.controlPlane.ca.configMapName }}
{{- fail "controlPlane.ca: set secretName or configMapName, not both" }}
{{- end }}
{{- else }}
{{- $_ := required "controlPlane.routesFile.configMapName is required when controlPlane.source is routesFile" $v.controlPlane.routesFile.configMapName }}
{{- if $v.gateway.enabled }}
{{- fail "gateway.enabled needs controlPlane.source=gateway" }}
{{- end }}
{{- end }}
{{- if $v.gateway.enabled }}
{{- $_ := required "gateway.tls.secretName is required: the reference gateway serves only HTTPS off loopback" $v.gateway.tls.secretName }}
{{- if not (or $v.controlPlane.ca.secretName $v.controlPlane.ca.configMapName) }}
{{- fail "gateway.enabled needs controlPlane.ca.secretName or controlPlane.ca.configMapName: the supervisors must verify the reference gateway's in-cluster certificate" }}
{{- end }}
{{- if and $v.gateway.config.existingConfigMap $v.gateway.config.existingSecret }}
{{- fail "gateway.config: set existingConfigMap or existingSecret, not both" }}
{{- end }}
{{- $g := $v.gateway }}
{{- if not (has $g.store (list "memory" "etcd")) }}
{{- fail (printf "gateway.store must be memory or etcd, not %q" $g.store) }}
{{- end }}
{{- if lt (int $g.replicas) 1 }}
{{- fail "gateway.replicas must be at least 1" }}
{{- end }}
{{- if and (eq $g.store "memory") (gt (int $g.replicas) 1) }}
{{- fail "gateway.replicas > 1 needs gateway.store=etcd: memory-store replicas would each hold different sessions and advertisements" }}
{{- end }}
{{- if not (regexMatch "^(source|any|cidr:[0-9a-fA-F.:/]+(,[0-9a-fA-F.:/]+)*)$" ($g.endpointPolicy | default "")) }}
{{- fail (printf "gateway.endpointPolicy must be source, any or cidr:CIDR[,CIDR...], not %q" $g.endpointPolicy) }}
{{- end }}
{{- if eq $g.store "etcd" }}
{{- if not $g.etcd.endpoints }}
{{- fail "gateway.etcd.endpoints is required when gateway.store is etcd" }}
{{- end }}
{{- range $g.etcd.endpoints }}
{{- if not (regexMatch "^https?://[^/,]+$" .) }}
{{- fail (printf "gateway.etcd.endpoints: %q is not an http(s)://host:port URL" .) }}
{{- end }}
{{- if and $g.etcd.tls.secretName (not (hasPrefix "https://" .)) }}
{{- fail (printf "gateway.etcd.endpoints: %q is plain http although gateway.etcd.tls.secretName gives client certificates" .) }}
{{- end }}
{{- end }}
{{- if not (regexMatch "^/(.*/)?$" ($g.etcd.prefix | default "")) }}
{{- fail (printf "gateway.etcd.prefix %q must start and end with /" $g.etcd.prefix) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $v.edge.enabled }}
{{- $e := $v.edge }}
{{- if ne $v.controlPlane.source "gateway" }}
{{- fail "edge.enabled needs controlPlane.source=gateway: the edge follows the gateway's discovery" }}
{{- end }}
{{- if not $v.appListener.enabled }}
{{- fail "edge.enabled needs appListener.enabled: the edge forwards to the supervisors' app port" }}
{{- end }}
{{- if not $e.workspaces }}
{{- fail "edge.workspaces is required when edge.enabled: the workspaces the edge serves (its token must cover them)" }}
{{- end }}
{{- if and $e.token.value $e.token.existingSecret }}
{{- fail "edge.token: set value or existingSecret, not both" }}
{{- end }}
{{- if not (or $e.token.value $e.token.existingSecret) }}
{{- fail "edge.token.existingSecret (a Secret with a workspace token of the gateway) or edge.token.value is required when edge.enabled" }}
{{- end }}
{{- if and (eq $e.proxyProtocol "v2") (not (or $v.appListener.requireProxyProtocol $v.appListener.trustedProxies)) }}
{{- fail "edge.proxyProtocol=v2 needs appListener.requireProxyProtocol (the Pod CIDR the edge runs in), else the supervisors refuse its PROXY headers; or set edge.proxyProtocol=off" }}
{{- end }}
{{- end }}
{{- $drain := int $v.drainTimeoutSeconds }}
{{- $need := add $drain (int $v.preStopSleepSeconds) }}
{{- if and $v.terminationGracePeriodSeconds (le (int $v.terminationGracePeriodSeconds) $need) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed drainTimeoutSeconds + preStopSleepSeconds (%d)" (int $v.terminationGracePeriodSeconds) $need) }}
{{- end }}
{{- end }}

{{- define "applistener.terminationGracePeriodSeconds" -}}
{{- if .Values.terminationGracePeriodSeconds }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- add (int .Values.drainTimeoutSeconds) (int .Values.preStopSleepSeconds) 10 }}
{{- end }}
{{- end }}
