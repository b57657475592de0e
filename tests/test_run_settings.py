"""The session settings a transform run takes for its size (fast: a run's rule and its undo)."""

from __future__ import annotations

import pytest

from jobs.transform.run_settings import (
    ARROW_BATCH,
    INTERPRETED,
    SMALL_RUN_EVENTS,
    SMALL_TABLE_ROWS,
    run_settings,
    settings_for,
)

pytestmark = pytest.mark.fast


def test_a_small_run_over_small_tables_is_interpreted() -> None:
    assert settings_for(1, 0, large=False) == INTERPRETED
    assert settings_for(SMALL_RUN_EVENTS, SMALL_TABLE_ROWS, large=False) == INTERPRETED


@pytest.mark.parametrize(
    ("events", "rows"),
    [(SMALL_RUN_EVENTS + 1, 0), (10, SMALL_TABLE_ROWS + 1), (1_000_000, 1_000_000)],
)
def test_many_events_or_a_large_table_keep_sparks_code_generation(events, rows) -> None:
    assert settings_for(events, rows, large=False) == {}


def test_a_run_of_large_events_takes_one_row_per_arrow_batch_and_compiles() -> None:
    assert settings_for(16, 0, large=True) == {ARROW_BATCH: "1"}


class _Conf:
    """A session's runtime settings as PySpark's `spark.conf` answers them (get with a
    default, set, unset): what `run_settings` calls, here without a JVM."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class _Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


def test_a_runs_settings_are_put_back_as_they_were_even_when_it_fails() -> None:
    session = _Session({"spark.sql.codegen.wholeStage": "true", "other": "kept"})
    with pytest.raises(RuntimeError), run_settings(session, INTERPRETED):
        assert session.conf.values == {**INTERPRETED, "other": "kept"}
        raise RuntimeError("the run failed")
    assert session.conf.values == {"spark.sql.codegen.wholeStage": "true", "other": "kept"}
