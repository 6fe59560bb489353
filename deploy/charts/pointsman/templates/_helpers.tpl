{{/*
Names: GIE's. The pool is <release>; the EPP's objects are <release>-epp (the release name lower-cased, trimmed and
cut to 40 characters, so every derived name stays a valid DNS label).
*/}}
{{- define "pointsman.poolName" -}}
{{- .Release.Name | lower | trim | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "pointsman.name" -}}
{{- printf "%s-epp" (include "pointsman.poolName" .) -}}
{{- end -}}

{{- define "pointsman.selectorLabels" -}}
inferencepool: {{ include "pointsman.name" . }}
{{- end -}}

{{- define "pointsman.labels" -}}
app.kubernetes.io/name: {{ include "pointsman.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pointsman
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The values as one canonical tree, in GIE's layout (inferencePool, inferenceExtension, inferenceObjectives,
provider, pointsman). llm-d-router's layout (router.*) is mapped onto it key by key: a key set under router.*
replaces the same key of the GIE layout. Every template reads this tree, never .Values directly:
  {{- $v := include "pointsman.values" . | fromYaml }}
*/}}
{{- define "pointsman.routerMap" -}}
- [epp.replicas, inferenceExtension.replicas]
- [epp.image.registry, inferenceExtension.image.registry]
- [epp.image.repository, inferenceExtension.image.repository]
- [epp.image.tag, inferenceExtension.image.tag]
- [epp.image.pullPolicy, inferenceExtension.image.pullPolicy]
- [epp.extProcPort, inferenceExtension.extProcPort]
- [epp.grpcHealthPort, inferenceExtension.grpcHealthPort]
- [metricsPort, inferenceExtension.metricsPort]
- [epp.flags, inferenceExtension.flags]
- [epp.env, inferenceExtension.env]
- [epp.pluginsConfigFile, inferenceExtension.pluginsConfigFile]
- [epp.pluginsCustomConfig, inferenceExtension.pluginsCustomConfig]
- [epp.metricsDataSource.scheme, inferenceExtension.metricsDataSource.scheme]
- [epp.metricsDataSource.path, inferenceExtension.metricsDataSource.path]
- [epp.metricsDataSource.insecureSkipVerify, inferenceExtension.metricsDataSource.insecureSkipVerify]
- [epp.extraContainerPorts, inferenceExtension.extraContainerPorts]
- [extraServicePorts, inferenceExtension.extraServicePorts]
- [epp.resources, inferenceExtension.resources]
- [epp.affinity, inferenceExtension.affinity]
- [epp.tolerations, inferenceExtension.tolerations]
- [epp.podAnnotations, inferenceExtension.podAnnotations]
- [epp.volumes, inferenceExtension.volumes]
- [epp.volumeMounts, inferenceExtension.volumeMounts]
- [monitoring.interval, inferenceExtension.monitoring.interval]
- [monitoring.prometheus.enabled, inferenceExtension.monitoring.prometheus.enabled]
- [monitoring.prometheus.auth.enabled, inferenceExtension.monitoring.prometheus.auth.enabled]
- [monitoring.prometheus.auth.secretName, inferenceExtension.monitoring.prometheus.auth.secretName]
- [monitoring.prometheus.extraLabels, inferenceExtension.monitoring.prometheus.extraLabels]
- [tracing.enabled, inferenceExtension.tracing.enabled]
- [tracing.otelExporterEndpoint, inferenceExtension.tracing.otelExporterEndpoint]
- [tracing.sampling.sampler, inferenceExtension.tracing.sampling.sampler]
- [tracing.sampling.samplerArg, inferenceExtension.tracing.sampling.samplerArg]
- [latencyPredictor.enabled, inferenceExtension.latencyPredictor.enabled]
- [inferencePool.create, inferencePool.create]
- [inferencePool.failureMode, inferenceExtension.failureMode]
- [modelServers.type, inferencePool.modelServerType]
- [modelServers.protocol, inferencePool.modelServerProtocol]
- [modelServers.targetPorts, inferencePool.targetPorts]
- [modelServers.matchLabels, inferencePool.modelServers.matchLabels]
- [inferenceObjectives, inferenceObjectives]
- [epp.parsers, inferencePool.parsers]
- [httpRoute.create, experimentalHttpRoute.enabled]
- [httpRoute.inferenceGatewayName, experimentalHttpRoute.inferenceGatewayName]
- [httpRoute.inferenceGatewayNamespace, experimentalHttpRoute.inferenceGatewayNamespace]
- [httpRoute.requestTimeout, experimentalHttpRoute.requestTimeout]
- [httpRoute.headerMatches, experimentalHttpRoute.headerMatches]
- [httpRoute.baseModel, experimentalHttpRoute.baseModel]
{{- end -}}

