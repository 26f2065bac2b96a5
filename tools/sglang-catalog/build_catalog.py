#!/usr/bin/env python3
"""Build a catalog of SGLang's `launch_server` flags from a wheel's source, without importing SGLang.

    build_catalog.py VERSION [--wheel FILE] [-o OUT.tsv] [--check REFERENCE.tsv]

The wheel is fetched with `pip download --no-deps sglang==VERSION` unless --wheel is given. The
source is read with `ast`, so neither SGLang nor its (GPU-only) dependencies are needed. Two styles
of flag definitions are understood:

* `parser.add_argument(...)` calls in `ServerArgs.add_cli_args` (0.4.x, 0.5.9, and the few dynamic
  flags of later versions);
* annotated namespace fields `name: A[T, "help" | Arg(...)] = default` under
  `sglang/srt/arg_groups/fields/` (0.5.2x), mirroring `add_cli_args_from_dataclass`.

Choices given by name are followed through module constants and `from sglang... import` lines.
--check prints how the result differs from a reference table, column by column.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

COLUMNS = "flag aliases kind type choices default nargs parser required fallback dest deprecated origin".split()
PLAIN_TYPES = {"int", "float", "str", "bool"}


class Source:
    """The wheel's Python files, parsed on demand."""

    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())
        self.trees: dict[str, ast.Module] = {}

    def tree(self, path: str) -> ast.Module | None:
        if path not in self.trees:
            if path not in self.names:
                return None
            self.trees[path] = ast.parse(self.zip.read(path).decode())
        return self.trees[path]

    def module_path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.names), None)

    def constant(self, path: str, node: ast.AST, depth: int = 0):
        """The value of a constant expression, following names to their module; None if unknown."""
        if depth > 8:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [self.constant(path, e, depth + 1) for e in node.elts]
            return None if any(i is None for i in items) else list(items)
        if isinstance(node, ast.Dict):
            keys = [self.constant(path, k, depth + 1) for k in node.keys if k is not None]
            return {k: None for k in keys}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.constant(path, node.left, depth + 1), self.constant(path, node.right, depth + 1)
            return left + right if isinstance(left, list) and isinstance(right, list) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "tuple", "sorted"):
            return self._listed(path, node.args[0], depth) if node.args else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
            return self._listed(path, node.func.value, depth)
        if isinstance(node, ast.Name):
            return self.name(path, node.id, depth + 1)
        return None

    def _listed(self, path, node, depth):
        value = self.constant(path, node, depth + 1)
        if isinstance(value, dict):
            return list(value)
        return list(value) if isinstance(value, list) else None

    def name(self, path: str, name: str, depth: int):
        tree = self.tree(path)
        if tree is None:
            return None
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) and stmt.value else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return self.constant(path, stmt.value, depth)
            if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.module.startswith("sglang"):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        other = self.module_path(stmt.module)
                        return self.name(other, alias.name, depth + 1) if other else None
        return None


def text(node: ast.AST | None) -> str:
    return "" if node is None else ast.unparse(node)


def default_text(src: Source, path: str, node: ast.AST | None) -> str:
    """A default as the reference tables write it: `false`, `auto`, `None`, `[]`."""
    if node is None:
        return "None"
    if text(node).startswith("ServerArgs."):
        node = server_args_default(src, path, text(node).split(".", 1)[1])
        if node is None:
            return "None"
    if isinstance(node, ast.Call) and "default_factory" in text(node):
        return {"list": "[]", "dict": "{}"}.get(text(node.keywords[-1].value), text(node))
    value = src.constant(path, node)
    if isinstance(value, bool):
        return str(value).lower()
    return text(node) if value is None and not (isinstance(node, ast.Constant)) else str(value)


