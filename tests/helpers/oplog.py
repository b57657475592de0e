"""The oplog made to forget: for tests of a resume point that is no longer in it."""

from __future__ import annotations

import time

from bson import Timestamp
from pymongo import MongoClient

from resources.mongo import oplog_window


def roll_oplog_past(client: MongoClient, ts: Timestamp) -> None:
    """Write to a tiny oplog until its first entry lies after `ts`.

    Truncation happens only after a checkpoint and on a later write, so write, fsync, repeat.
    """
    blob = "x" * 100_000
    for _ in range(60):
        client.shop.filler.insert_many([{"blob": blob} for _ in range(20)])
        client.admin.command("fsync")
        window = oplog_window(client)
        if window and window.first > ts:
            return
        time.sleep(0.5)
    raise AssertionError("the oplog was never truncated past the token")
