"""The JSONPath subset of an attached table's indexes."""

from __future__ import annotations

import pytest

from tablecast.contract.json_path import BadPath, JsonPath

DOC = {"a": {"b": 1, "c d": [1, 2]}, "tags": ["x", "y"], "rows": [{"n": 1}, {"n": 2}, {}]}


@pytest.mark.parametrize(
    ("path", "selected"),
    [
        ("$", [DOC]),
        ("$.a.b", [1]),
        ('$.a["c d"]', [[1, 2]]),
        ('$.a["c d"][*]', [1, 2]),
        ("$.tags[*]", ["x", "y"]),
        ("$.tags[0]", ["x"]),
        ("$.tags[-1]", ["y"]),
        ("$.tags[5]", []),
        ("$.rows[*].n", [1, 2]),
        ("$.missing.b", []),
        ("$.a.b.c", []),
        ("$.tags.x", []),
    ],
)
def test_a_path_selects(path: str, selected: list[object]) -> None:
    assert JsonPath(path).values(DOC) == selected


@pytest.mark.parametrize("path", ["a.b", "$.", "$..a", "$[a]", "$.a[", "$.a b", 7, "$" + ".a" * 33])
def test_what_is_not_a_path_is_refused(path: object) -> None:
    with pytest.raises(BadPath):
        JsonPath(path)  # type: ignore[arg-type]
