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


# --- exclude_fields: the stages that remove a stream's excluded fields on the server ---
#
# Why on the server rather than in Python when events are converted: the values never leave
# MongoDB, the snapshot's copy gets the very same stages (it runs the stream's pipeline over
# each document's insert event), the definition fingerprint covers them as part of the
# pipeline, and the raw zone's fast path (events kept as the reply's own bytes) stays as it
# is. An update's description names fields by dotted keys (`address.street`, `contacts.0`),
# which `$unset` cannot address, so it is rewritten by an expression (MongoDB 5.0+).


_IMAGES = ("fullDocument.", "fullDocumentBeforeChange.")


def removed_by_stages(stages: list[dict[str, Any]]) -> list[str]:
    """The document paths a pipeline statically removes from an image (`$unset` of
    `fullDocument.email`, or `fullDocumentBeforeChange.email`, or an exclusion `$project` of
    one), as `exclude_fields` paths. Such a stage removes only what it names: the same value
    still rides in an update's description and in the other image. The capture removes these
    paths from every document field of an event too, as it does `exclude_fields`, so a field
    the user's pipeline takes out of the document never reaches the lake by another road. A
    path the exclusion cannot express (an array position, `$`) is left to the stage alone."""
    found: list[str] = []
    for stage in stages:
        if not isinstance(stage, dict) or len(stage) != 1:
            continue
        ((operator, spec),) = stage.items()
        if operator == "$unset":
            paths = [spec] if isinstance(spec, str) else list(spec or [])
        elif operator == "$project" and isinstance(spec, dict):
            excluding = [k for k, v in spec.items() if k != "_id" and v in (0, False)]
            including = [k for k, v in spec.items() if k != "_id" and v not in (0, False)]
            paths = [] if including else excluding
        else:
            continue
        for path in paths:
            if not isinstance(path, str):
                continue
            for image in _IMAGES:
                rest = path[len(image) :] if path.startswith(image) else None
                segments = rest.split(".") if rest else []
                if rest and "$" not in rest and all(s and not s.isdigit() for s in segments):
                    found.append(rest)
    return found


def outermost(paths: list[str]) -> list[str]:
    """`paths` without repeats and without any path under another one of them (the server
    refuses a `$unset` of both with "Path collision"), in their first order."""
    kept: list[str] = []
    for path in paths:
        if any(path == k or path.startswith(k + ".") for k in kept):
            continue
        kept = [k for k in kept if not k.startswith(path + ".")] + [path]
    return kept


def exclusion_stages(paths: list[str]) -> list[dict[str, Any]]:
    """Stages that remove `paths` (validated dotted field paths) from every document of an
    event: both images (into arrays, as `$unset` does), and from the update description the
    updated and removed fields and truncated arrays at, under or holding such a path. Array
    positions in a description's keys (`contacts.0.phone`) are read past, as a path follows
    arrays; none when `paths` is empty."""
    if not paths:
        return []
    images = [
        f"{image}.{path}"
        for path in paths
        for image in ("fullDocument", "fullDocumentBeforeChange")
    ]
    description = {
        "updatedFields": _when(
            {"$eq": [{"$type": "$updateDescription.updatedFields"}, "object"]},
            {
                "$arrayToObject": {
                    "$map": {
                        "input": {
                            "$filter": {
                                "input": {"$objectToArray": "$updateDescription.updatedFields"},
                                "as": "field",
                                "cond": {"$not": [_excluded(_field_path("$$field.k"), paths)]},
                            }
                        },
                        "as": "field",
                        "in": {
                            "k": "$$field.k",
                            "v": _inside(_field_path("$$field.k"), "$$field.v", paths),
                        },
                    }
                }
            },
        ),
        "removedFields": _when(
            {"$isArray": "$updateDescription.removedFields"},
            {
                "$filter": {
                    "input": "$updateDescription.removedFields",
                    "as": "field",
                    "cond": {"$not": [_excluded(_field_path("$$field"), paths)]},
                }
            },
        ),
        "truncatedArrays": _when(
            {"$isArray": "$updateDescription.truncatedArrays"},
            {
                "$filter": {
                    "input": "$updateDescription.truncatedArrays",
                    "as": "array",
                    "cond": {"$not": [_excluded(_field_path("$$array.field"), paths)]},
                }
            },
        ),
    }
    rewrite = _when(
        {"$eq": [{"$type": "$updateDescription"}, "object"]},
        {"$mergeObjects": ["$updateDescription", description]},
    )
    return [{"$unset": images}, {"$set": {"updateDescription": rewrite}}]


