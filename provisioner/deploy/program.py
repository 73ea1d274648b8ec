"""The Pulumi program: one function, :func:`cluster_program`, for both entry points.

``stacks/__main__.py`` (the Pulumi CLI) and ``provisioner.deploy.automation`` (``slurmk8s up``,
an inline Automation API program) both call it, so both produce the same resource graph.

What it does, in order: read the Kubernetes nodes of the live cluster (unless given), run the pure
pipeline (:func:`provisioner.generate.generate`: inventory, topology, rendered files), build every
object with :mod:`provisioner.manifests`, and register them as Pulumi resources grouped in one
ComponentResource per concern. Nothing is derived here that the core does not derive.

Stack configuration it reads (namespace ``slurmk8s``; see ``stacks/Pulumi.*.yaml``):

- ``mungeKey``, ``sshHostKeyEd25519``, ``sshHostKeyEcdsa``, ``sshHostKeyRsa``,
  ``accountingDbPassword``, ``jwtKey``: secrets, generated once (``provisioner.deploy.keys``);
- ``wait`` (default true): wait for slurmctld / login to become ready; false adds
  ``pulumi.com/skipAwait`` (e.g. while images are not loaded yet);
- ``clusterDomain`` (default ``cluster.local``);
- ``owner``, ``ownerDescription`` (plain; ``slurmk8s up`` sets them): the stack's owner id and who
  deploys it from where, put on the Namespace as ``slurmk8s.io/owner`` /
  ``slurmk8s.io/owner-description`` (:mod:`provisioner.deploy.owner`); absent, no annotation;
- ``spec`` (stacks/ only): path of the cluster spec; ``nodes`` (optional): a saved
  ``kubectl get nodes -o json`` to use instead of the live cluster (offline previews, tests);
- ``kubernetes:kubeconfig`` (path or content) and ``kubernetes:context``: the cluster, for the
  program's own Kubernetes provider (ConfigMaps and Secrets mutable: updated in place) and for
  reading the nodes.

Ownership: PVCs (/home, slurmctld's state, the accounting database) and the namespace are kept on
``destroy`` (``retainOnDelete``); ``slurmk8s down
--purge`` removes them. Worker pods are never Pulumi resources (the resume/suspend programs own them).
"""

from __future__ import annotations

import re
from pathlib import Path
from os import PathLike
from typing import Any, Callable, Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from .. import manifests as m
from ..config import ClusterSpec
from ..generate import Generated, generate_for_kubernetes
from .owner import DESCRIPTION_CONFIG, OWNER_CONFIG, owner_annotations
from .keys import CONFIG_NAMESPACE, missing_jwt_key_error, public_key, secrets_from_config

PROJECT = "slurmk8s"
SKIP_AWAIT = "pulumi.com/skipAwait"

# (apiVersion, kind) -> resource class. Top-level fields are passed as keyword arguments.
_CLASSES: dict[tuple[str, str], Callable[..., pulumi.CustomResource]] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"):
        k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"):
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def k8s_resource(logical: str, obj: Mapping[str, Any], opts: pulumi.ResourceOptions,
                 *, skip_await: bool = False) -> Any:
    """A typed pulumi-kubernetes resource from a manifest dict (nested fields keep their API names).
    Typed Any: its outputs (metadata, spec, status) are declared on each kind's class, not on
    pulumi.CustomResource, and the kind is known only at run time."""
    cls = _CLASSES[(obj["apiVersion"], obj["kind"])]
    body = dict(obj)
    if skip_await:
        meta = dict(body["metadata"])
        meta["annotations"] = {**meta.get("annotations", {}), SKIP_AWAIT: "true"}
        body["metadata"] = meta
    kwargs = {_snake(k): v for k, v in body.items() if k not in ("apiVersion", "kind")}
    return cls(logical, opts=opts, **kwargs)


