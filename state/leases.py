"""Leases with fencing: one writer per stream, and a stale writer can never commit.

A lease row per stream and kind (`LeaseKind`: capture, replay, transform) holds its owner, an
expiry and an epoch. Taking a lease over grows the epoch; every commit first *fences*: it
extends the lease only if owner and epoch are still the ones it was granted, inside the
commit's own transaction, so a run whose lease was taken over commits nothing.

This module is the one place that knows how a lease row is named (`lease_name`,
`parse_lease_name`) and how long leases last (the `*_LEASE_TTL` constants). Every function
takes the open transaction's connection; the store opens the transactions.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from state import schema
from state.records import Lease, LeaseKind
from state.schema import utc_now
from tidemark.errors import LeaseHeld, LeaseLost

# Every raw-zone writer (drain, its snapshots, replay) and gc, which holds the writers' leases
# while it sweeps. A drain renews it at a third of this between batches.
CAPTURE_LEASE_TTL = timedelta(minutes=10)
# A transform run: renewed only between its phases (a Spark job cannot stop to renew), so it
# must outlast the longest phase.
TRANSFORM_LEASE_TTL = timedelta(minutes=30)
# `tidemark reset`: held for one short transaction, so a reset that dies blocks the stream for
# a minute at most.
RESET_LEASE_TTL = timedelta(minutes=1)

# Every lease under which files of a stream's raw zone are written (the drain's, which its
# snapshots share, and the replay's): gc holds them all while it sweeps.
RAW_WRITER_KINDS: tuple[LeaseKind, ...] = ("capture", "replay")

# A lease row's name is its kind's prefix and the stream's name. The capture lease is named
# by the stream alone: it was the only lease once, and stores keep these names as they are.
_PREFIX: dict[LeaseKind, str] = {"capture": "", "replay": "replay:", "transform": "transform:"}


def lease_name(stream: str, kind: LeaseKind) -> str:
    """The name of `stream`'s lease of `kind` in the leases table ("orders",
    "replay:orders", "transform:orders")."""
    return _PREFIX[kind] + stream


def parse_lease_name(name: str) -> tuple[str, LeaseKind] | None:
    """The stream and kind a lease row's name stands for; None for a name no kind makes."""
    prefix, colon, stream = name.rpartition(":")  # stream names are slugs: no colon
    for kind, kind_prefix in _PREFIX.items():
        if prefix + colon == kind_prefix:
            return stream, kind
    return None


def acquire(
    conn: Connection, stream: str, kind: LeaseKind, ttl: timedelta, owner: str | None
) -> Lease:
    """Take `stream`'s lease of `kind` for `ttl`, or fail fast.

    1. No row yet: insert one at epoch 1 (a concurrent first taker loses on the primary key).
    2. A row held by a live owner and not expired: refuse.
    3. Otherwise (released, expired, or its holder's process on this host is gone): take it
       over at epoch + 1, only if the epoch is still the one read (compare-and-set).

    Raises:
        LeaseHeld: another run holds the lease.
    """
    host = socket.gethostname()
    pid = os.getpid()
    owner = owner or f"{host}:{pid}:{uuid.uuid4().hex[:8]}"
    now = utc_now()
    leases = schema.leases
    name = lease_name(stream, kind)
    row = conn.execute(select(leases).where(leases.c.stream == name).with_for_update()).first()
    if row is None:
        try:
            with conn.begin_nested():
                conn.execute(
                    insert(leases).values(
                        stream=name,
                        owner=owner,
                        host=host,
                        pid=pid,
                        epoch=1,
                        acquired_at=now,
                        expires_at=now + ttl,
                    )
                )
        except IntegrityError:
            raise _held(stream, kind, None) from None
        return Lease(stream, kind, owner, 1)
    if row.owner is not None and row.expires_at > now and not _dead_local(row.host, row.pid):
        raise _held(stream, kind, row)
    done = conn.execute(
        update(leases)
        .where(leases.c.stream == name, leases.c.epoch == row.epoch)
        .values(
            owner=owner,
            host=host,
            pid=pid,
            epoch=row.epoch + 1,
            acquired_at=now,
            expires_at=now + ttl,
        )
    )
    if done.rowcount != 1:
        raise _held(stream, kind, row)
    return Lease(stream, kind, owner, row.epoch + 1)


def fence(conn: Connection, lease: Lease, ttl: timedelta) -> None:
    """Extend `lease` by `ttl` from now if it is still this run's; the first step of a commit.

    Raises:
        LeaseLost: the lease was taken over (or released); the caller's transaction must not
            commit, and does not when this is raised inside it.
    """
    leases = schema.leases
    done = conn.execute(
        update(leases)
        .where(
            leases.c.stream == lease_name(lease.stream, lease.kind),
            leases.c.epoch == lease.epoch,
            leases.c.owner == lease.owner,
        )
        .values(expires_at=utc_now() + ttl)
    )
    if done.rowcount != 1:
        raise LeaseLost(
            f"This run's {lease.kind} lease on stream {lease.stream!r} (epoch {lease.epoch}) "
            "was taken over by another run, so its commit was refused and its checkpoint not "
            "moved.",
            "Nothing is lost: the other run drains the same events. If runs keep losing "
            "their lease, raise the lease time or lower the run budget.",
        )


def release(conn: Connection, lease: Lease) -> None:
    """Give the lease up, unless it was taken over meanwhile (then it is not ours to free)."""
    leases = schema.leases
    conn.execute(
        update(leases)
        .where(
            leases.c.stream == lease_name(lease.stream, lease.kind),
            leases.c.epoch == lease.epoch,
        )
        .values(owner=None, expires_at=utc_now())
    )


# What the holder of a lease of each kind is doing, as a held lease's message says it.
_WORK: dict[LeaseKind, tuple[str, str]] = {
    "capture": ("drain", "drained"),
    "transform": ("transform", "transformed"),
    "replay": ("replay", "replayed"),
}


def _held(stream: str, kind: LeaseKind, row: Any) -> LeaseHeld:
    verb, done = _WORK[kind]
    who = f" by {row.owner} since {row.acquired_at:%Y-%m-%d %H:%M:%S} UTC" if row else ""
    until = f", until {row.expires_at:%H:%M:%S} UTC at the latest" if row else ""
    return LeaseHeld(
        f"Stream {stream!r} is being {done} by another run (lease held{who}{until}); "
        f"two runs of one stream never {verb} at once.",
        "Wait for that run to finish. If it died on another host, its lease expires by "
        "itself; a run that died on this host is detected and taken over automatically.",
    )


def _dead_local(host: str | None, pid: int | None) -> bool:
    """True for a holder on this host whose process is gone (crashed or killed)."""
    if host != socket.gethostname() or not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state == "Z"


def lease_rows(conn: Connection) -> list[dict[str, Any]]:
    """Every lease row (name, owner, acquired_at, expires_at): a released lease keeps when it
    was taken and, as its expiry, when it was given up, so it tells how long its last holder
    ran. The name is the row's, as stored: `parse_lease_name` tells its stream and kind."""
    leases = schema.leases
    query = select(leases.c.stream, leases.c.owner, leases.c.acquired_at, leases.c.expires_at)
    return [dict(row._mapping) for row in conn.execute(query)]
