"""The package's import graph: no cycles anywhere in tablecast/, and the pipeline's
stages import only from the stages before them (DSL -> plan -> compile -> run).

Every import counts, wherever it stands: at module level, inside a function (a
lazy import is still a dependency), and under ``if TYPE_CHECKING`` (a type named
from a later stage ties the modules together all the same).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "tablecast"

#: which pipeline stages each may import (besides itself and tablecast outside the pipeline)
STAGES = {
    "plan": set(),
    "dsl": {"plan"},
    "compile": {"plan"},
    "run": {"plan", "compile"},
    "app": {"dsl", "plan", "run"},
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the tablecast modules it imports (a name imported from a package is
    the submodule of that name when there is one, else the package)."""
    mods = modules(root)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(known(a.name) for a in node.names if a.name.startswith("tablecast"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                if base.split(".")[0] != "tablecast":
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps.add(full if full in mods else known(base))
        graph[mod] = {d for d in deps if d is not None and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "tablecast"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from tablecast.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n"
    )
    (pkg / "c.py").write_text("from tablecast import a\n")
    assert cycles(import_graph(pkg)) == [["tablecast.a", "tablecast.sub.b"]]


def test_no_import_cycle_in_tablecast() -> None:
    assert cycles(import_graph()) == []


def test_pipeline_stages_import_only_earlier_stages() -> None:
    prefix = "tablecast.pipeline."
    wrong = []
    for mod, deps in import_graph().items():
        if not mod.startswith(prefix):
            continue
        stage = mod[len(prefix) :].split(".")[0]
        for dep in deps:
            if dep.startswith(prefix):
                other = dep[len(prefix) :].split(".")[0]
                if other != stage and other not in STAGES[stage]:
                    wrong.append(f"{mod} ({stage}) imports {dep} ({other})")
    assert not wrong, "\n".join(wrong)
    assert sorted(STAGES) == sorted(
        p.stem
        for p in (ROOT / "pipeline").iterdir()
        if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())
    ), "every module or subpackage of tablecast/pipeline is a stage listed in STAGES"
