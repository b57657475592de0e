"""When a checkpoint moves: the resume rules across runs.

`jobs.capture.resume` holds the rules within a run (the drivers' spec: where the reader
resumes after an error). These are the rules between runs: where a drain opens the change
stream from the stored checkpoint, and where the checkpoint stands once the drain's pass is
done. A snapshot's start and `tidemark reset` move it explicitly (`jobs.capture.snapshot`,
`jobs.ops.reset`); a replay never moves it. The drain (`jobs.capture.drain_run`) applies them in
this order:

1. **An invalidate that stops.** A checkpoint at an invalidate, of a stream whose
   `on_invalidate` is `stop`, opens nothing: the run fails with the remedies
   (`check_invalidate`).
2. **Where the stream opens** (`start_options`), from the first of:
   - a stored token: `resumeAfter` it, or `startAfter` it when it is an invalidate's (only
     startAfter opens a stream past one); a token the store cannot decode fails the run;
   - a stored start time (a reset, a snapshot's time T): `startAtOperationTime`;
   - the stream's configured `start` time: `startAtOperationTime`;
   - otherwise nothing: the server starts at its current time ("now").
   The position's cluster time (`position_time`) is what server errors report the position as.
3. **An unflagged invalidate.** Checkpoints committed before closed cursors were detected hold
   an invalidate's token without the flag; the server refuses to resume after it, and the run
   reopens once as if the flag were set (`as_invalidate`), rule 1 included.
4. **Where the checkpoint moves after the pass** (`after_pass`): to the pass's token
   (`capture_pass` rule 2), flagged when the pass ended at an invalidate, with the deployment
   the run reached, except that it stays where it is when
   - the pass returned no token, or the token already stored;
   - a rename replaced a collection stream's collection (with `on_invalidate: continue`): that
     collection's documents were never events of the stream, only a copy has them, and the
     copy moves the position itself when it begins, so a crash in between redoes this;
   - the stream was opened at a snapshot's time T (no token stored), read no event, and
     answered with a high-water mark at exactly T: such a mark comes before any operation at
     T exists and, unlike a mark at an operation's time, does not cover an event at T that
     comes later (the server resumes before one), so the position stays at T until the
     stream has gone past it.
   The pass's batch, if it read events, is committed with the move in one transaction
   (`StateStore.commit_batch`), from the checkpoint's version read under the lease.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from bson import Timestamp

from jobs.capture.capture_pass import Capture
from state import Checkpoint, NewPosition
from tidemark.config import StreamConfig
from tidemark.errors import StateStoreError, StreamInvalidated
from tidemark.tokens import SourceIdentity, datetime_to_ts, moment_text, ts_to_datetime


def check_invalidate(checkpoint: Checkpoint, stream: StreamConfig) -> None:
    """Rule 1: a stream whose checkpoint is an invalidate either stops there or goes on."""
    if checkpoint.token_is_invalidate and stream.on_invalidate == "stop":
        moment = ts_to_datetime(checkpoint.cluster_time)
        when = f"at {moment_text(moment)} " if moment else ""
        raise StreamInvalidated(
            f"Stream {stream.name!r} ended with an invalidate {when}"
            f"({stream.namespace} was dropped or renamed), and "
            "its on_invalidate is 'stop'; everything up to the invalidate is committed.",
            "Set on_invalidate: continue to follow a re-created collection from there; if "
            "another collection was renamed onto it, its documents were never events of the "
            f"stream: then also run `tidemark resnapshot {stream.name}` to copy them. Or "
            f"`tidemark reset {stream.name} --to-now` to start afresh.",
        )


def start_options(checkpoint: Checkpoint, stream: StreamConfig) -> dict[str, Any]:
    """Rule 2: the $changeStream options that open the stream where the checkpoint says.

    Raises:
        StateStoreError: the stored token cannot be decoded.
    """
    if checkpoint.token is not None:
        try:
            token = checkpoint.token.document
        except (ValueError, TypeError) as exc:
            raise StateStoreError(
                f"The checkpoint of stream {stream.name!r} holds a damaged resume token "
                f"({str(exc)[:120]}); nothing was drained.",
                f"Run `tidemark reset {stream.name} --to-time T` with the time to restart from "
                "(see `tidemark status`), or restore the state store from a backup.",
            ) from None
        key = "startAfter" if checkpoint.token_is_invalidate else "resumeAfter"
        return {key: token}
    if checkpoint.start_at_operation_time is not None:
        return {"startAtOperationTime": checkpoint.start_at_operation_time}
    if isinstance(stream.start, datetime):
        return {"startAtOperationTime": datetime_to_ts(stream.start)}
    return {}  # "now": the server starts at the current time


def position_time(checkpoint: Checkpoint, options: dict[str, Any]) -> Timestamp | None:
    """The cluster time of the position the stream opens at (None: "now")."""
    if checkpoint.cluster_time is not None:
        return checkpoint.cluster_time
    return options.get("startAtOperationTime")


def as_invalidate(checkpoint: Checkpoint) -> Checkpoint:
    """Rule 3: the checkpoint with its token flagged as an invalidate's, once the server has
    named it one (the caller re-checks rule 1 and reopens with rule 2)."""
    return replace(checkpoint, token_is_invalidate=True)


@dataclass(frozen=True)
class Move:
    """Where the checkpoint stands after a pass (rule 4)."""

    position: NewPosition | None  # None: the checkpoint stays where it is
    collection_replaced: bool  # a rename replaced the watched collection: a copy is due


def after_pass(
    checkpoint: Checkpoint, got: Capture, stream: StreamConfig, source: SourceIdentity
) -> Move:
    """Rule 4: where `checkpoint` moves once the pass that opened at it consumed `got`."""
    token = got.resume_token
    replaced = stream.on_invalidate == "continue" and got.renamed_into(stream)
    # An unchanged token keeps its flag: a stream opened with startAfter at an invalidate
    # reports that same token until something new arrives.
    ahead = (
        not got.events
        and checkpoint.token is None
        and token is not None
        and token.cluster_time is not None
        and token.cluster_time == checkpoint.start_at_operation_time
        and token.is_high_water_mark
    )
    if token is None or token == checkpoint.token or replaced or ahead:
        return Move(None, replaced)
    position = NewPosition(
        token=token,
        token_is_invalidate=got.invalidated,
        cluster_time=token.cluster_time,
        source=source,
    )
    return Move(position, replaced)
