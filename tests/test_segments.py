"""Which segments of a run's fold hold no event, decided from each collection's span of event
ids without a Spark job (`segments.Segments.empty`): a segment is skipped only when no
collection in its scope has an event between its lower and upper bound."""

from __future__ import annotations

import pytest

from jobs.transform.fold import Watched
from jobs.transform.segments import Segments

pytestmark = pytest.mark.fast

SPANS = {("d", "a"): ("e10", "e20"), ("d", "b"): ("e30", "e30")}


def test_without_spans_no_segment_is_known_empty() -> None:
    assert not Segments().empty("e05", [Watched("d", "c")])


def test_a_segment_of_a_collection_without_events_is_empty() -> None:
    assert Segments(spans=SPANS).empty("e40", [Watched("d", "c")])


def test_a_segment_before_a_collections_first_event_is_empty() -> None:
    segments = Segments(spans=SPANS)
    assert segments.empty("e10", [Watched("d", "a")])  # strictly older than e10: none
    assert not segments.empty("e11", [Watched("d", "a")])


def test_a_collection_folded_past_its_newest_event_holds_no_more() -> None:
    segments = Segments(spans=SPANS)
    segments.passed([("d", "a")], [Watched("d", "a")], "e20")
    assert not segments.empty()  # b's event is still due
    segments.passed([("d", "b")], [Watched("d", "b")], "e31")
    assert segments.empty()
    segments = Segments(spans=SPANS)
    segments.passed([("d", "a")], [Watched("d", "a")], "e15")  # e16..e20 may remain
    assert not segments.empty(None, [Watched("d", "a")])


def test_a_database_scope_covers_its_collections() -> None:
    assert not Segments(spans=SPANS).empty("e99", [Watched("d", None)])
    assert Segments(spans=SPANS).empty("e99", [Watched("other", None)])
