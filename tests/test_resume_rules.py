"""The change-stream reader's resume rules (jobs/capture/resume.py), one test per rule of the
drivers' change-streams specification, with no server: the state is fed replies and errors as
the reader would feed them. tests/test_change_stream_reader.py runs the same rules against a
real mongod's faults."""

from __future__ import annotations

import pytest
from bson import Timestamp
from pymongo.errors import (
    AutoReconnect,
    ConfigurationError,
    CursorNotFound,
    NetworkTimeout,
    OperationFailure,
)

from jobs.capture.resume import ResumeState

pytestmark = pytest.mark.fast

OPENED_AT = {"_data": "8200000001"}  # a token the stream is opened with
PBRT = {"_data": "82000000FF"}  # a postBatchResumeToken, past every event below
SAVED_TIME = Timestamp(1_700_000_000, 1)  # an aggregate reply's operationTime
GIVEN_TIME = Timestamp(1_600_000_000, 1)
STREAM_OPTIONS = {"fullDocument": "updateLookup"}  # options that are not a start point
WIRE_4_2, WIRE_4_4, WIRE_8_0 = 8, 9, 25


def _events(*ids: str) -> list[dict]:
    return [{"_id": {"_data": i}, "operationType": "insert"} for i in ids]


def _opened(**start) -> ResumeState:
    return ResumeState.opened({**STREAM_OPTIONS, **start})


def _server_error(code: int, labels: tuple[str, ...] = ()) -> OperationFailure:
    return OperationFailure("failed", code, {"ok": 0, "code": code, "errorLabels": list(labels)})


# -- Updating the Cached Resume Token -------------------------------------------------------


@pytest.mark.parametrize("key", ["resumeAfter", "startAfter"])
def test_opening_with_a_token_caches_it(key):
    state = _opened(**{key: OPENED_AT})
    assert (state.token, state.initial_token, state.started_after) == (
        OPENED_AT,
        OPENED_AT,
        key == "startAfter",
    )


@pytest.mark.parametrize("start", [{}, {"startAtOperationTime": GIVEN_TIME}])
def test_opening_without_a_token_caches_none(start):
    state = _opened(**start)
    assert state.token is None and state.initial_token is None


def test_an_empty_reply_caches_its_post_batch_resume_token():
    state = _opened(resumeAfter=OPENED_AT)
    state.replied([], PBRT)
    assert state.token == PBRT and not state.returned_any


def test_an_empty_reply_without_a_post_batch_resume_token_keeps_the_token():
    state = _opened(resumeAfter=OPENED_AT)
    state.replied([], None)
    assert state.token == OPENED_AT and not state.returned_any


def test_after_a_reply_with_events_the_post_batch_resume_token_wins_over_the_last_id():
    state = _opened(resumeAfter=OPENED_AT)
    state.replied(_events("a1", "a2"), PBRT)
    assert state.token == PBRT and state.returned_any


def test_after_a_reply_with_events_and_no_post_batch_resume_token_the_last_id_is_cached():
    state = _opened(resumeAfter=OPENED_AT)
    state.replied(_events("a1", "a2", "a3"), None)
    assert state.token == {"_data": "a3"} and state.returned_any


# -- where the stream stands before its first event (Tidemark's rule) ------------------------


def test_an_empty_first_reply_moves_the_initial_token_to_its_post_batch_resume_token():
    state = _opened(resumeAfter=OPENED_AT)
    state.aggregate_replied([], PBRT, SAVED_TIME, WIRE_8_0)
    assert state.initial_token == PBRT


def test_a_first_reply_with_events_leaves_the_initial_token_where_the_stream_opened():
    """Its postBatchResumeToken lies past events the caller may not take."""
    state = _opened(resumeAfter=OPENED_AT)
    state.aggregate_replied(_events("a1"), PBRT, SAVED_TIME, WIRE_8_0)
    assert state.initial_token == OPENED_AT and state.token == PBRT