def server_args_default(src: Source, path: str, field: str) -> ast.AST | None:
    for cls in (n for n in src.tree(path).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and text(stmt.target) == field:
                return stmt.value
    return None


def row(**cols) -> dict:
    return {c: cols.get(c, "") for c in COLUMNS}


def choices_text(values) -> str:
    return ",".join(str(v) for v in values) if values else ""


def from_add_argument(src: Source, path: str, call: ast.Call, origin: str) -> dict | None:
    options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not options or not options[0].startswith("--"):
        return None
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = text(kw.get("action")).strip("'\"")
    type_ = text(kw.get("type"))
    nargs = str(src.constant(path, kw["nargs"]) or "") if "nargs" in kw else ""
    aliases = options[1:]
    if action == "argparse.BooleanOptionalAction":
        aliases.append("--no-" + options[0][2:])
    is_bool = action in ("store_true", "store_false", "argparse.BooleanOptionalAction") or action.startswith("Deprecated") and "Const" not in action
    kind = "bool" if is_bool else "list" if nargs in ("+", "*") else "value"
    value_type = "bool" if is_bool else type_ if type_ in PLAIN_TYPES else "json" if "json" in type_ else "str"
    parser = action if action and action != "store" else type_
    choices = src.constant(path, kw["choices"]) if "choices" in kw else None
    help_text = text(kw.get("help")).lower()
    default = default_text(src, path, kw.get("default"))
    if is_bool and "default" not in kw and "BooleanOptional" not in action:
        default = "false"  # argparse's default for store_true
    deprecated = "yes (per help text)" if "deprecated" in help_text else ""
    return row(flag=options[0], aliases=",".join(aliases), kind=kind, type=value_type,
               choices=choices_text(choices), default=default, nargs=nargs,
               parser=parser, required="yes" if text(kw.get("required")) == "True" else "",
               dest=text(kw.get("dest")).strip("'\"") or options[0][2:].replace("-", "_"),
               deprecated=deprecated, origin=origin)


def add_argument_calls(src: Source, path: str) -> list[dict]:
    tree = src.tree(path)
    rows = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"):
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
                    r = from_add_argument(src, path, call, "add_cli_args")
                    if r:
                        rows.append(r)
    return rows


def unwrap(node: ast.AST) -> tuple[ast.AST, bool]:
    """`Optional[T]` and `T | None` to T."""
    if isinstance(node, ast.Subscript) and text(node.value) in ("Optional", "typing.Optional"):
        return node.slice, True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and text(node.right) == "None":
        return node.left, True
    return node, False


def from_field(src: Source, path: str, cls: str, stmt: ast.AnnAssign) -> dict | None:
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and text(ann.value) == "A" and isinstance(ann.slice, ast.Tuple)):
        return None
    raw, meta = ann.slice.elts[0], ann.slice.elts[1]
    arg = {k.arg: k.value for k in meta.keywords} if isinstance(meta, ast.Call) and text(meta.func) == "Arg" else {}
    if not arg and not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
        return None
    if text(arg.get("no_cli")) == "True":
        return None
    field = stmt.target.id
    flag = (src.constant(path, arg["cli_name"]) if "cli_name" in arg else None) or "--" + field.replace("_", "-")
    aliases = src.constant(path, arg["aliases"]) if "aliases" in arg else []
    inner, _ = unwrap(raw)
    parser, nargs, choices = text(arg.get("type_parser")), "", None
    action = text(arg.get("action"))
    head = text(inner.value) if isinstance(inner, ast.Subscript) else text(inner)
    action_kwargs = src.constant(path, arg["action_kwargs"]) if "action_kwargs" in arg else None
    if action and isinstance(action_kwargs, dict) and "nargs" in text(arg["action_kwargs"]):
        kind, value_type, parser = "list", "str", action
        nargs = str(ast.literal_eval(arg["action_kwargs"].values[[text(k) for k in arg["action_kwargs"].keys].index("'nargs'")]))
    elif action:
        kind = "bool" if "Const" not in action else "value"
        value_type, parser = ("bool" if kind == "bool" else "str"), action
        if action == "argparse.BooleanOptionalAction":
            aliases = (aliases or []) + ["--no-" + flag[2:]]
    elif head == "Literal":
        values = [src.constant(path, e) for e in (inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice])]
        typed = [v for v in values if v is not None]
        kind, value_type, choices = "value", type(typed[0]).__name__ if typed else "str", values
    elif (head in ("list", "List") and not parser) or text(arg.get("nargs")) in ("'+'", "'*'"):
        kind, nargs = "list", str(src.constant(path, arg["nargs"]) if "nargs" in arg else "+")
        element = text(inner.slice) if isinstance(inner, ast.Subscript) else ""
        value_type = element if element in PLAIN_TYPES else "str"
    elif head == "bool":
        kind, value_type, parser = "bool", "bool", "store_true"
    else:
        kind = "value"
        value_type = "json" if "json" in parser else head if head in PLAIN_TYPES else "json" if head in ("dict", "Dict", "list", "List") else "str"
        nargs = str(src.constant(path, arg["nargs"]) or "") if "nargs" in arg else ""
    if "choices" in arg:
        choices = src.constant(path, arg["choices"])
    help_text = text(arg.get("help", meta)).lower()
    default = "(required)" if stmt.value is None else default_text(src, path, stmt.value)
    return row(flag=flag, aliases=",".join(aliases or []), kind=kind, type=value_type, choices=choices_text(choices),
               default=default, nargs=nargs, parser=parser, required="yes" if stmt.value is None else "",
               fallback=text(arg.get("fallback")).lower() if "fallback" in arg else "", dest=field,
               deprecated="yes (per help text)" if "deprecated" in help_text else "", origin=f"{cls}.{field}")