{{- define "pointsman.values" -}}
{{- /* Computed once per render and kept in .Values under a private key: every template and helper asks for it. */ -}}
{{- if not (hasKey .Values "__pointsmanCanonical") -}}
{{- $c := .Values | toYaml | fromYaml -}}
{{- $router := $c.router | default dict -}}
{{- $_ := unset $c "router" -}}
{{- range $pair := include "pointsman.routerMap" . | fromYamlArray -}}
  {{- $src := index $pair 0 | toString | splitList "." -}}
  {{- $dst := index $pair 1 | toString | splitList "." -}}
  {{- $node := $router -}}
  {{- $found := true -}}
  {{- range $k := $src -}}
    {{- if not (kindIs "map" $node) -}}
      {{- $found = false -}}
    {{- else if not (hasKey $node $k) -}}
      {{- $found = false -}}
    {{- else if $found -}}
      {{- $node = index $node $k -}}
    {{- end -}}
  {{- end -}}
  {{- if $found -}}
    {{- $at := $c -}}
    {{- range $k := initial $dst -}}
      {{- if not (kindIs "map" (index $at $k)) -}}
        {{- $_ := set $at $k dict -}}
      {{- end -}}
      {{- $at = index $at $k -}}
    {{- end -}}
    {{- $_ := set $at (last $dst) $node -}}
  {{- end -}}
{{- end -}}
{{- $_ := set $c "routerProxy" (dig "proxy" "enabled" false $router) -}}
{{- $_ := set $c "routerTokenizer" (dig "tokenizer" "enabled" false $router) -}}
{{- $_ := set .Values "__pointsmanCanonical" (toYaml $c) -}}
{{- end -}}
{{- index .Values "__pointsmanCanonical" -}}
{{- end -}}

{{/* A number as written (Helm reads YAML numbers as floats: 1000000 would print as 1e+06). */}}
{{- define "pointsman.scalar" -}}
{{- /* Go templates before Go 1.18 evaluate every argument of `and`: the checks are nested, not joined. */ -}}
{{- $out := toString . -}}
{{- if kindIs "float64" . -}}
{{- if eq (float64 (int64 .)) . -}}
{{- $out = toString (int64 .) -}}
{{- end -}}
{{- end -}}
{{- $out -}}
{{- end -}}

{{- define "pointsman.replicas" -}}
{{- $v := include "pointsman.values" . | fromYaml -}}
{{- int ($v.inferenceExtension.replicas | default 1) -}}
{{- end -}}

{{/* "true" when the replica bus is on: pointsman.bus.enabled, or unset (null) and more than one replica. */}}
{{- define "pointsman.busEnabled" -}}
{{- $v := include "pointsman.values" . | fromYaml -}}
{{- $bus := $v.pointsman.bus | default dict -}}
{{- if kindIs "bool" $bus.enabled -}}
{{- $bus.enabled -}}
{{- else -}}
{{- gt (int ($v.inferenceExtension.replicas | default 1)) 1 -}}
{{- end -}}
{{- end -}}

{{- define "pointsman.healthPort" -}}
{{- $v := include "pointsman.values" . | fromYaml -}}
{{- int ($v.inferenceExtension.grpcHealthPort | default 9003) -}}
{{- end -}}

