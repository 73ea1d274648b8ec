"""The cluster's keys as a resource of the stack, for :class:`provisioner.deploy.program.SlurmCluster`
embedded in a Pulumi program of your own.

`slurmk8s up` and stacks/ keep the keys in the stack's configuration (:mod:`provisioner.deploy.keys`),
made before the program runs. An embedding program has no such step, so the component declares
:class:`ClusterKeys`: a Pulumi dynamic resource whose create makes every key once (the same
:func:`provisioner.deploy.keys.generate`) and keeps them in the stack's state as secrets. Later
updates change nothing, so the host key fingerprints and the auth key stay stable; a key missing from
the state (one added in a later release) is made on the next update, the others are kept.

The engine runs the create in Pulumi's Python dynamic provider (`pulumi-resource-pulumi-python`,
which Pulumi's release ships beside its CLI and which runs ``python -m pulumi.dynamic``); that
process imports this module, so it needs slurmk8s installed in the Python it runs.
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping

import pulumi
import pulumi.dynamic as dyn

from ..manifests import ClusterSecrets
from .keys import DB_PASSWORD, HOST_KEYS, JWT_KEY, MUNGE_KEY, SECRET_KEYS, generate, pem_text


def _kept(olds: Mapping[str, Any]) -> dict[str, str]:
    return {k: olds[k] for k in SECRET_KEYS if isinstance(olds.get(k), str) and olds[k]}


class KeysProvider(dyn.ResourceProvider):
    """Makes the keys at create; keeps them ever after (no diff unless one is missing)."""

    serialize_as_secret_always = False  # it captures nothing secret: the keys are outputs, not code

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        return dyn.CreateResult(id_=uuid.uuid4().hex, outs=generate())

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        return dyn.DiffResult(changes=len(_kept(olds)) < len(SECRET_KEYS), replaces=[],
                              delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        kept = _kept(olds)
        return dyn.UpdateResult(outs={**kept, **generate(missing_only=kept)})


class ClusterKeys(dyn.Resource, module="slurmk8s", name="ClusterKeys"):
    """The munge key, the login pod's SSH host keys, the accounting database password and the JWT
    key, made once per stack (outputs named as the stack config keys, all Pulumi secrets)."""

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        secret = pulumi.ResourceOptions(additional_secret_outputs=list(SECRET_KEYS))
        super().__init__(KeysProvider(), name, {k: None for k in SECRET_KEYS},
                         pulumi.ResourceOptions.merge(opts, secret))

    def output(self, key: str) -> pulumi.Output[str]:
        return getattr(self, key)

    def secrets(self) -> ClusterSecrets:
        """The keys as the component's children take them (text as `slurmk8s up` gives it)."""
        strip = lambda v: v.strip()  # noqa: E731
        return ClusterSecrets(
            munge_key_b64=self.output(MUNGE_KEY).apply(strip),
            ssh_host_keys={kind: self.output(key).apply(pem_text) for kind, key in HOST_KEYS.items()},
            db_password=self.output(DB_PASSWORD).apply(strip),
            jwt_key_b64=self.output(JWT_KEY).apply(strip))
