{{/*
Mirrors of provisioner/manifests.py. Every template here has a Python twin; tests/test_chart.py
renders both for the same specs and fails, naming the object and the field, when they differ.
*/}}

{{/*
slurmk8s.spec: the values with the spec's defaults filled in where the builders read them, as
JSON. Use: {{- $s := include "slurmk8s.spec" . | fromJson }}
Every default comes from "slurmk8s.defaults" ($d; _defaults.tpl, generated from provisioner/config.py);
none is written here (tests/test_chart.py fails on a literal one).
Full validation (cross-field rules, pool and user checks) runs in the cluster, in the slurmctld
container's render at start, with the same Python code as `slurmk8s up`.
*/}}
{{- define "slurmk8s.spec" -}}
{{- $v := .Values -}}
{{- $ns := .Release.Namespace -}}
{{- $d := include "slurmk8s.defaults" . | fromJson -}}
{{- if not $v.name -}}
{{- fail "name: required: the cluster name (a DNS label, at most 30 characters)" -}}
{{- end -}}
{{- if and $v.namespace (ne (toString $v.namespace) $ns) -}}
{{- fail (printf "namespace: the values say %q but the release namespace is %q; the release namespace is the cluster's namespace: remove `namespace` from the values, or install with --namespace %s" (toString $v.namespace) $ns (toString $v.namespace)) -}}
{{- end -}}
{{- $c := $v.chart | default dict -}}
{{- $img := $v.images | default dict -}}
{{- $images := dict -}}
{{- range $k, $dflt := $d.Images }}{{ $_ := set $images $k (get $img $k | default $dflt) }}{{ end -}}
{{- $a := $v.accounting | default dict -}}
{{- $accounting := dict "enabled" (ternary $a.enabled $d.Accounting.enabled (hasKey $a "enabled")) "database_buffer_pool" (toString ($a.database_buffer_pool | default $d.Accounting.database_buffer_pool)) -}}
{{- if $a.external_database -}}
{{- $e := $a.external_database -}}
{{- $ps := $e.password_secret -}}
{{- $ed := $d.ExternalDatabase -}}
{{- $_ := set $accounting "external_database" (dict "host" $e.host "port" (int64 ($e.port | default $ed.port)) "database" ($e.database | default $ed.database) "user" ($e.user | default $ed.user) "password_secret" (dict "name" $ps.name "key" ($ps.key | default $d.SecretRef.key))) -}}
{{- end -}}
{{- $l := $v.login | default dict -}}
{{- $login := dict "enabled" (ternary $l.enabled $d.Login.enabled (hasKey $l "enabled")) "service_type" ($l.service_type | default $d.Login.service_type) -}}
{{- /* idle teardown (manifests.sleeps / login_sleeps) */ -}}
{{- $el := $v.elasticity | default dict -}}
{{- $sleeps := not (kindIs "invalid" $el.idle_teardown) -}}
{{- $_ := set $login "sleeps" (and $login.enabled ($l.sleeps_with_control_tier | default $d.Login.sleeps_with_control_tier)) -}}
{{- if not (kindIs "invalid" $l.node_port) -}}
{{- $_ := set $login "node_port" (int64 $l.node_port) -}}
{{- end -}}
{{- $r := $v.rest | default dict -}}
{{- $rest := dict "enabled" (ternary $r.enabled $d.Rest.enabled (hasKey $r "enabled")) "service_type" ($r.service_type | default $d.Rest.service_type) -}}
{{- if not (kindIs "invalid" $r.node_port) -}}
{{- $_ := set $rest "node_port" (int64 $r.node_port) -}}
{{- end -}}
{{- $users := list -}}
{{- range $u := $v.users | default list -}}
{{- $gid := $u.uid -}}
{{- if not (kindIs "invalid" $u.gid) }}{{ $gid = $u.gid }}{{ end -}}
{{- $keys := list -}}
{{- range $k := $u.ssh_keys | default $d.User.ssh_keys }}{{ $keys = append $keys (trim $k) }}{{ end -}}
{{- $users = append $users (dict "name" $u.name "uid" (int64 $u.uid) "gid" (int64 $gid) "shell" ($u.shell | default $d.User.shell) "groups" ($u.groups | default $d.User.groups) "ssh_keys" $keys) -}}
{{- end -}}
{{- $groups := list -}}
{{- range $g := $v.groups | default list -}}
{{- $groups = append $groups (dict "name" $g.name "gid" (int64 $g.gid)) -}}
{{- end -}}
{{- /* storage: a section left out takes its default volume (config.Storage); a volume given takes the access_mode default of config.Volume unless set */ -}}
{{- $st := $v.storage | default dict -}}
{{- $storage := dict -}}
{{- range $key, $dflt := $d.Storage -}}
{{- $vol := dict "size" $dflt.size "access_mode" $dflt.access_mode -}}
{{- if $dflt.storage_class }}{{ $_ := set $vol "storage_class" $dflt.storage_class }}{{ end -}}
{{- if hasKey $st $key -}}
{{- $given := index $st $key | default dict -}}
{{- $vol = dict "size" (toString $given.size) "access_mode" ($given.access_mode | default $d.Volume.access_mode) -}}
{{- if $given.storage_class }}{{ $_ := set $vol "storage_class" $given.storage_class }}{{ end -}}
{{- end -}}
{{- $_ := set $storage $key $vol -}}
{{- end -}}
{{- $pools := list -}}
{{- range $p := $v.pools | default list -}}
{{- $net := $p.network | default dict -}}
{{- if and $p.containers (or (eq (kindOf $p.containers) "bool") $p.containers.enabled) }}{{ fail (printf "pools[%s].containers: container jobs are not supported by the Helm chart yet; deploy this spec with `slurmk8s up` (docs/containers.md)" $p.name) }}{{ end -}}
{{- $network := dict "host_network" ($net.host_network | default $d.Network.host_network) "multus_networks" ($net.multus_networks | default $d.Network.multus_networks) "nccl_env" ($net.nccl_env | default $d.Network.nccl_env) "memlock_unlimited" (ternary $net.memlock_unlimited $d.Network.memlock_unlimited (hasKey $net "memlock_unlimited")) -}}
{{- /* Pool.image: unset takes images.worker */ -}}
{{- $pools = append $pools (dict "name" $p.name "mode" ($p.mode | default $d.Pool.mode) "image" ($p.image | default $images.worker) "node_selector" ($p.node_selector | default $d.Pool.node_selector) "tolerations" ($p.tolerations | default $d.Pool.tolerations) "network" $network "kueue" ($p.kueue | default dict) "priority_class" $p.priority_class) -}}
{{- end -}}
{{- $site := dict "cluster_domain" ($c.clusterDomain | default $d.chart.clusterDomain) "host_network_sources" ($c.hostNetworkSources | default $d.chart.hostNetworkSources) -}}
{{- $chart := dict "createSecrets" (ternary $c.createSecrets $d.chart.createSecrets (hasKey $c "createSecrets")) -}}
{{- $cluster := $v.name | replace "-" "_" -}}
{{- if and $v.slurm $v.slurm.cluster_name }}{{ $cluster = $v.slurm.cluster_name }}{{ end -}}
{{- toJson (dict "name" $v.name "namespace" $ns "sleeps" $sleeps "cluster_name" $cluster "images" $images "login" $login "users" $users "groups" $groups "storage" $storage "pools" $pools "site" $site "chart" $chart "accounting" $accounting "rest" $rest) -}}
{{- end -}}