def test_only_the_first_aggregate_sets_the_initial_token():
    state = _opened(resumeAfter=OPENED_AT)
    state.aggregate_replied(_events("a1"), None, SAVED_TIME, WIRE_8_0)
    state.aggregate_replied([], PBRT, SAVED_TIME, WIRE_8_0)  # a resume's aggregate
    assert state.initial_token == OPENED_AT


# -- startAtOperationTime -------------------------------------------------------------------


def test_the_first_aggregates_operation_time_is_saved_when_none_was_given():
    state = _opened()
    state.aggregate_replied([], None, SAVED_TIME, WIRE_8_0)
    assert state.operation_time == SAVED_TIME


def test_a_given_start_at_operation_time_is_kept_over_the_replies_operation_time():
    state = _opened(startAtOperationTime=GIVEN_TIME)
    state.aggregate_replied([], None, SAVED_TIME, WIRE_8_0)
    assert state.operation_time == GIVEN_TIME


def test_a_resumes_aggregate_does_not_replace_the_saved_operation_time():
    state = _opened()
    state.aggregate_replied([], None, SAVED_TIME, WIRE_8_0)
    state.aggregate_replied([], None, Timestamp(1_800_000_000, 1), WIRE_8_0)
    assert state.operation_time == SAVED_TIME


# -- Resume Process: the $changeStream options of the next aggregate -------------------------


@pytest.mark.parametrize(
    "start",
    [
        {"resumeAfter": OPENED_AT},
        {"startAfter": OPENED_AT},
        {"startAtOperationTime": GIVEN_TIME},
        {},
    ],
    ids=["resumeAfter", "startAfter", "startAtOperationTime", "now"],
)
def test_the_first_aggregate_sends_the_options_as_given(start):
    options = {**STREAM_OPTIONS, **start}
    assert ResumeState.opened(options).stage_options(options) == options


def test_started_after_and_nothing_returned_yet_resumes_with_start_after_the_cached_token():
    options = {**STREAM_OPTIONS, "startAfter": OPENED_AT}
    state = ResumeState.opened(options)
    state.aggregate_replied([], PBRT, SAVED_TIME, WIRE_8_0)
    assert state.stage_options(options) == {**STREAM_OPTIONS, "startAfter": PBRT}


def test_started_after_and_an_event_returned_resumes_with_resume_after_alone():
    options = {**STREAM_OPTIONS, "startAfter": OPENED_AT}
    state = ResumeState.opened(options)
    state.aggregate_replied(_events("a1"), None, SAVED_TIME, WIRE_8_0)
    assert state.stage_options(options) == {**STREAM_OPTIONS, "resumeAfter": {"_data": "a1"}}


def test_resume_after_resumes_after_the_latest_cached_token():
    options = {**STREAM_OPTIONS, "resumeAfter": OPENED_AT}
    state = ResumeState.opened(options)
    state.aggregate_replied(_events("a1"), None, SAVED_TIME, WIRE_8_0)
    state.replied([], PBRT)
    assert state.stage_options(options) == {**STREAM_OPTIONS, "resumeAfter": PBRT}


def test_a_cached_token_replaces_a_given_start_at_operation_time():
    options = {**STREAM_OPTIONS, "startAtOperationTime": GIVEN_TIME}
    state = ResumeState.opened(options)
    state.aggregate_replied([], PBRT, SAVED_TIME, WIRE_8_0)
    assert state.stage_options(options) == {**STREAM_OPTIONS, "resumeAfter": PBRT}


def test_without_a_token_a_resume_starts_at_the_saved_operation_time():
    """An empty first reply without a postBatchResumeToken (servers before 4.0.7)."""
    state = ResumeState.opened(STREAM_OPTIONS)
    state.aggregate_replied([], None, SAVED_TIME, WIRE_8_0)
    assert state.stage_options(STREAM_OPTIONS) == {
        **STREAM_OPTIONS,
        "startAtOperationTime": SAVED_TIME,
    }


