"""Markdown reference of the cluster spec, generated from its JSON schema (docs/spec.md)."""

from __future__ import annotations

from typing import Any

from .config import json_schema


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return f"[{prop['$ref'].rsplit('/', 1)[-1]}](#{prop['$ref'].rsplit('/', 1)[-1].lower()})"
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in prop and isinstance(prop["additionalProperties"], dict):
        return f"map of {_type(prop['additionalProperties'], defs)}"
    return str(kind)


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return "required" if prop.get("_required") else ""
    value = prop["default"]
    return f"`{value}`" if value not in (None, [], {}) else ("`null`" if value is None else "empty")


def _table(title: str, model: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    lines = [f"### {title}", ""]
    if model.get("description"):
        lines += [model["description"].strip(), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    required = set(model.get("required", ()))
    for name, prop in model.get("properties", {}).items():
        prop = dict(prop, _required=name in required)
        desc = (prop.get("description") or "").replace("\n", " ").replace("|", "\\|")
        lines.append(f"| `{name}` | {_type(prop, defs)} | {_default(prop)} | {desc} |")
    return lines + [""]


def spec_markdown() -> str:
    schema = json_schema()
    defs = schema.get("$defs", {})
    out = ["# Cluster spec reference", "",
           "Generated from the spec's JSON schema by `slurmk8s spec docs`; do not edit by hand.",
           "Durations take seconds or `90s`, `30m`, `2h`, `1d`; sizes take Kubernetes quantities (`16Gi`).", ""]
    out += _table("ClusterSpec", schema, defs)
    for name in sorted(defs):
        out += _table(name, defs[name], defs)
    return "\n".join(out)
