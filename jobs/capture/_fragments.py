"""Events over 16 MB: the fragments `$changeStreamSplitLargeEvent` sends, made whole again.

A server from 6.0.9 (and 7.0) splits an event too large for one BSON document into fragments
when the pipeline ends with that stage. Each fragment holds the event's `_id` (its own resume
token), `splitEvent: {fragment: k, of: n}` and some of the event's top-level fields, in order.

Rules (docs/ARCHITECTURE.md, "Events over 16 MB"):
1. The whole event is rebuilt by merging the fragments' top-level fields in order, without
   `splitEvent`, under the last fragment's `_id` (the event's token: resuming after it resumes
   after the whole event). It is one raw-zone row like any event.
2. Only whole events leave here: the capture pass, its budget and its horizon see events, never
   fragments, so a run can only stop at an event's boundary.
3. A reply that ends mid-event is handed on without the unfinished event, with the token of the
   last whole event before it, and never as "caught up": the pass keeps reading. So a
   fragment's token is never what a pass ends on, and never stored.
4. The reader itself may resume from a fragment's token after a resumable getMore error (it
   resumes from the last token it saw); the server then goes on with the next fragment, and
   the fragments held here complete the event. A stream that starts with a fragment other
   than the first (opened at a fragment's token by someone else) fails: never half an event.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from jobs.bson_buffer import RawDocuments, elements, int32_at
from jobs.capture.reader import Reply
from resources.mongo import RAW_CODEC
from tidemark.errors import FragmentOutOfOrder

# A fragment's marker as it sits in BSON: a document element named splitEvent. A reply whose
# buffer lacks these bytes holds no fragment (the common case: one search, no walk).
_MARKER = b"\x03splitEvent\x00"


def server_splits(client: MongoClient) -> bool:
    """Whether the server has `$changeStreamSplitLargeEvent`: 7.0 and later, and 6.0 from
    6.0.9 (the rapid releases 6.1-6.3 do not)."""
    version = tuple(client.server_info()["versionArray"][:3])
    return version >= (7, 0, 0) or (6, 0, 9) <= version < (6, 1, 0)


@dataclass(frozen=True)
class Fragment:
    """One fragment's place in its event."""

    number: int  # 1-based
    of: int


def fragment_of(raw: bytes, start: int = 0) -> Fragment | None:
    """The `splitEvent` of the event at `start`, None when it is a whole event."""
    for key, bson_type, value, _ in elements(raw, start):
        if key == "splitEvent" and bson_type == 0x03:
            split = RawBSONDocument(raw[value : value + int32_at(raw, value)[0]], RAW_CODEC)
            return Fragment(int(split["fragment"]), int(split["of"]))
    return None


def join_fragments(fragments: list[bytes]) -> bytes:
    """The whole event: the last fragment's `_id`, then every fragment's other top-level
    elements in order (without `_id` and `splitEvent`), copied byte for byte."""
    token = b""
    parts: list[bytes] = []
    for raw in fragments:
        for key, _, value, size in elements(raw):
            element = raw[value - len(key.encode()) - 2 : value + size]
            if key == "_id":
                token = element  # the last one wins
            elif key != "splitEvent":
                parts.append(element)
    body = token + b"".join(parts)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def has_fragments(events: RawDocuments) -> bool:
    if not len(events):
        return False
    start = int(events.starts[0])
    end = int(events.starts[-1] + events.sizes[-1])
    return events.buffer.find(_MARKER, start, end) >= 0


class Reassembler:
    """Holds the fragments of the event being read, across replies (and the reader's
    resumes); `whole` turns each reply into one of whole events (see the rules above)."""

    def __init__(self, token_before: Any) -> None:
        self.pending: list[bytes] = []
        self.token = token_before  # the token after the last whole event handed on

    def whole(self, reply: Reply) -> Reply:
        events = reply.events
        if not self.pending and not has_fragments(events):
            self.token = reply.token_after
            return reply
        out: list[bytes] = []
        for index in range(len(events)):
            start = int(events.starts[index])
            fragment = fragment_of(events.buffer, start)
            raw = events.raw(index)
            if fragment is None:
                if self.pending:
                    self._out_of_order(None)
                out.append(raw)
                continue
            if fragment.number != len(self.pending) + 1:
                self._out_of_order(fragment)
            self.pending.append(raw)
            if fragment.number == fragment.of:
                out.append(join_fragments(self.pending))
                self.pending = []
        whole = RawDocuments.of(out)
        if not self.pending:
            self.token = reply.token_after
            return Reply(whole, reply.token_after, reply.caught_up, reply.closed)
        if reply.closed:
            raise FragmentOutOfOrder(
                "The server closed the change stream in the middle of a split event "
                f"(fragment {len(self.pending)} of its fragments was the last); nothing was "
                "committed.",
                "Run again: the stream resumes before the event.",
            )
        if len(whole):
            self.token = whole[-1]["_id"]
        return Reply(whole, self.token, caught_up=False, closed=False)

    def _out_of_order(self, fragment: Fragment | None) -> None:
        got = f"fragment {fragment.number} of {fragment.of}" if fragment else "a whole event"
        raise FragmentOutOfOrder(
            f"The change stream sent {got} after {len(self.pending)} fragment(s) of a split "
            "event, so a part of the event is missing (a stream opened at a fragment's resume "
            "token starts with its next fragment; Tidemark never stores such a token). "
            "Nothing was committed.",
            "Reset the stream to a time before the event (`tidemark reset STREAM --to-time T`).",
        )


def whole_events(replies: Iterable[Reply], token_before: Any) -> Iterator[Reply]:
    """`replies` with every split event made whole (see `Reassembler`)."""
    reassembler = Reassembler(token_before)
    for reply in replies:
        yield reassembler.whole(reply)
