{{/*
Generated from provisioner/manifests/admission.py by
`python -m provisioner.chartdefaults admission > charts/slurmk8s/templates/_admission.tpl`: do not edit.
The worker pods' admission policy without the spec's values (templates/admission.yaml adds them).
*/}}
{{- define "slurmk8s.admission" -}}
{
  "matchConstraints": {
    "resourceRules": [
      {
        "apiGroups": [
          ""
        ],
        "apiVersions": [
          "v1"
        ],
        "operations": [
          "CREATE",
          "UPDATE"
        ],
        "resources": [
          "pods",
          "pods/ephemeralcontainers"
        ]
      }
    ]
  },
  "validations": [
    {
      "expression": "size(variables.badLabels) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod lacks the worker labels",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod lacks the worker label ' + variables.badLabels[0] + '=' + variables.workerLabels[variables.badLabels[0]]",
      "reason": "Forbidden"
    },
    {
      "expression": "variables.pool in variables.poolImages",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pool label names no pool of the spec",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pool label slurmk8s.io/pool=' + variables.pool + ' names no pool of the spec'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.badImages) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a container runs an image that is not its pool's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.badImages[0].name + ' runs image ' + (has(variables.badImages[0].image) ? variables.badImages[0].image : '(none)') + ', not the image of pool ' + variables.pool",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.commands) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a container sets its own command or args",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.commands[0].name + ' sets its own command or args (the template runs the entrypoint of the image)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.privileged) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a container is privileged",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.privileged[0].name + ' is privileged'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.escalating) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a container may escalate privileges",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.escalating[0].name + ' may escalate privileges (the template sets allowPrivilegeEscalation: false)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.badCaps) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a container has capabilities the template does not give",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.badCaps[0].name + ' has capabilities the template of pool ' + variables.pool + ' does not give (it drops ALL and adds only its own)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.unconfined) == 0 && has(object.spec.securityContext) && has(object.spec.securityContext.seccompProfile) && (object.spec.securityContext.seccompProfile.type == variables.seccomp.type && (object.spec.securityContext.seccompProfile.type != 'Localhost' || (has(object.spec.securityContext.seccompProfile.localhostProfile) && object.spec.securityContext.seccompProfile.localhostProfile == variables.seccomp.localhostProfile)))",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod or a container is not confined as the template is",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + (size(variables.unconfined) > 0 ? 'container ' + variables.unconfined[0].name : 'the pod') + ' is not confined as the template is (seccomp ' + variables.seccomp.type + ' as the template of pool ' + variables.pool + ', procMount Default, AppArmor not Unconfined)'",
      "reason": "Forbidden"
    },
    {
      "expression": "!has(object.spec.hostNetwork) || !object.spec.hostNetwork || variables.hostNetwork",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: hostNetwork is set but the pool's template has no host network",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'hostNetwork is set but the template of pool ' + variables.pool + ' has no host network'",
      "reason": "Forbidden"
    },
    {
      "expression": "!has(object.spec.hostPID) || !object.spec.hostPID",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: hostPID is set",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'hostPID is set (no template shares the process namespace of the node)'",
      "reason": "Forbidden"
    },
    {
      "expression": "!has(object.spec.hostIPC) || !object.spec.hostIPC",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: hostIPC is set",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'hostIPC is set (no template shares the IPC namespace of the node)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.hostPorts) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a container asks for a host port",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.hostPorts[0].name + ' asks for a host port'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.badVolumes) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a volume is not one of the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'volume ' + variables.badVolumes[0].name + ' is not one of the template volumes (its Secret, ConfigMap, claim and emptyDir; never a hostPath or a projected token)'",
      "reason": "Forbidden"
    },
    {
      "expression": "has(object.spec.automountServiceAccountToken) && !object.spec.automountServiceAccountToken",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod would mount a ServiceAccount token",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod would mount a ServiceAccount token (the template sets automountServiceAccountToken: false)'",
      "reason": "Forbidden"
    },
    {
      "expression": "!has(object.spec.serviceAccountName) || object.spec.serviceAccountName == variables.serviceAccount",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod runs as another ServiceAccount than the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod runs as ServiceAccount ' + object.spec.serviceAccountName + ', not ' + variables.serviceAccount",
      "reason": "Forbidden"
    },
    {
      "expression": "!has(object.spec.ephemeralContainers) || size(object.spec.ephemeralContainers) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod has ephemeral containers",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod has ephemeral containers'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offLabels) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod has a label the template does not give",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod has label ' + variables.offLabels[0] + '=' + variables.labels[variables.offLabels[0]] + ', which the template of pool ' + variables.pool + ' does not give'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offAnnotations) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod's annotations are not the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'annotation ' + variables.offAnnotations[0] + ' is not as the template of pool ' + variables.pool + ' has it'",
      "reason": "Forbidden"
    },
    {
      "expression": "'slurmk8s.io/node' in variables.labels && variables.labels['slurmk8s.io/node'] == object.metadata.name && has(object.spec.hostname) && object.spec.hostname == object.metadata.name",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod's hostname and node label are not its name",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the hostname and the label slurmk8s.io/node of pod ' + object.metadata.name + ' must be its name, the Slurm node\\'s'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offFields) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod sets a field other than the template",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod sets ' + variables.offNamed[0] + ' other than the template of pool ' + variables.pool + ' (only the node\\'s name, placement and size differ from it)'",
      "reason": "Forbidden"
    },
    {
      "expression": "!has(object.spec.schedulingGates) || variables.kueuePool && object.spec.schedulingGates.all(g, has(g.name) && g.name in ['kueue.x-k8s.io/admission', 'kueue.x-k8s.io/topology'])",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod has scheduling gates, and only Kueue's in a pool under Kueue may",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod has scheduling gates other than Kueue\\'s, or pool ' + variables.pool + ' is under no Kueue queue'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.missingFields) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod lacks a field of the template",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod lacks ' + variables.missingFields[0] + ', which the template of pool ' + variables.pool + ' sets'",
      "reason": "Forbidden"
    },
    {
      "expression": "!has(object.spec.nodeName) || request.operation == 'UPDATE' && has(oldObject.spec.nodeName) && oldObject.spec.nodeName == object.spec.nodeName",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod names its Kubernetes node (nodeName)",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod sets nodeName ' + object.spec.nodeName + ' (the scheduler places a worker pod, past its taints)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offTolerations) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod's tolerations are not the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod tolerates ' + (has(variables.offTolerations[0].key) ? variables.offTolerations[0].key : 'every taint') + ' other than the template of pool ' + variables.pool + ' (or lacks its toleration)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offAffinity) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the pod's affinity is not the template's and the node's placement",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'the pod sets affinity ' + variables.offAffinity[0] + ' other than the template of pool ' + variables.pool + ' and the placement of one Slurm node'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(object.spec.containers) == 1 && size(variables.offContainer) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the container is not the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + (size(object.spec.containers) != 1 ? 'the pod has ' + string(size(object.spec.containers)) + ' containers, the template one' : 'container ' + variables.container.name + ' sets ' + variables.offContainer[0] + ' other than the template of pool ' + variables.pool)",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offEnv) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: an environment variable is not the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.container.name + ' sets env ' + (has(variables.offEnv[0].name) ? variables.offEnv[0].name : '') + ' other than the template of pool ' + variables.pool + ' (a Secret, ConfigMap or value of its own, or one it lacks)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offPorts) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a container port is not the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.container.name + ' has port ' + string(variables.offPorts[0].containerPort) + ' other than the template of pool ' + variables.pool",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offResources) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: the container asks for resources the pool does not use",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'container ' + variables.container.name + ' sets resources ' + variables.offResources[0] + ' of a resource pool ' + variables.pool + ' does not use (DRA claims, a device of another pool)'",
      "reason": "Forbidden"
    },
    {
      "expression": "size(variables.offVolumes) == 0",
      "message": "slurmk8s: the controller may only create worker pods from the pool templates: a volume is not the template's",
      "messageExpression": "'slurmk8s: the controller may only create worker pods from the pool templates: ' + 'volume ' + variables.offVolumes[0].name + ' is not as the template of pool ' + variables.pool + ' has it'",
      "reason": "Forbidden"
    }
  ],
  "variables": [
    {
      "expression": "has(object.metadata.labels) ? object.metadata.labels : {}",
      "name": "labels"
    },
    {
      "expression": "'slurmk8s.io/pool' in variables.labels ? variables.labels['slurmk8s.io/pool'] : ''",
      "name": "pool"
    },
    {
      "expression": "variables.pool in variables.poolImages ? variables.poolImages[variables.pool] : []",
      "name": "images"
    },
    {
      "expression": "variables.pool in variables.poolCaps ? variables.poolCaps[variables.pool] : []",
      "name": "caps"
    },
    {
      "expression": "variables.pool in variables.hostNetworkPools",
      "name": "hostNetwork"
    },
    {
      "expression": "variables.pool in variables.poolSeccomp ? variables.poolSeccomp[variables.pool] : {'type': 'RuntimeDefault'}",
      "name": "seccomp"
    },
    {
      "expression": "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])",
      "name": "containers"
    },
    {
      "expression": "has(object.spec.volumes) ? object.spec.volumes : []",
      "name": "volumes"
    },
    {
      "expression": "variables.workerLabels.filter(k, !(k in variables.labels) || variables.labels[k] != variables.workerLabels[k])",
      "name": "badLabels"
    },
    {
      "expression": "variables.containers.filter(c, !has(c.image) || !(c.image in variables.images))",
      "name": "badImages"
    },
    {
      "expression": "variables.containers.filter(c, has(c.command) || has(c.args))",
      "name": "commands"
    },
    {
      "expression": "variables.containers.filter(c, has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged)",
      "name": "privileged"
    },
    {
      "expression": "variables.containers.filter(c, !has(c.securityContext) || !has(c.securityContext.allowPrivilegeEscalation) || c.securityContext.allowPrivilegeEscalation)",
      "name": "escalating"
    },
    {
      "expression": "variables.containers.filter(c, !has(c.securityContext) || !has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.drop) || !('ALL' in c.securityContext.capabilities.drop) || (has(c.securityContext.capabilities.add) && !c.securityContext.capabilities.add.all(a, a in variables.caps)))",
      "name": "badCaps"
    },
    {
      "expression": "variables.containers.filter(c, has(c.securityContext) && ((has(c.securityContext.seccompProfile) && !((c.securityContext.seccompProfile.type == variables.seccomp.type && (c.securityContext.seccompProfile.type != 'Localhost' || (has(c.securityContext.seccompProfile.localhostProfile) && c.securityContext.seccompProfile.localhostProfile == variables.seccomp.localhostProfile))))) || (has(c.securityContext.procMount) && c.securityContext.procMount != 'Default') || (has(c.securityContext.appArmorProfile) && c.securityContext.appArmorProfile.type == 'Unconfined')))",
      "name": "unconfined"
    },
    {
      "expression": "variables.containers.filter(c, has(c.ports) && c.ports.exists(p, has(p.hostPort) && p.hostPort != 0 && !(variables.hostNetwork && p.hostPort == p.containerPort)))",
      "name": "hostPorts"
    },
    {
      "expression": "variables.volumes.filter(v, !((has(v.secret) && has(v.secret.secretName) && v.secret.secretName in variables.secrets) || (has(v.configMap) && has(v.configMap.name) && v.configMap.name in variables.configMaps) || (has(v.persistentVolumeClaim) && v.persistentVolumeClaim.claimName in variables.claims) || has(v.emptyDir)))",
      "name": "badVolumes"
    },
    {
      "expression": "variables.pool in variables.poolTemplates ? variables.poolTemplates[variables.pool] : {'metadata': dyn({}), 'spec': dyn({'containers': dyn([dyn({})]), 'volumes': dyn([])})}",
      "name": "tmpl"
    },
    {
      "expression": "variables.tmpl.spec",
      "name": "tSpec"
    },
    {
      "expression": "has(variables.tmpl.metadata.labels) ? variables.tmpl.metadata.labels : {}",
      "name": "tLabels"
    },
    {
      "expression": "has(variables.tmpl.metadata.annotations) ? variables.tmpl.metadata.annotations : {}",
      "name": "tAnnotations"
    },
    {
      "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}",
      "name": "annotations"
    },
    {
      "expression": "request.operation == 'UPDATE' && has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}",
      "name": "oldLabels"
    },
    {
      "expression": "request.operation == 'UPDATE' && has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}",
      "name": "oldAnnotations"
    },
    {
      "expression": "'kueue.x-k8s.io/queue-name' in variables.tLabels",
      "name": "kueuePool"
    },
    {
      "expression": "variables.labels.filter(k, !(k == 'slurmk8s.io/node' ? variables.labels[k] == object.metadata.name : (k in variables.tLabels && variables.labels[k] == variables.tLabels[k])) && !(k == 'slurmk8s.io/busy' && variables.labels[k] == 'true') && !(variables.kueuePool && (k == 'kueue.x-k8s.io/pod-group-name' || k == 'kueue.x-k8s.io/managed' && variables.labels[k] == 'true')) && !(k in variables.oldLabels && variables.oldLabels[k] == variables.labels[k]))",
      "name": "offLabels"
    },
    {
      "expression": "variables.annotations.filter(k, !(k in ['slurmk8s.io/spec-hash', 'slurmk8s.io/k8s-node', 'slurmk8s.io/adopted', 'karpenter.sh/do-not-disrupt', 'cluster-autoscaler.kubernetes.io/safe-to-evict']) && !(variables.kueuePool && k in ['kueue.x-k8s.io/pod-group-total-count', 'kueue.x-k8s.io/role-hash']) && !(k in variables.tAnnotations && variables.annotations[k] == variables.tAnnotations[k]) && !(k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.annotations[k])) + variables.tAnnotations.filter(k, !(k in variables.annotations))",
      "name": "offAnnotations"
    },
    {
      "expression": "{'preemptionPolicy': dyn('PreemptLowerPriority'), 'priority': dyn(0), 'schedulerName': dyn('default-scheduler'), 'serviceAccount': dyn(variables.serviceAccount), 'serviceAccountName': dyn(variables.serviceAccount)}",
      "name": "podDefaults"
    },
    {
      "expression": "request.operation == 'UPDATE' ? dyn(oldObject.spec) : dyn({})",
      "name": "oldSpec"
    },
    {
      "expression": "object.spec.filter(k, !(k in ['affinity', 'containers', 'hostname', 'nodeName', 'schedulingGates', 'tolerations', 'volumes'] || (k in variables.tSpec ? object.spec[k] == variables.tSpec[k] : (k in variables.podDefaults && object.spec[k] == variables.podDefaults[k]))) && !(k in variables.oldSpec && object.spec[k] == variables.oldSpec[k]) && !(has(variables.tSpec.priorityClassName) && k in ['priority', 'preemptionPolicy']))",
      "name": "offFields"
    },
    {
      "expression": "variables.offFields.filter(k, !(k in variables.podDefaults))",
      "name": "offSet"
    },
    {
      "expression": "(size(variables.offSet) > 0 ? variables.offSet : variables.offFields).filter(k, (size(variables.offSet) > 0 ? variables.offSet : variables.offFields).all(j, j >= k))",
      "name": "offNamed"
    },
    {
      "expression": "variables.tSpec.filter(k, !(k in ['affinity', 'containers', 'hostname', 'nodeName', 'schedulingGates', 'tolerations', 'volumes']) && !(k in object.spec))",
      "name": "missingFields"
    },
    {
      "expression": "has(object.spec.tolerations) ? object.spec.tolerations : []",
      "name": "tolerations"
    },
    {
      "expression": "has(variables.tSpec.tolerations) ? variables.tSpec.tolerations : []",
      "name": "tTolerations"
    },
    {
      "expression": "has(variables.oldSpec.tolerations) ? variables.oldSpec.tolerations : []",
      "name": "oldTolerations"
    },
    {
      "expression": "variables.tolerations.filter(t, !(t in variables.tTolerations) && !(t in variables.oldTolerations) && !(size(t) == 4 && has(t.key) && t.key in ['node.kubernetes.io/not-ready', 'node.kubernetes.io/unreachable'] && has(t.operator) && t.operator == 'Exists' && has(t.effect) && t.effect == 'NoExecute' && has(t.tolerationSeconds))) + variables.tTolerations.filter(t, !(t in variables.tolerations))",
      "name": "offTolerations"
    },
    {
      "expression": "has(object.spec.affinity) ? object.spec.affinity : {}",
      "name": "affinity"
    },
    {
      "expression": "has(variables.tSpec.affinity) ? variables.tSpec.affinity : {}",
      "name": "tAffinity"
    },
    {
      "expression": "'nodeAffinity' in variables.affinity ? variables.affinity.nodeAffinity : {}",
      "name": "nodeAffinity"
    },
    {
      "expression": "has(variables.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) && has(variables.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms) && size(variables.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms) == 1 ? variables.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0] : {}",
      "name": "nodeTerm"
    },
    {
      "expression": "has(variables.nodeTerm.matchFields) && size(variables.nodeTerm.matchFields) == 1 && has(variables.nodeTerm.matchFields[0].values) && size(variables.nodeTerm.matchFields[0].values) == 1 ? variables.nodeTerm.matchFields[0].values[0] : ''",
      "name": "pinnedTo"
    },
    {
      "expression": "has(variables.nodeTerm.matchExpressions) && size(variables.nodeTerm.matchExpressions) == 1 && has(variables.nodeTerm.matchExpressions[0].values) && size(variables.nodeTerm.matchExpressions[0].values) == 1 ? variables.nodeTerm.matchExpressions[0].values[0] : ''",
      "name": "domain"
    },
    {
      "expression": "variables.pinnedTo != '' && variables.nodeAffinity == {'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [{'matchFields': [{'key': dyn('metadata.name'), 'operator': dyn('In'), 'values': dyn([variables.pinnedTo])}]}] } } || variables.pool in variables.poolDomains && variables.domain in variables.poolDomains[variables.pool]['values'] && variables.nodeAffinity == {'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [{'matchExpressions': [{'key': dyn(variables.poolDomains[variables.pool]['label']), 'operator': dyn('In'), 'values': dyn([variables.domain])}]}] } }",
      "name": "placed"
    },
    {
      "expression": "variables.affinity.filter(k, k == 'nodeAffinity' ? !variables.placed : !(k in variables.tAffinity && variables.affinity[k] == variables.tAffinity[k])) + variables.tAffinity.filter(k, !(k in variables.affinity))",
      "name": "offAffinity"
    },
    {
      "expression": "object.spec.containers[0]",
      "name": "container"
    },
    {
      "expression": "variables.tSpec.containers[0]",
      "name": "tContainer"
    },
    {
      "expression": "variables.container.filter(k, !(k in ['env', 'ports', 'resources'] || (k in variables.tContainer ? variables.container[k] == variables.tContainer[k] : (k in {'terminationMessagePath': '/dev/termination-log', 'terminationMessagePolicy': 'File'} && variables.container[k] == {'terminationMessagePath': '/dev/termination-log', 'terminationMessagePolicy': 'File'}[k])))) + variables.tContainer.filter(k, !(k in ['env', 'ports', 'resources']) && !(k in variables.container))",
      "name": "offContainer"
    },
    {
      "expression": "has(variables.container.env) ? variables.container.env : []",
      "name": "env"
    },
    {
      "expression": "has(variables.tContainer.env) ? variables.tContainer.env : []",
      "name": "tEnv"
    },
    {
      "expression": "variables.env.filter(e, !(e in variables.tEnv) && !(e == {'name': dyn('SLURMK8S_NODENAME'), 'value': dyn(object.metadata.name)}) && !(size(e) == 2 && has(e.name) && e.name in ['SLURMK8S_GPUS', 'SLURMK8S_GPU_TYPE'] && has(e.value))) + variables.tEnv.filter(e, !(e in variables.env))",
      "name": "offEnv"
    },
    {
      "expression": "has(variables.container.ports) ? variables.container.ports : []",
      "name": "ports"
    },
    {
      "expression": "has(variables.tContainer.ports) ? variables.tContainer.ports : []",
      "name": "tPorts"
    },
    {
      "expression": "variables.ports.filter(p, !(p in variables.tPorts) && !(variables.hostNetwork && has(p.hostPort) && p.hostPort == p.containerPort && variables.tPorts.exists(q, !has(q.hostPort) && (size(p.filter(f, !(f in ['hostPort'] || (f in q ? p[f] == q[f] : (f in {} && p[f] == {}[f]))))) == 0 && size(q.filter(f, !(f in ['hostPort']) && !(f in p))) == 0)))) + variables.tPorts.filter(q, !variables.ports.exists(p, p.name == q.name))",
      "name": "offPorts"
    },
    {
      "expression": "variables.pool in variables.poolResources ? variables.poolResources[variables.pool] : []",
      "name": "resourceNames"
    },
    {
      "expression": "has(variables.container.resources) ? variables.container.resources : {}",
      "name": "resources"
    },
    {
      "expression": "variables.resources.filter(k, !(k in ['limits', 'requests']) || variables.resources[k].exists(r, !(r in variables.resourceNames)))",
      "name": "offResources"
    },
    {
      "expression": "has(variables.tSpec.volumes) ? variables.tSpec.volumes : []",
      "name": "tVolumes"
    },
    {
      "expression": "variables.volumes.filter(v, !(v in variables.tVolumes) && !(size(v) == 2 && has(v.emptyDir) && variables.tVolumes.exists(w, w.name == v.name && has(w.emptyDir) && (size((has(v.emptyDir) ? v.emptyDir : {}).filter(f, !(f in ['sizeLimit'] || (f in (has(w.emptyDir) ? w.emptyDir : {}) ? (has(v.emptyDir) ? v.emptyDir : {})[f] == (has(w.emptyDir) ? w.emptyDir : {})[f] : (f in {} && (has(v.emptyDir) ? v.emptyDir : {})[f] == {}[f]))))) == 0 && size((has(w.emptyDir) ? w.emptyDir : {}).filter(f, !(f in ['sizeLimit']) && !(f in (has(v.emptyDir) ? v.emptyDir : {})))) == 0)))) + variables.tVolumes.filter(w, !variables.volumes.exists(v, v.name == w.name))",
      "name": "offVolumes"
    }
  ]
}
{{- end -}}
