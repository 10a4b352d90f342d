{{/*
Names the driver, the kubelet plugin and the controller agree on; they must
match driver/names.go.
*/}}
{{- define "gpulink.driverName" -}}gpu.gpulink.dev{{- end -}}
{{- define "gpulink.schedulingGate" -}}gpu.gpulink.dev/allocation{{- end -}}

{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "gpulink.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every object name: the release name, with the chart name appended
unless the release name already contains it.
*/}}
{{- define "gpulink.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Component names. The suffix is kept whole by truncating the prefix, so the
two names never collide however long the release name is.
*/}}
{{- define "gpulink.kubeletPlugin.fullname" -}}
{{- printf "%s-kubelet-plugin" (include "gpulink.fullname" . | trunc 48 | trimSuffix "-") -}}
{{- end -}}
{{- define "gpulink.controller.fullname" -}}
{{- printf "%s-controller" (include "gpulink.fullname" . | trunc 52 | trimSuffix "-") -}}
{{- end -}}

{{- define "gpulink.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "gpulink.labels" -}}
helm.sh/chart: {{ include "gpulink.chart" . }}
app.kubernetes.io/name: {{ include "gpulink.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpulink
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Metadata block body shared by all objects: labels plus common annotations.
Arguments: root (the chart context), component, labels (extra labels).
*/}}
{{- define "gpulink.metadata" -}}
labels:
  {{- include "gpulink.labels" .root | nindent 2 }}
  {{- with .component }}
  app.kubernetes.io/component: {{ . }}
  {{- end }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component; immutable once deployed, so kept minimal. */}}
{{- define "gpulink.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpulink.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpulink.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Full user name of the kubelet plugin's service account, as the API server sees it. */}}
{{- define "gpulink.kubeletPlugin.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpulink.kubeletPlugin.fullname" .) -}}
{{- end -}}

{{/*
Cross-field checks the JSON schema cannot express readably. Each guards a
combination that installs cleanly but leaves GPU pods Pending forever.
*/}}
{{- define "gpulink.validate" -}}
{{- $kp := .Values.kubeletPlugin -}}
{{- if and (eq $kp.discovery "topology-file") (not $kp.topologyConfigMap) -}}
{{- fail "kubeletPlugin.discovery=topology-file needs kubeletPlugin.topologyConfigMap: the ConfigMap holding `nvidia-smi topo -m` output" -}}
{{- end -}}
{{- if and .Values.gate.enabled (not .Values.controller.enabled) -}}
{{- fail "gate.enabled=true needs controller.enabled=true: only the controller lifts the scheduling gate, gated pods would never be scheduled" -}}
{{- end -}}
{{- if and .Values.gate.cpuPods.enabled (not .Values.controller.enabled) -}}
{{- fail "gate.cpuPods.enabled=true needs controller.enabled=true: only the controller lifts the scheduling gate, gated pods would never be scheduled" -}}
{{- end -}}
{{- if and $kp.managedByController (not .Values.controller.enabled) -}}
{{- fail "kubeletPlugin.managedByController=true needs controller.enabled=true: the devices are tainted against kube-scheduler and nothing else would allocate them" -}}
{{- end -}}
{{- if and .Values.gate.enabled (not $kp.managedByController) -}}
{{- fail "gate.enabled=true needs kubeletPlugin.managedByController=true: without the device taint kube-scheduler and the controller would both allocate the same GPUs" -}}
{{- end -}}
{{- if ne (empty .Values.apiServer.host) (empty .Values.apiServer.port) -}}
{{- fail (printf "apiServer.host (%q) and apiServer.port (%v) go together: set both to reach the API server at host:port, or neither for the kubernetes Service" .Values.apiServer.host .Values.apiServer.port) -}}
{{- end -}}
{{- end -}}

{{/*
KUBERNETES_SERVICE_HOST/PORT for in-cluster clients on clusters without
kube-proxy (apiServer); the container's own env wins over the kubelet's
service variables. Nothing when apiServer is unset.
*/}}
{{- define "gpulink.apiServerEnv" -}}
{{- with .Values.apiServer.host -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $.Values.apiServer.port | toString | quote }}
{{- end -}}
{{- end -}}

{{/* Full user name of the controller's service account, as the API server sees it. */}}
{{- define "gpulink.controller.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpulink.controller.fullname" .) -}}
{{- end -}}

{{/*
The extended resource names the translation webhook handles, as a JSON list
(for the webhook's matchConditions): the enabled families' names.
*/}}
{{- /* The MIG resources are taken by prefix (nvidia.com/mig-<profile>):
a CEL clause for the webhook's matchConditions, empty when off. */ -}}
{{- define "gpulink.compat.migMatch" -}}
{{- $n := .Values.compat.families.nvidia -}}
{{- if and $n.enabled $n.mig -}}
{{- printf " || k.startsWith(%s)" (toJson $n.migPrefix) -}}
{{- end -}}
{{- end -}}

{{- define "gpulink.compat.resourceNames" -}}
{{- $f := .Values.compat.families -}}
{{- $names := list -}}
{{- if $f.nvidia.enabled -}}
{{- $names = concat $names (list $f.nvidia.gpu $f.nvidia.memory $f.nvidia.memoryPercentage $f.nvidia.cores $f.nvidia.priority) -}}
{{- end -}}
{{- if $f.aliyun.enabled -}}
{{- $names = append $names $f.aliyun.gpu -}}
{{- end -}}
{{- if $f.tencent.enabled -}}
{{- $names = concat $names (list $f.tencent.cores $f.tencent.memory) -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The controller's steering taint key (controller/steer.TaintKey); effect PreferNoSchedule. */}}
{{- define "gpulink.steerTaintKey" -}}
gpu.gpulink.dev/free-gpus
{{- end -}}

{{/* The controller's second steering taint key (controller/steer.ScarceTaintKey); effect PreferNoSchedule. */}}
{{- define "gpulink.steerScarceTaintKey" -}}
gpu.gpulink.dev/scarce-gpus
{{- end -}}
