"""Which pipeline stages a stream may add after $changeStream, and why the others are refused.

A stage may filter or reshape events, but not take away what Tidemark resumes and folds by:
the event's `_id` (the resume token) and the fields named in `_NEEDED_FIELDS`. Refusing such a
stage when the config loads gives the operator the reason before the first run.
"""

from __future__ import annotations

from typing import Any

# The stages MongoDB accepts after $changeStream; anything else is refused by the server anyway,
# and refusing it here gives the message at load time instead of at the first run.
ALLOWED_STAGES = {
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
}


def stage_problem(stage: dict[str, Any]) -> str | None:
    """Why a stage may not follow $changeStream in a Tidemark stream, or None when it may."""
    if not isinstance(stage, dict) or len(stage) != 1:
        return "each pipeline stage must be a mapping with exactly one $-operator key"
    ((operator, spec),) = stage.items()
    if operator not in ALLOWED_STAGES:
        allowed = ", ".join(sorted(ALLOWED_STAGES))
        return f"{operator} cannot follow $changeStream; allowed stages: {allowed}"
    if operator in ("$replaceRoot", "$replaceWith"):
        return f"{operator} replaces the event and its _id (the resume token); use $project instead"
    if operator == "$unset":
        fields = [spec] if isinstance(spec, str) else list(spec or [])
        if "_id" in fields:
            return "it removes _id, the resume token Tidemark needs to resume exactly"
    if operator == "$project" and isinstance(spec, dict):
        if "_id" in spec and spec["_id"] in (0, False):
            return "it excludes _id, the resume token Tidemark needs to resume exactly"
        inclusion = any(v not in (0, False) for k, v in spec.items() if k != "_id")
        if "_id" in spec and spec["_id"] not in (1, True) and inclusion:
            return "it rewrites _id, the resume token Tidemark needs to resume exactly"
    if operator in ("$set", "$addFields") and isinstance(spec, dict) and "_id" in spec:
        return "it rewrites _id, the resume token Tidemark needs to resume exactly"
    if _rewrites_document_id(operator, spec):
        return (
            "it removes or rewrites fullDocument._id: current keys each row by the document's "
            "_id, and a snapshot row is what the pipeline makes of the document's insert event. "
            "Leave fullDocument._id as it is"
        )
    dropped = _dropped_fields(operator, spec)
    if dropped:
        reasons = "; ".join(f"it drops {f}, which {_NEEDED_FIELDS[f]}" for f in dropped)
        names = ", ".join(dropped[:-1]) + " and " + dropped[-1] if dropped[1:] else dropped[0]
        them = "them" if dropped[1:] else "it"
        return (
            f"{reasons}. Keep {them}: leave {names} out of $unset and exclusions, "
            f"or list {them} whole in an inclusion $project"
        )
    rewritten = _rewritten_fields(operator, spec)
    if rewritten:
        reasons = "; ".join(f"it rewrites {f}, which {_NEEDED_FIELDS[f]}" for f in rewritten)
        return f"{reasons}. Leave {', '.join(rewritten)} as the server sends it"
    return None


# The event fields Tidemark reads besides _id, and why a stage may not drop them.
_NEEDED_FIELDS = {
    "operationType": "tells the fold what each event does (insert, update, delete, drop, ...)",
    "clusterTime": "orders the events: the raw zone is partitioned and ordered by it",
    "ns": "holds the namespace (db and coll) the fold keys every document by",
    "documentKey": "is each document's key: current holds one row per key",
    "to": "holds a rename's target, where the fold moves the renamed collection's documents",
}


def _rewrites_document_id(operator: str, spec: Any) -> bool:
    """A static $unset, $set, $addFields or $project of fullDocument._id (or inside it). A
    computed one ($set of fullDocument as a whole) is caught by the snapshot when it runs."""

    def touches(path: Any) -> bool:
        return isinstance(path, str) and (
            path == "fullDocument._id" or path.startswith("fullDocument._id.")
        )

    if operator == "$unset":
        paths = [spec] if isinstance(spec, str) else list(spec or [])
        return any(touches(p) for p in paths)
    if not isinstance(spec, dict):
        return False
    if operator == "$project":
        return any(touches(k) and v not in (1, True) for k, v in spec.items())
    return operator in ("$set", "$addFields") and any(touches(k) for k in spec)


def _rewritten_fields(operator: str, spec: Any) -> list[str]:
    """The needed fields a $set, $addFields or $project gives a value of its own: an event
    whose operationType, ns or documentKey is not the server's folds into the wrong rows
    (and would slip past the deletes and namespace events `capture_pipeline` lets through)."""
    if operator not in ("$set", "$addFields", "$project") or not isinstance(spec, dict):
        return []

    def assigns(value: Any) -> bool:
        if value == "$$REMOVE":
            return False  # a removal: `_dropped_fields` names it
        if operator == "$project":
            if isinstance(value, dict) and not any(str(k).startswith("$") for k in value):
                return False  # a nested projection ({ns: {db: 1, coll: 1}}), not a value
            return not isinstance(value, (bool, int, float))  # 0/1/true/false: in or out
        return True

    paths = [k for k, v in spec.items() if isinstance(k, str) and assigns(v)]
    return [f for f in _NEEDED_FIELDS if any(p == f or p.startswith(f + ".") for p in paths)]


