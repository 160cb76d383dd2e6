"""``python -m devtools.docs``: write the generated parts of ``docs/``;
``--check`` only says which differ (exit status 1), as the tests do.

Each generated part sits between two markers in its file, so the prose
around it is written by hand and the part that would drift is not:

- docs/configuration.md: every setting, from :class:`paycron.config.Config`
  (the ``#:`` comment above each field, its default, whether it is secret);
- docs/api.md: every operation and schema, from the OpenAPI document the
  web process serves at ``/openapi.json``;
- docs/design.md: the payment state machine, from the ``-- transition:``
  line of each block in ``paycron/store/sql/transitions.sql`` (a test holds
  each line to its block's ``SET status`` and ``WHERE status`` guard).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs"
CONFIG_SOURCE = REPO_ROOT / "paycron" / "config.py"
TRANSITIONS_SQL = REPO_ROOT / "paycron" / "store" / "sql" / "transitions.sql"


def begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED {name}: python -m devtools.docs writes this part -->"


def end(name: str) -> str:
    return f"<!-- END GENERATED {name} -->"


# -- configuration -------------------------------------------------------------


def setting_comments(source: str) -> dict[str, str]:
    """``{field: its description}`` from the ``#:`` lines above each field of
    ``class Config``. A run of fields with no blank or other line between
    them shares the comment above its first field."""
    comments: dict[str, str] = {}
    body = source.split("class Config:", 1)[1]
    pending: list[str] = []
    current = ""
    first = ""
    in_run = False
    for line in body.splitlines():
        stripped = line.strip()
        if stripped.startswith("def "):
            break
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            in_run = False
            continue
        field = re.match(r"^    (\w+): [^=]+= ", line)
        if field:
            name = field.group(1)
            if pending:
                current, pending, first = " ".join(pending), [], name
            elif not in_run:
                current, first = "", name
            # The run's later fields point at its first, where the comment is.
            comments[name] = current if first == name else f"See `{first.upper()}`."
            in_run = "setting(" in line
            continue
        if not (in_run and line.startswith("        ") or stripped == ")"):
            in_run = False
            current = ""
    return comments


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _default(value, parse) -> str:
    from paycron.config import parse_duration, parse_durations

    if value is None or value == ():
        return "unset"
    if parse is parse_duration:
        return _duration(value)
    if parse is parse_durations:
        return ",".join(_duration(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= 10_000:
        return f"{value:_}".replace("_", ",")
    return str(value)


def configuration_table() -> str:
    from paycron.config import Config

    comments = setting_comments(CONFIG_SOURCE.read_text())
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for f in fields(Config):
        parse = f.metadata.get("parse")
        if parse is None:
            continue
        default = f.default if f.default is not MISSING else None
        what = comments.get(f.name, "")
        if not f.repr:
            what += " A secret: never logged, never in a repr."
        what = re.sub(r":\w+:`([^`]+)`", r"`\1`", what)
        what = re.sub(r"``([^`]+)``", r"`\1`", what).replace("|", "\\|")
        rows.append(f"| `{f.name.upper()}` | `{_default(default, parse)}` | {what.strip()} |")
    return "\n".join(rows)


# -- the API ---------------------------------------------------------------------


def openapi_document() -> dict:
    """The document ``GET /openapi.json`` serves, built without a database."""
    from flask import Flask

    from paycron.config import Config
    from web import API_BLUEPRINTS
    from web.api import Api
    from web.schemas import now_utc

    app = Flask("web")
    app.extensions["paycron.config"] = Config()
    app.extensions["paycron.clock"] = now_utc
    api = Api(app)
    for blueprint in API_BLUEPRINTS:
        api.register_blueprint(blueprint)
    return api.spec.to_dict()


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _type(prop: dict) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[1]
    if "allOf" in prop:
        return " & ".join(_type(p) for p in prop["allOf"])
    kind = prop.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        return f"array of {_type(prop.get('items', {}))}"
    if "format" in prop:
        kind = f"{kind} ({prop['format']})"
    if "enum" in prop and len(prop["enum"]) <= 8:
        kind += ": " + ", ".join(f"`{v}`" for v in prop["enum"] if v is not None)
    return kind


def _schema_table(schema: dict) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        rows.append(
            f"| `{name}` | {_type(prop)} | {'yes' if name in required else 'no'} "
            f"| {_one_line(prop.get('description'))} |"
        )
    return rows


def api_reference() -> str:
    document = openapi_document()
    out = [f"_{_one_line(document['info'].get('description'))}_", ""]
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            out.append(f"### `{method.upper()} {path}`")
            out.append("")
            out.append(_one_line(op.get("summary")))
            if op.get("description"):
                out += ["", _one_line(op["description"])]
            out.append("")
            secured = op.get("security", document.get("security", []))
            out.append("Authentication: " + ("bearer API key" if secured else "none") + ".")
            out.append("")
            params = [*item.get("parameters", []), *op.get("parameters", [])]
            if params:
                out += ["| parameter | in | required | description |", "|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} "
                        f"| {_one_line(p.get('description'))} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media in body.values():
                out.append(f"Body: {_type(media['schema'])} (see Schemas).")
                out.append("")
            out += ["| status | answer |", "|---|---|"]
            for status in sorted(op["responses"]):
                out.append(
                    f"| {status} | {_one_line(op['responses'][status].get('description'))} |"
                )
            out.append("")
    out += ["## Schemas", ""]
    for name, schema in sorted(document["components"]["schemas"].items()):
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [_one_line(schema["description"]), ""]
        out += _schema_table(schema)
        out.append("")
    return "\n".join(out).rstrip()


# -- the state machine -------------------------------------------------------------

_BLOCK = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_TRANSITION = re.compile(r"^--\s*transition:\s*(.+?)\s*->\s*(.+?)\s*$", re.MULTILINE)


def transitions(sql: str | None = None) -> list[tuple[str, list[str], list[str]]]:
    """``(block, sources, targets)`` for each ``-- transition:`` line, in file order."""
    sql = TRANSITIONS_SQL.read_text() if sql is None else sql
    parts = _BLOCK.split(sql)
    found = []
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        for sources, targets in _TRANSITION.findall(body):
            split = lambda text: [s.strip() for s in text.split(",")]  # noqa: E731
            found.append((name, split(sources), split(targets)))
    return found


def state_diagram() -> str:
    lines = ["```mermaid", "stateDiagram-v2", "    [*] --> PENDING: create (the API)"]
    edges: dict[tuple[str, str], list[str]] = {}
    for name, sources, targets in transitions():
        for source in sources:
            for target in targets:
                edges.setdefault((source, target), []).append(name)
    for (source, target), names in edges.items():
        lines.append(f"    {source} --> {target}: {', '.join(names)}")
    for terminal in ("COMPLETED", "CANCELLED"):
        lines.append(f"    {terminal} --> [*]")
    lines.append("```")
    return "\n".join(lines)


# -- the files -----------------------------------------------------------------------

PARTS = {
    "configuration": (DOCS / "configuration.md", configuration_table),
    "api": (DOCS / "api.md", api_reference),
    "states": (DOCS / "design.md", state_diagram),
}


def rewritten(text: str, name: str, content: str) -> str:
    start, stop = begin(name), end(name)
    if start not in text or stop not in text:
        raise ValueError(f"no {name} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(stop, 1)
    return f"{head}{start}\n{content}\n{stop}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which files differ")
    args = parser.parse_args(argv)
    stale = []
    for name, (path, generate) in PARTS.items():
        text = path.read_text()
        wanted = rewritten(text, name, generate())
        if wanted != text:
            stale.append(path.relative_to(REPO_ROOT))
            if not args.check:
                path.write_text(wanted)
    for path in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
