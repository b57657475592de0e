"""Resume tokens and cluster times: the typed token, packing, decoding and display.

`ResumeToken` is how every layer above the state store holds a stored token; the packed
integers (`pack_ts`) and the JSON text (`ResumeToken.to_json`) are the state store's columns,
and only `state/` converts to and from them.

A resume token's `_data` is the server's KeyString encoding, whose first field is the event's
cluster time (type byte 0x82, then 4 bytes of seconds and 4 of increment). Reading it lets
status and metrics show the time of any token, postBatchResumeTokens included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from bson import Timestamp, json_util
from bson.json_util import JSONMode, JSONOptions
from bson.raw_bson import RawBSONDocument

CANONICAL = JSONOptions(json_mode=JSONMode.CANONICAL, tz_aware=True)


def pack_ts(ts: Timestamp) -> int:
    """A BSON Timestamp as one sortable 64-bit integer."""
    return (ts.time << 32) | ts.inc


def unpack_ts(value: int) -> Timestamp:
    return Timestamp(value >> 32, value & 0xFFFFFFFF)


def ts_to_datetime(ts: Timestamp | int | None) -> datetime | None:
    if ts is None:
        return None
    if isinstance(ts, int):
        ts = unpack_ts(ts)
    return datetime.fromtimestamp(ts.time, UTC)


def moment_text(moment: datetime | Timestamp | None) -> str:
    """A moment as Tidemark's messages write it: `2026-11-28 19:35:23 UTC`."""
    if isinstance(moment, Timestamp):
        moment = ts_to_datetime(moment)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else "an unknown time"


def datetime_to_ts(moment: datetime) -> Timestamp:
    """The first cluster time at or after `moment` (increments start at 1)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = int(moment.timestamp())
    if seconds < moment.timestamp():
        seconds += 1
    return Timestamp(seconds, 1)


def token_data(token: Mapping[str, Any] | RawBSONDocument | None) -> str | None:
    if token is None:
        return None
    value = token["_data"]
    return value if isinstance(value, str) else None


def token_cluster_time(token: Mapping[str, Any] | str | None) -> Timestamp | None:
    """The cluster time encoded at the start of a token's `_data` (None if not decodable)."""
    data = token if isinstance(token, str) else token_data(token)
    if not data or len(data) < 18 or not data.startswith("82"):
        return None
    try:
        return Timestamp(int(data[2:10], 16), int(data[10:18], 16))
    except ValueError:
        return None


def covered_until(token: Mapping[str, Any] | str | None) -> Timestamp | None:
    """A cluster time such that every event before it has been returned once the stream
    has returned `token` (None if not decodable).

    For an event's token that is its own cluster time (more events may share it: a
    transaction's). A high-water-mark token (a postBatchResumeToken sent when the server
    reached the end of the oplog) holds the last oplog time it read, so events at that time
    are covered too. Its KeyString has the token type 0 (byte 0x29) right after the
    version (0x2B and one byte); events have type 128 (0x2C 0x01 0x00).
    """
    data = token if isinstance(token, str) else token_data(token)
    at = token_cluster_time(data)
    if at is None or data is None:
        return None
    if is_high_water_mark(data):
        return next_tick(at)
    return at


def is_high_water_mark(token: Mapping[str, Any] | str | None) -> bool:
    """True for a high-water-mark token (type 0, byte 0x29, right after the version)."""
    data = token if isinstance(token, str) else token_data(token)
    return data is not None and data[18:20] == "2B" and data[22:24] == "29"


def next_tick(ts: Timestamp) -> Timestamp:
    """The cluster time right after `ts`."""
    return Timestamp(ts.time + 1, 0) if ts.inc == 0xFFFFFFFF else Timestamp(ts.time, ts.inc + 1)


def token_to_json(token: Mapping[str, Any] | RawBSONDocument) -> str:
    """Canonical Extended JSON: lossless, and readable in the state store."""
    return json_util.dumps(token, json_options=CANONICAL)


