{{/* Names: <fullname> is the release name (or "<release>-talaria" when the release name does
not contain "talaria"); components are <fullname>-proxy, <fullname>-runtime, ... */}}
{{- define "talaria.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "talaria.fullname" -}}
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

{{- define "talaria.proxy.fullname" -}}
{{- printf "%s-proxy" (include "talaria.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "talaria.runtime.fullname" -}}
{{- printf "%s-runtime" (include "talaria.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "talaria.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource; pass (dict "ctx" $ "component" "proxy"). */}}
{{- define "talaria.labels" -}}
helm.sh/chart: {{ include "talaria.chart" .ctx }}
{{ include "talaria.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{- define "talaria.selectorLabels" -}}
app.kubernetes.io/name: {{ include "talaria.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The Secret the pods read: secrets.existingSecret, else the chart's (named after the release). */}}
{{- define "talaria.secretName" -}}
{{- default (include "talaria.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* Whether the chart creates that Secret: no existingSecret, and some secret value given. */}}
{{- define "talaria.createSecret" -}}
{{- if and (not .Values.secrets.existingSecret) (or .Values.database.url .Values.secrets.apiKeys .Values.secrets.adminToken .Values.secrets.metricsToken) -}}
true
{{- end }}
{{- end }}

{{/* The chart's cluster secret: secrets.clusterSecret, else the one its Secret already holds
(so that an upgrade keeps it), else a new random one. */}}
{{- define "talaria.clusterSecret" -}}
{{- if .Values.secrets.clusterSecret }}
{{- .Values.secrets.clusterSecret }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "talaria.fullname" .) }}
{{- if and $existing $existing.data (hasKey $existing.data "cluster-secret") }}
{{- index $existing.data "cluster-secret" | b64dec }}
{{- else }}
{{- randAlphaNum 48 }}
{{- end }}
{{- end }}
{{- end }}

{{/* The chart's runtime token: secrets.runtimeToken, else the one its Secret already holds
(so that an upgrade keeps it), else a new random one. */}}
{{- define "talaria.runtimeToken" -}}
{{- if .Values.secrets.runtimeToken }}
{{- .Values.secrets.runtimeToken }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "talaria.fullname" .) }}
{{- if and $existing $existing.data (hasKey $existing.data "runtime-token") }}
{{- index $existing.data "runtime-token" | b64dec }}
{{- else }}
{{- randAlphaNum 48 }}
{{- end }}
{{- end }}
{{- end }}

{{- define "talaria.proxy.image" -}}
{{- printf "%s:%s" .Values.proxy.image.repository (.Values.proxy.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "talaria.runtime.image" -}}
{{- printf "%s:%s" .Values.runtime.image.repository (.Values.runtime.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* TALARIA_RUNTIMES: each runtime pod by its stable DNS name (headless Service + StatefulSet
ordinal), then proxy.extraRuntimes; comma-separated (proxy/contract/settings.py). */}}
{{- define "talaria.runtimeUrls" -}}
{{- $urls := list }}
{{- if .Values.runtime.enabled }}
{{- $name := include "talaria.runtime.fullname" . }}
{{- range $i := until (int .Values.runtime.replicas) }}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.runtime.port)) }}
{{- end }}
{{- end }}
{{- range .Values.proxy.extraRuntimes }}
{{- $urls = append $urls . }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* The restricted pod security profile; the images' user is 10001. */}}
{{- define "talaria.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "talaria.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop:
    - ALL
{{- end }}

{{/* Refuse values that cannot work, at render time rather than as a hook Job that hangs. */}}
{{- define "talaria.checkValues" -}}
{{- if not (or .Values.secrets.existingSecret .Values.database.url) }}
{{- fail "set database.url (postgresql+asyncpg://USER:PASSWORD@HOST:5432/DATABASE) or secrets.existingSecret (a Secret with the key database-url): the proxies and the migration Job need the database" }}
{{- end }}
{{- if and .Values.secrets.clusterSecret (lt (len .Values.secrets.clusterSecret) 32) }}
{{- fail "secrets.clusterSecret must have at least 32 characters (or leave it empty: the chart generates one)" }}
{{- end }}
{{- if and .Values.secrets.runtimeToken (lt (len .Values.secrets.runtimeToken) 16) }}
{{- fail "secrets.runtimeToken must have at least 16 characters (or leave it empty: the chart generates one)" }}
{{- end }}
{{- if and .Values.proxy.autoscaling.enabled (lt (int .Values.proxy.autoscaling.minReplicas) 1) }}
{{- fail "proxy.autoscaling.minReplicas must be at least 1" }}
{{- end }}
{{- end }}
