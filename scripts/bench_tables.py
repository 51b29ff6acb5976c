"""MkDocs hook: benchmark pages take their numbers from result JSON, never from typed text.

A page names a JSON file beside it and writes the table's header and one row template:

    <!-- table: load.json runs -->
    | run | stored / sent | /recall p95 (ms) |
    |---|---|---|
    | {label} | {found:,} / {sent:,} | {recall_ms.p95:.0f} |
    <!-- end table -->

The template row is repeated for every item of `runs` (a list, or a mapping whose keys come
as `_key`). A field is an expression over the item: dotted names (`recall_ms.p95`),
subscripts (`by_category["multi-hop"]`), + - * /, and min()/max(); `.x` on a list maps over
it. After a colon comes a format spec (`:.3f`, `:,`). An inline value in prose or a table
cell is `{{ load.json min(runs.recall_ms.p95):.0f }}`. A whole `speakermem eval` report
(`--out`, recorded with `bench/benchmark_docs.py record`) is `<!-- report: locomo.json -->`:
the same tables the command prints (`memory.eval.harness.markdown_table`) and the run it came
from. A name no row of the JSON has, or a file
that is not there, fails the build (a name only some rows have shows as "-" in the others);
so does a marker left unexpanded.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

TABLE = re.compile(
    r"<!-- table: (?P<file>[\w./-]+\.json) (?P<rows>[^>]*?) -->\n"
    r"(?P<head>[^\n]*)\n(?P<sep>[^\n]*)\n(?P<row>[^\n]*)\n<!-- end table -->"
)
REPORT = re.compile(r"<!-- report: (?P<file>[\w./-]+\.json) -->")
INLINE = re.compile(r"\{\{\s*(?P<file>[\w./-]+\.json)\s+(?P<expr>[^{}]+?)\s*\}\}")
FIELD = re.compile(r"\{(?P<expr>[^{}]+)\}")


class BenchDataError(ValueError):
    """A page asks for a file or a value its JSON does not have."""


def _split_format(text: str) -> tuple[str, str]:
    """'expr:spec' -> (expr, spec); a colon inside quotes belongs to the expression."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == ":":
            return text[:i].strip(), text[i + 1 :]
    return text.strip(), ""


def _get(value: Any, key: str | int, where: str) -> Any:
    if isinstance(value, list) and isinstance(key, str):
        return [_get(v, key, where) for v in value]
    try:
        return value[key]
    except (KeyError, IndexError, TypeError):
        raise BenchDataError(f"{where}: no {key!r} in the data") from None


def evaluate(expr: str, scope: Any, where: str = "") -> Any:
    """The value of a field expression over `scope` (a JSON object)."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as exc:
        raise BenchDataError(f"{where}: cannot read {expr!r}: {exc.msg}") from None

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return _get(scope, node.id, where)
        if isinstance(node, ast.Attribute):
            return _get(ev(node.value), node.attr, where)
        if isinstance(node, ast.Subscript):
            return _get(ev(node.value), ev(node.slice), where)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b}
            ops.update({ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b})
            for kind, fn in ops.items():
                if isinstance(node.op, kind):
                    return fn(left, right)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("min", "max")
            and len(node.args) == 1
        ):
            values = ev(node.args[0])
            return (min if node.func.id == "min" else max)(values)
        raise BenchDataError(f"{where}: {expr!r} uses something the hook does not read")

    return ev(tree)


def render_field(text: str, scope: Any, where: str) -> str:
    expr, spec = _split_format(text)
    value = evaluate(expr, scope, where)
    if value is None:
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError) as exc:
        msg = f"{where}: {expr!r} = {value!r} does not format as {spec!r}: {exc}"
        raise BenchDataError(msg) from None


def _has(field: str, item: Any) -> bool:
    try:
        evaluate(_split_format(field)[0], item)
    except BenchDataError:
        return False
    return True


def _rows(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [
            {"_key": k, **v} if isinstance(v, dict) else {"_key": k, "value": v}
            for k, v in value.items()
        ]
    if isinstance(value, list):
        return value
    raise BenchDataError(f"rows must be a list or a mapping, not {type(value).__name__}")


def expand(markdown: str, load: Any, where: str = "") -> str:
    """Replace every table block and inline value; `load(name)` returns a parsed JSON file."""

    def table(m: re.Match[str]) -> str:
        data = load(m["file"])
        place = f"{where} ({m['file']})"
        rows = _rows(evaluate(m["rows"], data, place))
        known = {  # a field some row has: "-" where another row lacks it (a case without it)
            f["expr"] for f in FIELD.finditer(m["row"]) for item in rows if _has(f["expr"], item)
        }

        def cell(f: re.Match[str], item: Any) -> str:
            if f["expr"] in known and not _has(f["expr"], item):
                return "-"
            return render_field(f["expr"], item, place)

        body = [FIELD.sub(lambda f, item=item: cell(f, item), m["row"]) for item in rows]
        return "\n".join([m["head"], m["sep"], *body])

    def inline(m: re.Match[str]) -> str:
        return render_field(m["expr"], load(m["file"]), f"{where} ({m['file']})")

    def report(m: re.Match[str]) -> str:
        return report_tables(load(m["file"]), f"{where} ({m['file']})")

    parts = []
    for fenced, text in _fences(markdown):
        if fenced:
            parts.append(text)
            continue
        out = INLINE.sub(inline, TABLE.sub(table, REPORT.sub(report, text)))
        if "<!-- table:" in out or "<!-- end table -->" in out:
            raise BenchDataError(f"{where}: a table marker is malformed (scripts/bench_tables.py)")
        parts.append(out)
    return "".join(parts)


def report_tables(report: Any, where: str) -> str:
    """An eval report as `speakermem eval` prints it, with the command and commit of its run."""
    from speakermem.memory.eval.harness import markdown_table

    if not isinstance(report, dict) or not {"dataset", "systems", "k"} <= set(report):
        raise BenchDataError(f"{where}: not a `speakermem eval` report")
    lines = [markdown_table(report)]
    run = report.get("run") or {}
    if run:
        commit = str(run.get("commit", "?"))[:12]
        lines += ["", f"Run: `{run.get('command', '?')}` at {commit}, {run.get('date', '?')}."]
    return "\n".join(lines)


def _fences(markdown: str) -> list[tuple[bool, str]]:
    """The text cut into (inside a fenced code block?, text): examples in code stay as written."""
    parts: list[tuple[bool, str]] = []
    fence = ""
    current: list[str] = []
    for line in markdown.splitlines(keepends=True):
        marker = line.lstrip()[:3]
        if not fence and marker in ("```", "~~~"):
            parts.append((False, "".join(current)))
            current, fence = [line], marker
        elif fence and line.lstrip().startswith(fence):
            current.append(line)
            parts.append((True, "".join(current)))
            current, fence = [], ""
        else:
            current.append(line)
    parts.append((bool(fence), "".join(current)))
    return parts


def loader(folder: Path) -> Any:
    cache: dict[str, Any] = {}

    def load(name: str) -> Any:
        if name not in cache:
            path = folder / name
            if not path.is_file():
                raise BenchDataError(f"{path} does not exist")
            cache[name] = json.loads(path.read_text(encoding="utf-8"))
        return cache[name]

    return load


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook (`hooks:` in mkdocs.yml)."""
    if "<!-- table:" not in markdown and "<!-- report:" not in markdown and "{{" not in markdown:
        return markdown
    folder = (Path(config["docs_dir"]) / page.file.src_uri).parent
    return expand(markdown, loader(folder), page.file.src_uri)
