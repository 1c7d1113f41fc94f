"""The JSONPath subset an attached table's indexes are written in: ``$`` followed by
fields (``.name``, or ``["any name"]``), list items (``[0]``, ``[-1]``) and every item of
a list (``[*]``). A path selects zero or more values of a JSON document; a field or item
that is not there selects nothing."""

from __future__ import annotations

import re
from typing import Any

import orjson

_STEP = re.compile(
    r"""\.(?P<field>[A-Za-z_][A-Za-z0-9_-]*)"""
    r"""|\[(?P<index>-?\d{1,18})\]"""
    r"""|\[(?P<all>\*)\]"""
    r"""|\[(?P<quoted>"(?:[^"\\]|\\.)*")\]"""
)
#: longer paths are more likely a mistake than a document's shape
MAX_STEPS = 32


class BadPath(ValueError):
    """Text that is not a path of this subset; says where."""


class JsonPath:
    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.startswith("$"):
            raise BadPath(f"{text!r}: a path starts with $")
        steps: list[tuple[str, Any]] = []
        at = 1
        while at < len(text):
            m = _STEP.match(text, at)
            if m is None:
                raise BadPath(f"{text!r}: cannot read it from character {at + 1} on")
            try:
                if m["field"] is not None:
                    steps.append(("field", m["field"]))
                elif m["index"] is not None:
                    steps.append(("index", int(m["index"])))
                elif m["all"] is not None:
                    steps.append(("all", None))
                else:
                    steps.append(("field", orjson.loads(m["quoted"])))
            except ValueError as e:  # a bad escape, or an index of thousands of digits
                raise BadPath(f"{text!r}: {e}") from None
            at = m.end()
        if len(steps) > MAX_STEPS:
            raise BadPath(f"{text!r}: more than {MAX_STEPS} steps")
        self.text = text
        self._steps = tuple(steps)

    def values(self, document: Any) -> list[Any]:
        """What the path selects in `document` (parsed JSON), in document order."""
        current = [document]
        for kind, arg in self._steps:
            following: list[Any] = []
            for node in current:
                if kind == "field":
                    if isinstance(node, dict) and arg in node:
                        following.append(node[arg])
                elif isinstance(node, list):
                    if kind == "all":
                        following.extend(node)
                    elif -len(node) <= arg < len(node):
                        following.append(node[arg])
            current = following
        return current

    def __repr__(self) -> str:
        return f"JsonPath({self.text!r})"
