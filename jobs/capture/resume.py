"""The change-stream reader's resume state, and the spec's rules for changing it.

The reader (`jobs.capture.reader`) replaces pymongo's ChangeStream, so it keeps what the
drivers' change-streams specification (mongodb/specifications, source/change-streams) says a
change stream remembers in order to resume after an error: the cached resume token, the saved
operation time, whether it was opened with startAfter and has returned anything since, and the
wire version that decides which errors are resumable. Each rule that reads or changes that
state is one method below, headed by the words of the spec section it implements ("Updating the
Cached Resume Token", "startAtOperationTime", "Resume Process", "Resumable Error"). Nothing
here talks to a server: tests/test_resume_rules.py checks every rule without one.

Threads: the state has no lock, because it never has two users at once. The caller's thread
uses it for the initial aggregate, before the reader's getMore thread starts; from then on only
that thread changes it. The caller sees its tokens only as values copied into each reply handed
over the reader's queue, and `initial_token`, which is final before the thread starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo.errors import ConnectionFailure, OperationFailure

CURSOR_NOT_FOUND = 43
# Servers from 4.4 on (wire version 9) label the errors a change stream may resume after.
LABELLED_FROM_WIRE_VERSION = 9
RESUMABLE_LABEL = "ResumableChangeStreamError"
# Older servers (Tidemark supports 4.2, wire version 8) do not: for them the spec's "Resumable
# Error" section lists the codes, copied here in the table's order.
LEGACY_RESUMABLE_CODES = frozenset(
    {
        6,  # HostUnreachable
        7,  # HostNotFound
        89,  # NetworkTimeout
        91,  # ShutdownInProgress
        189,  # PrimarySteppedDown
        262,  # ExceededTimeLimit
        9001,  # SocketException
        10107,  # NotWritablePrimary
        11600,  # InterruptedAtShutdown
        11602,  # InterruptedDueToReplStateChange
        13435,  # NotPrimaryNoSecondaryOk
        13436,  # NotPrimaryOrSecondary
        63,  # StaleShardVersion
        150,  # StaleEpoch
        13388,  # StaleConfig
        234,  # RetryChangeStream
        133,  # FailedToSatisfyReadPreference
    }
)
# The $changeStream options that say where a stream starts; at most one is sent.
START_OPTIONS = ("resumeAfter", "startAfter", "startAtOperationTime")


@dataclass
class ResumeState:
    """Where a change stream resumes after an error, and where it stood before its first event.

    Open one with `opened(options)`; then the reader reports every reply (`aggregate_replied`,
    `replied`) and asks `stage_options` for each aggregate and `is_resumable` for each error.
    """

    token: Any = None  # the spec's cached resumeToken
    operation_time: Timestamp | None = None  # startAtOperationTime, given or saved
    started_after: bool = False  # the stream was opened with startAfter
    returned_any: bool = False  # some reply held an event
    wire_version: int = 0  # of the server the last aggregate ran on
    # Where the caller stands before it takes any event: see `aggregate_replied`.
    initial_token: Any = None
    first_reply_seen: bool = False

    @classmethod
    def opened(cls, options: Mapping[str, Any]) -> ResumeState:
        # Updating the Cached Resume Token: "When the ChangeStream is started: If startAfter
        # is set, cache it. Else if resumeAfter is set, cache it. Else, resumeToken remains
        # unset." (The server refuses both at once, so their order never matters here.)
        token = options.get("startAfter")
        if token is None:
            token = options.get("resumeAfter")
        # Resume Process: the saved operation time is "either from an originally specified
        # startAtOperationTime or saved from the original aggregation".
        return cls(
            token=token,
            operation_time=options.get("startAtOperationTime"),
            started_after="startAfter" in options,
            initial_token=token,
        )

    def aggregate_replied(
        self,
        events: Sequence[Mapping[str, Any]],
        post_batch_token: Any,
        operation_time: Timestamp | None,
        wire_version: int,
    ) -> None:
        """An aggregate (the first or a resume) replied with `events`."""
        # Resumable Error: "the driver MUST use the wire version of the connection used to do
        # the initial aggregate or the getMore that resulted in the error". The getMores run
        # on the cursor's server, the one the last aggregate ran on.
        self.wire_version = wire_version
        # startAtOperationTime: "The ChangeStream MUST save the operationTime from the initial
        # aggregate response when ... None of startAtOperationTime, resumeAfter, startAfter
        # were specified ... The initial aggregate response had no results ... did not include
        # a postBatchResumeToken." Saving it whenever none is saved yet is the same rule: the
        # time is only read while no token is cached, and then all those conditions held.
        if self.operation_time is None:
            self.operation_time = operation_time
        self.replied(events, post_batch_token)
        # Tidemark's rule, not the spec's: where the stream stands before any event is the
        # token just cached only if the first reply is empty. With events in it, its
        # postBatchResumeToken lies past them, so a caller that takes none of them (they are
        # past its end) must stay at the token it opened with, or they would be skipped.
        if not self.first_reply_seen:
            self.first_reply_seen = True
            if not len(events):
                self.initial_token = self.token

    def replied(self, events: Sequence[Mapping[str, Any]], post_batch_token: Any) -> None:
        """An aggregate or a getMore replied with `events`: cache the token after them."""
        # Updating the Cached Resume Token: "When aggregate or getMore returns: If an empty
        # batch was returned and a postBatchResumeToken was included, cache it. When returning
        # a document to the user: If it's the last document in the batch and a
        # postBatchResumeToken is included, cache it. Else, cache the _id of the document."
        # The reader returns each reply whole to its caller, so the rule for its last document
        # is the one that holds once the reply is handed over; the caller keeps the tokens
        # inside a reply itself (capture_pass, rule 2).
        if post_batch_token is not None:
            self.token = post_batch_token
        elif len(events):
            self.token = events[len(events) - 1]["_id"]
        # Resume Process reads "has yet to return a result document" (below).
        if len(events):
            self.returned_any = True

    def stage_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The $changeStream options of the next aggregate: the stream's `options` with the
        start the resume process names (for the first aggregate, the options' own start)."""
        stage = {key: value for key, value in options.items() if key not in START_OPTIONS}
        # Resume Process: "If there is a cached resumeToken: If the ChangeStream was started
        # with startAfter and has yet to return a result document: The driver MUST set
        # startAfter to the cached resumeToken. The driver MUST NOT set resumeAfter. The
        # driver MUST NOT set startAtOperationTime."
        if self.token is not None and self.started_after and not self.returned_any:
            stage["startAfter"] = self.token
        # "Else: The driver MUST set resumeAfter to the cached resumeToken. The driver MUST NOT
        # set startAfter ... MUST NOT set startAtOperationTime."
        elif self.token is not None:
            stage["resumeAfter"] = self.token
        # "Else if there is no cached resumeToken and the ChangeStream has a saved operation
        # time ... The driver MUST set startAtOperationTime to [it]." Its condition "max wire
        # version >= 7" holds for every server Tidemark supports (4.2 on), and the first
        # aggregate, whose wire version is not known yet, must send a given time too.
        elif self.operation_time is not None:
            stage["startAtOperationTime"] = self.operation_time
        # "Else: The driver MUST NOT set resumeAfter, startAfter, or startAtOperationTime.
        # The driver MUST use the original aggregation command to resume."
        return stage

    def is_resumable(self, error: Exception) -> bool:
        """Whether the reader may resume after `error` of a getMore (errors of an aggregate
        never are: the spec's "Only errors on a getMore command may be considered")."""
        # Resumable Error: "Any error encountered which is not a server error (e.g. a timeout
        # error or network error)". pymongo raises ConnectionFailure (AutoReconnect,
        # NetworkTimeout, ...) for those; its other errors are the client's own, which a resume
        # would repeat, and pymongo's own ChangeStream does not resume after them either.
        if isinstance(error, ConnectionFailure):
            return True
        if not isinstance(error, OperationFailure):
            return False
        # "A server error with code 43 (CursorNotFound)"
        if error.code == CURSOR_NOT_FOUND:
            return True
        # "For servers with wire version 9 or higher (server version 4.4 or higher), any server
        # error with the ResumableChangeStreamError error label."
        if self.wire_version >= LABELLED_FROM_WIRE_VERSION:
            return error.has_error_label(RESUMABLE_LABEL)
        # "For servers with wire version less than 9, a server error with one of the following
        # codes" (LEGACY_RESUMABLE_CODES).
        return error.code in LEGACY_RESUMABLE_CODES
