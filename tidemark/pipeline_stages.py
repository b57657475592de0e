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
    dropped = _dropped_fields(operator, spec)
    if dropped:
        reasons = "; ".join(f"it drops {f}, which {_NEEDED_FIELDS[f]}" for f in dropped)
        names = ", ".join(dropped[:-1]) + " and " + dropped[-1] if dropped[1:] else dropped[0]
        them = "them" if dropped[1:] else "it"
        return (
            f"{reasons}. Keep {them}: leave {names} out of $unset and exclusions, "
            f"or list {them} whole in an inclusion $project"
        )
    return None


# The event fields Tidemark reads besides _id, and why a stage may not drop them.
_NEEDED_FIELDS = {
    "operationType": "tells the fold what each event does (insert, update, delete, drop, ...)",
    "clusterTime": "orders the events: the raw zone is partitioned and ordered by it",
    "ns": "holds the namespace (db and coll) the fold keys every document by",
    "documentKey": "is each document's key: current holds one row per key",
    "to": "holds a rename's target, where the fold moves the renamed collection's documents",
}


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
