{{/* Names, labels and the exporter's container, shared by every template. */}}

{{- define "see.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "see.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "see.selectorLabels" -}}
app.kubernetes.io/name: {{ include "see.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The chart's labels, then commonLabels (a platform's labelling policy), on every object. The
     chart's own win a clash: the selector labels must stay what the DaemonSet selects. */}}
{{- define "see.labels" -}}
{{- $own := dict "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-") "app.kubernetes.io/name" (include "see.name" .) "app.kubernetes.io/instance" .Release.Name "app.kubernetes.io/version" .Chart.AppVersion "app.kubernetes.io/managed-by" .Release.Service }}
{{- toYaml (merge $own (.Values.commonLabels | default dict)) }}
{{- end }}

{{/* The pod template's labels: the full set (as every object has), workload identity's, then
     podLabels and commonLabels, the chart's own winning a clash. */}}
{{- define "see.podLabels" -}}
{{- $own := include "see.labels" . | fromYaml }}
{{- if and .Values.eventhubs.enabled .Values.eventhubs.workloadIdentity.enabled }}
{{- $_ := set $own "azure.workload.identity/use" "true" }}
{{- end }}
{{- toYaml (merge $own (.Values.podLabels | default dict)) }}
{{- end }}

{{/* The platform process's labels: the full set, with its own name (so that nothing the
     DaemonSet, its Service, monitors or NetworkPolicy select includes it) and a component. */}}
{{- define "see.platformSelectorLabels" -}}
app.kubernetes.io/name: {{ include "see.name" . | trunc 54 | trimSuffix "-" }}-platform
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "see.platformLabels" -}}
{{- $labels := include "see.labels" . | fromYaml }}
{{- $labels = merge (include "see.platformSelectorLabels" . | fromYaml) (dict "app.kubernetes.io/component" "platform-feed") $labels }}
{{- toYaml $labels }}
{{- end }}

{{- define "see.platformName" -}}
{{- include "see.fullname" . | trunc 54 | trimSuffix "-" }}-platform
{{- end }}

