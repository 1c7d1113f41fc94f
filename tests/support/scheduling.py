"""How ``./run tests`` hands modules to its pytest-xdist workers.

As ``--dist loadscope``: a module goes whole to one worker, its tests in order (a module's
tests may build on each other and share one cluster). Two rules on top:

- every module that uses the session's SparkSession (a function of it takes the ``spark``
  fixture) goes to one of the first half of the workers (rounded up), so the run starts that
  many Sparks, not one per worker;
- modules go out in the order the collection sorted them (``tests/conftest.py``: Spark
  modules, then integration, then unit; in each, the modules of ``LONGEST_FIRST`` first),
  not by their number of tests, so the long modules start early and the many short unit
  tests fill the end.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

#: the fixture whose modules go to the Spark workers only
SPARK = "spark"

#: the modules of tests/integration that take a minute or more (CI's --durations), longest
#: first: each goes out before the shorter ones, so none starts late and runs on alone
LONGEST_FIRST = (
    "test_chaos.py",
    "test_pipeline_fk_joins.py",
    "test_examples.py",
    "test_pipeline_joins.py",
    "test_ingest_faults.py",
    "test_openapi_fuzz.py",
    "test_cluster.py",
    "test_broker_failure.py",
    "test_serving.py",
    "test_pipeline_restart.py",
    "test_watch.py",
    "test_history_indexes.py",
    "test_secure_kafka.py",
    "test_conformance.py",
    "test_outage.py",
    "test_pipeline_grouped.py",
    "test_coalesce.py",
    "test_spark_cluster.py",
    "test_console.py",
    "test_signals.py",
    "test_pipeline_stream_joins.py",
    "test_pipeline_stream.py",
)


def rank(module: Path) -> int:
    """Where the module goes among its kind: by LONGEST_FIRST, the others after them."""
    try:
        return LONGEST_FIRST.index(module.name)
    except ValueError:
        return len(LONGEST_FIRST)


@cache
def uses_spark(module: Path) -> bool:
    """True when a function of the module (a test or a fixture) takes the `spark` fixture."""
    try:
        tree = ast.parse(module.read_text())
    except (OSError, SyntaxError):
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(a.arg == SPARK for a in node.args.args + node.args.kwonlyargs)
        for node in ast.walk(tree)
    )


class ModulesInOrder(LoadScopeScheduling):
    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the collection's order, not by size
        self._root = config.rootpath
        self._spark_nodes: list[WorkerController] = []
        self._spark_workers = (self.numnodes + 1) // 2

    def _for_spark(self, scope: str) -> bool:
        return uses_spark(self._root / scope.split("::", 1)[0])

    def remove_node(self, node: WorkerController) -> str | None:
        if node in self._spark_nodes:  # crashed: its replacement takes its Spark modules
            self._spark_nodes.remove(node)
        return super().remove_node(node)

    def _assign_work_unit(self, node: WorkerController) -> None:
        if node not in self._spark_nodes and len(self._spark_nodes) < self._spark_workers:
            self._spark_nodes.append(node)
        for scope in self.workqueue:
            if node in self._spark_nodes or not self._for_spark(scope):
                break
        else:  # only Spark modules are left, and they are the Spark workers'
            if not self._pending_of(self.assigned_work.get(node, {})):
                node.shutdown()
            return
        self.workqueue.move_to_end(scope, last=False)  # xdist hands out the first unit
        super()._assign_work_unit(node)