class _Component(pulumi.ComponentResource):
    """Base: children parented to the component, named '<cluster>-<object name>'."""

    def __init__(self, typ: str, name: str, spec: ClusterSpec, wait: bool, opts: pulumi.ResourceOptions | None,
                 depends_on: Sequence[pulumi.Resource] = ()) -> None:
        super().__init__(typ, name, None, opts)
        self._spec = spec
        self._wait = wait
        self._depends_on = list(depends_on)

    def _add(self, obj: Mapping[str, Any], *, retain: bool = False,
             after: Sequence[pulumi.Resource] = ()) -> Any:  # a pulumi-kubernetes resource: k8s_resource
        opts = pulumi.ResourceOptions(
            parent=self,
            depends_on=[*self._depends_on, *after] or None,
            retain_on_delete=retain or None,
            # fixed names: a replacement must delete the old object first (else SSA "creates" the
            # same object and the delete of the old one removes it)
            delete_before_replace=True,
        )
        name = f"{self._spec.name}-{obj['metadata']['name']}"
        # PVCs: never awaited. With a WaitForFirstConsumer class a claim binds only once its pod
        # exists (the StatefulSet / Deployment await covers that), and provider 4.25 waits for
        # phase Pending when it adopts a claim kept by `down` that is already Bound: 300 s, then
        # failure (seen on the local cluster; fixed upstream only for updates, pulumi-kubernetes#4181).
        skip = not self._wait or obj["kind"] == "PersistentVolumeClaim"
        return k8s_resource(name, obj, opts, skip_await=skip)


