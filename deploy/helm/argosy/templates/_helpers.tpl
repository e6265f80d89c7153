{{/* Names and labels. */}}
{{- define "argosy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "argosy.selector" -}}
app.kubernetes.io/name: argosy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "argosy.labels" -}}
{{ include "argosy.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "argosy.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "argosy.serviceAccount" -}}
{{ .Values.serviceAccount.name | default (include "argosy.fullname" .) }}
{{- end -}}

{{/* A model name as Argosy writes it into the argosy.dev/model label (kubernetes_pods.label_value). */}}
{{- define "argosy.modelLabel" -}}
{{- regexReplaceAll "[^A-Za-z0-9._-]+" . "-" | trunc 63 | trimAll "-._" | default "x" -}}
{{- end -}}

{{/* A model name as a DNS label fragment (kubernetes_pods.dns_label). */}}
{{- define "argosy.modelDNS" -}}
{{- regexReplaceAll "[^a-z0-9-]+" (lower .) "-" | trimAll "-" | trunc 40 | trimSuffix "-" | default "model" -}}
{{- end -}}

{{- define "argosy.redisURL" -}}
{{- if .Values.redis.enabled -}}redis://{{ include "argosy.fullname" . }}-redis:6379/0
{{- else -}}{{ .Values.redis.url }}{{- end -}}
{{- end -}}

{{/* Managed models: a checkpoint, no fixed upstreams, no traffic split (fleet/controller.py managed()). */}}
{{- define "argosy.managed" -}}
{{- $out := list -}}
{{- range (.Values.fleet.models | default list) -}}
{{- if and .checkpoint (not .upstreams) (not .traffic) -}}{{- $out = append $out . -}}{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The fleet file the controller reads: the values' fleet with the cluster's addresses filled in. */}}
{{- define "argosy.fleetFile" -}}
{{- $ctx := .ctx -}}
{{- $fleet := deepCopy ($ctx.Values.fleet | default dict) -}}
{{- $gw := deepCopy ($fleet.gateway | default dict) -}}
{{- $_ := set $gw "host" "0.0.0.0" -}}
{{- $_ := set $gw "port" 8000 -}}
{{- $redis := include "argosy.redisURL" $ctx -}}
{{- if $redis -}}{{- $_ := set $gw "redis_url" $redis -}}{{- end -}}
{{- $_ := set $fleet "gateway" $gw -}}
{{- $providers := deepCopy ($fleet.providers | default dict) -}}
{{- $k := deepCopy ((get $providers "kubernetes") | default dict) -}}
{{- $labels := merge (deepCopy ($k.labels | default dict)) (dict "app.kubernetes.io/instance" $ctx.Release.Name "app.kubernetes.io/name" "argosy") -}}
{{- $k = merge $k (dict "image" (include "argosy.image" $ctx) "image_pull_policy" $ctx.Values.image.pullPolicy "namespace" $ctx.Release.Namespace "leader_election" (gt (int $ctx.Values.controller.replicas) 1) "image_pull_secrets" $ctx.Values.imagePullSecrets) -}}
{{- $_ := set $k "labels" $labels -}}
{{- $_ := set $providers "kubernetes" $k -}}
{{- $_ := set $fleet "providers" $providers -}}
{{- $models := list -}}
{{- range ($fleet.models | default list) -}}
{{- $m := deepCopy . -}}
{{- if and (not $m.upstreams) (not $m.provider) -}}{{- $_ := set $m "provider" "kubernetes" -}}{{- end -}}
{{- if and $.gateway $m.checkpoint (not $m.upstreams) (not $m.traffic) -}}
{{- $_ := set $m "discover" (printf "%s.%s.svc:8000" (include "argosy.replicaService" (dict "ctx" $ctx "name" $m.name)) $ctx.Release.Namespace) -}}
{{- end -}}
{{- $models = append $models $m -}}
{{- end -}}
{{- $_ := set $fleet "models" $models -}}
{{- if kindIs "invalid" $fleet.nodes -}}{{- $_ := unset $fleet "nodes" -}}{{- end -}}
{{- if kindIs "invalid" $fleet.admin_key_hash -}}{{- $_ := unset $fleet "admin_key_hash" -}}{{- end -}}
{{- toYaml $fleet -}}
{{- end -}}

{{/* The headless Service of one model's replicas: dict "ctx" $ "name" MODEL. */}}
{{- define "argosy.replicaService" -}}
{{- printf "%s-replicas-%s" (include "argosy.fullname" .ctx) (include "argosy.modelDNS" .name) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
