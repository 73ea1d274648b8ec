"""charts/slurmk8s/templates/_defaults.tpl: the spec's defaults for the chart's templates, generated.

The chart fills in the spec's defaults itself where its templates read a value (the in-cluster
programs parse the values with :func:`provisioner.config.parse_spec` and need none of this). So
that a default changed in provisioner/config.py cannot leave the chart behind, the templates take
every default from the named template ``slurmk8s.defaults`` instead of restating it: a JSON object
with, for each spec model (the names of values.schema.json's ``$defs``, plus ``ClusterSpec``), the
default of each of its fields that has one, and under ``chart`` the defaults of the chart's own
settings. Use: ``{{- $d := include "slurmk8s.defaults" . | fromJson -}}``, then
``$img.controller | default $d.Images.controller``.

Regenerate: ``python -m provisioner.chartdefaults > charts/slurmk8s/templates/_defaults.tpl``;
tests/test_chart.py fails while the file is out of date.

Likewise ``charts/slurmk8s/templates/_admission.tpl`` (``python -m provisioner.chartdefaults admission``):
the part of the worker pods' admission policy that does not depend on the spec
(:mod:`provisioner.manifests.admission`), which templates/admission.yaml completes with the spec's
values as the Pulumi program does.
"""

from __future__ import annotations

import json
import sys
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from .chart import _CHART_SCHEMA, CHART_KEY
from .config import ClusterSpec
from .manifests import admission

TEMPLATE = "slurmk8s.defaults"
PATH = "charts/slurmk8s/templates/_defaults.tpl"
ADMISSION_TEMPLATE = "slurmk8s.admission"
ADMISSION_PATH = "charts/slurmk8s/templates/_admission.tpl"


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models in a field's type (through Optional, tuple[...], Annotated, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]


def spec_models() -> dict[str, type[BaseModel]]:
    """Every model of the spec by class name, from ClusterSpec down."""
    found: dict[str, type[BaseModel]] = {}
    todo: list[type[BaseModel]] = [ClusterSpec]
    while todo:
        model = todo.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            todo += _nested_models(field.annotation)
    return found


def field_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """The default of each field of ``model`` that has one, as JSON (what model_dump(mode="json") gives)."""
    return {name: to_jsonable_python(field.get_default(call_default_factory=True))
            for name, field in model.model_fields.items() if not field.is_required()}


def chart_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {name: field_defaults(model) for name, model in spec_models().items()}
    out[CHART_KEY] = {k: p["default"] for k, p in _CHART_SCHEMA["properties"].items() if "default" in p}
    return out


def chart_defaults_text() -> str:
    body = json.dumps(chart_defaults(), indent=2, sort_keys=True)
    if "{{" in body or "}}" in body:  # (indented JSON has no "}}" of its own)
        # a Go template action inside a default would be executed, not printed
        raise ValueError("a spec default contains '{{' or '}}'; escape it before generating the chart defaults")
    return (
        "{{/*\n"
        "Generated from the cluster spec (provisioner/config.py) by\n"
        f"`python -m provisioner.chartdefaults > {PATH}`: do not edit.\n"
        "The default of every spec field that has one, by model (values.schema.json's $defs), and of the\n"
        f"chart's own settings (`{CHART_KEY}`). Use: {{{{- $d := include \"{TEMPLATE}\" . | fromJson -}}}}\n"
        "(numbers come back as floats: wrap integers in int64).\n"
        "*/}}\n"
        f"{{{{- define \"{TEMPLATE}\" -}}}}\n"
        f"{body}\n"
        "{{- end -}}\n"
    )


def admission_text() -> str:
    """_admission.tpl: the spec-independent part of the admission policy, as JSON."""
    body = json.dumps({"matchConstraints": admission.MATCH_CONSTRAINTS, "variables": admission.STATIC_VARIABLES,
                       "validations": admission.VALIDATIONS}, indent=2, sort_keys=True)
    if "{{" in body or "}}" in body:
        raise ValueError("the admission policy contains '{{' or '}}'; escape it before generating the chart's copy")
    return (
        "{{/*\n"
        "Generated from provisioner/manifests/admission.py by\n"
        f"`python -m provisioner.chartdefaults admission > {ADMISSION_PATH}`: do not edit.\n"
        "The worker pods' admission policy without the spec's values (templates/admission.yaml adds them).\n"
        "*/}}\n"
        f"{{{{- define \"{ADMISSION_TEMPLATE}\" -}}}}\n"
        f"{body}\n"
        "{{- end -}}\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.write(admission_text() if args == ["admission"] else chart_defaults_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
