"""The reference the oracle compares with: what a plain `watch()` returns, filtered as the stream
filters, and a pure-Python fold of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from jobs.transform.identity import identity_key
from tests.helpers.oracle import canonical
from tidemark.config import StreamConfig
from tidemark.pipeline_stages import ALWAYS_PASSING_EVENTS
from tidemark.tokens import (
    covered_until,
    is_high_water_mark,
    pack_ts,
    token_from_json,
    unpack_ts,
)


@dataclass(frozen=True)
class Ref:
    """One reference event, reduced to what the oracle compares."""

    data: str
    op: str
    ts: int  # packed cluster time
    db: str | None
    coll: str | None
    key: str | None  # canonical Extended JSON of the document key, like `_tm_key`
    doc: str | None  # canonical Extended JSON of fullDocument
    to: tuple[str, str] | None


def _ref(event: Any) -> Ref:
    ns, to = event.get("ns") or {}, event.get("to")
    key, doc = event.get("documentKey"), event.get("fullDocument")
    return Ref(
        data=event["_id"]["_data"],
        op=event["operationType"],
        ts=pack_ts(event["clusterTime"]),
        db=ns.get("db"),
        coll=ns.get("coll"),
        key=identity_key(canonical(key.raw)) if key is not None else None,
        doc=canonical(doc.raw) if doc is not None else None,
        to=(to["db"], to["coll"]) if to is not None else None,
    )


def reference_events(raw: MongoClient, stream: StreamConfig, start: int) -> list[Ref]:
    """Every event of the stream's scope from `start` on, as plain `watch()` returns them,
    going on after each invalidate with startAfter; the stream's `$match` is applied here."""
    target: Any = raw
    if stream.database is not None:
        target = raw[stream.database]
        if stream.collection is not None:
            target = target[stream.collection]
    events: list[Ref] = []
    options: dict[str, Any] = {"start_at_operation_time": unpack_ts(start)}
    while True:
        with target.watch(full_document="updateLookup", max_await_time_ms=300, **options) as cs:
            last = None
            while cs.alive:
                event = cs.try_next()
                if event is None:
                    break
                last = event
                events.append(_ref(event))
            if last is None or last["operationType"] != "invalidate":
                return [e for e in events if matches(stream, e)]
            options = {"start_after": last["_id"]}


def matches(stream: StreamConfig, event: Ref) -> bool:
    """The stream's `$match` stages (the two forms the variants use), in Python, with
    Tidemark's rule: deletes and namespace events pass a non-namespace filter while the
    stream feeds `current` (`tidemark.pipeline_stages.capture_pipeline`)."""
    passes_filters = stream.current_table and event.op in ALWAYS_PASSING_EVENTS
    for stage in stream.pipeline:
        spec = stage.get("$match", {})
        hidden = "operationType" in spec and event.op not in spec["operationType"]["$in"]
        if hidden and not passes_filters:
            return False
        if "ns.db" in spec and event.db not in spec["ns.db"]["$in"]:
            return False
    return True


def covers(token: str, event: Ref) -> bool:
    """Whether a stored resume token says `event` is consumed."""
    data = token_from_json(token)["_data"]
    if is_high_water_mark(data):  # a high-water mark: its time is covered
        until = covered_until(data)
        return until is not None and event.ts < pack_ts(until)
    return event.data <= data


def python_fold(
    events: list[Ref], database: str | None, collection: str | None
) -> tuple[dict[tuple[str, str, str], str], set[tuple[str, str, str]]]:
    """The reference fold, in event order. Keys whose last event is an update carry a post-image
    looked up at read time (updateLookup), not the drain's: they are not compared ('unsure')."""
    state: dict[tuple[str, str, str], str] = {}
    unsure: set[tuple[str, str, str]] = set()
    for e in sorted(events, key=lambda e: e.data):
        if e.op in ("insert", "replace", "update") and e.key is not None:
            key = (e.db, e.coll, e.key)
            if e.doc is not None:
                state[key] = e.doc
            if e.op == "update":
                unsure.add(key)
            else:
                unsure.discard(key)
        elif e.op == "delete" and e.key is not None:
            state.pop((e.db, e.coll, e.key), None)
            unsure.discard((e.db, e.coll, e.key))
        elif e.op == "drop":
            state = {k: v for k, v in state.items() if (k[0], k[1]) != (e.db, e.coll)}
        elif e.op == "dropDatabase":
            state = {k: v for k, v in state.items() if k[0] != e.db}
        elif e.op == "rename" and e.to is not None:
            # The target's old documents go; the source's move only if the stream watches the
            # target, else they leave `current` as with a drop (README, "The tables").
            inside = database is None or (e.to[0] == database and collection in (None, e.to[1]))
            moved = {}
            for k, v in state.items():
                if (k[0], k[1]) == e.to:
                    continue
                if (k[0], k[1]) == (e.db, e.coll):
                    if inside:
                        moved[(*e.to, k[2])] = v
                    continue
                moved[k] = v
            state = moved
            unsure = {
                (*e.to, k[2]) if (k[0], k[1]) == (e.db, e.coll) else k
                for k in unsure
                if inside or (k[0], k[1]) != (e.db, e.coll)
            }
    return state, unsure
