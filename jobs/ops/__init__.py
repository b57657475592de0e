"""Operators' commands on a stream: status, health facts, garbage collection and reset."""

from jobs.capture.namespaces import missing_namespace
from jobs.ops.gc import collect_garbage
from jobs.ops.health import SourceCount, source_count, uncommitted_files
from jobs.ops.reset import reset_stream
from jobs.ops.status import StreamStatus, stream_status

__all__ = [
    "SourceCount",
    "StreamStatus",
    "collect_garbage",
    "missing_namespace",
    "reset_stream",
    "source_count",
    "stream_status",
    "uncommitted_files",
]
