{{/* Names and labels. */}}
{{- define "batchpipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "batchpipe.fullname" -}}
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

{{- define "batchpipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "batchpipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "batchpipe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "batchpipe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "batchpipe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "batchpipe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Settings the templates read from the worker configuration, with its defaults. */}}
{{- define "batchpipe.metricsPort" -}}
{{- dig "metrics" "port" 9400 .Values.config }}
{{- end }}

{{- define "batchpipe.partitions" -}}
{{- dig "kafka" "partitions" 6 .Values.config }}
{{- end }}

{{/* The worker drains for worker.drain_timeout_s; the kubelet waits that plus a margin. */}}
{{- define "batchpipe.terminationGracePeriodSeconds" -}}
{{- $drain := dig "worker" "drain_timeout_s" 30 .Values.config | float64 | ceil | int }}
{{- add $drain .Values.terminationGraceMarginSeconds }}
{{- end }}

{{/* librdkafka security.protocol from the sasl/tls switches. */}}
{{- define "batchpipe.securityProtocol" -}}
{{- if and .Values.kafka.sasl.enabled .Values.kafka.tls.enabled }}SASL_SSL
{{- else if .Values.kafka.sasl.enabled }}SASL_PLAINTEXT
{{- else if .Values.kafka.tls.enabled }}SSL
{{- else }}PLAINTEXT
{{- end }}
{{- end }}

{{/* KEDA's name for a SASL mechanism. */}}
{{- define "batchpipe.kedaSasl" -}}
{{- $m := .Values.kafka.sasl.mechanism }}
{{- if eq $m "PLAIN" }}plaintext
{{- else if eq $m "SCRAM-SHA-256" }}scram_sha256
{{- else if eq $m "SCRAM-SHA-512" }}scram_sha512
{{- else }}{{ fail (printf "kafka.sasl.mechanism %q has no KEDA equivalent" $m) }}
{{- end }}
{{- end }}

{{/* One consumer per partition at most: more workers than partitions sit idle. */}}
{{- define "batchpipe.checkReplicas" -}}
{{- $partitions := include "batchpipe.partitions" . | int }}
{{- if .Values.keda.enabled }}
{{- if gt (int .Values.keda.maxReplicaCount) $partitions }}
{{- fail (printf "keda.maxReplicaCount (%d) exceeds config.kafka.partitions (%d): a consumer group has at most one active consumer per partition" (int .Values.keda.maxReplicaCount) $partitions) }}
{{- end }}
{{- if gt (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount) }}
{{- fail (printf "keda.minReplicaCount (%d) exceeds keda.maxReplicaCount (%d)" (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount)) }}
{{- end }}
{{- else if gt (int .Values.replicaCount) $partitions }}
{{- fail (printf "replicaCount (%d) exceeds config.kafka.partitions (%d): a consumer group has at most one active consumer per partition" (int .Values.replicaCount) $partitions) }}
{{- end }}
{{- if and .Values.kafka.sasl.enabled (not .Values.kafka.sasl.existingSecret) }}
{{- fail "kafka.sasl.enabled needs kafka.sasl.existingSecret: the name of a Secret with the username and password" }}
{{- end }}
{{- end }}

{{/* Kafka address and client security settings, as environment variables (worker and api). */}}
{{- define "batchpipe.kafkaEnv" -}}
- name: BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: BATCHPIPE_KAFKA__CLIENT__SECURITY_PROTOCOL
  value: {{ include "batchpipe.securityProtocol" . }}
{{- if .Values.kafka.sasl.enabled }}
- name: BATCHPIPE_KAFKA__CLIENT__SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism }}
- name: BATCHPIPE_KAFKA__CLIENT__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: BATCHPIPE_KAFKA__CLIENT__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.existingSecret }}
- name: BATCHPIPE_KAFKA__CLIENT__SSL_CA_LOCATION
  value: /etc/batchpipe/kafka-ca/{{ .Values.kafka.tls.caKey }}
{{- end }}
{{- end }}
