"""Posting a Slack-compatible webhook: `{"text": ...}` as JSON, with a timeout and one retry.

Callers are Dagster sensors, whose loop must never stop for an unreachable chat server: a post
that fails is a logged warning and a False, never an exception. The URL is never logged (a
webhook's URL is its credential); only its host is.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

log = logging.getLogger("tidemark.notifications")

# One retry after this pause: a chat server's brief hiccup passes, a long outage is not waited out.
RETRY_PAUSE_SECONDS = 1.0


def post_text(
    url: str, text: str, timeout: float = 5.0, attempts: int = 2, pause: float = RETRY_PAUSE_SECONDS
) -> bool:
    """POST `{"text": text}` to `url`; True once the server answers 2xx, False after
    `attempts` failures (each logged as a warning naming the host only)."""
    body = json.dumps({"text": text}).encode()
    host = urlsplit(url).hostname or "the webhook"
    for attempt in range(1, attempts + 1):
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
            return True
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            problem = f"{type(exc).__name__}: {reason}"
        log.warning(
            "notification to %s failed (attempt %d of %d): %s", host, attempt, attempts, problem
        )
        if attempt < attempts:
            time.sleep(pause)
    return False