def _when(condition: Any, then: Any) -> dict[str, Any]:
    # Absent when the condition fails: an insert gets no updateDescription, an update without
    # truncatedArrays (older servers) no such field.
    return {"$cond": [condition, then, "$$REMOVE"]}


def _field_path(key: Any) -> dict[str, Any]:
    """A description's dotted key without its array positions: `contacts.0.phone` ->
    `contacts.phone`."""
    segments = {
        "$filter": {
            "input": {"$split": [key, "."]},
            "as": "segment",
            "cond": {"$not": [{"$regexMatch": {"input": "$$segment", "regex": "^[0-9]+$"}}]},
        }
    }
    return {
        "$reduce": {
            "input": segments,
            "initialValue": "",
            "in": {
                "$cond": [
                    {"$eq": ["$$value", ""]},
                    "$$this",
                    {"$concat": ["$$value", ".", "$$this"]},
                ]
            },
        }
    }


def _excluded(path: Any, paths: list[str]) -> dict[str, Any]:
    """`path` is an excluded path or lies under one."""
    tests = []
    for excluded in paths:
        prefix = excluded + "."
        tests += [
            {"$eq": [path, excluded]},
            {"$eq": [{"$substrCP": [path, 0, len(prefix)]}, prefix]},
        ]
    return {"$or": tests}


def _inside(path: Any, value: Any, paths: list[str]) -> dict[str, Any]:
    """`value` (set at `path`) without the excluded paths below it: `$set: {address: {...}}`
    carries `address.street` inside its value."""
    below: dict[str, list[list[str]]] = {}
    for excluded in paths:
        segments = excluded.split(".")
        for n in range(1, len(segments)):
            below.setdefault(".".join(segments[:n]), []).append(segments[n:])
    if not below:
        return value
    branches = []
    for parent, rests in below.items():
        then: Any = "$$set"
        for rest in rests:
            then = _remove(rest, then, 0)
        branches.append({"case": {"$eq": ["$$path", parent]}, "then": then})
    return {
        "$let": {
            "vars": {"path": path, "set": value},
            "in": {"$switch": {"branches": branches, "default": "$$set"}},
        }
    }


# How deep arrays nested in arrays are followed at one segment of a path, as `$unset` does (an
# expression cannot recurse, so each level is written out); an array nested deeper is dropped
# whole from the update's value (null in its place): a lost value, never a leaked one.
_ARRAY_LEVELS = 3


def _remove(segments: list[str], value: Any, depth: int, arrays: int = _ARRAY_LEVELS) -> Any:
    """`value` without the field at `segments`, followed into arrays as `$unset` does."""
    here, element = f"x{depth}", f"e{depth}"
    field = {"$literal": segments[0]}
    if segments[1:]:
        inner = {"$getField": {"field": field, "input": f"$${here}"}}
        in_document: Any = {
            "$setField": {
                "field": field,
                "input": f"$${here}",
                "value": _remove(segments[1:], inner, depth + 1),
            }
        }
    else:
        in_document = {"$unsetField": {"field": field, "input": f"$${here}"}}
    branches: list[dict[str, Any]] = [
        {"case": {"$eq": [{"$type": f"$${here}"}, "missing"]}, "then": "$$REMOVE"},
        {"case": {"$eq": [{"$type": f"$${here}"}, "object"]}, "then": in_document},
    ]
    if arrays:
        each = _remove(segments, f"$${element}", depth + 1, arrays - 1)
        deeper: Any = {"$map": {"input": f"$${here}", "as": element, "in": each}}
    else:
        deeper = "$$REMOVE"
    branches.append({"case": {"$isArray": f"$${here}"}, "then": deeper})
    return {
        "$let": {
            "vars": {here: value},
            "in": {"$switch": {"branches": branches, "default": f"$${here}"}},
        }
    }


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