def _dropped_fields(operator: str, spec: Any) -> list[str]:
    """The needed fields (or parts of them) a $project, $unset, $set or $addFields removes."""

    def touches(path: str, field: str) -> bool:
        return path == field or path.startswith(field + ".")

    def removes(value: Any) -> bool:
        return value in (0, False) or value == "$$REMOVE"

    if operator == "$unset":
        paths = [spec] if isinstance(spec, str) else [p for p in spec or [] if isinstance(p, str)]
        return [f for f in _NEEDED_FIELDS if any(touches(p, f) for p in paths)]
    if not isinstance(spec, dict):
        return []
    kept = [k for k, v in spec.items() if k != "_id" and not removes(v)]
    if operator == "$project" and (kept or list(spec) == ["_id"]):
        # Inclusion: every field not listed is gone (a sub-path keeps only that part).
        return [f for f in _NEEDED_FIELDS if f not in spec or removes(spec[f])]
    if operator in ("$project", "$set", "$addFields"):
        removed = [k for k, v in spec.items() if isinstance(k, str) and removes(v)]
        if operator != "$project":  # 0 and false are values there, not exclusions
            removed = [k for k in removed if spec[k] == "$$REMOVE"]
        return [f for f in _NEEDED_FIELDS if any(touches(k, f) for k in removed)]
    return []


# -- what a stream feeding `current` must always see ----------------------------------------

# The events that take documents out of `current`: a delete its document, drop and
# dropDatabase a namespace's, rename moves or removes them, and invalidate ends the stream
# there. A filter that hides one of them leaves rows in `current` that are gone from the
# source, for good, without a word; so while `current_table` is on they pass every `$match`.
ALWAYS_PASSING_EVENTS = ("delete", "drop", "rename", "dropDatabase", "invalidate")
# And an update whose post-image lookup found nothing (its document deleted or dropped
# since): the fold ignores it, but a run resuming after such an update's token must see it
# again, or the server refuses to resume ("the resume token was not found", measured on
# 6.0.5 once a drop or delete behind it passes the filter).
_UPDATE_OF_A_GONE_DOCUMENT = {"operationType": "update", "fullDocument": None}
ALWAYS_PASSING = [
    {"operationType": {"$in": list(ALWAYS_PASSING_EVENTS)}},
    _UPDATE_OF_A_GONE_DOCUMENT,
]

# Keys of a filter that stay outside the wrapping: a namespace condition holds for every
# event of the namespaces it keeps, inserts included, so a delete or drop elsewhere concerns
# no row of `current` (and a cluster stream filtered to one database keeps out the others').
_NAMESPACE_KEYS = ("ns", "to")
_TOP_LEVEL_ONLY = ("$comment",)


def capture_pipeline(stages: list[dict[str, Any]], current_table: bool) -> list[dict[str, Any]]:
    """The stages the change stream is opened with: the stream's own, each `$match` widened
    so the `ALWAYS_PASSING_EVENTS` pass it while `current_table` is on.

    `{$match: F}` becomes `{$match: {$or: [F, *ALWAYS_PASSING]}}` (the events above, and an
    update whose document is gone),
    with F's conditions on the namespace (`ns`, `ns.db`, `ns.coll`) kept beside the `$or`, as
    conditions on the event's `ns` or on a rename's target (`to`). Inserts, updates and
    replaces meet F as written, so the snapshot's rule (the pipeline run over each document's
    insert event) and the source counts mean the same with or without the wrapping. The
    stream's fingerprint covers `stages` as written: the wrapping is a function of them.
    """
    if not current_table:
        return stages
    return [_widened(stage) if "$match" in stage else stage for stage in stages]


def _widened(stage: dict[str, Any]) -> dict[str, Any]:
    spec = stage["$match"]
    if not isinstance(spec, dict):
        return stage  # the server refuses it with its own message
    namespace = {k: v for k, v in spec.items() if _is_namespace_key(k)}
    outside = {k: v for k, v in spec.items() if k in _TOP_LEVEL_ONLY}
    rest = {k: v for k, v in spec.items() if k not in namespace and k not in outside}
    if not rest:
        return stage  # a namespace filter only: it hides nothing current holds
    widened = {"$or": [rest, *ALWAYS_PASSING]}
    if namespace:
        # A rename onto a kept namespace comes with the source's ns: its target counts too.
        target = {"to" + k[2:]: v for k, v in namespace.items() if k.startswith("ns")}
        scope = {"$or": [namespace, target]} if target else namespace
        widened = {"$and": [scope, widened]}
    return {"$match": {**widened, **outside}}


def _is_namespace_key(key: str) -> bool:
    return any(key == f or key.startswith(f + ".") for f in _NAMESPACE_KEYS)


def fold_problem(stages: list[dict[str, Any]]) -> str | None:
    """Why a pipeline cannot feed `current` (None when it can): checked when `current_table`
    is on, beside `stage_problem`'s rules for every stream."""
    for index, stage in enumerate(stages):
        if isinstance(stage, dict) and "$redact" in stage:
            return (
                f"stage {index} ($redact) decides per event and per embedded document, so it "
                "can prune the deletes and namespace events (or their ns and documentKey) the "
                "current-state table needs to stay true, and Tidemark cannot make them pass "
                "it: filter with $match (deletes, drops, renames and invalidates always pass a "
                "$match while current_table is on) and remove fields with $unset or $project, "
                "or set current_table: false for a change log only"
            )
    return None
