"""Drain benchmark: Tidemark's drain against the raw pymongo drain, on the same oplog range.

    .venv/bin/python -m benchmarks.drain                 # the issue's sizes (330k events)
    .venv/bin/python -m benchmarks.drain --inserts 2000 --updates 1000 --replaces 100 \
        --deletes 200 --repeats 1 --memory 2000,5000     # a quick smoke run

Starts its own mongod (one-node replica set, an oplog sized for the workload), writes a seeded
workload, then measures every consumer over the same range, each in its own process, the
rounds interleaved; prints markdown tables (median and range of events/s, MB/s, peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bson import json_util
from pymongo import MongoClient, ReplaceOne, UpdateOne

from resources.embedded_mongo import start_mongod, stop_mongod
from resources.embedded_s3 import start_s3, stop_s3
from resources.mongo import cluster_time

ROOT = Path(__file__).resolve().parent.parent
S3_KEYS = {"AWS_ACCESS_KEY_ID": "tidemark-bench", "AWS_SECRET_ACCESS_KEY": "tidemark-bench-secret"}
CONSUMERS = [
    "getmore",
    "pymongo",
    "tidemark",
    "tidemark_s3",
    "pymongo_lookup",
    "tidemark_lookup",
    "naive_json",
]
LABELS = {
    "getmore": "aggregate/getMore commands, batches counted, never decoded (server ceiling)",
    "pymongo": "pymongo `watch()` iterating RawBSONDocument, doing nothing",
    "tidemark": "**Tidemark drain**: typed Arrow -> Parquet -> commit with the token",
    "tidemark_s3": "**Tidemark drain, lake on S3** (SeaweedFS on loopback, pyarrow's S3)",
    "pymongo_lookup": "pymongo `watch()`, `full_document=updateLookup`",
    "tidemark_lookup": "**Tidemark drain**, `full_document=updateLookup`",
    "naive_json": "pymongo dicts + `json.dumps` per event to JSON lines (updateLookup)",
}


def document(rng: random.Random, n: int, filler: int) -> dict[str, Any]:
    return {
        "_id": n,
        "customer": {
            "name": f"customer {rng.randint(1, 10**6)}",
            "tier": rng.choice("ABC"),
            "address": {"city": f"city {rng.randint(1, 500)}", "zip": rng.randint(10**4, 10**5)},
        },
        "items": [
            {
                "sku": f"SKU-{rng.randint(1, 9999):04d}",
                "qty": rng.randint(1, 9),
                "price": rng.random() * 100,
            }
            for _ in range(4)
        ],
        "status": "new",
        "notes": "x" * filler,
    }


def write_workload(client: MongoClient, db: str, coll: str, args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    target = client[db][coll]
    filler = max(0, int(args.doc_kb * 1024) - 420)
    for start in range(0, args.inserts, 1000):
        target.insert_many(
            [document(rng, n, filler) for n in range(start, min(start + 1000, args.inserts))],
            ordered=False,
        )
    ids = list(range(args.inserts))
    for chunk in range(0, args.updates, 1000):
        target.bulk_write(
            [
                UpdateOne(
                    {"_id": rng.choice(ids)}, {"$set": {"status": "paid"}, "$inc": {"rev": 1}}
                )
                for _ in range(min(1000, args.updates - chunk))
            ],
            ordered=False,
        )
    for chunk in range(0, args.replaces, 1000):
        target.bulk_write(
            [
                ReplaceOne({"_id": n}, document(rng, n, filler))
                for n in rng.sample(ids, min(1000, args.replaces - chunk))
            ],
            ordered=False,
        )
    doomed = rng.sample(ids, args.deletes)
    for chunk in range(0, len(doomed), 1000):
        target.delete_many({"_id": {"$in": doomed[chunk : chunk + 1000]}})


def prepare(client: MongoClient, db: str, coll: str, args: argparse.Namespace) -> tuple[str, Any]:
    """Write the workload; returns the start token (JSON) and the end cluster time."""
    with client[db][coll].watch(max_await_time_ms=100) as stream:
        stream.try_next()
        token = stream.resume_token
    write_workload(client, db, coll, args)
    return json_util.dumps(token), cluster_time(client)


def consume(name: str, uri: str, db: str, coll: str, token: str, end: Any) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.consumers",
            name,
            uri,
            db,
            coll,
            token,
            str(end.time),
            str(end.inc),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"consumer {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_range(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    low, mid, high = (format(v, fmt) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} ({low}-{high})"


def throughput_table(results: dict[str, list[dict[str, Any]]]) -> str:
    base = statistics.median(r["events"] / r["seconds"] for r in results["pymongo"])
    lines = [
        "| consumer | events | events/s | MB/s | peak RSS (MiB) | x pymongo iteration |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in CONSUMERS:
        runs = results.get(name)
        if not runs:
            continue
        rates = [r["events"] / r["seconds"] for r in runs]
        mbs = [r["bytes"] / r["seconds"] / 1e6 for r in runs]
        rss = [r["peak_rss_mib"] for r in runs]
        lines.append(
            f"| {LABELS[name]} | {runs[0]['events']:,} | {median_range(rates, ',.0f')} | "
            f"{median_range(mbs, '.1f')} | {median_range(rss, '.0f')} | "
            f"{statistics.median(rates) / base:.2f} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> str:
    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-") as work:
        events_total = args.inserts + args.updates + args.replaces + args.deletes
        biggest = max([events_total, *args.memory])
        oplog_mb = max(1024, int(biggest * args.doc_kb * 2.2 / 1024) + 512)
        mongod = start_mongod(Path(work) / "data", oplog_size_mb=oplog_mb)
        # The S3 row's store: a real S3 server on loopback; the consumers' processes find it
        # by the standard variables, as a deployment's would.
        (Path(work) / "s3").mkdir()
        s3 = start_s3(Path(work) / "s3", credentials=S3_KEYS)
        os.environ.update(S3_KEYS | {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": "us-east-1"})
        try:
            client = MongoClient(mongod.uri, tz_aware=True)
            print(
                f"mongod 6.0 on port {mongod.port}, oplog {oplog_mb} MB; writing the workload "
                f"({events_total:,} events) ...",
                file=sys.stderr,
                flush=True,
            )
            token, end = prepare(client, "bench", "orders", args)
            results: dict[str, list[dict[str, Any]]] = {n: [] for n in CONSUMERS}
            for round_number in range(args.repeats):
                for name in CONSUMERS:  # interleaved: each round runs every consumer once
                    result = consume(name, mongod.uri, "bench", "orders", token, end)
                    results[name].append(result)
                    print(
                        f"round {round_number + 1}: {name}: {result['events']:,} events, "
                        f"{result['events'] / result['seconds']:,.0f}/s",
                        file=sys.stderr,
                        flush=True,
                    )
            counts = {n: {r["events"] for r in rs} for n, rs in results.items()}
            assert all(c == {events_total} for c in counts.values()), counts
            out.append(
                f"### Drain throughput ({events_total:,} events: {args.inserts:,} "
                f"inserts of ~{args.doc_kb} KB, {args.updates:,} updates, "
                f"{args.replaces:,} replaces, {args.deletes:,} deletes; median of "
                f"{args.repeats}, range in brackets)\n"
            )
            out.append(throughput_table(results))
            out.append("\n" + s3_ratio(results))
            out.append("\n" + memory_table(client, mongod.uri, args))
            out.append("\n" + fixed_cost_table(mongod.uri, token, end))
            client.close()
        finally:
            stop_mongod(mongod)
            stop_s3(s3)
    return "\n".join(out)


def s3_ratio(results: dict[str, list[dict[str, Any]]]) -> str:
    def rate(name: str) -> float:
        return statistics.median(r["events"] / r["seconds"] for r in results[name])

    return (
        f"Lake on S3 / lake on local disk, the same drain: "
        f"{rate('tidemark_s3') / rate('tidemark'):.2f}x (goal >= 0.8x)"
    )


def memory_table(client: MongoClient, uri: str, args: argparse.Namespace) -> str:
    lines = [
        "### Peak RSS against the number of events (Tidemark drain, inserts only)\n",
        "| events | seconds | events/s | peak RSS (MiB) |",
        "|---:|---:|---:|---:|",
    ]
    for size in args.memory:
        coll = f"memory_{size}"
        sized = argparse.Namespace(
            **{**vars(args), "inserts": size, "updates": 0, "replaces": 0, "deletes": 0}
        )
        print(f"memory: writing {size:,} inserts ...", file=sys.stderr, flush=True)
        token, end = prepare(client, "bench", coll, sized)
        result = consume("tidemark", uri, "bench", coll, token, end)
        assert result["events"] == size, result
        lines.append(
            f"| {size:,} | {result['seconds']:.1f} | "
            f"{result['events'] / result['seconds']:,.0f} | {result['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def fixed_cost_table(uri: str, token: str, end: Any) -> str:
    """A drain that finds nothing: from start to the committed postBatchResumeToken.

    Two cases: nothing was written anywhere since the last run (the aggregate's own
    postBatchResumeToken covers the horizon), and a quiet collection in a database that is
    written to (the server reads past the other writes, finds nothing for this stream and
    waits maxAwaitTimeMS before it answers)."""
    from datetime import timedelta

    from jobs.capture import drain
    from resources.mongo import connect
    from state import NewPosition, StateStore
    from tidemark.config import StreamConfig
    from tidemark.tokens import ResumeToken

    cases = {"nothing written since the last run": [], "other collections written to": []}
    with tempfile.TemporaryDirectory() as work:
        store = StateStore(f"sqlite:///{Path(work) / 'state.db'}")
        raw = connect(uri, raw=True)
        stream = StreamConfig(
            name="quiet", database="bench", collection="quiet", max_await_time_ms=1000
        )
        checkpoint = store.ensure_stream(stream)
        lease = store.acquire_lease("quiet", "capture", timedelta(minutes=1))
        store.commit_batch(
            lease, checkpoint.version, None, NewPosition(token=ResumeToken.from_json(token))
        )
        store.release_lease(lease)
        drain(stream, raw, store, Path(work) / "lake")  # catch up with the workload, untimed
        for case, timings in cases.items():
            for _ in range(5):
                if case.startswith("other"):
                    raw["bench"]["busy"].insert_one({"at": time.time()})
                started = time.perf_counter()
                result = drain(stream, raw, store, Path(work) / "lake")
                timings.append(time.perf_counter() - started)
                assert result.events == 0 and result.stop_reason == "caught_up"
        raw.close()
        store.close()
    lines = [
        "### Fixed cost: a drain that finds nothing (max_await_time_ms = 1000)\n",
        "| case | runs | median seconds | min | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for case, timings in cases.items():
        lines.append(
            f"| {case} | {len(timings)} | {statistics.median(timings):.3f} | "
            f"{min(timings):.3f} | {max(timings):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inserts", type=int, default=200_000)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--replaces", type=int, default=10_000)
    parser.add_argument("--deletes", type=int, default=20_000)
    parser.add_argument("--doc-kb", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--memory",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[100_000, 1_000_000],
        help="event counts for the RSS table",
    )
    args = parser.parse_args(argv)
    print(run(args))


if __name__ == "__main__":
    main()
