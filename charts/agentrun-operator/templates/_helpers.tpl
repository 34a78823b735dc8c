{{/* Names, labels, the image reference, and the operator's RBAC rules (one definition, used by
the namespaced Roles and by the ClusterRole alike). */}}

{{- define "agentrun-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentrun-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agentrun-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrun-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentrun-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentrun-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentrun
{{- end -}}

{{- define "agentrun-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentrun-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "agentrun-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "agentrun-operator.reporterImage" -}}
{{- default (include "agentrun-operator.image" .) .Values.reporter.image -}}
{{- end -}}

{{/* "true" when kopf peering is on: asked for, or implied by more than one replica. */}}
{{- define "agentrun-operator.peering" -}}
{{- if or .Values.peering.enabled (gt (int .Values.replicas) 1) -}}true{{- end -}}
{{- end -}}

{{/* The kopf peering object of this release's replicas. */}}
{{- define "agentrun-operator.peeringName" -}}
{{- default (include "agentrun-operator.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "agentrun-operator.clusterWide" -}}
{{- if not .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/*
The operator's rules: exactly the requests it makes (operator/agentrun_operator/shell/kube.py and the
watches of shell/informer.py) plus kopf's watch of AgentRuns. docs/operations.md#rbac explains each line. `peeringResource` is kopfpeerings in the
namespaced Roles and clusterkopfpeerings in the ClusterRole.
*/}}
{{- define "agentrun-operator.rules" -}}
{{- $root := index . 0 -}}
{{- $peeringResource := index . 1 -}}
# AgentRuns: read (reconcile, resync, kopf's watch); delete once ttlSecondsAfterFinished has passed.
- apiGroups: ["agents.proompteng.ai"]
  resources: ["agentruns"]
  verbs: ["get", "list", "watch", "delete"]
# The operator is the one writer of status (PUT with the read resourceVersion).
- apiGroups: ["agents.proompteng.ai"]
  resources: ["agentruns/status"]
  verbs: ["update"]
# Jobs carry an ownerReference with blockOwnerDeletion to their AgentRun; clusters that enable the
# OwnerReferencesPermissionEnforcement admission plugin require this to create such Jobs.
- apiGroups: ["agents.proompteng.ai"]
  resources: ["agentruns/finalizers"]
  verbs: ["update"]
# What a run refers to: watched into the operator's cache, read with get when not found there.
- apiGroups: ["agents.proompteng.ai"]
  resources: ["agents", "agentproviders", "implementationspecs"]
  verbs: ["get", "list", "watch"]
# One Job per iteration attempt: create (get on 409 to adopt), list by label, watch, delete
# (cancel, timeout), patch (ttlSecondsAfterFinished once the result is recorded).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "watch", "delete", "patch"]
# The iterations' pods: listed by label (exit codes, the reporter's termination message) and watched;
# deletecollection: an immediate cancel deletes the running Job's pods (by its uid label) with a short
# grace period, where the garbage collector would give them their own (docs/design.md#grace-period).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "deletecollection"]
# Events on AgentRuns (ours and kopf's warnings); patch: a repeated Event is one series whose count
# and last timestamp the operator updates (docs/operator.md#events). list, watch: the pods'
# FailedMount and FailedAttachVolume Events, why a pod's volume waits (docs/design.md#pod-waits).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "list", "watch"]
# Idempotency claims: a Lease with a deterministic name, created atomically.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create"]
# The PersistentVolumeClaims a run mounts: read (never changed) before the first Job, to fail a
# missing one and to wait for an unbound one.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
# The VersionControlProviders a run names (version control): read with get on each reconcile.
- apiGroups: ["agents.proompteng.ai"]
  resources: ["versioncontrolproviders"]
  verbs: ["get"]
# Secrets, by name, before the first Job, for their key names only (values are never kept or
# logged): a read-write run's VersionControlProvider credential, and an Agent's Secret-backed
# systemPromptRef; a missing one or key fails the run InvalidSpec. create: a warm loop's run key
# (`<run>-warm`, owned by the run, docs/design.md#warm-pod), made once per run and read back.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# ConfigMaps: get the one an Agent's systemPromptRef names (its key names only) before the first Job;
# create the runner contract's (run.json, agent-runner.json, input files), owned by the run; one that
# exists by name is adopted (its name is a hash of its data).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
{{- if include "agentrun-operator.peering" $root }}
# kopf peering: watch the peering object and patch this pod's keep-alive into it.
- apiGroups: ["kopf.dev"]
  resources: [{{ $peeringResource | quote }}]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- with $root.Values.rbac.extraRules }}
# rbac.extraRules
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The PromQL matchers of this operator's series, for the rules and the dashboard (single quotes:
the dashboard's JSON needs no escaping). */}}
{{- define "agentrun-operator.seriesSelector" -}}
{{- .Values.metrics.seriesSelector | default (printf "job='%s-metrics', namespace='%s'" (include "agentrun-operator.fullname" .) .Release.Namespace) -}}
{{- end -}}
