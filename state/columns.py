"""Typed values <-> the state store's columns: the one place a cluster time is packed into an
integer and a resume token written as JSON text (and read back).

The records (`state.records`) carry `bson.Timestamp`s and `ResumeToken`s; the columns keep
what they always kept: a Timestamp as one sortable 64-bit integer (`pack_ts`), a token as its
canonical Extended JSON. A token is read back undecoded (`ResumeToken.from_json`), so its text
round-trips byte for byte and a damaged one fails only the run that resumes from it.
"""

from __future__ import annotations

from typing import Any

from bson import Timestamp

from state.records import NewPosition
from tidemark.tokens import ResumeToken, SourceIdentity, pack_ts, unpack_ts


def ts_column(ts: Timestamp | None) -> int | None:
    """A cluster time as its column (a packed Timestamp)."""
    return pack_ts(ts) if ts is not None else None


def ts_value(column: int | None) -> Timestamp | None:
    """A packed Timestamp column as the cluster time."""
    return unpack_ts(column) if column is not None else None


def token_column(token: ResumeToken | None) -> str | None:
    """A resume token as its column (canonical Extended JSON)."""
    return token.to_json() if token is not None else None


def token_value(column: str | None) -> ResumeToken | None:
    """A token column as the token (decoded on first use)."""
    return ResumeToken.from_json(column) if column is not None else None


def position_columns(position: NewPosition) -> dict[str, Any]:
    """The checkpoint columns `position` sets."""
    columns = {
        "token": token_column(position.token),
        "token_is_invalidate": position.token_is_invalidate,
        "start_at_operation_time": ts_column(position.start_at_operation_time),
        "cluster_time": ts_column(position.cluster_time),
    }
    return {**columns, **source_columns(position.source)} if position.source else columns


def source_columns(source: SourceIdentity) -> dict[str, Any]:
    """The checkpoint columns that record `source`."""
    return {"source_kind": source.kind, "source_set": source.set_name, "source_id": source.id}


def source_value(row: Any) -> SourceIdentity | None:
    """The deployment a checkpoint row records (`source_columns`); None when it records none."""
    if not row.source_kind:
        return None
    return SourceIdentity(row.source_kind, row.source_set, row.source_id)
