{{- define "tether.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tether.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tether.labels" -}}
{{ include "tether.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tether.serviceAccountName" -}}
{{- default (include "tether.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* tether's config file: the values' config, the admin port, and one
remote per Secret. */}}
{{- define "tether.config" -}}
{{- $remotes := list -}}
{{- range .Values.remotes -}}
{{- $remote := dict "name" .name "kubeconfig" (printf "/etc/tether/remotes/%s/%s" .name (default "kubeconfig" .key)) "required" (ne .required false) -}}
{{- if .context }}{{ $_ := set $remote "context" .context }}{{ end -}}
{{- $remotes = append $remotes $remote -}}
{{- end -}}
{{- $config := deepCopy .Values.config -}}
{{- $_ := set $config "admin" (dict "address" (printf "0.0.0.0:%d" (int .Values.adminPort))) -}}
{{- $_ := set $config "remotes" $remotes -}}
{{- $exec := .Values.manager.exec -}}
{{- if $exec.command -}}
{{- $_ := unset $config "watch" -}}
{{- $spec := dict "stopSignal" $exec.stopSignal "gracePeriod" $exec.gracePeriod -}}
{{- if not $exec.image.repository }}{{ $_ := set $spec "command" $exec.command }}{{ end -}}
{{- if $exec.env }}{{ $_ := set $spec "env" $exec.env }}{{ end -}}
{{- if $exec.readiness }}{{ $_ := set $spec "readiness" $exec.readiness }}{{ end -}}
{{- $_ := set $config "manager" (dict "exec" $spec) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
