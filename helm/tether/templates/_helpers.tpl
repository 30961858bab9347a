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

{{/* Whether the controller runs in a container of its own, without
tether's token: the exec manager's process, started there by `tether
launcher`. */}}
{{- define "tether.separate" -}}
{{- and .Values.manager.exec.command .Values.manager.exec.separate.enabled | toString -}}
{{- end -}}

{{- define "tether.controllerServiceAccountName" -}}
{{- default (printf "%s-controller" (include "tether.fullname" .)) .Values.manager.exec.separate.serviceAccount.name -}}
{{- end -}}

{{/* Where the launcher listens, in a volume both containers mount. */}}
{{- define "tether.launcherSocket" -}}/run/tether-launcher/launcher.sock{{- end -}}

{{/* tether's config file: the values' config, the admin port, and one
remote per Secret. */}}
{{/* Whether leader election's settings are on: as set, or when
replicaCount > 1; always with sharding, which uses them. */}}
{{- define "tether.leaderElection" -}}
{{- $set := .Values.leaderElection.enabled -}}
{{- if .Values.sharding.enabled -}}true{{- else if kindIs "bool" $set -}}{{ $set }}{{- else -}}{{ gt (int .Values.replicaCount) 1 }}{{- end -}}
{{- end -}}

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
{{- with .Values.discovery }}{{ $_ := set $config "discovery" . }}{{ end -}}
{{- if eq (include "tether.leaderElection" .) "true" -}}
{{- $le := .Values.leaderElection -}}
{{- $_ := set $config "leaderElection" (dict "enabled" true "leaseName" (default (include "tether.fullname" .) $le.leaseName) "leaseDuration" $le.leaseDuration "renewDeadline" $le.renewDeadline "retryPeriod" $le.retryPeriod) -}}
{{- end -}}
{{- if .Values.sharding.enabled -}}
{{- $_ := set $config "sharding" (dict "enabled" true "leasePrefix" (default (printf "%s-shard" (include "tether.fullname" .)) .Values.sharding.leasePrefix)) -}}
{{- end -}}
{{- $exec := .Values.manager.exec -}}
{{- if $exec.command -}}
{{- $_ := unset $config "watch" -}}
{{- $spec := dict "stopSignal" $exec.stopSignal -}}
{{- if $exec.gracePeriod }}{{ $_ := set $spec "gracePeriod" $exec.gracePeriod }}{{ end -}}
{{- if $exec.followsRemotesFile }}{{ $_ := set $spec "followsRemotesFile" true }}{{ end -}}
{{- if $exec.putBackAfter }}{{ $_ := set $spec "putBackAfter" $exec.putBackAfter }}{{ end -}}
{{- $separate := eq (include "tether.separate" .) "true" -}}
{{- if or $separate (not $exec.image.repository) }}{{ $_ := set $spec "command" $exec.command }}{{ end -}}
{{- if $separate -}}
{{- $_ := set $spec "launcher" (dict "socket" (include "tether.launcherSocket" .)) -}}
{{- $_ := set $spec "serviceAccount" (dict "name" (include "tether.controllerServiceAccountName" .) "expiration" $exec.separate.tokenExpiration) -}}
{{- end -}}
{{- if $exec.env }}{{ $_ := set $spec "env" $exec.env }}{{ end -}}
{{- if $exec.readiness }}{{ $_ := set $spec "readiness" $exec.readiness }}{{ end -}}
{{- $_ := set $config "manager" (dict "exec" $spec) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
