"""The stages that remove a stream's excluded fields on the server (`exclude_fields`, and
the paths the stream's own pipeline removes from a document image), from every document field
of an event: both images and the update's description.

Why on the server rather than in Python when events are converted: the values never leave
MongoDB, the snapshot's copy gets the very same stages (it runs the stream's pipeline over
each document's insert event), the definition fingerprint covers them as part of the
pipeline, and the raw zone's fast path (events kept as the reply's own bytes) stays as it
is. An update's description names fields by dotted keys (`address.street`, `contacts.0`),
which `$unset` cannot address, so it is rewritten by an expression (MongoDB 5.0+).
"""

from __future__ import annotations

from typing import Any

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