{{- define "see.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "see.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: [registry/]repository:tag[@digest]. global.imageRegistry (one mirror
     for every chart of an umbrella release) wins over image.registry; image.flavor's suffix
     (-slim, -shell) ends the tag unless it does already or the tag is the flavor's name (the
     README's own build tags the slim image :slim and the shell image :shell); by digest when
     one is given. */}}
{{- define "see.image" -}}
{{- $registry := .Values.image.registry }}
{{- with .Values.global }}{{ with .imageRegistry }}{{ $registry = . }}{{ end }}{{ end }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}{{ end }}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- $flavor := default "default" .Values.image.flavor }}
{{- $suffix := get (dict "default" "" "slim" "-slim" "shell" "-shell") $flavor }}
{{- if and $suffix (ne $tag $flavor) (not (hasSuffix $suffix $tag)) }}{{ $tag = printf "%s%s" $tag $suffix }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" $repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/* The sinks in effect, as SEE_SINKS lists them. */}}
{{- define "see.sinks" -}}
{{- $sinks := list }}
{{- if .Values.otlp.enabled }}{{ $sinks = append $sinks "otlp" }}{{ end }}
{{- if .Values.eventhubs.enabled }}{{ $sinks = append $sinks "eventhubs" }}{{ end }}
{{- $console := .Values.console.enabled }}
{{- if or $console (and (kindIs "invalid" $console) (empty $sinks)) }}
{{- $sinks = append $sinks "console" }}
{{- end }}
{{- if empty $sinks }}
{{- fail "no sink is enabled: enable otlp, eventhubs or console (console.enabled: true writes records to the pod's log)" }}
{{- end }}
{{- join "," $sinks }}
{{- end }}

{{- define "see.metricsExporters" -}}
{{- $exporters := list }}
{{- if and .Values.otlp.enabled .Values.otlp.metrics }}{{ $exporters = append $exporters "otlp" }}{{ end }}
{{- if .Values.prometheus.enabled }}{{ $exporters = append $exporters "prometheus" }}{{ end }}
{{- if and .Values.otlp.metrics (not .Values.otlp.enabled) }}
{{- fail "otlp.metrics: true needs otlp.enabled: true (metrics go to the same collector)" }}
{{- end }}
{{- default "none" (join "," $exporters) }}
{{- end }}

{{/* "true" when the pods carry prometheus.io/* annotations: not while a PodMonitor or
     ServiceMonitor scrapes them, or an annotation-based scrape config scrapes every pod a
     second time under another job. */}}
{{- define "see.scrapeAnnotations" -}}
{{- if and .Values.prometheus.enabled .Values.prometheus.podAnnotations (not (or .Values.podMonitor.enabled .Values.serviceMonitor.enabled)) }}true{{ end }}
{{- end }}

{{/* "true" when the egress NetworkPolicy is rendered: networkPolicy.enabled, or by default
     (null) unless the pods use the host's network, which NetworkPolicy does not cover. */}}
{{- define "see.networkPolicy" -}}
{{- $enabled := .Values.networkPolicy.enabled }}
{{- if or (eq $enabled true) (and (kindIs "invalid" $enabled) (not .Values.hostNetwork)) }}true{{ end }}
{{- end }}

{{/* Checks the values cannot express in values.schema.json, with a line that says what to set. */}}
{{- define "see.validate" -}}
{{- /* A surge runs the new pod beside the old one on each node: refused where the two would
     share something only one can hold (docs/kubernetes.md, "Upgrades and rollbacks"). */}}
{{- with .Values.updateStrategy.rollingUpdate }}
{{- if and (hasKey . "maxSurge") (not (has (toString .maxSurge) (list "0" "0%"))) }}
{{- if ne $.Values.state.type "emptyDir" }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge=%v: expected 0 with state.type=%s. One exporter per state directory: a surged pod would find the node's directory held by the pod it replaces, wait for it, and exit with code 3; with state.type=emptyDir each pod has its own and a surge is allowed (docs/kubernetes.md, \"Upgrades and rollbacks\")" .maxSurge $.Values.state.type) }}
{{- else if $.Values.hostNetwork }}
{{- $held := printf "health %v" $.Values.ports.health }}
{{- if $.Values.prometheus.enabled }}{{ $held = printf "%s, metrics %v" $held $.Values.ports.metrics }}{{ end }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge=%v: expected 0 with hostNetwork=true. A surged pod needs the node ports its predecessor holds (%s): it cannot be scheduled beside it, and the rollout stops (docs/kubernetes.md, \"Upgrades and rollbacks\")" .maxSurge $held) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* The slim image has neither gRPC nor the Event Hubs SDK: values that use either would
     render pods that stop at start, which `helm template | kubectl apply` learns of only from
     CrashLoopBackOff. The protocols as the exporter reads them: extraEnv's literal values
     replace the chart's (see.env), a signal's own variable wins over the general one. */}}
{{- if eq (default "default" .Values.image.flavor) "slim" }}
{{- $extra := dict }}
{{- range .Values.extraEnv }}{{ if hasKey . "value" }}{{ $_ := set $extra .name (toString .value) }}{{ end }}{{ end }}
{{- $signals := list (list "log records" "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL" true) (list "metrics" "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL" .Values.otlp.metrics) }}
{{- $grpc := list }}
{{- $chosenBy := list }}
{{- range $signals }}
{{- if and $.Values.otlp.enabled (index . 2) }}
{{- $by := "otlp.protocol" }}
{{- $protocol := $.Values.otlp.protocol }}
{{- if hasKey $extra "OTEL_EXPORTER_OTLP_PROTOCOL" }}{{ $by = "extraEnv OTEL_EXPORTER_OTLP_PROTOCOL" }}{{ $protocol = get $extra "OTEL_EXPORTER_OTLP_PROTOCOL" }}{{ end }}
{{- if hasKey $extra (index . 1) }}{{ $by = printf "extraEnv %s" (index . 1) }}{{ $protocol = get $extra (index . 1) }}{{ end }}
{{- if eq $protocol "grpc" }}{{ $grpc = append $grpc (index . 0) }}{{ $chosenBy = append $chosenBy $by }}{{ end }}
{{- end }}
{{- end }}
{{- $routes := list }}
{{- if $grpc }}{{ $routes = append $routes (printf "OTLP over gRPC (%s)" (join " and " $grpc)) }}{{ end }}
{{- if .Values.eventhubs.enabled }}{{ $routes = append $routes "to Event Hubs (eventhubs.enabled)" }}{{ end }}
{{- if $routes }}
{{- $instead := "" }}
{{- if and $grpc (not .Values.eventhubs.enabled) }}{{ $instead = printf " (or %s=http/protobuf, the collector's port 4318)" (join " and " (uniq $chosenBy)) }}{{ end }}
{{- fail (printf "image.flavor=slim: the slim image carries neither gRPC nor the Event Hubs SDK, and these values send %s: every pod would stop at start with \"configuration error: ... which is not in this image\"; expected image.flavor=default%s" (join " and " $routes) $instead) }}
{{- end }}
{{- end }}
{{- $eh := .Values.eventhubs }}
{{- if $eh.enabled }}
{{- if and $eh.existingSecret.name $eh.workloadIdentity.enabled }}
{{- fail "eventhubs: set either existingSecret.name (a connection string) or workloadIdentity.enabled, not both" }}
{{- end }}
{{- if not (or $eh.existingSecret.name $eh.workloadIdentity.enabled) }}
{{- fail "eventhubs.enabled needs a credential: eventhubs.existingSecret.name (a Secret holding a connection string) or eventhubs.workloadIdentity (enabled, namespace, clientId)" }}
{{- end }}
{{- if and $eh.workloadIdentity.enabled (not (and $eh.workloadIdentity.namespace $eh.workloadIdentity.clientId)) }}
{{- fail "eventhubs.workloadIdentity needs namespace (e.g. myns.servicebus.windows.net) and clientId (the managed identity's client id)" }}
{{- end }}
{{- end }}
{{- range $key, $range := dict "pollInterval" (list 0.2 3600.0) "stalenessLimit" (list 1.0 86400.0) "shutdownTimeout" (list 0.0 600.0) }}
{{- $value := float64 (index $.Values.config $key) }}
{{- if or (lt $value (index $range 0)) (gt $value (index $range 1)) }}
{{- fail (printf "config.%s=%v: expected a number of seconds from %v to %v" $key (index $.Values.config $key) (index $range 0) (index $range 1)) }}
{{- end }}
{{- end }}
{{- if lt (float64 .Values.terminationGracePeriodSeconds) (addf (float64 .Values.config.shutdownTimeout) 5) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be above config.shutdownTimeout (%v) + 5 s: the drain and the shutdown watchdog must fit before the kubelet kills the pod" .Values.terminationGracePeriodSeconds .Values.config.shutdownTimeout) }}
{{- end }}
{{- if eq (int .Values.ports.health) (int .Values.ports.metrics) }}
{{- fail (printf "ports.health and ports.metrics are both %v: the health and metrics servers need a port each" .Values.ports.health) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled: true (a ServiceMonitor selects a Service)" }}
{{- end }}
{{- if and (or .Values.podMonitor.enabled .Values.serviceMonitor.enabled) (not .Values.prometheus.enabled) }}
{{- fail "podMonitor/serviceMonitor scrape /metrics: set prometheus.enabled: true" }}
{{- end }}
{{- /* Text fields of a given form: checked here rather than by a schema pattern, whose error
     shows the regular expression instead of what to write. */}}
{{- $forms := list
  (list "image.digest" .Values.image.digest "^(sha256:[a-f0-9]{64})?$" "sha256: and 64 hex digits, or empty to pull by tag")
  (list "config.imdsEndpoint" .Values.config.imdsEndpoint "^http://[^/]+/?$" "an http:// URL with a host and no path, e.g. http://169.254.169.254")
  (list "eventhubs.workloadIdentity.namespace" .Values.eventhubs.workloadIdentity.namespace "^$|^[A-Za-z0-9][A-Za-z0-9-]*(\\.[A-Za-z0-9-]+)+$" "the fully qualified namespace, e.g. myns.servicebus.windows.net")
  (list "state.hostPath" .Values.state.hostPath "^/" "an absolute path on the node, e.g. /var/lib/scheduled-events-exporter")
  (list "podMonitor.interval" .Values.podMonitor.interval "^[0-9]+(ms|s|m|h)$" "a duration such as 30s or 1m")
  (list "serviceMonitor.interval" .Values.serviceMonitor.interval "^[0-9]+(ms|s|m|h)$" "a duration such as 30s or 1m") }}
{{- range $forms }}
{{- if not (regexMatch (index . 2) (toString (index . 1))) }}
{{- fail (printf "%s=%q: expected %s" (index . 0) (toString (index . 1)) (index . 3)) }}
{{- end }}
{{- end }}
{{- $_ := include "see.otlpPorts" . }}
{{- $names := dict }}
{{- range .Values.extraEnv }}
{{- if hasKey $names .name }}
{{- fail (printf "extraEnv names %s twice" .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- end }}
{{- end }}

{{/* The TCP ports otlp.endpoint sends to, comma-separated, as the exporter reaches them (empty:
     a Unix socket, no network). An http:// or https:// URL: its port; without one, 80 for http
     and 443 for https over http/protobuf, and 443 over gRPC, whose resolver gives a name
     without a port 443 even on a plaintext channel. A gRPC target (gRPC's doc/naming.md, passed
     to the client as written; protocol grpc only): dns: its port, else 443; ipv4: and ipv6:
     every address's port (gRPC refuses an address without one); unix: and unix-abstract:
     none. Anything else fails, saying what to write; so does a port outside 1-65535. */}}
{{- define "see.otlpPorts" -}}
{{- $endpoint := toString .Values.otlp.endpoint }}
{{- $grpc := eq .Values.otlp.protocol "grpc" }}
{{- $scheme := regexFind `^[A-Za-z][A-Za-z0-9+.-]*:` $endpoint | trimSuffix ":" | lower }}
{{- $expected := "expected the collector's URL with its scheme, e.g. http://otel-collector.observability.svc:4318" }}
{{- if $grpc }}
{{- $expected = "expected the collector's URL with its scheme, e.g. http://otel-collector.observability.svc:4317, or a gRPC target such as dns:///otel-collector.observability.svc:4317 or unix:///run/otel/otlp.sock" }}
{{- end }}
{{- $ports := list }}
{{- if and (has $scheme (list "http" "https")) (regexMatch `^[A-Za-z]+://([^/?#@]*@)?(\[[0-9A-Fa-f:.]+\]|[^/?#@\[\]:]+)(:[0-9]*)?([/?#].*)?$` $endpoint) }}
{{- $port := regexFind `:[0-9]+$` (urlParse $endpoint).host | trimPrefix ":" }}
{{- $ports = list ($port | default (ternary "443" "80" (or $grpc (eq $scheme "https")))) }}
{{- else if and $grpc (eq $scheme "dns") }}
{{- $name := regexReplaceAll `^[A-Za-z]+:(//[^/]*/)?` $endpoint "" }}
{{- $port := "443" }}
{{- if hasPrefix "[" $name }}
{{- if not (regexMatch `^\[[0-9A-Fa-f:.]+\](:[0-9]+)?$` $name) }}{{ fail (printf "otlp.endpoint=%q: %s" $endpoint $expected) }}{{ end }}
{{- $port = regexFind `\]:[0-9]+$` $name | trimPrefix "]:" | default "443" }}
{{- else if eq (len (splitList ":" $name)) 2 }}
{{- if not (regexMatch `^[^:/]+:[0-9]+$` $name) }}{{ fail (printf "otlp.endpoint=%q: %s" $endpoint $expected) }}{{ end }}
{{- $port = regexFind `[0-9]+$` $name }}
{{- else if not $name }}
{{- fail (printf "otlp.endpoint=%q: %s" $endpoint $expected) }}
{{- end }}
{{- $ports = list $port }}
{{- else if and $grpc (has $scheme (list "ipv4" "ipv6")) }}
{{- $form := ternary `^[0-9.]+:([0-9]+)$` `^\[[0-9A-Fa-f:.]+\]:([0-9]+)$` (eq $scheme "ipv4") }}
{{- range splitList "," (regexReplaceAll `^[A-Za-z0-9]+:` $endpoint "") }}
{{- if not (regexMatch $form .) }}
{{- fail (printf "otlp.endpoint=%q: expected each %s: address with its port (%s), which gRPC requires there" $endpoint $scheme (ternary "ipv4:10.0.0.5:4317" "ipv6:[fd00::5]:4317" (eq $scheme "ipv4"))) }}
{{- end }}
{{- $ports = append $ports (regexFind `[0-9]+$` .) }}
{{- end }}
{{- else if not (and $grpc (has $scheme (list "unix" "unix-abstract"))) }}
{{- if and (not $grpc) (has $scheme (list "dns" "ipv4" "ipv6" "unix" "unix-abstract")) }}
{{- fail (printf "otlp.endpoint=%q: a gRPC target needs otlp.protocol=grpc (otlp.protocol is %s); %s" $endpoint .Values.otlp.protocol $expected) }}
{{- end }}
{{- fail (printf "otlp.endpoint=%q: %s" $endpoint $expected) }}
{{- end }}
{{- range $ports }}
{{- if or (lt (int .) 1) (gt (int .) 65535) }}
{{- fail (printf "otlp.endpoint=%q: port %s is not a TCP port, expected 1 to 65535" $endpoint .) }}
{{- end }}
{{- end }}
{{- join "," (uniq $ports) }}
{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES: where this pod runs, from the downward API (NODE_NAME, POD_NAME
     and POD_NAMESPACE are set before it, so $(...) expands), plus config.resourceAttributes. */}}
{{- define "see.resourceAttributes" -}}
{{- include "see.resourceAttributesOf" (dict "root" . "instance" .Values.config.serviceInstanceId) }}
{{- end }}

{{/* The same for a given service.instance.id: the platform process is one per release, named
     after its pod, wherever it runs. */}}
{{- define "see.resourceAttributesOf" -}}
{{- $v := .root.Values }}
{{- $attrs := list (printf "service.instance.id=%s" .instance) "k8s.node.name=$(NODE_NAME)" "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" (printf "cloud.platform=%s" $v.config.cloudPlatform) }}
{{- range $key, $value := $v.config.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $key (toString $value)) }}
{{- end }}
{{- join "," $attrs }}
{{- end }}

{{/* The exporter's environment: the chart's variables, each replaced by an extraEnv entry of the
     same name, then extraEnv. No name appears twice (server-side apply refuses that). */}}
{{- define "see.env" -}}
{{- include "see.envOf" (dict "root" . "platform" false) }}
{{- end }}

{{/* The platform process's environment (platform.enabled): the same sinks, state directory,
     health and metrics settings as the exporter's, no IMDS settings (it reads a queue, not IMDS),
     SEE_PLATFORM_QUEUE_URL, then platform.extraEnv. */}}
{{- define "see.platformEnv" -}}
{{- include "see.envOf" (dict "root" . "platform" true) }}
{{- end }}

{{- define "see.envOf" -}}
{{- $root := .root }}
{{- $platform := .platform }}
{{- $v := $root.Values }}
{{- $env := list }}
{{- $env = append $env (dict "name" "NODE_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))) }}
{{- $env = append $env (dict "name" "POD_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) }}
{{- $env = append $env (dict "name" "POD_NAMESPACE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))) }}
{{- $env = append $env (dict "name" "SEE_SINKS" "value" (include "see.sinks" $root)) }}
{{- if $platform }}
{{- $env = append $env (dict "name" "SEE_PLATFORM_QUEUE_URL" "value" $v.platform.queueUrl) }}
{{- else }}
{{- $env = append $env (dict "name" "SEE_POLL_INTERVAL" "value" (toString $v.config.pollInterval)) }}
{{- $env = append $env (dict "name" "SEE_IMDS_ENDPOINT" "value" $v.config.imdsEndpoint) }}
{{- end }}
{{- $env = append $env (dict "name" "SEE_STATE_DIR" "value" "/var/lib/scheduled-events-exporter") }}
{{- $env = append $env (dict "name" "SEE_HEALTH_ADDR" "value" (printf "0.0.0.0:%v" $v.ports.health)) }}
{{- if not $platform }}
{{- $env = append $env (dict "name" "SEE_STALENESS_LIMIT" "value" (toString $v.config.stalenessLimit)) }}
{{- end }}
{{- if $v.config.readinessIncludes }}
{{- $env = append $env (dict "name" "SEE_READINESS_INCLUDES" "value" (join "," $v.config.readinessIncludes)) }}
{{- end }}
{{- $env = append $env (dict "name" "SEE_SHUTDOWN_TIMEOUT" "value" (toString $v.config.shutdownTimeout)) }}
{{- $env = append $env (dict "name" "SEE_LOG_LEVEL" "value" $v.config.logLevel) }}
{{- $env = append $env (dict "name" "OTEL_SERVICE_NAME" "value" $v.config.serviceName) }}
{{- $instance := ternary "$(POD_NAME)" $v.config.serviceInstanceId $platform }}
{{- $env = append $env (dict "name" "OTEL_RESOURCE_ATTRIBUTES" "value" (include "see.resourceAttributesOf" (dict "root" $root "instance" $instance))) }}
{{- $env = append $env (dict "name" "OTEL_METRICS_EXPORTER" "value" (include "see.metricsExporters" $root)) }}
{{- if $v.prometheus.enabled }}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_PROMETHEUS_HOST" "value" "0.0.0.0") }}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_PROMETHEUS_PORT" "value" (toString $v.ports.metrics)) }}
{{- end }}
{{- if $v.otlp.enabled }}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_OTLP_ENDPOINT" "value" $v.otlp.endpoint) }}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_OTLP_PROTOCOL" "value" $v.otlp.protocol) }}
{{- if $v.otlp.headersSecret.name }}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_OTLP_HEADERS" "valueFrom" (dict "secretKeyRef" (dict "name" $v.otlp.headersSecret.name "key" $v.otlp.headersSecret.key))) }}
{{- end }}
{{- end }}
{{- if $v.eventhubs.enabled }}
{{- if $v.eventhubs.existingSecret.name }}
{{- $env = append $env (dict "name" "SEE_EVENTHUB_CONNECTION_STRING" "valueFrom" (dict "secretKeyRef" (dict "name" $v.eventhubs.existingSecret.name "key" $v.eventhubs.existingSecret.key))) }}
{{- else }}
{{- $env = append $env (dict "name" "SEE_EVENTHUB_NAMESPACE" "value" $v.eventhubs.workloadIdentity.namespace) }}
{{- end }}
{{- $env = append $env (dict "name" "SEE_EVENTHUB_NAME" "value" $v.eventhubs.name) }}
{{- if $v.eventhubs.metricsName }}
{{- $env = append $env (dict "name" "SEE_EVENTHUB_METRICS_NAME" "value" $v.eventhubs.metricsName) }}
{{- end }}
{{- end }}
{{- $extra := ternary $v.platform.extraEnv $v.extraEnv $platform }}
{{- $replaced := dict }}
{{- range $extra }}{{ $_ := set $replaced .name true }}{{ end }}
{{- $out := list }}
{{- range $env }}
{{- if not (hasKey $replaced .name) }}{{ $out = append $out . }}{{ end }}
{{- end }}
{{- toYaml (concat $out $extra) }}
{{- end }}

{{/* The exporter's container: the DaemonSet's, and the one config/k8s/'s sidecar examples are
     rendered from (tools/render_k8s.py). */}}
{{- define "see.container" -}}
name: scheduled-events-exporter
image: {{ include "see.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
command: ["scheduled-events-exporter"]
args: ["run"]
env:
  {{- include "see.env" . | nindent 2 }}
ports:
  - name: health
    containerPort: {{ .Values.ports.health }}
    protocol: TCP
  {{- if .Values.prometheus.enabled }}
  - name: metrics
    containerPort: {{ .Values.ports.metrics }}
    protocol: TCP
  {{- end }}
# /healthz: the poll loop is alive (only a wedged exporter fails it; the kubelet restarts it).
livenessProbe:
  httpGet: {path: /healthz, port: health}
  {{- toYaml .Values.livenessProbe | nindent 2 }}
readinessProbe:
  httpGet: {path: /readyz, port: health}
  {{- toYaml .Values.readinessProbe | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
volumeMounts:
  - name: state
    mountPath: /var/lib/scheduled-events-exporter
  - name: tmp
    mountPath: /tmp
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
