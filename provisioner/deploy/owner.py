"""One cluster, one owner: the namespace records which `slurmk8s up` stack owns it.

Each `--state` directory is its own Pulumi state. Two stacks deploying the same spec (two engineers,
a CI job and an engineer, a benchmark run beside a running cluster) used to both apply into the
same namespace: the second one co-owned the first one's objects (server-side-apply conflicts,
half applied), and its `down` deleted the first cluster's Services, RBAC and worker pods.

So every stack gets a random owner id, generated once and kept (plain) in its stack config
(``slurmk8s:owner``), and a description computed each run (``<user>@<host>:<state dir> (stack
<name>)``, ``slurmk8s:ownerDescription``). The program puts both on the Namespace as annotations
(:data:`OWNER_ANNOTATION`, :data:`DESCRIPTION_ANNOTATION`). Before `up`, `preview` and `down`
apply or delete anything, :func:`check` reads the namespace and :func:`decide` (pure, over plain
dicts) says whether this stack may go on:

- no namespace, or an empty one without an owner record: go on (`up` records this stack);
- recorded owner = this stack: go on;
- another owner: refused, naming it and the fix (run it where that state lives, or ``--take-over``
  when that state directory is lost for good);
- no owner record but this stack's state holds the namespace (a cluster made before owners were
  recorded): go on, and `up` records this stack, saying so;
- no owner record and slurmk8s workloads present: refused (a Helm release: use helm; else a
  cluster made without an owner record: ``--take-over``).

``--take-over`` (`up`, `down`) makes this stack the owner; `up` first copies the cluster's running
keys (munge key, SSH host keys, database password) into this stack's config, so taking over
changes no key.

`up` claims the namespace before it applies anything, atomically (:func:`claim_for`,
:func:`claim`): the decision was made on a read, and two first `up`s of one namespace both read
"no namespace" and both went on. The claim is a write the API server refuses to the second of two:
the Namespace created with this stack's record when there was none (409 AlreadyExists), else the
record written under the resourceVersion read as precondition (409 Conflict). The loser reads
again and decides again: refused, naming the winner. A `--take-over` takes the namespace from the
owner it saw first only, never from a stack that claimed it meanwhile. The program then applies the
same Namespace (server-side apply of an existing object, as after a `down` that kept it).
"""

from __future__ import annotations

import base64
import getpass
import os
import re
import secrets as pysecrets
import socket
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..errors import SlurmK8sError

OWNER_ANNOTATION = "slurmk8s.io/owner"
DESCRIPTION_ANNOTATION = "slurmk8s.io/owner-description"
OWNER_CONFIG = "owner"  # slurmk8s:owner in the stack config (plain): the random owner id
DESCRIPTION_CONFIG = "ownerDescription"  # slurmk8s:ownerDescription: who and where, rewritten each run
HELM_RELEASE_ANNOTATION = "meta.helm.sh/release-name"
READ_TIMEOUT = (5.0, 30.0)
FIELD_MANAGER = "slurmk8s-owner"  # the claim's writes
CLAIM_TRIES = 3  # reads and claims before giving up on a namespace that keeps changing
SHOWN = 4  # workloads named in a message

Printer = Callable[[str], Any]


class NotOwner(SlurmK8sError):
    """This stack does not own the namespace: nothing was applied or deleted."""

    reason = "NotOwner"


@dataclass(frozen=True)
class Decision:
    proceed: bool
    message: str = ""  # what to tell the user ("" = nothing to say)
    took_over: bool = False  # --take-over was needed (and given): the namespace changes owner


@dataclass(frozen=True)
class Found:
    """What the namespace holds, as far as ownership goes."""

    namespace: Mapping[str, Any] | None  # the Namespace object (API JSON), None when there is none
    workloads: tuple[str, ...] = ()  # slurmk8s workloads in it: 'StatefulSet/slurmctld', 'Pod/cpu-0', ...
    helm_release: str | None = None  # the Helm release that made them, if one did