def namespace_fields(src: Source) -> list[dict]:
    rows = []
    for path in sorted(p for p in src.names if p.startswith("sglang/srt/arg_groups/fields/") and p.endswith(".py")):
        for cls in (n for n in src.tree(path).body if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    r = from_field(src, path, cls.name, stmt)
                    if r:
                        rows.append(r)
    return rows


def build(wheel: Path, version: str) -> list[str]:
    src = Source(wheel)
    rows = namespace_fields(src) + add_argument_calls(src, "sglang/srt/server_args.py")
    seen, unique = set(), []
    for r in rows:
        if r["flag"] not in seen:
            seen.add(r["flag"])
            unique.append(r)
    header = f"# SGLang {version} launch_server flags, read from the sglang {version} wheel's server_args source (facts only: names, kinds, types, choices, defaults)"
    return [header, "\t".join(COLUMNS)] + ["\t".join(r[c] for c in COLUMNS) for r in unique]


def read_table(lines) -> dict[str, dict]:
    rows = [l.rstrip("\n").split("\t") for l in lines if l.startswith("--")]
    return {r[0]: dict(zip(COLUMNS, r + [""] * len(COLUMNS))) for r in rows}


def check(ours: dict, ref: dict) -> int:
    missing, extra = sorted(ref.keys() - ours.keys()), sorted(ours.keys() - ref.keys())
    print(f"flags: {len(ours)} built, {len(ref)} in reference, {len(missing)} missing, {len(extra)} extra")
    for name in missing:
        print(f"  missing {name}")
    for name in extra:
        print(f"  extra   {name}")
    common = sorted(ours.keys() & ref.keys())
    differences = len(missing) + len(extra)
    for col in COLUMNS[1:]:
        diffs = [n for n in common if ours[n][col] != ref[n][col]]
        differences += len(diffs)
        print(f"{col}: {len(common) - len(diffs)}/{len(common)} equal")
        for n in diffs[:5]:
            print(f"  {n}: built {ours[n][col]!r}, reference {ref[n][col]!r}")
    return differences


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version")
    ap.add_argument("--wheel", type=Path, help="a downloaded sglang wheel (default: pip download it)")
    ap.add_argument("-o", "--output", type=Path, help="where to write the TSV (default: stdout)")
    ap.add_argument("--check", type=Path, metavar="REFERENCE.tsv", help="print differences from a reference table")
    args = ap.parse_args()
    wheel = args.wheel
    if wheel is None:
        folder = Path(tempfile.mkdtemp(prefix="sglang-wheel-"))
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={args.version}", "-d", str(folder)], check=True)
        wheel = next(folder.glob("sglang-*.whl"))
    lines = build(wheel, args.version)
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    elif not args.check:
        print("\n".join(lines))
    if args.check:
        return 1 if check(read_table(lines), read_table(args.check.read_text().splitlines())) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
