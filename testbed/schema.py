"""The experiment spec's JSON Schema, for editors.

``testbed schema`` prints it (:func:`schema_text`: pydantic's ``model_json_schema()`` of
:class:`testbed.spec.Experiment`, every field's description its docstring), and
:data:`SCHEMA_FILE` holds it committed. Every shipped spec begins with a comment that points
an editor's YAML language server at that file (:data:`MODELINE`, a path relative to the
spec), which then completes and checks the spec's fields as it is typed::

    # yaml-language-server: $schema=../testbed/data/spec.schema.json

The schema knows each section's fields and types, fixed sets of values and bounds; what only
the testbed can check (a scheme's name and its ``options``, a path that must exist, checks
across fields) is left to ``testbed run --dry-run``. :func:`field_paths` lists the dotted
paths of the schema's fields (the shell completion of ``--set``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["SCHEMA_FILE", "MODELINE", "spec_schema", "schema_text", "modeline", "field_paths"]

#: the committed schema (package data), what ``testbed schema`` prints
SCHEMA_FILE = Path(__file__).parent / "data" / "spec.schema.json"

#: the comment a spec's first line holds: ``MODELINE + <path of SCHEMA_FILE from the spec's folder>``
MODELINE = "# yaml-language-server: $schema="


def spec_schema() -> dict:
    """The JSON Schema (draft 2020-12, as pydantic writes it) of an experiment spec."""
    from testbed.spec import Experiment  # lazy: torch (the model registry); completion reads the file

    return Experiment.model_json_schema()


def schema_text() -> str:
    """:func:`spec_schema` as :data:`SCHEMA_FILE` holds it: JSON indented by 2, one newline at the end."""
    return json.dumps(spec_schema(), indent=2) + "\n"


def modeline(spec_file: str | Path) -> str:
    """The first line of the spec ``spec_file``: :data:`MODELINE` and the path of
    :data:`SCHEMA_FILE` relative to the file's folder."""
    rel = os.path.relpath(SCHEMA_FILE.resolve(), Path(spec_file).resolve().parent)
    return MODELINE + Path(rel).as_posix()


def field_paths(schema: dict | None = None) -> list[str]:
    """The dotted paths of every field in ``schema`` (default: :data:`SCHEMA_FILE`'s), each
    section's fields under it (``workload``, ``workload.scheme``, ...), sorted: what ``--set``
    can set. A field whose value may be one of several sections (a union) lists the fields of
    each; a list's items are not listed (``--set`` sets a whole list).

    Raises:
        OSError, ValueError: :data:`SCHEMA_FILE` cannot be read or is not JSON.
    """
    if schema is None:
        schema = json.loads(SCHEMA_FILE.read_text())
    defs = schema.get("$defs", {})
    out: set[str] = set()

    def sections(node: dict) -> list[dict]:
        """The object schemas ``node`` may be ($ref resolved, unions walked; not a list's
        items: ``--set`` sets a whole list)."""
        if "$ref" in node:
            return sections(defs.get(node["$ref"].rsplit("/", 1)[-1], {}))
        found = [node] if "properties" in node else []
        for key in ("anyOf", "oneOf", "allOf"):
            for member in node.get(key, []):
                found += sections(member)
        return found

    def walk(node: dict, prefix: str, depth: int) -> None:
        for section in sections(node):
            for name, sub in section.get("properties", {}).items():
                path = f"{prefix}{name}"
                if path not in out and depth < 8:
                    out.add(path)
                    walk(sub, f"{path}.", depth + 1)

    walk(schema, "", 0)
    return sorted(out)
