{{- define "kcover.labels" -}}
app.kubernetes.io/name: kcover
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}
{{- define "kcover.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}
