"""The one schema of verify's JSON report (``verify_report.schema.json``) and the small validator for it: the
subset of JSON Schema the file uses (type, properties, required, additionalProperties, items). Verify's
runs are held to it: the recorded cases judged by the command's judge (``test_report_json.py``), and every report
of a real ``verify -- COMMAND`` run in ``user/test_command.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA = json.loads((HERE / "verify_report.schema.json").read_text(encoding="utf-8"))
KINDS = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def violations(doc: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Where ``doc`` breaks ``schema``: one line per problem (empty: it conforms)."""
    kinds = schema.get("type")
    if kinds is not None:
        wanted = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(doc, k) for k in wanted):
            return [f"{path}: {type(doc).__name__} where {'/'.join(wanted)} is expected"]
    out: list[str] = []
    if isinstance(doc, dict):
        props = schema.get("properties", {})
        out += [f"{path}: missing key {k!r}" for k in schema.get("required", []) if k not in doc]
        extra = schema.get("additionalProperties", True)
        for k, v in doc.items():
            if k in props:
                out += violations(v, props[k], f"{path}.{k}")
            elif extra is False:
                out.append(f"{path}: unknown key {k!r}")
            elif isinstance(extra, dict):
                out += violations(v, extra, f"{path}.{k}")
    if isinstance(doc, list) and "items" in schema:
        for i, item in enumerate(doc):
            out += violations(item, schema["items"], f"{path}[{i}]")
    return out


def _is(value: Any, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, KINDS[kind])
