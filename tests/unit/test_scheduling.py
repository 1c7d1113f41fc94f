"""The order ./run tests hands modules out in (tests/support/scheduling.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.scheduling import LONGEST_FIRST, rank, uses_spark

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_every_module_named_longest_first_exists_once() -> None:
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    missing = [name for name in LONGEST_FIRST if not (INTEGRATION / name).is_file()]
    assert not missing, f"renamed or removed: {missing}"


def test_the_named_modules_go_first_in_their_order() -> None:
    named = [INTEGRATION / name for name in LONGEST_FIRST]
    assert [rank(m) for m in named] == list(range(len(named)))
    assert rank(INTEGRATION / "test_auth.py") == len(LONGEST_FIRST)


def test_a_module_uses_spark_when_a_function_takes_the_fixture(tmp_path: Path) -> None:
    spark = tmp_path / "test_a.py"
    spark.write_text("def test_x(spark, tmp_path):\n    pass\n")
    plain = tmp_path / "test_b.py"
    plain.write_text("def test_y(broker):\n    spark = 1\n")
    assert uses_spark(spark) and not uses_spark(plain)
    assert uses_spark(INTEGRATION / "test_pipeline_joins.py")
    assert not uses_spark(INTEGRATION / "test_chaos.py")
