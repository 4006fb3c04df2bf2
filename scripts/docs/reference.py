"""Reference pages generated from the code when the site builds, never pasted:

    cli_page()       every command of the typer app (``headlab.cli.app``): usage, help, options
    json_api_page()  every operation of the FastAPI app's OpenAPI schema (create_app().openapi())

The mkdocs hook (scripts/docs/hooks.py) adds them to the site as reference/cli.md and
reference/json-api.md; ``python scripts/docs/reference.py cli|json-api`` prints one.
"""

from __future__ import annotations

import sys
from typing import Any


def _escape(text: str) -> str:
    """Help text as Markdown: pipes and brackets escaped (``[layer][head]`` is no link), line
    breaks kept as spaces."""
    for char in "|[]":
        text = text.replace(char, "\\" + char)
    return " ".join(text.split())


def _options_table(command: Any, ctx: Any) -> str:
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx)
        if record is None:  # an argument: its name and its help
            name, text = param.human_readable_name, getattr(param, "help", "") or ""
            decl = f"`{name}`" + ("" if param.required else " (optional)")
        else:
            decl = ", ".join(f"`{d.strip()}`" for d in record[0].split(", "))
            text = record[1]
        rows.append(f"| {decl} | {_escape(text)} |")
    if not rows:
        return "No options."
    return "\n".join(["| argument or option | what it does |", "|---|---|", *rows])


def cli_page() -> str:
    """Markdown for every command of ``headlab``, in the order ``headlab --help`` lists them."""
    import typer.main

    from headlab.cli import app

    group = typer.main.get_command(app)
    root = group.make_context("headlab", [], resilient_parsing=True)
    lines = [
        "# Command line",
        "",
        "Generated from the typer app (`headlab.cli.app`) when this site was built: each "
        "command's usage, help and options, as `headlab COMMAND --help` prints them.",
        "",
        "```text",
        group.get_usage(root),
        "```",
        "",
        _escape(group.help or ""),
        "",
    ]
    for name, command in group.commands.items():
        ctx = command.make_context(name, [], parent=root, resilient_parsing=True)
        usage = command.get_usage(ctx).replace("Usage: headlab", "headlab", 1)
        help_text = (command.help or "").strip()
        lines += [f"## `headlab {name}`", "", "```text", usage, "```", ""]
        for paragraph in help_text.split("\n\n"):
            lines += [_escape(paragraph), ""]
        lines += [_options_table(command, ctx), ""]
    return "\n".join(line.replace("Usage: headlab ", "headlab ") for line in lines)


# --- the JSON API ----------------------------------------------------------------------------


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words: ``integer``, ``array of number``, ``Shapes``, ``a | b``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(s) for s in schema[key])
    if schema.get("type") == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    return schema.get("type", "any")


def _bounds(schema: dict[str, Any]) -> str:
    words = {
        "minimum": "≥",
        "maximum": "≤",
        "exclusiveMinimum": ">",
        "exclusiveMaximum": "<",
        "minLength": "length ≥",
        "maxLength": "length ≤",
        "maxItems": "items ≤",
    }
    found = [f"{w} {schema[k]}" for k, w in words.items() if k in schema]
    for alt in schema.get("anyOf", []):
        found += [f"{w} {alt[k]}" for k, w in words.items() if k in alt]
    if "default" in schema:
        found.append(f"default `{schema['default']}`")
    return ", ".join(found)


def _model(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [_escape(schema["description"]), ""]
    props = schema.get("properties", {})
    if not props:
        return [*lines, f"Type: {_type(schema)}.", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | limits | meaning |", "|---|---|---|---|---|"]
    for field, prop in props.items():
        lines.append(
            f"| `{field}` | {_type(prop)} | {'yes' if field in required else ''} | "
            f"{_bounds(prop)} | {_escape(prop.get('description', prop.get('title', '')))} |"
        )
    return [*lines, ""]


def _body(op: dict[str, Any]) -> str:
    content = op.get("requestBody", {}).get("content", {})
    return "; ".join(f"`{kind}`: {_type(c.get('schema', {}))}" for kind, c in content.items())


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"## `{method.upper()} {path}`", ""]
    for key in ("summary", "description"):
        if op.get(key):
            lines += [_escape(op[key]), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required |", "|---|---|---|---|"]
        lines += [
            f"| `{p['name']}` | {p['in']} | {_type(p.get('schema', {}))} | "
            f"{'yes' if p.get('required') else ''} |"
            for p in params
        ]
        lines.append("")
    if _body(op):
        lines += [f"Body: {_body(op)}.", ""]
    lines += ["| status | answer |", "|---|---|"]
    for status, answer in op.get("responses", {}).items():
        kinds = answer.get("content", {})
        shape = "; ".join(f"`{k}` {_type(v.get('schema', {}))}" for k, v in kinds.items())
        lines.append(f"| {status} | {_escape(answer.get('description', ''))} {shape} |")
    return [*lines, ""]


def json_api_page() -> str:
    """Markdown for every operation and schema of the explainer's API, from its OpenAPI schema."""
    from headlab.server import create_app

    spec = create_app().openapi()
    lines = [
        "# JSON API",
        "",
        f"Generated from the OpenAPI {spec['openapi']} schema of `headlab.server.create_app()` "
        "when this site was built. A running `headlab serve` answers the same schema at "
        "`/openapi.json` and shows it at `/docs`.",
        "",
    ]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            lines += _operation(path, method, op)
    lines += ["## Schemas", ""]
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        lines += _model(name, schema)
    return "\n".join(lines)


if __name__ == "__main__":
    pages = {"cli": cli_page, "json-api": json_api_page}
    if len(sys.argv) != 2 or sys.argv[1] not in pages:
        sys.exit(f"usage: {sys.argv[0]} cli|json-api")
    sys.stdout.write(pages[sys.argv[1]]() + "\n")