{{/* slurmk8s.document: the spec as the in-cluster programs read it (spec.json): the values as
given, less the chart's own settings, with the release namespace. */}}
{{- define "slurmk8s.document" -}}
{{- $doc := omit (deepCopy .Values) "chart" -}}
{{- $_ := set $doc "namespace" .Release.Namespace -}}
{{- toJson $doc -}}
{{- end -}}

{{/* base_labels(spec, component); argument: dict "s" $s "component" NAME */}}
{{- define "slurmk8s.labels" -}}
app.kubernetes.io/name: slurmk8s
app.kubernetes.io/instance: {{ .s.name | quote }}
app.kubernetes.io/part-of: slurmk8s
app.kubernetes.io/component: {{ .component | quote }}
slurmk8s.io/cluster: {{ .s.name | quote }}
{{- end -}}

{{/* selector(spec, component) */}}
{{- define "slurmk8s.selector" -}}
slurmk8s.io/cluster: {{ .s.name | quote }}
app.kubernetes.io/component: {{ .component | quote }}
{{- end -}}

{{/* _meta(spec, name, component), plus the labels Helm charts carry; argument: dict "s" $s "name" NAME "component" C "root" $ */}}
{{- define "slurmk8s.meta" -}}
name: {{ .name | quote }}
namespace: {{ .s.namespace | quote }}
labels:
  {{- include "slurmk8s.labels" . | nindent 2 }}
  {{- include "slurmk8s.helmLabels" .root | nindent 2 }}
{{- end -}}

