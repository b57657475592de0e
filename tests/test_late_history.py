"""Which collections a run with late events rebuilds (`late_history.rebuild_set`): fast, pure."""

from __future__ import annotations

import pytest

from jobs.transform.late_history import Rename, rebuild_set

pytestmark = pytest.mark.fast


def _r(event_id: str, source: str, target: str) -> Rename:
    return Rename(event_id, ("d", source), ("d", target))


def test_no_rename_since_the_late_events_rebuilds_nothing() -> None:
    # b -> e happened before the run's oldest new event: the late insert's barrier is right.
    assert rebuild_set({("d", "b"): "10"}, [_r("05", "b", "e")]) == []
    assert rebuild_set({("d", "b"): "10"}, []) == []


def test_a_late_event_follows_later_renames_and_brings_their_sources() -> None:
    renames = [_r("03", "x", "b"), _r("20", "b", "e"), _r("30", "e", "f"), _r("40", "g", "h")]
    # b was renamed to e, then e to f, after the late event: b, e and f are rebuilt, with x,
    # renamed into b before (its rows are part of b's history); g -> h is unrelated.
    got = rebuild_set({("d", "b"): "10"}, renames)
    assert got == [("d", "b"), ("d", "e"), ("d", "f"), ("d", "x")]


def test_a_late_event_in_a_renames_target_stays_behind_its_barrier() -> None:
    # A late insert into e, older than b -> e: the rename replaced e, so it stays gone.
    assert rebuild_set({("d", "e"): "10"}, [_r("20", "b", "e")]) == []


def test_a_late_rename_itself_counts() -> None:
    # The late window holds a -> b; b -> e was folded before: a's rows go on to e.
    renames = [_r("12", "a", "b"), _r("20", "b", "e")]
    assert rebuild_set({("d", "a"): "12"}, renames) == [("d", "a"), ("d", "b"), ("d", "e")]


def test_a_late_window_that_starts_with_its_rename_follows_the_renames_since() -> None:
    # c's oldest late event is the rename c -> a itself; a -> e was folded before.
    renames = [_r("10", "c", "a"), _r("20", "a", "e")]
    assert rebuild_set({("d", "c"): "10"}, renames) == [("d", "a"), ("d", "c"), ("d", "e")]


def test_only_a_rename_newer_than_the_collections_own_late_events_moves_them() -> None:
    # The run's oldest event is x's at 05; b's late events start at 15, after b -> e at 12
    # (b was made again): nothing of b moved, so nothing is rebuilt. An older late event of b
    # (11) was moved by that rename: b, e rebuilt.
    renames = [_r("12", "b", "e")]
    assert rebuild_set({("d", "x"): "05", ("d", "b"): "15"}, renames) == []
    assert rebuild_set({("d", "x"): "05", ("d", "b"): "11"}, renames) == [("d", "b"), ("d", "e")]


def test_rows_move_on_only_by_renames_after_they_arrived() -> None:
    # b's late event (10) moved to e at 20; e -> f at 15 came before they arrived: f stays.
    renames = [_r("15", "e", "f"), _r("20", "b", "e")]
    assert rebuild_set({("d", "b"): "10"}, renames) == [("d", "b"), ("d", "e")]
