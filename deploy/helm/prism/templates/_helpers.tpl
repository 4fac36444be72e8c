{{/* The release's base name: the release name, with the chart's name unless the release's holds it. */}}
{{- define "prism.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* A tier's resource name: fullname-COMPONENT. Call with (list $ "router"). */}}
{{- define "prism.name" -}}
{{- printf "%s-%s" (include "prism.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{/* Selector labels of a tier. Call with (list $ "router"). */}}
{{- define "prism.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Every label of a tier's objects. Call with (list $ "router"). */}}
{{- define "prism.labels" -}}
{{- $ := index . 0 -}}
{{ include "prism.selectorLabels" . }}
app.kubernetes.io/part-of: prism
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version }}
{{- end -}}

{{- define "prism.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The TLS flags of a tier (internal/auth/authflag). */}}
{{- define "prism.tlsArgs" -}}
{{- if .Values.tls.enabled }}
- --certs
- {{ .Values.tls.mountPath }}
{{- else }}
- --insecure
{{- end }}
{{- end -}}

{{/* The address a worker binds: the pod IP (announced as it is), or every interface when it announces a DNS name. Call with (list $ port). The pod IP is bracketed: an IPv6 one needs it ([fd00::7]:8502), an IPv4 one takes it ([10.1.2.3]:8502). */}}
{{- define "prism.workerAddr" -}}
{{- $ := index . 0 -}}
{{- if $.Values.workers.advertiseDNS -}}
{{- printf "0.0.0.0:%v" (index . 1) -}}
{{- else -}}
{{- printf "[$(POD_IP)]:%v" (index . 1) -}}
{{- end -}}
{{- end -}}

{{/* The gRPC health check of a tier, as a probe's handler. Call with (list $ port host): host is the address the tier listens on as the pod sees it. */}}
{{- define "prism.healthProbe" -}}
{{- $ := index . 0 -}}
{{- $port := index . 1 -}}
{{- if $.Values.tls.enabled }}
exec:
  command:
    - sh
    - -c
    - exec grpc_health_probe -addr="{{ index . 2 }}:{{ $port }}" -tls -tls-ca-cert={{ $.Values.tls.mountPath }}/ca.pem -tls-client-cert={{ $.Values.tls.mountPath }}/cert.pem -tls-client-key={{ $.Values.tls.mountPath }}/key.pem -tls-server-name=localhost -connect-timeout=2s -rpc-timeout=2s
{{- else }}
grpc:
  port: {{ $port }}
{{- end }}
timeoutSeconds: {{ $.Values.probes.timeoutSeconds }}
{{- end -}}

{{/* The host a worker's probe dials (the pod IP bracketed, for IPv6). */}}
{{- define "prism.workerProbeHost" -}}
{{- if .Values.workers.advertiseDNS -}}127.0.0.1{{- else -}}[${POD_IP}]{{- end -}}
{{- end -}}

{{/* Pod annotations: Prometheus scrape of the metrics port, https when the tiers serve TLS. Call with (list $ metricsPort), or (list $ metricsPort SCHEME). */}}
{{- define "prism.podAnnotations" -}}
{{- $ := index . 0 -}}
{{- $scheme := ternary "https" "http" $.Values.tls.enabled -}}
{{- if gt (len .) 2 }}{{ $scheme = index . 2 }}{{ end -}}
{{- if $.Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
prometheus.io/scheme: {{ $scheme }}
{{- end }}
{{- end -}}

{{/* Environment every tier gets: its pod's IP and name (for addresses), and OpenTelemetry's when tracing.endpoint is set. */}}
{{- define "prism.podEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- with .Values.tracing }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME)"
{{- if .protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
{{- end }}
{{- if .sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | quote }}
{{- end }}
{{- if .samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerArg | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The router's and dense workers' environment: prism.podEnv and GOMEMLIMIT at the container's memory limit. The embedding workers size themselves to the limit instead (serve embedding --memory-limit auto: a quarter for the page cache, Go's limit at the rest less Pebble's C-allocated caches). */}}
{{- define "prism.env" -}}
{{ include "prism.podEnv" . }}
- name: GOMEMLIMIT
  valueFrom:
    resourceFieldRef:
      resource: limits.memory
{{- end -}}

{{/* The volume of a tier's certificates. Call with (list $ role). */}}
{{- define "prism.certsVolume" -}}
{{- $ := index . 0 -}}
{{- if $.Values.tls.enabled }}
- name: certs
  secret:
    secretName: {{ index $.Values.tls.secrets (index . 1) }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "prism.certsMount" -}}
{{- if .Values.tls.enabled }}
- name: certs
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The model repository volume. */}}
{{- define "prism.modelsVolume" -}}
- name: models
{{- with .Values.modelRepository }}
{{- if eq .type "pvc" }}
  persistentVolumeClaim:
    claimName: {{ .pvc.claimName }}
    readOnly: true
{{- else if eq .type "hostPath" }}
  hostPath:
    path: {{ .hostPath.path }}
    type: Directory
{{- else if eq .type "image" }}
  image:
    reference: {{ required "modelRepository.image.reference is required with type image" .image.reference }}
    pullPolicy: {{ .image.pullPolicy }}
{{- else }}
{{- fail (printf "modelRepository.type %q: want pvc, hostPath or image" .type) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "prism.modelsMount" -}}
- name: models
  mountPath: {{ .Values.modelRepository.mountPath }}
  readOnly: true
{{- end -}}

{{/* --plan DIR for every model. */}}
{{- define "prism.planArgs" -}}
{{- range .Values.models }}
- --plan
- {{ $.Values.modelRepository.mountPath }}/{{ .plan }}
{{- end }}
{{- end -}}

{{/* The routers a worker announces to: every pod behind the headless Service. */}}
{{- define "prism.routerAddr" -}}
{{- printf "%s-headless:%v" (include "prism.name" (list . "router")) .Values.router.port -}}
{{- end -}}

{{/* The embedding tier's shard count: embedding.shards, 0 (or 1) for an unsharded tier. A sharded tier needs its init step, which makes each pod's store its shard's. */}}
{{- define "prism.embeddingShards" -}}
{{- $v := .Values.embedding.shards | default 0 -}}
{{- if not (or (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v)) -}}
{{- fail (printf "embedding.shards %v: want a whole number of shards (0 or 1: unsharded)" $v) -}}
{{- end -}}
{{- $n := int $v -}}
{{- if or (lt $n 0) (ne (float64 $n) (float64 $v)) -}}
{{- fail (printf "embedding.shards %v: want a whole number of shards (0 or 1: unsharded)" $v) -}}
{{- end -}}
{{- if and (ge $n 2) (not .Values.embedding.ingest.enabled) -}}
{{- fail (printf "embedding.shards %d needs embedding.ingest.enabled: the init step ingests each pod's shard (prism ingest --shard K); a worker would ingest the whole model into an empty store itself" $n) -}}
{{- end -}}
{{- if ge $n 2 }}{{ $n }}{{ else }}0{{ end -}}
{{- end -}}

{{/* embedding.hotBytes as serve embedding --hot-bytes takes it: a string ("2560MiB", "auto", "-1"); a byte count written as a YAML number (a float64 from a values file) in whole digits, not 2.56e+09. Quote it in args: a number there is not a string, which the API server refuses. */}}
{{- define "prism.hotBytes" -}}
{{- $v := .Values.embedding.hotBytes -}}
{{- if kindIs "float64" $v }}{{ int64 $v }}{{ else }}{{ toString $v | trim }}{{ end -}}
{{- end -}}

{{/* The init step's --hot-bytes: embedding.hotBytes recorded as the store's default when it is a size; "auto" and a negative size (the tier off) are serve embedding's alone, which prism ingest refuses, so they record nothing. */}}
{{- define "prism.ingestHotBytes" -}}
{{- $hb := include "prism.hotBytes" . -}}
{{- if and $hb (ne $hb "auto") (not (hasPrefix "-" $hb)) }} --hot-bytes {{ $hb }}{{ end -}}
{{- end -}}

{{/* The embedding StatefulSets' shard indices: 0 to shards-1, or -1 alone for the unsharded tier. */}}
{{- define "prism.embeddingShardList" -}}
{{- $n := include "prism.embeddingShards" . | int -}}
{{- if ge $n 2 }}{{ until $n | toJson }}{{ else }}[-1]{{ end -}}
{{- end -}}

{{/* An embedding StatefulSet's name: the tier's, with -shard-K for shard K. Call with (list $ K), K -1 for the unsharded tier. */}}
{{- define "prism.embeddingName" -}}
{{- $name := include "prism.name" (list (index . 0) "embedding") -}}
{{- if ge (int (index . 1)) 0 -}}
{{- printf "%s-shard-%d" $name (int (index . 1)) -}}
{{- else -}}
{{- $name -}}
{{- end -}}
{{- end -}}

{{/* The label that tells one shard's embedding pods from the other shards' (nothing for the unsharded tier). Call with (list $ K). */}}
{{- define "prism.shardLabel" -}}
{{- if ge (int (index . 1)) 0 -}}
prism.dev/shard: {{ int (index . 1) | quote }}
{{- end -}}
{{- end -}}
