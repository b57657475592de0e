"""Progress of long CLI work on a terminal: one line on stderr that rewrites itself.

`terminal_progress()` gives the callback the jobs take (`jobs.progress`), or None when stderr
is not a terminal, so logs and pipes get the final summary only (and the jobs skip the work
of reporting).
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from jobs.progress import Progress, ProgressCallback, describe


def terminal_progress(out: TextIO | None = None) -> ProgressCallback | None:
    out = out or sys.stderr
    if not out.isatty():
        return None

    def show(progress: Progress) -> None:
        width = shutil.get_terminal_size().columns - 1
        # Carriage return and erase-to-end-of-line: the line rewrites itself until it is final.
        out.write("\r" + describe(progress)[:width] + "\x1b[K" + ("\n" if progress.final else ""))
        out.flush()

    return show