def test_without_a_token_or_a_time_a_resume_sends_the_original_options():
    state = ResumeState.opened(STREAM_OPTIONS)
    state.aggregate_replied([], None, None, WIRE_8_0)
    assert state.stage_options(STREAM_OPTIONS) == STREAM_OPTIONS


def test_consecutive_resumes_without_a_reply_in_between_send_the_same_start():
    options = {**STREAM_OPTIONS, "resumeAfter": OPENED_AT}
    state = ResumeState.opened(options)
    state.aggregate_replied(_events("a1"), PBRT, SAVED_TIME, WIRE_8_0)
    first = state.stage_options(options)
    assert state.stage_options(options) == first == {**STREAM_OPTIONS, "resumeAfter": PBRT}


# -- Resumable Error ------------------------------------------------------------------------

# The spec's table for servers below 4.4, by name, so that a code typed wrong fails here.
LEGACY_CODES = {
    "HostUnreachable": 6,
    "HostNotFound": 7,
    "NetworkTimeout": 89,
    "ShutdownInProgress": 91,
    "PrimarySteppedDown": 189,
    "ExceededTimeLimit": 262,
    "SocketException": 9001,
    "NotWritablePrimary": 10107,
    "InterruptedAtShutdown": 11600,
    "InterruptedDueToReplStateChange": 11602,
    "NotPrimaryNoSecondaryOk": 13435,
    "NotPrimaryOrSecondary": 13436,
    "StaleShardVersion": 63,
    "StaleEpoch": 150,
    "StaleConfig": 13388,
    "RetryChangeStream": 234,
    "FailedToSatisfyReadPreference": 133,
}


def _on(wire_version: int) -> ResumeState:
    state = _opened(resumeAfter=OPENED_AT)
    state.aggregate_replied([], PBRT, SAVED_TIME, wire_version)
    return state


@pytest.mark.parametrize("wire_version", [WIRE_4_2, WIRE_8_0])
@pytest.mark.parametrize(
    "error",
    [AutoReconnect("connection reset"), NetworkTimeout("timed out")],
    ids=["network", "timeout"],
)
def test_an_error_that_is_not_the_servers_is_resumable(error, wire_version):
    assert _on(wire_version).is_resumable(error)


def test_a_client_side_error_is_not_resumable():
    """A resume would repeat it: pymongo's ChangeStream does not resume either."""
    assert not _on(WIRE_8_0).is_resumable(ConfigurationError("bad option"))


@pytest.mark.parametrize("wire_version", [WIRE_4_2, WIRE_8_0])
def test_cursor_not_found_is_resumable_without_a_label(wire_version):
    state = _on(wire_version)
    assert state.is_resumable(CursorNotFound("cursor id 7 not found", 43, {"code": 43}))
    assert state.is_resumable(_server_error(43))


@pytest.mark.parametrize("wire_version", [WIRE_4_4, WIRE_8_0])
def test_from_4_4_on_the_label_alone_decides(wire_version):
    state = _on(wire_version)
    assert state.is_resumable(_server_error(2, ("ResumableChangeStreamError",)))
    assert not state.is_resumable(_server_error(91))  # a legacy code, unlabelled


@pytest.mark.parametrize("name", LEGACY_CODES)
def test_before_4_4_the_specs_codes_are_resumable_unlabelled(name):
    assert _on(WIRE_4_2).is_resumable(_server_error(LEGACY_CODES[name]))


def test_before_4_4_other_codes_are_not_resumable_even_if_labelled():
    state = _on(WIRE_4_2)
    assert not state.is_resumable(_server_error(2, ("ResumableChangeStreamError",)))
    assert not state.is_resumable(_server_error(286))  # ChangeStreamHistoryLost


def test_the_wire_version_is_the_last_aggregates():
    """A resume may land on another server: its wire version decides from then on."""
    state = _on(WIRE_8_0)
    unlabelled = _server_error(LEGACY_CODES["PrimarySteppedDown"])
    assert not state.is_resumable(unlabelled)
    state.aggregate_replied([], PBRT, SAVED_TIME, WIRE_4_2)
    assert state.is_resumable(unlabelled)
