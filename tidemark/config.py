"""The streams config: one YAML file, validated with pydantic, one entry per change stream.

A stream's *fingerprint* covers everything its resume tokens depend on (scope, pipeline and
the change-stream options). A checkpoint stores it; a stream whose fingerprint changed refuses
to resume until an operator runs `tidemark reset`.

Long because the file is read two ways that share its parsing and its messages: strictly
(`load_config`, every entry valid) and entry by entry (`load_streams`, a broken stream reported
while the others load).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from bson import json_util
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from tidemark.errors import ConfigError, TidemarkError, UnknownStream, WebhookUrlUnset
from tidemark.field_exclusion import exclusion_stages, outermost, removed_by_stages
from tidemark.pipeline_stages import fold_problem, stage_problem

# A stream's name starts its Dagster names (`<name>_sync`, `<name>__replay`, ...): with no
# `__` inside, no `_` at its end (the pattern) and not Tidemark's own prefix, no two streams'
# names meet and none meets Tidemark's (`tidemark_gc_schedule`): `a`'s op `a__replay` was
# `a_`'s job.
SLUG_PATTERN = r"^[a-z](?:[a-z0-9]|_[a-z0-9])*$"
SLUG_MAX = 63
RESERVED_PREFIX = "tidemark"

Scope = Literal["collection", "database", "cluster"]
_DB_FORBIDDEN = '/\\. "$*<>:|?\x00'
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-?LW#]+")


class Budget(BaseModel):
    """Per-run limits: a run stops at the first one reached and commits what it drained."""

    model_config = ConfigDict(extra="forbid")

    max_events: Annotated[int, Field(gt=0)] | None = 1_000_000
    max_bytes: Annotated[int, Field(gt=0)] | None = 1 << 30
    max_seconds: Annotated[float, Field(gt=0)] | None = 300.0


def check_cron(value: str) -> str:
    # Shape only (Dagster validates fully when it builds the schedule): five fields.
    fields = value.split()
    if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise ValueError(f"{value!r} is not a cron expression, e.g. '*/5 * * * *'")
    return value


class Replay(BaseModel):
    """The time-window partitions of the backfill-by-operation-time asset."""

    model_config = ConfigDict(extra="forbid")

    cron: str = "0 * * * *"  # one partition per hour; "0 0 * * *" for days
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC)

    @field_validator("start")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        return check_cron(value)


class Checks(BaseModel):
    """Thresholds of the asset checks (seconds)."""

    model_config = ConfigDict(extra="forbid")

    lag_warn_seconds: Annotated[float, Field(gt=0)] = 15 * 60
    lag_error_seconds: Annotated[float, Field(gt=0)] = 60 * 60
    headroom_warn_seconds: Annotated[float, Field(gt=0)] = 24 * 3600
    headroom_error_seconds: Annotated[float, Field(gt=0)] = 3 * 3600


class Compaction(BaseModel):
    """When the newest version of `current` is rewritten as one base (see jobs.transform.compact):
    once its deltas hold `delta_ratio` times the base's rows, or number `max_deltas`."""

    model_config = ConfigDict(extra="forbid")

    delta_ratio: Annotated[float, Field(gt=0)] = 0.5
    max_deltas: Annotated[int, Field(ge=1)] = 50