def token_from_json(text: str) -> dict[str, Any]:
    value = json_util.loads(text, json_options=CANONICAL)
    if not isinstance(value, dict) or "_data" not in value:
        raise ValueError("a resume token is a document with a '_data' field")
    return value


class ResumeToken:
    """A change stream's resume token: the document the server sent, or one read back from
    the state store as its canonical Extended JSON.

    A stored token is decoded on first use (`document`), so a damaged one fails only the run
    that resumes from it, never a status or a reset that merely carries it. Two tokens are
    equal when their canonical JSON is, the form the state store keeps.
    """

    __slots__ = ("_document", "_json")

    def __init__(self, document: Mapping[str, Any] | RawBSONDocument) -> None:
        self._document: Mapping[str, Any] | RawBSONDocument | None = document
        self._json: str | None = None

    @classmethod
    def from_json(cls, text: str) -> ResumeToken:
        """The token stored as `text` (not decoded yet: see `document`)."""
        token = cls.__new__(cls)
        token._document, token._json = None, text
        return token

    @property
    def document(self) -> Mapping[str, Any] | RawBSONDocument:
        """The token as the server takes it (resumeAfter, startAfter).

        Raises:
            ValueError, TypeError: the stored text is not a resume token.
        """
        if self._document is None:
            assert self._json is not None
            self._document = token_from_json(self._json)
        return self._document

    def to_json(self) -> str:
        """Canonical Extended JSON, exactly as stored (the text read back, or the encoding)."""
        if self._json is None:
            assert self._document is not None
            self._json = token_to_json(self._document)
        return self._json

    @property
    def data(self) -> str | None:
        return token_data(self.document)

    @property
    def cluster_time(self) -> Timestamp | None:
        """The cluster time encoded at the start of `_data` (None if not decodable)."""
        return token_cluster_time(self.document)

    @property
    def is_high_water_mark(self) -> bool:
        return is_high_water_mark(self.document)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResumeToken):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"ResumeToken({self.to_json()})"


def optional_token(document: Mapping[str, Any] | RawBSONDocument | None) -> ResumeToken | None:
    """A server's token (None: none yet) as a `ResumeToken`."""
    return ResumeToken(document) if document is not None else None


# -- the deployment a token belongs to -----------------------------------------------------


@dataclass(frozen=True)
class SourceIdentity:
    """Which deployment a resume token (or a cluster time) came from.

    A token from one replica set opens a change stream on another without a word when its
    time lies in the other's oplog, so the checkpoint keeps the deployment it was taken on.
    `id` is the replica set's `replicaSetId` (chosen at `rs.initiate()`, kept for the set's
    life; elections change `electionId` and `topologyVersion`, never it) or, behind mongos, the
    config servers' `clusterId`; None when the user may not read it, and then only the set
    name is compared.
    """

    kind: Literal["replica_set", "sharded"]
    set_name: str | None  # the replica set's name; None behind mongos
    id: str | None  # hex ObjectId: replicaSetId, or the sharded cluster's clusterId

    def describe(self) -> str:
        if self.kind == "sharded":
            return f"the sharded cluster with clusterId {self.id or 'unknown'}"
        return f"replica set {self.set_name!r} (replicaSetId {self.id or 'unknown'})"

    def differs_from(self, current: SourceIdentity) -> bool:
        """True when `current` is surely another deployment than this stored one; a part
        either side could not read is not compared."""
        if self.kind != current.kind:
            return True
        if self.set_name and current.set_name and self.set_name != current.set_name:
            return True
        return bool(self.id and current.id and self.id != current.id)

    def completed_by(self, current: SourceIdentity) -> SourceIdentity:
        """This identity with the parts it lacks taken from `current` (the same deployment)."""
        return SourceIdentity(self.kind, self.set_name or current.set_name, self.id or current.id)
