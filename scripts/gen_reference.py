#!/usr/bin/env python3
"""
Write docs/reference.md, the function reference of the formula's loader modules, from their
docstrings: every public function of ``_runners``, ``_modules``, ``_states``, ``_returners``
and ``_fileserver``, with its signature and docstring, under the name Salt loads it by.

    python scripts/gen_reference.py          # rewrite docs/reference.md
    python scripts/gen_reference.py --check  # fail when docs/reference.md is not current, or a
                                             # public runner, execution or state function has
                                             # no "CLI Example"
"""

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "reference.md"
KINDS = [
    ("_runners", "Runners", "salt-run"),
    ("_modules", "Execution modules", "salt"),
    ("_states", "State modules", None),
    ("_returners", "Returners", None),
    ("_fileserver", "File server backends", None),
    ("_engines", "Engines", None),
]
# Kinds whose public functions a user calls from the CLI, so each shows how.
NEEDS_CLI_EXAMPLE = {"_runners", "_modules", "_states"}
HEADER = """# Function reference

Generated from the docstrings by `scripts/gen_reference.py`; do not edit by hand (CI checks it
is current: `make reference` rewrites it).
"""


def virtual_name(tree, path):
    """
    The name Salt loads the module by: its ``__virtualname__``, else its file name.
    """
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__virtualname__" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return path.stem


def aliases(tree):
    """
    ``__func_alias__``: the public name of a function whose Python name differs.
    """
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__func_alias__" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return {}


def public_functions(tree):
    """
    ``(name, signature, docstring)`` of each top-level public function, in file order.
    """
    alias = aliases(tree)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (
            not node.name.startswith("_") or node.name in alias
        ):
            name = alias.get(node.name, node.name)
            yield name, ast.unparse(node.args), ast.get_docstring(node) or ""


def module_section(path, tree):
    name = virtual_name(tree, path)
    lines = [f"### `{name}`", "", f"`{path.relative_to(ROOT)}`", ""]
    summary = (ast.get_docstring(tree) or "").strip()
    if summary:
        lines += [summary, ""]
    for fname, signature, doc in public_functions(tree):
        lines += [f"#### `{name}.{fname}({signature})`", "", "```", doc.strip(), "```", ""]
    return lines


def render():
    lines = [HEADER]
    for directory, title, _ in KINDS:
        paths = sorted((ROOT / directory).glob("*.py"))
        if not paths:
            continue
        lines += [f"## {title}", ""]
        for path in paths:
            lines += module_section(path, ast.parse(path.read_text(encoding="utf-8")))
    return "\n".join(lines).rstrip() + "\n"


def missing_cli_examples():
    """
    ``module.function`` of each public runner, execution or state function without one.
    """
    missing = []
    for directory in sorted(NEEDS_CLI_EXAMPLE):
        for path in sorted((ROOT / directory).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for fname, _, doc in public_functions(tree):
                if "CLI Example" not in doc:
                    missing.append(f"{path.relative_to(ROOT)}: {fname}")
    return missing


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        TARGET.write_text(text, encoding="utf-8")
        return 0
    problems = [f"no 'CLI Example' in the docstring of {m}" for m in missing_cli_examples()]
    if not TARGET.exists() or TARGET.read_text(encoding="utf-8") != text:
        problems.append(f"{TARGET.relative_to(ROOT)} is not current: run make reference")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
