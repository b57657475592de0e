"""Capture: MongoDB change streams -> the raw zone, committed with the resume token.

`drain` (`drain_run`) moves a stream's checkpoint, taking a snapshot first when one is due;
`replay` (`replay_window`) re-reads an operation-time window without moving it; both say why
they stopped (`StopReason`). Both are one capture pass (`capture_pass`) over the change-stream
reader (`reader`, its resume rules in `resume`), written by `writer`; the event conversion is
private (`_events`), over the BSON walker that the transform shares (`jobs.bson_buffer`).
"""

from jobs.capture.capture_pass import StopReason
from jobs.capture.drain_result import DrainResult
from jobs.capture.drain_run import drain, drain_until_caught_up
from jobs.capture.replay_window import replay

__all__ = [
    "DrainResult",
    "StopReason",
    "drain",
    "drain_until_caught_up",
    "replay",
]