{{/* FailOpen or FailClose (llm-d's documented "FailClosed" is read as FailClose); anything else fails. */}}
{{- define "pointsman.failureMode" -}}
{{- $v := include "pointsman.values" . | fromYaml -}}
{{- $mode := $v.inferenceExtension.failureMode | default "FailOpen" | toString -}}
{{- if eq $mode "FailClosed" -}}{{- $mode = "FailClose" -}}{{- end -}}
{{- if not (has $mode (list "FailOpen" "FailClose")) -}}
{{- fail (printf "inferenceExtension.failureMode must be FailOpen or FailClose, got %q" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* The engine Pointsman's metrics reader assumes for pods without the llm-d.ai/engine-type label. */}}
{{- define "pointsman.engine" -}}
{{- $v := include "pointsman.values" . | fromYaml -}}
{{- $type := $v.inferencePool.modelServerType | default "vllm" | toString -}}
{{- $engines := dict "vllm" "vllm" "sglang" "sglang" "triton-tensorrt-llm" "triton" "trtllm-serve" "trtllm-serve" "triton" "triton" -}}
{{- if not (hasKey $engines $type) -}}
{{- fail (printf "inferencePool.modelServerType must be one of vllm, sglang, triton-tensorrt-llm, trtllm-serve, triton; got %q" $type) -}}
{{- end -}}
{{- index $engines $type -}}
{{- end -}}

{{- define "pointsman.image" -}}
{{- $v := include "pointsman.values" . | fromYaml -}}
{{- $img := $v.inferenceExtension.image | default dict -}}
{{- $tag := $img.tag | default .Chart.AppVersion | toString -}}
{{- if $img.hub -}}
{{- printf "%s/%s:%s" $img.hub ($img.name | default "pointsman") $tag -}}
{{- else if $img.registry -}}
{{- printf "%s/%s:%s" $img.registry $img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Checks every template runs first: a bad value stops the install with a message naming it. */}}
{{- define "pointsman.validate" -}}
{{- $v := include "pointsman.values" . | fromYaml -}}
{{- if not $v.inferencePool.modelServers.matchLabels -}}
{{- fail ".Values.inferencePool.modelServers.matchLabels is required" -}}
{{- end -}}
{{- $_ := include "pointsman.failureMode" . -}}
{{- $_ := include "pointsman.engine" . -}}
{{- if not (has ($v.inferencePool.modelServerProtocol | default "http" | toString) (list "http" "grpc")) -}}
{{- fail (printf "inferencePool.modelServerProtocol must be http or grpc, got %q" (toString $v.inferencePool.modelServerProtocol)) -}}
{{- end -}}
{{- $ports := $v.inferencePool.targetPorts | default list -}}
{{- if or (lt (len $ports) 1) (gt (len $ports) 8) -}}
{{- fail "inferencePool.targetPorts must list 1 to 8 ports ({number: 8000})" -}}
{{- end -}}
{{- if not (has ($v.provider.name | default "none" | toString) (list "none" "istio" "gke")) -}}
{{- fail (printf "provider.name must be none, istio or gke, got %q" (toString $v.provider.name)) -}}
{{- end -}}
{{- if $v.inferenceExtension.latencyPredictor.enabled -}}
{{- fail "latencyPredictor.enabled: Pointsman runs no latency predictor sidecars; its default profile (estimated-latency-scorer) predicts latency itself. Remove the setting." -}}
{{- end -}}
{{- if $v.routerProxy -}}
{{- fail "router.proxy.enabled: this chart renders no proxy; put the proxy in inferenceExtension.sidecar or run a gateway (docs/deploy.md)" -}}
{{- end -}}
{{- if $v.routerTokenizer -}}
{{- fail "router.tokenizer.enabled: this chart renders no vllm-render sidecar; Pointsman tokenizes itself (--tokenizers-dir, docs/deploy.md)" -}}
{{- end -}}
{{- if and $v.inferenceObjectives (eq (toString $v.inferencePool.create) "false") -}}
{{- fail "inferenceObjectives need an InferencePool (inferencePool.create: true)" -}}
{{- end -}}
{{- $api := $v.inferencePool.apiVersion | default "inference.networking.k8s.io/v1" | toString -}}
{{- if ne $api "inference.networking.k8s.io/v1" -}}
{{- fail (printf "inferencePool.apiVersion %q: this chart renders the InferencePool inference.networking.k8s.io/v1 only (as GIE v1.5's)" $api) -}}
{{- end -}}
{{- range $p := concat (list ($v.inferencePool.parser | default "")) ($v.inferencePool.parsers | default list) -}}
{{- if not (has (toString $p) (list "" "openai-parser")) -}}
{{- fail (printf "parser %q: Pointsman parses requests as OpenAI's API (openai-parser) only" (toString $p)) -}}
{{- end -}}
{{- end -}}
{{- $transport := $v.pointsman.transport | default "" | toString -}}
{{- if not (has $transport (list "" "h2" "grpcio")) -}}
{{- fail (printf "pointsman.transport must be h2 or grpcio, got %q" $transport) -}}
{{- end -}}
{{- end -}}

{{/* The default configs' data layer: scrape the model servers (metrics-data-source) and read them as `.engine`. */}}
{{- define "pointsman.dataLayer" -}}
- type: metrics-data-source
  parameters:
    scheme: {{ .mds.scheme | default "http" | quote }}
    path: {{ .mds.path | default "/metrics" | quote }}
    insecureSkipVerify: {{ ne (toString .mds.insecureSkipVerify) "false" }}
- type: core-metrics-extractor
  parameters:
    defaultEngine: {{ .engine | quote }}
{{- end -}}
{{- define "pointsman.dataLayerSection" -}}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
{{- end -}}
