"""tablecast: serve the live state of Kafka streams.

The public API (SPEC.md): ``App`` and its streams and tables, ``serde``,
``windows``, and ``Client``. Everything else is internal and may change.
``App`` is imported lazily so that a serving node never loads PySpark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tablecast import serde, windows
from tablecast.client import Client, QueryError

if TYPE_CHECKING:
    from tablecast.pipeline.app import App

__all__ = ["App", "Client", "QueryError", "serde", "windows"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "App":
        from tablecast.pipeline.app import App

        return App
    raise AttributeError(f"module 'tablecast' has no attribute {name!r}")