class StreamConfig(BaseModel):
    """One change stream: what it watches, how, and how much one run may drain."""

    # `schema` in the file, `schema_policy` in code (pydantic's own `schema` is taken).
    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)

    name: Annotated[str, Field(pattern=SLUG_PATTERN, max_length=SLUG_MAX)]
    database: Annotated[str, Field(min_length=1)] | None = None
    collection: Annotated[str, Field(min_length=1)] | None = None
    pipeline: list[dict[str, Any]] = Field(default_factory=list)
    # Dotted paths removed from every document of every event and from snapshot rows, on the
    # server, before anything is written (tidemark.field_exclusion.exclusion_stages).
    exclude_fields: list[str] = Field(default_factory=list)
    full_document: Literal["default", "updateLookup", "whenAvailable", "required"] = "updateLookup"
    full_document_before_change: Literal["off", "whenAvailable", "required"] = "off"
    show_expanded_events: bool = False
    # Events over 16 MB (a large document with pre- and post-images): split by the server
    # ($changeStreamSplitLargeEvent, MongoDB 6.0.9+ / 7.0+) and joined again into one event;
    # on a server without the stage such an event stops the stream with a clear error.
    split_large_events: bool = True
    batch_size: Annotated[int, Field(gt=0, le=100_000)] = 1000
    max_await_time_ms: Annotated[int, Field(gt=0, le=60_000)] = 1000
    budget: Budget = Field(default_factory=Budget)
    start: Literal["now", "snapshot"] | datetime = "now"
    on_history_lost: Literal["fail", "resnapshot"] = "fail"
    # After an invalidate (the collection dropped or renamed, or the database dropped):
    # continue opens the stream again with startAfter and follows a re-created collection.
    on_invalidate: Literal["stop", "continue"] = "continue"
    snapshot_chunk_size: Annotated[int, Field(gt=0, le=1_000_000)] = 5000
    # A chunk also ends before this many bytes of documents (one larger document is a chunk of
    # its own): chunks of large documents would otherwise run out of memory on every retry.
    snapshot_chunk_bytes: Annotated[int, Field(gt=0)] = 64 << 20
    current_table: bool = True  # fold into the versioned current-state table
    # What a run does with a document field its collection's `current` lacks, or a field whose
    # type changes: `evolve` adds the column or widens it (the README's rule), `freeze` fails
    # the run before `current` changes, naming the fields (the key is `schema` in the file).
    schema_policy: Literal["evolve", "freeze"] = Field("evolve", alias="schema")
    keep_versions: Annotated[int, Field(ge=1, le=1000)] = 5
    # A collection's `current` (and the stream's `removed`) gets Delta's deletion vectors once
    # its live files reach this many bytes (0: from its first commit); see the README.
    deletion_vectors_from_bytes: Annotated[int, Field(ge=0)] = 16 << 20
    compaction: Compaction = Field(default_factory=Compaction)
    schedule: str = "*/5 * * * *"  # cron of the Dagster schedule
    replay: Replay = Field(default_factory=Replay)
    checks: Checks = Field(default_factory=Checks)

    @field_validator("start")
    @classmethod
    def _start_is_utc(cls, value: str | datetime) -> str | datetime:
        if isinstance(value, datetime):
            if value.tzinfo is None:
                return value.replace(tzinfo=UTC)
            return value.astimezone(UTC)
        return value

    @field_validator("pipeline")
    @classmethod
    def _pipeline_keeps_id(cls, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, stage in enumerate(stages):
            problem = stage_problem(stage)
            if problem:
                raise ValueError(f"stage {index} ({json.dumps(stage, default=str)}): {problem}")
        return stages

    @field_validator("exclude_fields")
    @classmethod
    def _excludable_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            segments = path.split(".")
            problem = None
            if "" in segments:
                problem = "it has an empty segment (write dotted paths like address.street)"
            elif "$" in path or "\x00" in path:
                problem = "it contains '$' or a null character: name fields, not operators"
            elif segments[0] == "_id":
                problem = "_id keys every row of current and cannot be removed"
            elif any(s.isdigit() for s in segments):
                problem = (
                    "an array position cannot be excluded: name the field, the exclusion "
                    "follows arrays (contacts.phone removes phone from every element)"
                )
            if problem:
                raise ValueError(f"exclude_fields entry {path!r}: {problem}")
        # The server refuses a $unset of a path and one under it, or of one path twice ("Path
        # collision"): the stream would never open.
        for index, path in enumerate(paths):
            for other in paths[:index]:
                if path == other:
                    raise ValueError(f"exclude_fields lists {path!r} twice: list it once")
                outer, inner = sorted((path, other), key=len)
                if inner.startswith(outer + "."):
                    raise ValueError(
                        f"exclude_fields entry {inner!r} lies under {outer!r}, which removes "
                        f"it already: list {outer!r} alone"
                    )
        return paths

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value.startswith(RESERVED_PREFIX):
            raise ValueError(
                f"{value!r} starts with {RESERVED_PREFIX!r}, which Tidemark's own Dagster names "
                "use (the job tidemark_gc): choose another stream name"
            )
        return value

    @field_validator("database")
    @classmethod
    def _database_name(cls, value: str | None) -> str | None:
        bad = sorted(set(value or "") & set(_DB_FORBIDDEN))
        if value is not None and (bad or len(value.encode()) > 63):
            raise ValueError(
                f"{value!r} is not a valid MongoDB database name: it may not contain "
                f"{' '.join(repr(c) for c in bad) or 'more than 63 bytes'}"
            )
        return value

    @field_validator("collection")
    @classmethod
    def _collection_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        problem = None
        if "\x00" in value or "$" in value:
            problem = "it may not contain '$' or a null character"
        elif value.startswith(".") or value.endswith(".") or ".." in value:
            problem = "it may not start or end with '.' or contain '..'"
        elif value.startswith("system."):
            problem = "names starting with 'system.' are MongoDB's own"
        if problem:
            raise ValueError(f"{value!r} is not a valid MongoDB collection name: {problem}")
        return value

    @model_validator(mode="after")
    def _collection_needs_database(self) -> StreamConfig:
        if self.collection is not None and self.database is None:
            raise ValueError("'collection' is set but 'database' is not: name the database too")
        return self

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        return check_cron(value)

    @model_validator(mode="after")
    def _current_needs_post_images(self) -> StreamConfig:
        if self.current_table and self.full_document == "default":
            raise ValueError(
                "this stream feeds the current-state table, which needs the document after each "
                "update: set full_document to updateLookup (or required with pre- and "
                "post-images enabled on the collection), or set current_table: false"
            )
        if self.current_table and self.full_document == "whenAvailable":
            # An update whose post-image is missing (images not enabled, or expired) carries
            # no document: `current` would keep the old one without a word.
            raise ValueError(
                "full_document: whenAvailable gives updates without the document when no "
                "post-image is available, and the current-state table would silently keep the "
                "old document: set full_document to required (with pre- and post-images enabled "
                "on the collection) or updateLookup, or set current_table: false"
            )
        return self

    @model_validator(mode="after")
    def _current_needs_its_events(self) -> StreamConfig:
        # Deletes and namespace events pass every $match while current_table is on
        # (pipeline_stages.capture_pipeline); a stage Tidemark cannot widen is refused.
        problem = fold_problem(self.pipeline) if self.current_table else None
        if problem:
            raise ValueError(problem)
        return self

    @property
    def scope(self) -> Scope:
        if self.collection is not None:
            return "collection"
        return "database" if self.database is not None else "cluster"

    @property
    def namespace(self) -> str:
        """Human-readable: `db.coll`, `db.*` or `*` (the whole cluster)."""
        if self.scope == "collection":
            return f"{self.database}.{self.collection}"
        return f"{self.database}.*" if self.scope == "database" else "*"

    def token_definition(self) -> dict[str, Any]:
        """Everything a resume token of this stream depends on, in a stable form."""
        return {
            "scope": self.scope,
            "database": self.database,
            "collection": self.collection,
            "pipeline": self.pipeline,
            "full_document": self.full_document,
            "full_document_before_change": self.full_document_before_change,
            "show_expanded_events": self.show_expanded_events,
            # The token of a split event resumes only with the split stage (the server's
            # ChangeStreamFatalError). Only the non-default value is named, so the
            # fingerprints of streams defined before the option stay as they were.
            **({} if self.split_large_events else {"split_large_events": False}),
            # What the server is asked for: named only when set, as above.
            **({"exclude_fields": self.exclude_fields} if self.exclude_fields else {}),
        }

    def fingerprint(self) -> str:
        return definition_fingerprint(self.token_definition())

    def mongo_pipeline(self) -> list[dict[str, Any]]:
        """The pipeline as BSON-ready values: Extended JSON forms such as {"$date": ...} decoded,
        followed by the stages that remove `exclude_fields` and the paths the pipeline itself
        removes from an image, from every document field of the event
        (`field_exclusion.removed_by_stages`)."""
        pipeline: list[dict[str, Any]] = json_util.loads(json.dumps(self.pipeline))
        removed = outermost([*self.exclude_fields, *removed_by_stages(pipeline)])
        return [*pipeline, *exclusion_stages(removed)]


# `${NAME}` in a notification setting: the value of the environment variable NAME, read when a
# message is sent, so a secret webhook URL stays out of the file (and of every log line).
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Notifications(BaseModel):
    """Where run and check failures are posted (a Slack-compatible incoming webhook)."""

    model_config = ConfigDict(extra="forbid")

    # An http(s) URL or a `${VARIABLE}` reference (the URL of a webhook is its credential).
    webhook_url: Annotated[str, Field(min_length=1)]
    # The Dagster UI's base URL, e.g. http://dagster.example.com: messages then link the run.
    ui_url: str | None = None
    # The least severity of a failed check that is posted: error, or warn for both.
    check_severity: Literal["error", "warn"] = "error"
    timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 5.0

    @field_validator("webhook_url", "ui_url")
    @classmethod
    def _url_or_reference(cls, value: str | None) -> str | None:
        # The message never repeats the value: it may be the secret itself.
        if value is None or _ENV_REFERENCE.search(value):
            return value
        if not re.match(r"https?://[^/\s]+", value):
            raise ValueError("must be an http(s):// URL or a ${VARIABLE} reference")
        return value

    def resolved_webhook_url(self, environ: dict[str, str] | None = None) -> str:
        """The webhook URL with each `${VARIABLE}` replaced by its value.

        Raises:
            WebhookUrlUnset: a variable it names is unset or empty, or the result is no URL.
        """
        env = os.environ if environ is None else environ
        unset = [n for n in _ENV_REFERENCE.findall(self.webhook_url) if not env.get(n)]
        if unset:
            raise WebhookUrlUnset(
                f"notifications.webhook_url names the environment variable {unset[0]}, which "
                "is not set here: failures are not posted.",
                f"Set {unset[0]} to the webhook's URL where Dagster's daemon and code server "
                "run, or write the URL into the streams file.",
            )
        url = _ENV_REFERENCE.sub(lambda m: env[m.group(1)], self.webhook_url)
        if not re.match(r"https?://[^/\s]+", url):
            names = ", ".join(_ENV_REFERENCE.findall(self.webhook_url))
            raise WebhookUrlUnset(
                f"notifications.webhook_url (from {names}) is not an http(s):// URL: failures "
                "are not posted.",
                "Set the variable to the webhook's full URL, e.g. https://hooks.slack.com/...",
            )
        return url


class TidemarkConfig(BaseModel):
    """The whole streams file."""

    model_config = ConfigDict(extra="forbid")

    streams: list[StreamConfig] = Field(min_length=1)
    notifications: Notifications | None = None

    @field_validator("streams")
    @classmethod
    def _unique_names(cls, streams: list[StreamConfig]) -> list[StreamConfig]:
        seen: set[str] = set()
        for stream in streams:
            if stream.name in seen:
                raise ValueError(f"stream name {stream.name!r} is used twice: names must be unique")
            seen.add(stream.name)
        return streams

    # Entries of the streams file that did not validate, by name (see `load_streams`).
    _broken: dict[str, ConfigError] = PrivateAttr(default_factory=dict)

    @property
    def broken(self) -> dict[str, ConfigError]:
        """The entries of the streams file that did not validate, by name, with their error."""
        return dict(self._broken)

    def stream(self, name: str) -> StreamConfig:
        if name in self._broken:
            raise self._broken[name]
        for stream in self.streams:
            if stream.name == name:
                return stream
        known = ", ".join(s.name for s in self.streams)
        raise UnknownStream(
            f"No stream named {name!r} in the streams config.",
            f"Use one of: {known}.",
        )


def definition_fingerprint(definition: dict[str, Any]) -> str:
    # Pipeline key order is meaningful to MongoDB (e.g. in $sort), so only the outer keys sort.
    canonical = json.dumps(definition, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def describe_definition_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """'pipeline: [...] -> [...]; full_document: default -> updateLookup'."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            before = json.dumps(old.get(key), default=str)
            after = json.dumps(new.get(key), default=str)
            changes.append(f"{key}: {before} -> {after}")
    return "; ".join(changes) or "(no field differs, the fingerprint algorithm changed)"


_FIX_HINT = "Fix the file (see README, 'Configuration') or point TIDEMARK_CONFIG at another one."


def load_config(path: Path | str) -> TidemarkConfig:
    """Read and validate the streams file; every problem becomes one `ConfigError`."""
    path = Path(path)
    raw = _read_streams_file(path)
    try:
        return TidemarkConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            f"The streams config {path} is invalid: {_format_validation(exc, raw)}.", _FIX_HINT
        ) from None


def _read_streams_file(path: Path) -> dict[str, Any]:
    fix_hint = _FIX_HINT
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"The streams config {path} does not exist.",
            "Create it (the README shows an example) or set TIDEMARK_CONFIG to its path.",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"The streams config {path} cannot be read: {exc}.", fix_hint) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"The streams config {path} is not valid YAML{where}: {reason}.", fix_hint
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"The streams config {path} must be a mapping with a 'streams' list, "
            f"not {type(raw).__name__}.",
            fix_hint,
        )
    return raw


def _format_validation(exc: ValidationError, raw: dict[str, Any]) -> str:
    return _format_errors(exc.errors(), raw)


def _format_errors(errors: list[Any], raw: dict[str, Any]) -> str:
    parts = []
    for error in errors:
        loc = list(error["loc"])
        where = _location(loc, raw)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (check its spelling)"
        elif error["type"] == "string_pattern_mismatch" and loc and loc[-1] == "name":
            message = (
                "stream names are slugs: lowercase letters, digits and single '_' inside, "
                "starting with a letter, at most 63 characters, not starting with 'tidemark'"
            )
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _location(loc: list[Any], raw: dict[str, Any]) -> str:
    text = ""
    node: Any = raw
    for part in loc:
        if isinstance(part, int):
            name = (
                node[part].get("name")
                if isinstance(node, list)
                and isinstance(node[part] if part < len(node) else None, dict)
                else None
            )
            text += f"[{part}]" + (f" ({name})" if name else "")
        else:
            text += f".{part}" if text else str(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return text


# --- One broken stream does not take the others down (issue 23, item 9) ---------------------


@dataclass(frozen=True)
class BrokenStream:
    """An entry of the streams file that did not validate, with its one-paragraph message."""

    key: str  # the entry's name when it is a usable slug no other entry has, else `Entry_<index>`
    index: int  # its place in the file's `streams` list
    # The entry's ConfigError; StreamNotLoaded for a valid entry whose Dagster definitions
    # failed to build (`orchestration.definitions`).
    error: TidemarkError


@dataclass(frozen=True)
class StreamsFile:
    """The streams file read entry by entry: the valid streams and the broken ones."""

    path: Path
    streams: list[StreamConfig]
    broken: list[BrokenStream]
    notifications: Notifications | None = None

    def config(self) -> TidemarkConfig:
        """The valid streams; asking it for a broken one (`stream(name)`) raises that one's
        error. With no valid stream at all, the first broken one's error."""
        if not self.streams:
            raise self.broken[0].error
        config = TidemarkConfig.model_construct(
            streams=self.streams, notifications=self.notifications
        )
        config._broken = {b.key: b.error for b in self.broken}
        return config


def load_streams(path: Path | str) -> StreamsFile:
    """The streams file, validated per entry: a typo in one stream leaves the others usable.

    Raises:
        ConfigError: the file as a whole is unusable (missing, not YAML, not a mapping with a
            `streams` list, an unknown top-level key): no entry can be trusted then.
    """
    path = Path(path)
    raw = _read_streams_file(path)
    try:
        config = TidemarkConfig.model_validate(raw)
        return StreamsFile(path, list(config.streams), [], config.notifications)
    except ValidationError as exc:
        errors = exc.errors()
    entries = raw.get("streams")
    per_entry: dict[int, list[Any]] = {}
    for error in errors:
        loc = error["loc"]
        if not (isinstance(entries, list) and len(loc) >= 2 and loc[0] == "streams"):
            raise ConfigError(
                f"The streams config {path} is invalid: {_format_errors(errors, raw)}.", _FIX_HINT
            ) from None
        per_entry.setdefault(int(loc[1]), []).append(error)
    assert isinstance(entries, list)
    streams: list[StreamConfig] = []
    broken: list[BrokenStream] = []
    for index, entry in enumerate(entries):
        if index in per_entry:
            problem = _format_errors(per_entry[index], raw)
        else:
            stream = StreamConfig.model_validate(entry)
            if all(s.name != stream.name for s in streams):
                streams.append(stream)
                continue
            problem = (
                f"streams[{index}] ({stream.name}): stream name {stream.name!r} is used twice: "
                "names must be unique"
            )
        error = ConfigError(f"The streams config {path} is invalid: {problem}.", _FIX_HINT)
        broken.append(BrokenStream(_broken_key(entry, index, entries, broken), index, error))
    # Only the streams had errors (any other key's raised above): this section validated.
    notifications = raw.get("notifications")
    return StreamsFile(
        path,
        streams,
        broken,
        None if notifications is None else Notifications.model_validate(notifications),
    )


def _broken_key(entry: Any, index: int, entries: list[Any], broken: list[BrokenStream]) -> str:
    """The entry's name when no other entry of the file (valid or not) has it, else
    `Entry_<index>`: its capital letter makes it no stream's name, so it meets none."""
    name = entry.get("name") if isinstance(entry, dict) else None
    others = [e.get("name") for i, e in enumerate(entries) if i != index and isinstance(e, dict)]
    taken = set(others) | {b.key for b in broken}
    usable = isinstance(name, str) and re.fullmatch(SLUG_PATTERN, name) and len(name) <= SLUG_MAX
    if usable and not name.startswith(RESERVED_PREFIX) and name not in taken:
        return name
    return f"Entry_{index}"
