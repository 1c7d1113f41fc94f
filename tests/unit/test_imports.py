"""The package's import graph: no cycles anywhere in tablecast/, every package imports
only from the layers below it (the tree follows the data: the record contract, Kafka,
stores, the cluster, the read core, the front ends, the node process, the CLI), and the
pipeline's stages import only from the stages before them (DSL -> plan -> compile -> run).

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


#: the package's layers, lowest first: a package imports only from its own layer and the
#: layers before it. ``tablecast`` itself (the public API) may import anything.
LAYERS: list[set[str]] = [
    # pure data and functions: the record contract and what it is written with
    {"contract", "serde", "windows", "jvm", "lifetime", "metric_families", "proto", "version"},
    {"client"},
    {"kafka"},
    {"pipeline"},
    {"store"},
    {"cluster"},
    # reads as values, routed, authorized and answered, whatever the transport
    {"query"},
    {"live"},
    {"console"},
    {"grpc"},
    {"pg"},
    {"http"},
    # a serving node's process puts the layers below together
    {"node"},
    {"cli"},
    {"submit"},
]


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a module's top-level package (None for ``tablecast``)."""
    top = module.split(".")[1] if "." in module else None
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    return None


def import_edges(root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    """Module -> (tablecast module it imports, line of the import), for every import (a
    name imported from a package is the submodule of that name when there is one, else
    the package)."""
    mods = modules(root)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, list[tuple[str, int]]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: list[tuple[str | None, int]] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.extend(
                    (known(a.name), node.lineno)
                    for a in node.names
                    if a.name.startswith("tablecast")
                )
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                if base.split(".")[0] != "tablecast":
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps.append((full if full in mods else known(base), node.lineno))
        edges[mod] = sorted({(d, n) for d, n in deps if d is not None and d != mod})
    return edges


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the tablecast modules it imports."""
    return {mod: {d for d, _ in deps} for mod, deps in import_edges(root).items()}


def upward_imports(root: Path = ROOT) -> list[str]:
    """Each import of a module from a layer above its own, as ``file:line: a imports b``."""
    wrong = []
    for mod, deps in import_edges(root).items():
        mine = layer_of(mod)
        if mine is None:
            continue
        for dep, line in deps:
            theirs = layer_of(dep)
            if theirs is None or theirs > mine:
                path = modules(root)[mod].relative_to(root.parent)
                wrong.append(f"{path}:{line}: {mod} imports {dep} from a layer above")
    return sorted(wrong)


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


def test_the_checker_names_an_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "tablecast"
    for sub in ("kafka", "store"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "store" / "base.py").write_text("from tablecast.kafka import topics\n")
    (pkg / "kafka" / "topics.py").write_text("import os\n\n\ndef f():\n    import tablecast\n")
    (pkg / "kafka" / "catalog.py").write_text("X = 1\n\nfrom tablecast.store.base import f\n")
    assert upward_imports(pkg) == [
        "tablecast/kafka/catalog.py:3: tablecast.kafka.catalog imports tablecast.store.base"
        " from a layer above",
        "tablecast/kafka/topics.py:5: tablecast.kafka.topics imports tablecast from a layer above",
    ]


def test_no_import_cycle_in_tablecast() -> None:
    assert cycles(import_graph()) == []


def test_every_package_imports_only_from_its_layer_and_below() -> None:
    assert not upward_imports(), "\n".join(upward_imports())
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    tops |= {p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py"}
    assert tops == set().union(*LAYERS), "every package and module of tablecast/ has a layer"


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
