"""Resume tokens and cluster times: a stored token reads back as the same BSON, a token's
cluster time is read from its `_data`, and what it covers depends on its kind."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import bson
import pytest
from bson import Binary, Timestamp
from bson.raw_bson import RawBSONDocument
from hypothesis import given
from hypothesis import strategies as st

from tidemark.tokens import (
    ResumeToken,
    covered_until,
    datetime_to_ts,
    next_tick,
    pack_ts,
    token_cluster_time,
    token_from_json,
    token_to_json,
    ts_to_datetime,
    unpack_ts,
)

pytestmark = pytest.mark.fast

# Cluster times short of the very last second (whose next tick a Timestamp cannot hold).
times = st.builds(Timestamp, st.integers(0, 2**32 - 2), st.integers(0, 2**32 - 1))
hex_text = st.text("0123456789ABCDEF", max_size=40)
tokens = st.fixed_dictionaries(
    {"_data": hex_text}, optional={"_typeBits": st.binary(min_size=1, max_size=4).map(Binary)}
)


def _data(ts: Timestamp, rest: str = "") -> str:
    """A token's `_data` as the server writes it: 0x82, the seconds, the increment, ..."""
    return f"82{ts.time:08X}{ts.inc:08X}{rest}"


@given(times, times)
def test_packed_cluster_times_unpack_and_sort_as_the_times_do(a, b) -> None:
    assert unpack_ts(pack_ts(a)) == a
    assert (pack_ts(a) < pack_ts(b)) == ((a.time, a.inc) < (b.time, b.inc))


@given(times)
def test_the_next_tick_is_the_cluster_time_right_after(ts) -> None:
    assert pack_ts(next_tick(ts)) == pack_ts(ts) + 1


@given(times, hex_text)
def test_a_tokens_cluster_time_is_read_from_its_data(ts, rest) -> None:
    assert token_cluster_time(_data(ts, rest)) == ts
    assert token_cluster_time({"_data": _data(ts, rest)}) == ts


@pytest.mark.parametrize(
    "token",
    [None, "", "82000000010000", "83" + "0" * 16, "82" + "G" * 16, {"_data": 5}],
    ids=["none", "empty", "short", "not a time", "not hex", "not a string"],
)
def test_a_token_without_a_readable_time_has_none(token) -> None:
    assert token_cluster_time(token) is None
    assert covered_until(token) is None


@given(times, st.text("0123456789ABCDEF", min_size=2, max_size=2), hex_text)
def test_an_events_token_covers_its_time_and_a_high_water_mark_all_of_it(ts, version, rest) -> None:
    """An event's token (type 128: 2C 01 00 after the version) leaves later events of its
    cluster time uncovered (a transaction's); a high-water mark (type 0: 29) covers them."""
    assert covered_until(_data(ts, f"2B{version}2C0100{rest}")) == ts
    assert covered_until({"_data": _data(ts, f"2B{version}29{rest}")}) == next_tick(ts)


@given(tokens)
def test_a_stored_token_reads_back_as_the_same_bson(token) -> None:
    """As the server sent it (raw) or decoded: the stored JSON gives back the same bytes."""
    for sent in (token, RawBSONDocument(bson.encode(token))):
        assert bson.encode(token_from_json(token_to_json(sent))) == bson.encode(token)


@pytest.mark.parametrize("text", ['["82AB"]', '"82AB"', '{"data": "82AB"}'])
def test_stored_json_that_is_not_a_token_is_refused(text) -> None:
    with pytest.raises(ValueError, match="a resume token is a document with a '_data' field"):
        token_from_json(text)


def test_stored_text_that_is_not_json_is_refused() -> None:
    with pytest.raises(json.JSONDecodeError):
        token_from_json('{"_data": broken')


@given(tokens, times)
def test_a_typed_token_keeps_its_stored_text_and_equals_the_one_sent(token, ts) -> None:
    """Read back from the store, a token is its stored text (byte for byte) and equals the
    token the server sent; its time and kind are read from its `_data`."""
    token = {**token, "_data": _data(ts, token["_data"])}
    sent = ResumeToken(RawBSONDocument(bson.encode(token)))
    stored = ResumeToken.from_json(sent.to_json())
    assert stored == sent and hash(stored) == hash(sent)
    assert stored.to_json() == token_to_json(token)
    assert bson.encode(stored.document) == bson.encode(token)
    assert (stored.data, stored.cluster_time) == (token["_data"], ts)


def test_a_damaged_stored_token_fails_only_when_it_is_used() -> None:
    """Reading a damaged checkpoint must not fail (status, reset); resuming from it does."""
    stored = ResumeToken.from_json('{"_data": broken')
    assert stored.to_json() == '{"_data": broken'
    with pytest.raises(ValueError):
        _ = stored.document


@given(
    st.datetimes(datetime(1970, 1, 1), datetime(2106, 1, 1))
    | st.datetimes(datetime(1970, 1, 1), datetime(2106, 1, 1), timezones=st.just(UTC))
)
def test_a_start_time_is_the_first_cluster_time_at_or_after_it(moment) -> None:
    """Naive times are UTC; the increment is 1, the first of its second."""
    ts = datetime_to_ts(moment)
    at = ts_to_datetime(ts)
    assert ts.inc == 1 and ts_to_datetime(pack_ts(ts)) == at
    aware = moment.replace(tzinfo=UTC)
    assert aware <= at < aware + timedelta(seconds=1)
