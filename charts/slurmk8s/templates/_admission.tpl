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
    }
  ]
}
{{- end -}}
