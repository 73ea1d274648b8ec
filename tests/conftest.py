"""Fixtures shared by the unit tests (the test tiers are selected in the root conftest.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest


SECRET_SIG = "4dabf18193072939515e22adb298388d"


def unwrap(value: Any) -> Any:
    """Inputs as the provider would see them once decrypted: Pulumi's secret wrappers removed."""
    if isinstance(value, dict):
        if SECRET_SIG in value:
            return unwrap(value.get("value"))
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


def dynamic_create(inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A dynamic resource's create as Pulumi's Python dynamic provider runs it: the provider object
    serialized into the inputs (`__provider`, base64 of its dill pickle), loaded and called."""
    import base64

    import dill

    made = dill.loads(base64.b64decode(inputs["__provider"])).create(inputs)
    return made.id, {**outputs, **(made.outs or {})}


@dataclass
class Registration:
    """One resource as the Pulumi engine would have received it."""

    type: str
    name: str
    parent: str
    custom: bool
    retain_on_delete: bool
    delete_before_replace: bool
    dependencies: tuple[str, ...]
    inputs: dict[str, Any]
    secret_paths: tuple[str, ...]  # top-level input keys sent as Pulumi secrets
    provider: str = ""  # provider reference ('urn::id') of a custom resource


@dataclass
class PulumiRun:
    """Runs a program under Pulumi's mocks and records what it registered."""

    resources: list[Registration] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def run(self, program: Callable[[], Any], config: dict[str, str] | None = None,
            secret_keys: list[str] | None = None, *, project: str = "slurmk8s", stack: str = "test",
            preview: bool = False) -> "PulumiRun":
        import pulumi
        from pulumi.runtime import config as pconfig
        from pulumi.runtime import mocks as pm

        run = self
        run.resources.clear()
        run.outputs.clear()

        class Monitor(pm.MockMonitor):
            def RegisterResource(self, request):  # noqa: N802 - gRPC method name
                from google.protobuf import json_format

                raw = json_format.MessageToDict(request.object)
                secret = tuple(k for k, v in raw.items() if isinstance(v, dict) and
                               v.get(SECRET_SIG) == "1b47061264138c4ac30d75fd1eb44270")
                resp = super().RegisterResource(request)
                if request.type != "pulumi:pulumi:Stack":
                    run.resources.append(Registration(
                        type=request.type, name=request.name, parent=request.parent, custom=request.custom,
                        retain_on_delete=request.retainOnDelete, delete_before_replace=request.deleteBeforeReplace,
                        dependencies=tuple(request.dependencies), inputs=mocks.inputs.get(request.name + request.type, {}),
                        secret_paths=secret, provider=request.provider))
                return resp

        class Mocks(pm.Mocks):
            def __init__(self) -> None:
                self.inputs: dict[str, dict[str, Any]] = {}

            def new_resource(self, args):
                self.inputs[args.name + args.typ] = unwrap(args.inputs)
                if args.typ.startswith("pulumi-python:dynamic"):  # what the engine's dynamic provider does
                    return dynamic_create(unwrap(args.inputs), dict(args.inputs))
                return f"{args.name}-id", dict(args.inputs)

            def call(self, args):
                return {}

        mocks = Mocks()
        # Pulumi's mocks run on the thread's current event loop; a test that used asyncio.run()
        # before (asyncssh in the integration tier) leaves none set.
        asyncio.set_event_loop(asyncio.new_event_loop())
        pm.set_mocks(mocks, project=project, stack=stack, preview=preview, monitor=Monitor(mocks))
        pconfig.set_all_config(dict(config or {}), secret_keys or [])

        @pulumi.runtime.test
        def body():
            program()
            root = pulumi.runtime.settings.get_root_resource()
            names = sorted(root.outputs) if root is not None else []
            values = [root.outputs[n] for n in names]

            def keep(resolved: list[Any]) -> None:
                run.outputs.update(dict(zip(names, resolved)))

            return pulumi.Output.all(*values).apply(keep)

        body()
        return run

    def of_type(self, suffix: str) -> list[Registration]:
        return [r for r in self.resources if r.type.endswith(suffix)]

    def kubernetes(self) -> list[Registration]:
        """The Kubernetes objects (custom resources other than providers)."""
        return [r for r in self.resources if r.custom and not r.type.startswith("pulumi:providers:")]

    def graph(self) -> list[tuple[str, str, str]]:
        return sorted((r.type, r.name, r.parent.rsplit("::", 1)[-1]) for r in self.resources)


@pytest.fixture
def pulumi_run() -> PulumiRun:
    """`pulumi_run.run(program, config)`: the program under Pulumi mocks (pulumi.runtime.set_mocks);
    resources are created inside the test, never at import time."""
    return PulumiRun()