{{/* Labels every chart object carries besides the builders' (not on pod templates). */}}
{{- define "slurmk8s.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
{{- end -}}

{{/* content_hash(value): sha256 of compact, key-sorted JSON, 16 hex digits */}}
{{- define "slurmk8s.hash" -}}
{{- toJson . | sha256sum | trunc 16 -}}
{{- end -}}

{{- define "slurmk8s.fqdn" -}}
{{- printf "%s.%s.svc.%s" .service .s.namespace .s.site.cluster_domain -}}
{{- end -}}

{{/* controller_address(spec, site) */}}
{{- define "slurmk8s.controllerAddress" -}}
{{- printf "slurmctld-0.%s:6817" (include "slurmk8s.fqdn" (dict "s" . "service" "slurmctld")) -}}
{{- end -}}

{{/* dns_searches(spec, site), as JSON */}}
{{- define "slurmk8s.dnsSearches" -}}
{{- toJson (list (include "slurmk8s.fqdn" (dict "s" . "service" "workers")) (include "slurmk8s.fqdn" (dict "s" . "service" "slurmctld"))) -}}
{{- end -}}

{{/* render_passwd(spec) */}}
{{- define "slurmk8s.passwd" -}}
{{- range $u := .users -}}
{{ printf "%s:x:%d:%d:%s:/home/%s:%s" $u.name (int64 $u.uid) (int64 $u.gid) $u.name $u.name $u.shell }}
{{ end -}}
{{- end -}}

{{/* render_group(spec) */}}
{{- define "slurmk8s.group" -}}
{{- range $u := .users -}}
{{ printf "%s:x:%d:" $u.name (int64 $u.gid) }}
{{ end -}}
{{- range $g := .groups -}}
{{- $members := list -}}
{{- range $u := $.users }}{{ if has $g.name $u.groups }}{{ $members = append $members $u.name }}{{ end }}{{ end -}}
{{ printf "%s:x:%d:%s" $g.name (int64 $g.gid) (join "," $members) }}
{{ end -}}
{{- end -}}

{{/* authorized_keys(spec), as JSON: user -> file content (users without keys left out) */}}
{{- define "slurmk8s.authorizedKeys" -}}
{{- $out := dict -}}
{{- range $u := .users -}}
{{- if $u.ssh_keys -}}
{{- $text := "" -}}
{{- range $k := $u.ssh_keys }}{{ $text = printf "%s%s\n" $text $k }}{{ end -}}
{{- $_ := set $out $u.name $text -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* elastic_env(spec), as JSON list of [name, value] in the builder's order */}}
{{- define "slurmk8s.elasticEnv" -}}
{{- toJson (list (list "SLURMK8S_BACKEND" "kubernetes") (list "SLURMK8S_INVENTORY" "/etc/slurm/inventory.json") (list "SLURMK8S_SPEC" "/etc/slurmk8s/spec/spec.json") (list "SLURMK8S_SITE" "/etc/slurmk8s/spec/site.json") (list "SLURMK8S_NAMESPACE" .namespace)) -}}
{{- end -}}

{{/* _container_security(caps), as JSON; argument: list of capabilities */}}
{{- define "slurmk8s.containerSecurity" -}}
{{- toJson (dict "privileged" false "allowPrivilegeEscalation" false "capabilities" (dict "drop" (list "ALL") "add" .) "seccompProfile" (dict "type" "RuntimeDefault")) -}}
{{- end -}}

{{- define "slurmk8s.baseCaps" -}}
{{- toJson (list "CHOWN" "DAC_OVERRIDE" "FOWNER" "FSETID" "KILL" "SETGID" "SETUID") -}}
{{- end -}}

{{- define "slurmk8s.loginCaps" -}}
{{- toJson (concat (include "slurmk8s.baseCaps" . | fromJsonArray) (list "SYS_CHROOT" "NET_BIND_SERVICE" "AUDIT_WRITE")) -}}
{{- end -}}

{{/* worker_pod_template(spec, pool, site), as JSON; argument: dict "s" $s "pool" $pool */}}
{{- define "slurmk8s.workerPodTemplate" -}}
{{- $s := .s -}}
{{- $p := .pool -}}
{{- $net := $p.network -}}
{{- $env := list (dict "name" "SLURMK8S_CONTROLLER" "value" (include "slurmk8s.controllerAddress" $s)) (dict "name" "SLURMK8S_POOL" "value" $p.name) (dict "name" "SLURMK8S_MEMLOCK_UNLIMITED" "value" (ternary "1" "0" $net.memlock_unlimited)) -}}
{{- range $k := keys $net.nccl_env | sortAlpha }}{{ $env = append $env (dict "name" $k "value" (index $net.nccl_env $k | toString)) }}{{ end -}}
{{- /* task_prolog_env(pool): the job environment, for Slurm's TaskProlog */ -}}
{{- $jobEnv := "" -}}
{{- range $k := keys $net.nccl_env | sortAlpha }}{{ $jobEnv = printf "%sexport %s=%s\n" $jobEnv $k (index $net.nccl_env $k | toString) }}{{ end -}}
{{- if $jobEnv }}{{ $env = append $env (dict "name" "SLURMK8S_JOB_ENV" "value" $jobEnv) }}{{ end -}}
{{- $container := dict
    "name" "slurmd"
    "image" $p.image
    "imagePullPolicy" $s.images.pull_policy
    "env" $env
    "ports" (list (dict "name" "slurmd" "containerPort" 6818 "protocol" "TCP"))
    "securityContext" (include "slurmk8s.containerSecurity" (include "slurmk8s.baseCaps" . | fromJsonArray) | fromJson)
    "lifecycle" (dict "preStop" (dict "exec" (dict "command" (list "/usr/local/lib/slurmk8s/worker-stop"))))
    "volumeMounts" (list
      (dict "name" "munge-key" "mountPath" "/etc/slurmk8s/secret" "readOnly" true)
      (dict "name" "users" "mountPath" "/etc/slurmk8s/users" "readOnly" true)
      (dict "name" "home" "mountPath" "/home")
      (dict "name" "dshm" "mountPath" "/dev/shm")) -}}
{{- $spec := dict
    "subdomain" "workers"
    "restartPolicy" "Always"
    "terminationGracePeriodSeconds" 15
    "automountServiceAccountToken" false
    "enableServiceLinks" false
    "dnsPolicy" (ternary "ClusterFirstWithHostNet" "ClusterFirst" $net.host_network)
    "dnsConfig" (dict "searches" (include "slurmk8s.dnsSearches" $s | fromJsonArray))
    "securityContext" (dict "seccompProfile" (dict "type" "RuntimeDefault"))
    "containers" (list $container)
    "volumes" (list
      (dict "name" "munge-key" "secret" (dict "secretName" "slurm-auth" "defaultMode" 256))
      (dict "name" "users" "configMap" (dict "name" "slurm-users" "defaultMode" 292))
      (dict "name" "home" "persistentVolumeClaim" (dict "claimName" "home"))
      (dict "name" "dshm" "emptyDir" (dict "medium" "Memory"))) -}}
{{- if $net.host_network }}{{ $_ := set $spec "hostNetwork" true }}{{ end -}}
{{- if $p.node_selector }}{{ $_ := set $spec "nodeSelector" $p.node_selector }}{{ end -}}
{{- if $p.tolerations }}{{ $_ := set $spec "tolerations" $p.tolerations }}{{ end -}}
{{- if $p.priority_class }}{{ $_ := set $spec "priorityClassName" $p.priority_class }}{{ end -}}
{{- $labels := dict "app.kubernetes.io/name" "slurmk8s" "app.kubernetes.io/instance" $s.name "app.kubernetes.io/part-of" "slurmk8s" "app.kubernetes.io/component" "worker" "slurmk8s.io/cluster" $s.name "slurmk8s.io/pool" $p.name "slurmk8s.io/subdomain" "workers" "app.kubernetes.io/managed-by" "slurmk8s" -}}
{{- $meta := dict "namespace" $s.namespace "labels" $labels -}}
{{- if $net.multus_networks }}{{ $_ := set $meta "annotations" (dict "k8s.v1.cni.cncf.io/networks" (join "," $net.multus_networks)) }}{{ end -}}
{{- /* a pool under Kueue (provisioner/kueue.py): its LocalQueue, priority class, and groups done once none of their pods is active */ -}}
{{- if $p.kueue.queue -}}
{{- $_ := set $labels "kueue.x-k8s.io/queue-name" $p.kueue.queue -}}
{{- if $p.kueue.priority_class }}{{ $_ := set $labels "kueue.x-k8s.io/priority-class" $p.kueue.priority_class }}{{ end -}}
{{- $_ := set $meta "annotations" (merge (dict "kueue.x-k8s.io/retriable-in-group" "false") ($meta.annotations | default dict)) -}}
{{- end -}}
{{- toJson (dict "apiVersion" "v1" "kind" "Pod" "metadata" $meta "spec" $spec) -}}
{{- end -}}

{{- /* cel_dyn_literal (provisioner/manifests/admission.py): JSON data as a CEL literal, each value of
a map and each element of a list wrapped in dyn() (the API server's CEL takes aggregate literals of
one type only); keys sorted, scalars as toJson writes them. */ -}}
{{- define "slurmk8s.celLiteral" -}}
{{- $kind := kindOf . -}}
{{- if eq $kind "map" -}}
{{- $m := . -}}
{{- $parts := list -}}
{{- range $k := keys $m | sortAlpha }}{{ $parts = append $parts (printf "%s:dyn(%s)" ($k | toJson) (include "slurmk8s.celLiteral" (index $m $k))) }}{{ end -}}
{{- printf "{%s}" (join "," $parts) -}}
{{- else if eq $kind "slice" -}}
{{- $parts := list -}}
{{- range $e := . }}{{ $parts = append $parts (printf "dyn(%s)" (include "slurmk8s.celLiteral" $e)) }}{{ end -}}
{{- printf "[%s]" (join "," $parts) -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}