class Storage(_Component):
    """Shared /home (RWX PVC, kept on destroy)."""

    home_claim: pulumi.Output[str]

    def __init__(self, name: str, spec: ClusterSpec, *, wait: bool, depends_on: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:Storage", name, spec, wait, opts, depends_on)
        home = self._add(m.home_pvc(spec), retain=True)
        self.home_claim = home.metadata.name
        self.register_outputs({"home_claim": self.home_claim})


class Controller(_Component):
    """slurmctld: auth key, rendered configuration, users, spec, RBAC for the worker pods and the
    admission policy that holds them to the pool templates, state PVC, headless Service and the
    StatefulSet."""

    address: pulumi.Output[str]
    statefulset: pulumi.Output[str]
    service_account: pulumi.Output[str]

    def __init__(self, name: str, spec: ClusterSpec, gen: Generated, secrets: m.ClusterSecrets, site: m.K8sSite, *,
                 wait: bool, depends_on: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:Controller", name, spec, wait, opts, depends_on)
        files = gen.files
        # what slurmctld's pod reads at its start (m.pod_files) and the Role that lets it: before the
        # StatefulSet, so that a pod started by this update reads this update's spec and users
        before_pod = [self._add(m.auth_secret(spec, pulumi.Output.secret(secrets.munge_key_b64)))]
        # the JWT key (rest.enabled): slurmctld and slurmdbd read it, so it comes before both
        self.jwt_secret: pulumi.Resource | None = None
        if spec.rest.enabled:
            if secrets.jwt_key_b64 is None:
                raise pulumi.RunError(missing_jwt_key_error())
            self.jwt_secret = self._add(m.jwt_secret(spec, pulumi.Output.secret(secrets.jwt_key_b64)))
            before_pod.append(self.jwt_secret)
        self._add(m.slurm_config_map(spec, files))
        before_pod.append(self._add(m.users_config_map(spec, files)))
        before_pod.append(self._add(m.spec_config_map(spec, site)))
        sa = self._add(m.controller_service_account(spec))
        before_pod += [sa, self._add(m.worker_role(spec)), self._add(m.worker_role_binding(spec))]
        # the pods that account may create: those of the pool templates (cluster-scoped, named per
        # namespace; `down` deletes them with the rest). In place before slurmctld starts.
        policy = self._add(m.worker_pod_policy(spec, site))
        binding = self._add(m.worker_pod_policy_binding(spec), after=[policy])
        # pinned pools: the pod's render at start and the reconcile loop read the nodes (cluster-scoped)
        read_nodes = [self._add(obj) for obj in m.read_nodes_objects(spec)]
        if m.sleeps(spec):  # idle teardown: the loop sleeps the tier and records its state (on a
            # ConfigMap of its own, there before the loop starts; the deploy writes none of its state)
            before_pod.append(self._add(m.tier_state_config_map(spec)))
            self._add(m.control_tier_role(spec))
            self._add(m.control_tier_role_binding(spec))
        self._add(m.controller_state_pvc(spec), retain=True)
        self._add(m.controller_service(spec))
        sts = self._add(m.controller_statefulset(spec, files, site), after=[policy, binding, *read_nodes, *before_pod])
        self.address = pulumi.Output.from_input(m.controller_address(spec, site))
        self.statefulset = sts.metadata.name
        self.service_account = sa.metadata.name
        self.register_outputs({"address": self.address, "statefulset": self.statefulset,
                               "service_account": self.service_account})


class Accounting(_Component):
    """slurmdbd (Deployment + Service, slurmdbd.conf in its own Secret) and, unless the spec names an
    external database, MariaDB: its generated password (Secret), data volume (kept on destroy),
    Service and StatefulSet."""

    host: pulumi.Output[str]
    database: pulumi.Output[str]

    def __init__(self, name: str, spec: ClusterSpec, secrets: m.ClusterSecrets, site: m.K8sSite, *, wait: bool,
                 depends_on: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:Accounting", name, spec, wait, opts, depends_on)
        sec = m.ClusterSecrets(secrets.munge_key_b64, secrets.ssh_host_keys,
                               pulumi.Output.secret(secrets.db_password) if secrets.db_password is not None else None)
        for obj in m.accounting_objects(spec, sec, site):
            self._add(obj, retain=obj["kind"] == "PersistentVolumeClaim")
        host, port, _, db = m.db_endpoint(spec, site)
        self.host = pulumi.Output.from_input(f"{m.slurmdbd_host(spec, site)}:{m.SLURMDBD_PORT}")
        self.database = pulumi.Output.from_input(f"{host}:{port}/{db}")
        self.register_outputs({"host": self.host, "database": self.database})


class Login(_Component):
    """sshd + Slurm clients: host keys (Secret, stable), authorized keys, Deployment, Service."""

    service: pulumi.Output[str]
    service_type: pulumi.Output[str]
    node_port: pulumi.Output[Any]
    external_ips: pulumi.Output[Any]
    host_public_keys: pulumi.Output[list[str]]
    address: pulumi.Output[str | None]

    def __init__(self, name: str, spec: ClusterSpec, gen: Generated, secrets: m.ClusterSecrets, site: m.K8sSite, *,
                 wait: bool, depends_on: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:Login", name, spec, wait, opts, depends_on)
        host_keys = {t: pulumi.Output.secret(v) for t, v in secrets.ssh_host_keys.items()}
        self._add(m.ssh_host_keys_secret(spec, host_keys))
        self._add(m.authorized_keys_secret(spec))
        agent: list[pulumi.Resource] = []
        if m.sleeps(spec):  # the wake agent's account (its token reaches only the agent container)
            agent = [self._add(m.login_agent_service_account(spec)), self._add(m.login_agent_role(spec)),
                     self._add(m.login_agent_role_binding(spec))]
        self._add(m.login_deployment(spec, gen.files, site), after=agent)  # its pod names the account
        svc = self._add(m.login_service(spec))
        self.service = svc.metadata.name
        self.service_type = svc.spec.type
        self.node_port = svc.spec.apply(lambda sp: sp.ports[0].node_port if sp is not None and sp.ports else None)
        self.external_ips = svc.status.apply(_lb_addresses)
        # where to SSH to: a LoadBalancer's address once it has one, else the Service inside the cluster
        if spec.login.service_type == "LoadBalancer":
            self.address = self.external_ips.apply(lambda ips: f"{ips[0]}:{m.SSH_PORT}" if ips else None)
        else:
            self.address = pulumi.Output.from_input(f"{m.service_fqdn(spec, m.LOGIN, site)}:{m.SSH_PORT}")
        # Public halves of the host keys, for users' known_hosts (not secret).
        self.host_public_keys = pulumi.Output.unsecret(
            pulumi.Output.all(*[host_keys[t] for t in m.SSH_HOST_KEY_TYPES]).apply(
                lambda keys: [public_key(k) for k in keys]))
        self.register_outputs({"service": self.service, "service_type": self.service_type,
                               "node_port": self.node_port, "external_ips": self.external_ips,
                               "address": self.address, "host_public_keys": self.host_public_keys})


class Rest(_Component):
    """The REST API: slurmrestd's client configuration, Service and Deployment; with the idle
    teardown, its waking front's ServiceAccount and Role."""

    url: pulumi.Output[str]
    service_type: pulumi.Output[str]
    node_port: pulumi.Output[Any]
    external_ips: pulumi.Output[Any]

    def __init__(self, name: str, spec: ClusterSpec, gen: Generated, site: m.K8sSite, *,
                 wait: bool, depends_on: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:Rest", name, spec, wait, opts, depends_on)
        svc = None
        front: list[pulumi.Resource] = []
        if m.sleeps(spec):  # the waking front's account (its token reaches only the front's container)
            front = [self._add(m.rest_front_service_account(spec)), self._add(m.rest_front_role(spec)),
                     self._add(m.rest_front_role_binding(spec))]
        for obj in m.rest_objects(spec, gen.files, site):  # its JWT key Secret is the Controller's
            res = self._add(obj, after=front if obj["kind"] == "Deployment" else ())
            if obj["kind"] == "Service":
                svc = res
        assert svc is not None
        self.url = pulumi.Output.from_input(rest_url(spec, site))
        self.service_type = svc.spec.type
        self.node_port = svc.spec.apply(lambda sp: sp.ports[0].node_port if sp is not None and sp.ports else None)
        self.external_ips = svc.status.apply(_lb_addresses)
        self.register_outputs({"url": self.url, "service_type": self.service_type, "node_port": self.node_port,
                               "external_ips": self.external_ips})


def rest_url(spec: ClusterSpec, site: m.K8sSite) -> str:
    """The REST API's address inside the Kubernetes cluster (its Service); see rest_hint for outside."""
    return f"http://{m.service_fqdn(spec, m.REST, site)}:{m.REST_PORT}"


def rest_hint(spec: ClusterSpec) -> str:
    ns = spec.namespace_name
    if spec.rest.service_type == "ClusterIP":
        return f"kubectl -n {ns} port-forward svc/{m.REST} {m.REST_PORT}:{m.REST_PORT} & curl http://localhost:{m.REST_PORT}/..."
    if spec.rest.service_type == "NodePort":
        return "http://<any node address>:<rest_node_port>/..."
    return f"http://<rest_external_ips[0]>:{m.REST_PORT}/..."


def _lb_addresses(status: Any) -> list[str]:
    """Addresses of a LoadBalancer Service (empty before one is assigned, or for other types)."""
    lb = getattr(status, "load_balancer", None)
    ingress = getattr(lb, "ingress", None) or []
    return [a for a in (getattr(i, "ip", None) or getattr(i, "hostname", None) for i in ingress) if a]


class WorkerPools(_Component):
    """No pods at rest: the per-pool pod template (ConfigMap), the headless Service under which
    workers resolve each other by Slurm node name, and the PodDisruptionBudget."""

    node_names: pulumi.Output[list[str]]
    partitions: pulumi.Output[dict[str, list[str]]]

    def __init__(self, name: str, spec: ClusterSpec, gen: Generated, site: m.K8sSite, *, wait: bool,
                 depends_on: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:WorkerPools", name, spec, wait, opts, depends_on)
        for pool in spec.pools:
            self._add(m.worker_template_config_map(spec, pool, site))
        self._add(m.workers_service(spec))
        self._add(m.workers_pdb(spec))
        parts: dict[str, list[str]] = {}
        for node in gen.inventory.nodes:
            parts.setdefault(node.partition, []).append(node.name)
        self.node_names = pulumi.Output.from_input(gen.inventory.names)
        self.partitions = pulumi.Output.from_input(parts)
        self.register_outputs({"node_names": self.node_names, "partitions": self.partitions})


class NetworkPolicies(_Component):
    """Everything among the cluster's own pods; from outside only SSH to login."""

    names: pulumi.Output[list[str]]

    def __init__(self, name: str, spec: ClusterSpec, site: m.K8sSite, *, wait: bool,
                 depends_on: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:NetworkPolicy", name, spec, wait, opts, depends_on)
        policies = [self._add(obj) for obj in m.network_policies(spec, site)]
        self.names = pulumi.Output.all(*[p.metadata.name for p in policies])
        self.register_outputs({"names": self.names})


class SlurmCluster(pulumi.ComponentResource):
    """A whole Slurm cluster in one Kubernetes namespace: the public component.

    In a Pulumi program of your own, beside the Kubernetes cluster it runs on::

        from provisioner.deploy import SlurmCluster

        cluster = SlurmCluster("research", "cluster.yaml",
                               opts=pulumi.ResourceOptions(provider=k8s_provider))
        pulumi.export("login", cluster.login_address)

    `spec`: the cluster spec as a path to its YAML file, a dict, or a parsed ClusterSpec. The
    Kubernetes objects go through the provider of `opts` (``provider=`` or ``providers=``); without
    one the component makes its own from `kubeconfig` / `context` (or the default kubeconfig).

    `nodes`: the Kubernetes Node objects (`kubectl get nodes -o json` items), if known. They are
    not needed: slurmctld renders slurm.conf from the live nodes at every start and follows them
    (:mod:`provisioner.livenodes`), so the cluster may be declared before its nodes exist. Given,
    they fill the ``node_names`` and ``partitions`` outputs and the preview's slurm-config. Pools
    with ``network.host_network`` need them (their NetworkPolicy admits the nodes' addresses).

    `keys`: the cluster's generated keys. Without them they are made as a resource of the stack
    (:class:`provisioner.deploy.stackkeys.ClusterKeys`, Pulumi secrets, made once and kept).

    Outputs: ``namespace``, ``controller`` (slurmctld's address), ``login_address`` (host:port to
    SSH to; None without a login), ``login_host_public_keys``, ``rest_url`` (None without REST),
    ``node_names``, ``partitions``.
    """

    namespace: pulumi.Output[str]
    controller: pulumi.Output[str]
    login_address: pulumi.Output[str | None]
    login_host_public_keys: pulumi.Output[list[str]]
    rest_url: pulumi.Output[str | None]
    node_names: pulumi.Output[list[str]]
    partitions: pulumi.Output[dict[str, list[str]]]

    def __init__(self, name: str, spec: ClusterSpec | Mapping[str, Any] | str | PathLike[str], *,
                 nodes: Sequence[Mapping[str, Any]] | None = None, keys: m.ClusterSecrets | None = None,
                 cluster_domain: str = "cluster.local", wait: bool = True,
                 kubeconfig: str | None = None, context: str | None = None,
                 owner: Mapping[str, str] | None = None, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("slurmk8s:index:Cluster", name, None, opts)
        spec = as_spec(spec)
        raw = list(nodes or [])
        gen = generate_for_kubernetes(spec, raw, cluster_domain)
        site = m.K8sSite(cluster_domain=cluster_domain, host_network_sources=host_network_sources(spec, gen, raw))
        if nodes is None and any(p.network.host_network for p in spec.pools):
            raise pulumi.RunError(
                f"cluster {spec.name}: pools {', '.join(p.name for p in spec.pools if p.network.host_network)} use "
                "network.host_network, whose NetworkPolicy admits the addresses of the Kubernetes nodes they run on. "
                "Fix: pass nodes= (the Node objects, as `kubectl get nodes -o json` lists them)")
        m.check_names(spec, gen.inventory)
        m.check_home_access(spec, gen.inventory)
        self.spec, self.generated = spec, gen
        if keys is None:
            from .stackkeys import ClusterKeys

            keys = ClusterKeys(f"{name}-keys", opts=pulumi.ResourceOptions(parent=self)).secrets()
        # a Kubernetes provider of the caller's (opts' provider or providers, or its parent's): the
        # children inherit it; Pulumi's merged map of this component's providers says which
        provider = None
        if "kubernetes" not in (getattr(self, "_providers", None) or {}):
            # An explicit provider: ConfigMaps and Secrets are updated in place (server-side apply) when
            # the inventory, users or keys change, instead of the default delete-and-recreate.
            provider = k8s.Provider(
                f"{spec.name}-k8s",
                kubeconfig=pulumi.Output.secret(kubeconfig) if kubeconfig and "\n" in kubeconfig else kubeconfig,
                context=context, enable_config_map_mutable=True, enable_secret_mutable=True,
                opts=pulumi.ResourceOptions(parent=self))
        ns_obj = m.namespace(spec)
        if owner:  # which stack owns the namespace (provisioner/deploy/owner.py); not in the Helm chart
            ns_obj["metadata"]["annotations"] = dict(owner)
        ns = k8s_resource(f"{spec.name}-namespace", ns_obj,
                          pulumi.ResourceOptions(parent=self, provider=provider, retain_on_delete=True),
                          skip_await=not wait)
        child = pulumi.ResourceOptions(parent=self, providers={"kubernetes": provider} if provider else None)
        self.storage = Storage(f"{name}-storage", spec, wait=wait, depends_on=[ns], opts=child)
        self.controller_tier = Controller(f"{name}-controller", spec, gen, keys, site, wait=wait,
                                          depends_on=[ns], opts=child)
        jwt = [self.controller_tier.jwt_secret] if self.controller_tier.jwt_secret is not None else []
        self.accounting = (Accounting(f"{name}-accounting", spec, keys, site, wait=wait, depends_on=[ns, *jwt],
                                      opts=child)
                           if spec.accounting.enabled else None)
        self.workers = WorkerPools(f"{name}-workers", spec, gen, site, wait=wait, depends_on=[ns], opts=child)
        self.login = (Login(f"{name}-login", spec, gen, keys, site, wait=wait,
                            depends_on=[ns, self.storage, self.controller_tier], opts=child)
                      if spec.login.enabled else None)
        # depends on the controller: slurmctld must have the JWT key before requests arrive
        self.rest = (Rest(f"{name}-rest", spec, gen, site, wait=wait, depends_on=[ns, self.controller_tier],
                          opts=child)
                     if spec.rest.enabled else None)
        self.network = NetworkPolicies(f"{name}-network", spec, site, wait=wait, depends_on=[ns], opts=child)
        self.namespace = ns.metadata.name
        self.controller = self.controller_tier.address
        none = pulumi.Output.from_input(None)
        self.login_address = self.login.address if self.login is not None else none
        self.login_host_public_keys = (self.login.host_public_keys if self.login is not None
                                       else pulumi.Output.from_input([]))
        self.rest_url = self.rest.url if self.rest is not None else none
        self.node_names = self.workers.node_names
        self.partitions = self.workers.partitions
        self.register_outputs({"namespace": self.namespace, "controller": self.controller,
                               "login_address": self.login_address, "rest_url": self.rest_url})


def as_spec(spec: ClusterSpec | Mapping[str, Any] | str | PathLike[str]) -> ClusterSpec:
    """A cluster spec from what SlurmCluster accepts: a parsed spec, a dict, or a YAML file's path."""
    from ..config import load_spec, parse_spec

    if isinstance(spec, ClusterSpec):
        return spec
    if isinstance(spec, Mapping):
        return parse_spec(dict(spec))
    return load_spec(spec)


# ---------------------------------------------------------------- reading the live cluster


def load_kubeconfig(value: str | None) -> Any:
    """A kubernetes ApiClient for a kubeconfig given as a path, as YAML content, or (None) the
    default (in-cluster / KUBECONFIG / ~/.kube/config): :func:`provisioner.kubeapi.api_client`."""
    from ..kubeapi import api_client

    return api_client(value)


def read_k8s_nodes(kubeconfig: str | None) -> list[dict[str, Any]]:
    """The cluster's Node objects as the API returns them (`kubectl get nodes -o json` items)."""
    import json

    from kubernetes import client

    api = client.CoreV1Api(load_kubeconfig(kubeconfig))
    resp: Any = api.list_node(_preload_content=False)  # the raw response (JSON in .data), not a V1NodeList
    return json.loads(resp.data)["items"]


def host_network_sources(spec: ClusterSpec, gen: Generated, raw_nodes: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """/32s of the Kubernetes nodes that back, or may back, host-network Slurm nodes (for the
    NetworkPolicy): a pinned pool's own nodes; for a slots pool, every node its pods may be
    scheduled on (its node_selector, and its domains when it has a domain_label)."""
    pools = {p.name for p in spec.pools if p.network.host_network}
    if not pools:
        return ()
    wanted = {n.k8s_node for n in gen.inventory.nodes if n.pool in pools and n.k8s_node}
    slots = [p for p in spec.pools if p.name in pools and p.mode == "slots"]
    cidrs = set()
    for obj in raw_nodes:
        meta = obj.get("metadata") or {}
        if meta.get("name") not in wanted and not any(p.selects(meta.get("labels") or {}) for p in slots):
            continue
        for addr in (obj.get("status") or {}).get("addresses") or []:
            if addr.get("type") == "InternalIP" and addr.get("address"):
                ip = addr["address"]
                cidrs.add(f"{ip}/128" if ":" in ip else f"{ip}/32")
    return tuple(sorted(cidrs))


# ---------------------------------------------------------------- the program


def cluster_program(spec: ClusterSpec, k8s_nodes: Sequence[Mapping[str, Any]] | None = None, *,
                    secrets: m.ClusterSecrets | None = None) -> SlurmCluster:
    """Declare the whole cluster as `slurmk8s up` and stacks/ do: the keys from the stack
    configuration, the nodes read from the cluster in `kubernetes:kubeconfig` (or the default
    kubeconfig) when `k8s_nodes` is None, the component's own provider, and the stack's outputs."""
    cfg = pulumi.Config(CONFIG_NAMESPACE)
    if k8s_nodes is None:
        k8s_nodes = nodes_from_config(cfg)
    wait = cfg.get_bool("wait")
    kcfg = pulumi.Config("kubernetes")
    cluster = SlurmCluster(spec.name, spec, nodes=list(k8s_nodes),
                           keys=secrets if secrets is not None else secrets_from_config(cfg),
                           cluster_domain=cfg.get("clusterDomain") or "cluster.local",
                           wait=True if wait is None else wait,
                           kubeconfig=kcfg.get("kubeconfig"), context=kcfg.get("context"),
                           owner=owner_annotations(cfg.get(OWNER_CONFIG), cfg.get(DESCRIPTION_CONFIG)))
    gen = cluster.generated
    for ex in gen.inventory.excluded:
        pulumi.log.info(f"Kubernetes node {ex.k8s_node} left out of pool {ex.pool}: {ex.reason}")
    for notice in gen.topology.notices:
        pulumi.log.warn(str(notice))
    pulumi.export("namespace", cluster.namespace)
    pulumi.export("controller", cluster.controller)
    pulumi.export("slurm_nodes", cluster.workers.node_names)
    pulumi.export("partitions", cluster.workers.partitions)
    pulumi.export("excluded_k8s_nodes", [f"{e.k8s_node} ({e.pool}): {e.reason}" for e in gen.inventory.excluded])
    if cluster.accounting is not None:
        pulumi.export("slurmdbd", cluster.accounting.host)
        pulumi.export("accounting_database", cluster.accounting.database)
    pulumi.export("kept_volumes", kept_volumes(spec))
    if cluster.login is not None:
        pulumi.export("login_service", cluster.login.service)
        pulumi.export("login_service_type", cluster.login.service_type)
        pulumi.export("login_node_port", cluster.login.node_port)
        pulumi.export("login_external_ips", cluster.login.external_ips)
        pulumi.export("ssh_host_public_keys", cluster.login.host_public_keys)
        pulumi.export("ssh_hint", ssh_hint(spec))
    if cluster.rest is not None:
        pulumi.export("rest_url", cluster.rest.url)
        pulumi.export("rest_service_type", cluster.rest.service_type)
        pulumi.export("rest_node_port", cluster.rest.node_port)
        pulumi.export("rest_external_ips", cluster.rest.external_ips)
        pulumi.export("rest_hint", rest_hint(spec))
    return cluster


def kept_volumes(spec: ClusterSpec) -> list[str]:
    """The PersistentVolumeClaims `slurmk8s down` keeps (and `down --purge` deletes)."""
    return m.kept_claims(spec)


def nodes_from_config(cfg: pulumi.Config) -> list[dict[str, Any]]:
    """`slurmk8s:nodes` (a saved `kubectl get nodes -o json`, for offline previews and tests) when set,
    else the live cluster of `kubernetes:kubeconfig`."""
    import json

    saved = cfg.get("nodes")
    if saved:
        data = json.loads(Path(saved).expanduser().read_text())
        return list(data["items"] if isinstance(data, dict) else data)
    return read_k8s_nodes(pulumi.Config("kubernetes").get("kubeconfig"))


def inline_program(spec: ClusterSpec, k8s_nodes: Sequence[Mapping[str, Any]] | None = None) -> Callable[[], None]:
    """The Automation API's inline program: the same function, spec already loaded."""

    def program() -> None:
        cluster_program(spec, k8s_nodes)

    return program


def stack_program() -> SlurmCluster:
    """For `pulumi up` in stacks/: the spec path comes from config `slurmk8s:spec` (relative to the
    project directory)."""
    from ..config import load_spec

    return cluster_program(load_spec(pulumi.Config(CONFIG_NAMESPACE).require("spec")))


def ssh_hint(spec: ClusterSpec) -> str:
    ns = spec.namespace_name
    user = spec.users[0].name if spec.users else "USER"
    if spec.login.service_type == "ClusterIP":
        return f"kubectl -n {ns} port-forward svc/{m.LOGIN} 2222:22 & ssh -p 2222 {user}@localhost"
    if spec.login.service_type == "NodePort":
        return f"ssh -p <login_node_port> {user}@<any node address>"
    return f"ssh {user}@<login_external_ips[0]>"