def owner_annotations(owner: str | None, description: str | None) -> dict[str, str]:
    """The Namespace annotations for a stack's owner id and description (none without an id: a plain
    `pulumi up` in stacks/ records no owner)."""
    if not owner:
        return {}
    out = {OWNER_ANNOTATION: owner}
    if description:
        out[DESCRIPTION_ANNOTATION] = description
    return out


def recorded_owner(namespace: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """(owner id, description) recorded on a Namespace object; (None, '') when it has none."""
    ann = ((namespace or {}).get("metadata") or {}).get("annotations") or {}
    owner = ann.get(OWNER_ANNOTATION) or None
    return owner, ann.get(DESCRIPTION_ANNOTATION) or (f"owner id {owner}" if owner else "")


def _where(description: str) -> str:
    """'--state DIR --stack NAME' from '<user>@<host>:<state dir> (stack <name>)', where it parses."""
    m = re.fullmatch(r"(?P<who>[^:\s]+):(?P<state>.+) \(stack (?P<stack>[^)]+)\)", description)
    if not m:
        return "its --state directory"
    return f"`--state {m['state']} --stack {m['stack']}` on {m['who'].split('@', 1)[-1]}"


def _listed(workloads: Sequence[str]) -> str:
    more = len(workloads) - SHOWN
    return ", ".join(workloads[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def decide(op: str, name: str, found: Found, *, mine: str | None, me: str, stack_holds_it: bool,
           take_over: bool = False) -> Decision:
    """May stack `mine` (described as `me`) run `op` ('up', 'preview' or 'down') on namespace `name`?

    `stack_holds_it`: this stack's state already has resources in that namespace (asked only when the
    namespace has no owner record). Pure: no cluster, no state is read here."""
    cmd = f"slurmk8s {op}"
    if found.namespace is None:
        return Decision(True)
    owner, described = recorded_owner(found.namespace)
    if owner is not None and owner == mine:
        return Decision(True)
    if owner is not None:
        if take_over:
            return Decision(True, f"--take-over: namespace {name} was owned by {described}; "
                                  + (f"this stack ({me}) owns it from now on, and `up` / `down` from that other "
                                     "state directory are refused" if op != "down"
                                     else f"`down` from this stack ({me}) deletes in it as asked"), took_over=True)
        harm = ("would delete that cluster's worker pods (and with --purge its volumes and the namespace)"
                if op == "down" else "would take over and change that cluster's objects")
        fix = (f"Fix: run `{cmd}` where that state lives ({_where(described)}); if that state directory is lost "
               f"for good, rerun with --take-over"
               + (" (this stack becomes the owner; the lost one's objects are adopted as they are)" if op == "up"
                  else " (add --purge to delete the cluster with its volumes)" if op == "down"
                  else " on `slurmk8s up`"))
        return Decision(False, f"namespace {name} belongs to another slurmk8s stack: {described}. `{cmd}` from this "
                               f"stack ({me}) {harm}; nothing was changed. {fix}")
    # no owner record
    if stack_holds_it:
        if op == "down":
            return Decision(True)
        will = "records" if op == "up" else "will record"
        return Decision(True, f"namespace {name} has no owner record (made before slurmk8s recorded owners); this "
                              f"stack's state holds it, so `slurmk8s up` {will} this stack ({me}) as its owner")
    if not found.workloads:
        return Decision(True)
    what = _listed(found.workloads)
    if found.helm_release:
        rel = found.helm_release
        return Decision(False, f"namespace {name} holds the Helm release {rel!r} of slurmk8s ({what}), not a "
                               f"`slurmk8s up` stack; `{cmd}` would fight Helm over its objects; nothing was changed "
                               "(--take-over does not apply to a Helm release). Fix: manage it with helm "
                               f"(`helm upgrade {rel} charts/slurmk8s -n {name} -f SPEC`, `helm uninstall {rel} -n "
                               f"{name}`), or `helm uninstall` it first (the volumes are kept) and then `slurmk8s up`")
    if take_over:
        return Decision(True, f"--take-over: namespace {name} holds a slurmk8s cluster made without an owner record "
                              f"({what}); " + (f"this stack ({me}) owns it from now on" if op != "down"
                                               else "`down` deletes in it as asked"), took_over=True)
    return Decision(False, f"namespace {name} already holds a slurmk8s cluster ({what}) made without an owner "
                           f"record, and this stack's state ({me}) does not hold it; `{cmd}` would "
                           + ("delete its worker pods" if op == "down" else "take over and change its objects")
                           + f"; nothing was changed. Fix: run `{cmd}` with the state directory that made it "
                           "(--state DIR --stack NAME); if that state is lost for good, rerun with --take-over"
                           + ("" if op != "preview" else " on `slurmk8s up`"))


# ---------------------------------------------------------------- reading the cluster and the stack


def describe(state: Any, stack_name: str) -> str:
    """'<user>@<host>:<state dir> (stack <name>)': who deploys from where, for the messages."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container)
        user = os.environ.get("USER") or str(os.getuid())
    return f"{user}@{socket.gethostname()}:{state} (stack {stack_name})"


def read(kubeconfig: str | None, name: str) -> Found:
    """The namespace and the slurmk8s workloads in it (StatefulSets, Deployments, pods)."""
    from kubernetes import client

    from ..kubeapi import ApiError, api_client, raw_call
    from ..names import L_PART_OF

    api = api_client(kubeconfig)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    try:
        ns = raw_call(core.read_namespace, READ_TIMEOUT, name)
    except ApiError as err:
        if err.status == 404:
            return Found(None)
        raise NotOwner(f"cannot read namespace {name} to check which stack owns it: {err}; nothing was changed. "
                       "Fix: check the kubeconfig and that it may read namespaces") from None
    selector = f"{L_PART_OF}=slurmk8s"
    objs: list[tuple[str, Mapping[str, Any]]] = []
    try:
        for kind, fn, limit in (("StatefulSet", apps.list_namespaced_stateful_set, None),
                                ("Deployment", apps.list_namespaced_deployment, None),
                                ("Pod", core.list_namespaced_pod, 50)):
            extra = {"limit": limit} if limit else {}
            objs += [(kind, o) for o in raw_call(fn, READ_TIMEOUT, name, label_selector=selector, **extra)["items"]]
    except ApiError as err:
        raise NotOwner(f"cannot list the workloads of namespace {name} to check which stack owns it: {err}; "
                       "nothing was changed") from None
    return found_from(ns, objs)


def found_from(namespace: Mapping[str, Any], objs: Sequence[tuple[str, Mapping[str, Any]]]) -> Found:
    """Found from the namespace and (kind, object) pairs of its slurmk8s workloads (pure)."""
    from ..names import L_COMPONENT

    workloads, release = [], None
    for kind, obj in objs:
        meta = obj.get("metadata") or {}
        worker = (meta.get("labels") or {}).get(L_COMPONENT) == "worker"
        if kind == "Pod" and ((meta.get("ownerReferences") and not worker) or meta.get("deletionTimestamp")):
            # the StatefulSet's / Deployment's own pods say nothing more; a terminating one is going.
            # Worker pods count though they name the slurmctld StatefulSet as their owner (for the
            # garbage collector): they are not its replicas, and may outlive it for a moment
            continue
        workloads.append(f"{kind}/{meta.get('name')}")
        release = release or (meta.get("annotations") or {}).get(HELM_RELEASE_ANNOTATION)
    return Found(namespace, tuple(workloads), release)


def stack_holds(stack: Any, name: str) -> bool:
    """Whether the stack's state has the Namespace `name` (it deployed there before)."""
    deployment = stack.export_stack().deployment or {}
    for res in deployment.get("resources") or []:
        if res.get("type") == "kubernetes:core/v1:Namespace":
            outputs = res.get("outputs") or {}
            if res.get("id") == name or (outputs.get("metadata") or {}).get("name") == name:
                return True
    return False


def ensure_owner(session: Any, *, write: bool = True) -> tuple[str | None, str]:
    """(this stack's owner id, its description). With `write`, an id is generated once into the stack
    config and the description rewritten (the program puts both on the Namespace)."""
    from pulumi import automation as auto

    from .keys import CONFIG_NAMESPACE

    stack = session.stack
    me = describe(session.state, stack.name)
    have = stack.get_all_config().get(f"{CONFIG_NAMESPACE}:{OWNER_CONFIG}")
    mine = getattr(have, "value", None) or None
    if not write:
        return mine, me
    mine = mine or pysecrets.token_hex(8)
    stack.set_all_config({f"{CONFIG_NAMESPACE}:{OWNER_CONFIG}": auto.ConfigValue(mine),
                          f"{CONFIG_NAMESPACE}:{DESCRIPTION_CONFIG}": auto.ConfigValue(me)})
    return mine, me


@dataclass(frozen=True)
class Claim:
    """This stack's owner record as one write the API server refuses to the second of two writers:
    the Namespace created with it (`namespace`), or its annotations written under `resource_version`."""

    name: str
    annotations: Mapping[str, str]
    namespace: Mapping[str, Any] | None = None  # the Namespace to create; None: it exists
    resource_version: str = ""  # the version read: the precondition of the write to an existing one


def claim_for(found: Found, namespace: Mapping[str, Any], mine: str | None, me: str) -> Claim | None:
    """The claim `up` makes before applying (pure): None when the namespace's record already names
    this stack (or the stack has no id); `namespace`: the Namespace the program applies, created with
    the record when there is none yet."""
    if not mine or recorded_owner(found.namespace)[0] == mine:
        return None
    record = owner_annotations(mine, me)
    name = str(namespace["metadata"]["name"])
    if found.namespace is None:
        meta = {**namespace["metadata"], "annotations": {**(namespace["metadata"].get("annotations") or {}), **record}}
        return Claim(name, record, {**namespace, "metadata": meta})
    return Claim(name, record, None, str((found.namespace.get("metadata") or {}).get("resourceVersion") or ""))


def claim(kubeconfig: str | None, wanted: Claim) -> None:
    """Write the claim (a create, or a merge patch with the resourceVersion as precondition); the
    API server's refusal is an ApiError (409: another writer was first)."""
    from urllib.parse import quote

    from ..kubeapi import MERGE_PATCH, RawClient, api_client

    raw = RawClient(api_client(kubeconfig), timeout=READ_TIMEOUT)
    query = {"fieldManager": FIELD_MANAGER}
    if wanted.namespace is not None:
        raw.request("POST", "/api/v1/namespaces", query, dict(wanted.namespace))
    else:
        # a resourceVersion in the patch is a precondition: 409 Conflict when the object changed since
        patch = {"metadata": {"resourceVersion": wanted.resource_version, "annotations": dict(wanted.annotations)}}
        raw.request("PATCH", f"/api/v1/namespaces/{quote(wanted.name, safe='')}", query, patch, MERGE_PATCH)


def _claimed(session: Any, found: Found, mine: str | None, me: str) -> bool:
    """`up`'s claim written (or none needed): True; False when another writer was first (read again)."""
    from .. import manifests as m
    from ..kubeapi import ApiError

    name = session.spec.namespace_name
    wanted = claim_for(found, m.namespace(session.spec), mine, me)
    if wanted is None:
        return True
    try:
        claim(session.kubeconfig, wanted)
    except ApiError as err:
        if err.status == 409 or (err.status == 404 and wanted.namespace is None):  # first, or deleted meanwhile
            return False
        raise NotOwner(f"cannot record this stack as the owner of namespace {name}: {err}; nothing was applied. "
                       "Fix: check that the kubeconfig may create and patch namespaces") from None
    return True


def check(session: Any, op: str, echo: Printer, *, take_over: bool = False,
          reader: Callable[[str | None, str], Found] | None = None) -> Decision:
    """Before `op` applies or deletes anything: refuse (NotOwner, nothing changed) unless this stack
    owns the namespace, or may take it (see :func:`decide`). `up` and `preview` record this stack's
    owner id in its config (down only reads it); `up` then claims the namespace atomically (see the
    module's docstring), and a claim lost to another writer reads and decides again."""
    name = session.spec.namespace_name
    mine, me = ensure_owner(session, write=op != "down")
    seen_first: list[str | None] = []
    for _ in range(CLAIM_TRIES):
        found = (reader or read)(session.kubeconfig, name)
        owner_now = recorded_owner(found.namespace)[0]
        seen_first = seen_first or [owner_now]
        holds = False
        if found.namespace is not None and owner_now is None:
            holds = stack_holds(session.stack, name)
        # a take-over is of the owner this run saw, never of a stack that claimed the namespace meanwhile
        decision = decide(op, name, found, mine=mine, me=me, stack_holds_it=holds,
                          take_over=take_over and owner_now == seen_first[0])
        if not decision.proceed:
            raise NotOwner(decision.message)
        if op != "up" or _claimed(session, found, mine, me):
            break
    else:
        raise NotOwner(f"namespace {name} changed under each of this stack's {CLAIM_TRIES} claims of it (another "
                       "writer each time); nothing was applied. Fix: see who writes it "
                       f"(`kubectl get namespace {name} -o yaml`), then rerun")
    if decision.message:
        echo(decision.message)
    return decision


def adopt_keys(session: Any, echo: Printer, store: Callable[[str, str], None]) -> list[str]:
    """--take-over: copy the running cluster's keys (munge key, SSH host keys, internal database
    password, JWT key) into this stack's config, so the stack that takes over applies the same keys (no pod
    restarts with a new munge key, no new host key for users, no database password change).
    `store(key, value)` writes one secret config value (`pulumi config set --secret`, the
    automation's). Returns the config keys copied; a key whose Secret is missing is generated later as usual."""
    from kubernetes import client

    from ..kubeapi import ApiError, api_client, raw_call
    from ..names import AUTH_SECRET, DB_SECRET, DB_SECRET_KEY, JWT_KEY_FILE, JWT_SECRET, SSH_HOST_KEYS_SECRET
    from . import keys

    ns = session.spec.namespace_name
    core = client.CoreV1Api(api_client(session.kubeconfig))
    wanted: list[tuple[str, str, str, bool]] = [(keys.MUNGE_KEY, AUTH_SECRET, "munge.key", False)]
    wanted += [(cfg, SSH_HOST_KEYS_SECRET, f"ssh_host_{kind}_key", True) for kind, cfg in keys.HOST_KEYS.items()]
    if session.spec.accounting.enabled and session.spec.accounting.external_database is None:
        wanted.append((keys.DB_PASSWORD, DB_SECRET, DB_SECRET_KEY, True))
    if session.spec.rest.enabled:  # base64 of the raw key, as the config value
        wanted.append((keys.JWT_KEY, JWT_SECRET, JWT_KEY_FILE, False))
    cache: dict[str, Mapping[str, str]] = {}
    copied = []
    for cfg_key, secret, field, decode in wanted:
        if secret not in cache:
            try:
                cache[secret] = raw_call(core.read_namespaced_secret, READ_TIMEOUT, secret, ns).get("data") or {}
            except ApiError as err:
                if err.status != 404:
                    raise NotOwner(f"--take-over: cannot read Secret {ns}/{secret}: {err}; "
                                   "nothing was applied") from None
                cache[secret] = {}
        raw = cache[secret].get(field)
        if not raw:
            continue
        # slurm-auth and slurm-jwt carry the key's base64 as is (the config value); the others are text
        value = base64.b64decode(raw).decode() if decode else raw
        store(f"{keys.CONFIG_NAMESPACE}:{cfg_key}", value)
        copied.append(cfg_key)
    if copied:
        echo(f"--take-over: kept the cluster's running keys in this stack's config: {', '.join(copied)}")
    return copied


__all__: Sequence[str] = (
    "OWNER_ANNOTATION", "DESCRIPTION_ANNOTATION", "NotOwner", "Decision", "Found", "annotations", "recorded_owner",
    "decide", "describe", "read", "found_from", "stack_holds", "ensure_owner", "Claim", "claim_for", "claim", "check",
    "adopt_keys",
)
