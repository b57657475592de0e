"""A webhook receiver on 127.0.0.1: a real HTTP server in a thread that records every POST
(path and JSON body) and answers with the statuses it is given, in order (then 200)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    url: str
    posts: list[tuple[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    def texts(self) -> list[str]:
        return [body["text"] for _, body in self.posts]


@contextmanager
def webhook_receiver(path: str = "/services/T000/B000/hook-secret") -> Iterator[Receiver]:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            receiver.posts.append((self.path, json.loads(self.rfile.read(length))))
            status = receiver.statuses.pop(0) if receiver.statuses else 200
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:  # keep the test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(f"http://127.0.0.1:{server.server_address[1]}{path}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
