"""When the compaction sensor starts Delta OPTIMIZE: after enough merges since the last
compaction, counted from the state store alone (no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.transform import delta_debt
from jobs.transform.compact import COMPACTION
from state import TransformRun
from tidemark.config import StreamConfig


def _commit(store, stream: str, number: int, kind: str, folded: int, rows: int) -> None:
    run = TransformRun(
        stream=stream,
        run=number,
        path=f"curated/{stream}",
        rows=rows,
        doc_schema="",
        events_folded=folded,
        changes_added=folded,
        created_at=datetime.now(UTC),
        kind=kind,
        base_run=number,
    )
    lease = store.acquire_lease(stream, "transform", timedelta(minutes=5))
    try:
        store.transforms.commit(lease, stream, number - 1 or None, run, [])
    finally:
        store.release_lease(lease)


@pytest.mark.fast
def test_the_first_load_is_no_debt_and_merges_since_a_compaction_are(store):
    stream = StreamConfig(name="orders", database="shop", collection="orders")
    store.ensure_stream(stream)
    _commit(store, stream.name, 1, "merge", folded=20, rows=20)  # the first load: fresh files
    debt = delta_debt(store, stream.name)
    assert (debt.run, debt.deltas) == (1, 0) and not debt.due(0.5, 10)

    _commit(store, stream.name, 2, "merge", folded=6, rows=20)
    assert not delta_debt(store, stream.name).due(0.5, 10)  # 6 rows < 0.5 x 20
    _commit(store, stream.name, 3, "merge", folded=6, rows=20)
    debt = delta_debt(store, stream.name)
    assert (debt.deltas, debt.delta_rows) == (2, 12) and debt.due(0.5, 10)

    _commit(store, stream.name, 4, COMPACTION, folded=0, rows=20)
    debt = delta_debt(store, stream.name)
    assert (debt.run, debt.deltas) == (4, 0) and not debt.due(0.5, 1)
    _commit(store, stream.name, 5, "merge", folded=1, rows=20)
    assert delta_debt(store, stream.name).due(0.5, 1)  # max_deltas alone
