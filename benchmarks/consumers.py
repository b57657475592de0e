"""The consumers the drain benchmark compares, each run in its own process so that its peak
RSS is its own. Every consumer reads the same oplog range: from a start token to the first
event after an end cluster time, or until it is caught up.

Each returns (events, bytes, seconds). A plain consumer's clock runs from opening its stream
to handling its last event: it only learns it is done from an empty getMore, which waits
maxAwaitTimeMS for nothing, and that wait is not counted. Tidemark's clock runs over the
whole `drain()` (lease, change stream, Parquet, the commit of the token); it needs no such
wait, the postBatchResumeToken telling it that the run's horizon is covered."""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bson import Timestamp, json_util
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

BATCH_SIZE = 1000
MAX_AWAIT_MS = 300


def _watch(client: MongoClient, db: str, coll: str, token: dict, lookup: bool) -> Any:
    kwargs: dict[str, Any] = {
        "resume_after": token,
        "batch_size": BATCH_SIZE,
        "max_await_time_ms": MAX_AWAIT_MS,
    }
    if lookup:
        kwargs["full_document"] = "updateLookup"
    return client[db][coll].watch(**kwargs)


def getmore_ceiling(
    client: MongoClient, db: str, coll: str, token: dict, end: Timestamp
) -> tuple[int, int, float]:
    """aggregate + getMore commands; batches counted, events never decoded."""
    raw = CodecOptions(document_class=RawBSONDocument)
    started = time.perf_counter()
    database = client.get_database(db, codec_options=raw)
    reply = database.command(
        "aggregate",
        coll,
        pipeline=[{"$changeStream": {"resumeAfter": token}}],
        cursor={"batchSize": BATCH_SIZE},
        codec_options=raw,
    )
    cursor = reply["cursor"]
    batch, cursor_id = cursor["firstBatch"], cursor["id"]
    events = nbytes = 0
    finished = time.perf_counter()
    while True:
        for event in batch:  # slices of the reply: no decoding of the events themselves
            events += 1
            nbytes += len(event.raw)
        if batch:
            finished = time.perf_counter()
        if batch and batch[len(batch) - 1]["clusterTime"] > end:
            break
        if not batch and events:
            break
        reply = database.command(
            "getMore",
            cursor_id,
            collection=coll,
            batchSize=BATCH_SIZE,
            maxTimeMS=MAX_AWAIT_MS,
            codec_options=raw,
        )
        batch = reply["cursor"]["nextBatch"]
    database.command("killCursors", coll, cursors=[cursor_id])
    return events, nbytes, finished - started


def pymongo_iteration(
    client: MongoClient, db: str, coll: str, token: dict, end: Timestamp, lookup: bool = False
) -> tuple[int, int, float]:
    """watch() over RawBSONDocument, doing nothing with the events."""
    events = nbytes = 0
    started = finished = time.perf_counter()
    with _watch(client, db, coll, token, lookup) as stream:
        while (event := stream.try_next()) is not None:
            if event["clusterTime"] > end:
                break
            events += 1
            nbytes += len(event.raw)
            finished = time.perf_counter()
    return events, nbytes, finished - started


def naive_json(uri: str, db: str, coll: str, token: dict, end: Timestamp) -> tuple[int, int, float]:
    """What a hand-written consumer often does: dicts, json.dumps per event, JSON lines."""
    client = MongoClient(uri, tz_aware=True)
    events = nbytes = 0
    started = finished = time.perf_counter()
    with (
        tempfile.NamedTemporaryFile("w", suffix=".jsonl") as out,
        _watch(client, db, coll, token, True) as stream,
    ):
        while (event := stream.try_next()) is not None:
            if event["clusterTime"] > end:
                break
            line = json.dumps(event, default=str)
            out.write(line + "\n")
            events += 1
            nbytes += len(line)
            finished = time.perf_counter()
    return events, nbytes, finished - started


def tidemark_drain(
    uri: str, db: str, coll: str, token: dict, lookup: bool, s3: bool = False
) -> tuple[int, int, float]:
    """Tidemark's drain: change stream -> typed Arrow -> Parquet, committed with the token;
    `s3`: the lake on the S3 server AWS_ENDPOINT_URL names (bucket `lake`)."""
    from datetime import timedelta

    from jobs.capture import drain
    from resources.mongo import connect
    from state import NewPosition, StateStore
    from tidemark.config import StreamConfig
    from tidemark.object_path import ObjectPath
    from tidemark.tokens import ResumeToken

    with tempfile.TemporaryDirectory() as work:
        store = StateStore(f"sqlite:///{Path(work) / 'state.db'}")
        stream = StreamConfig(
            name="bench",
            database=db,
            collection=coll,
            batch_size=BATCH_SIZE,
            max_await_time_ms=MAX_AWAIT_MS,
            full_document="updateLookup" if lookup else "default",
            current_table=lookup,
            budget={"max_events": None, "max_bytes": None, "max_seconds": None},
        )
        checkpoint = store.ensure_stream(stream)
        lease = store.acquire_lease(stream.name, "capture", timedelta(minutes=1))
        store.commit_batch(lease, checkpoint.version, None, NewPosition(token=ResumeToken(token)))
        store.release_lease(lease)
        client = connect(uri, raw=True)
        started = time.perf_counter()
        lake = ObjectPath("s3", "lake", f"bench-{uuid.uuid4().hex[:8]}") if s3 else Path(work)
        result = drain(stream, client, store, lake / "lake")
        seconds = time.perf_counter() - started
        store.close()
    return result.events, result.bytes, seconds


def main() -> None:
    name, uri, db, coll, token_json, end_t, end_i = sys.argv[1:8]
    token = json_util.loads(token_json)
    end = Timestamp(int(end_t), int(end_i))
    client = MongoClient(uri, document_class=RawBSONDocument, tz_aware=True)
    if name == "getmore":
        events, nbytes, seconds = getmore_ceiling(client, db, coll, token, end)
    elif name == "pymongo":
        events, nbytes, seconds = pymongo_iteration(client, db, coll, token, end)
    elif name == "pymongo_lookup":
        events, nbytes, seconds = pymongo_iteration(client, db, coll, token, end, lookup=True)
    elif name == "naive_json":
        events, nbytes, seconds = naive_json(uri, db, coll, token, end)
    elif name in ("tidemark", "tidemark_lookup", "tidemark_s3"):
        events, nbytes, seconds = tidemark_drain(
            uri, db, coll, token, lookup=name.endswith("lookup"), s3=name.endswith("s3")
        )
    else:
        raise SystemExit(f"unknown consumer {name}")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "consumer": name,
                "events": events,
                "bytes": nbytes,
                "seconds": seconds,
                "peak_rss_mib": peak_kib / 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
