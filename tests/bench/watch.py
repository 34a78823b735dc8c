"""A watch on one collection that a benchmark times its events with, resumed when its stream ends.

The API server closes a watch whose reader falls behind (as a benchmark's may at thousands of runs
on a loaded machine); the stream is resumed from the last resourceVersion seen, so no event is
missed. `gaps` counts the times the server no longer had that version (410 Gone: the events
meanwhile are lost to this watch, and a check built on it cannot vouch for them); `resumes` counts
every stream that ended.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from typing import Any, Self

from agentrun_devcluster.controlplane import ControlPlane


class ResumableWatch:
    """Streams the events of `path` (with `query`, e.g. `&labelSelector=...`) on a daemon thread and
    hands each to `on_event` with the monotonic time it was read."""

    def __init__(
        self, plane: ControlPlane, path: str, query: str = "", thread_name: str | None = None
    ) -> None:
        self.plane = plane
        self.path = path
        self.query = query
        self.resumes = 0
        self.gaps = 0
        self._version = ""
        self._thread_name = thread_name

    def start(self) -> Self:
        threading.Thread(target=self._run, daemon=True, name=self._thread_name).start()
        return self

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        """One event (`ADDED`, `MODIFIED`, `DELETED`) of the collection, read at `now`."""
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a broken stream: resume below
                self._stream()
            self.resumes += 1
            time.sleep(0.1)

    def _stream(self) -> None:
        url = f"{self.plane.server}{self.path}?watch=1&timeoutSeconds=3600{self.query}"
        if self._version:
            url += f"&resourceVersion={self._version}"
        ctx = self.plane._client_ssl()
        with urllib.request.urlopen(urllib.request.Request(url), context=ctx, timeout=3600) as resp:
            for raw in resp:
                now = time.monotonic()  # as it arrived, before parsing (a large object takes a while)
                event = json.loads(raw)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":  # 410 Gone: list-free resume impossible
                    self.gaps += 1
                    self._version = ""
                    return
                self._version = str((obj.get("metadata") or {}).get("resourceVersion") or self._version)
                self.on_event(str(event.get("type")), obj, now)
