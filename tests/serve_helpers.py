"""Running `kiro serve` for tests: a real server process on 127.0.0.1 (any free port), talked to with
real clients (httpx for REST and Server-Sent Events, the `websockets` client for the WebSocket)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kiro.fs import locks

TOKEN = "test-token-0123456789abcdef"


@dataclass
class Served:
    proc: subprocess.Popen[str]
    base: str
    token: str
    root: Path
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self) -> httpx.Client:
        if not self.clients:
            self.clients.append(httpx.Client(base_url=self.base, timeout=httpx.Timeout(60.0)))
        return self.clients[0]

    def get(self, path: str, **kw: Any) -> httpx.Response:
        headers = {**self.auth, **kw.pop("headers", {})}
        return self.client().get(path, headers=headers, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        headers = {**self.auth, **kw.pop("headers", {})}
        return self.client().post(path, json=body, headers=headers, **kw)

    @property
    def ws_url(self) -> str:
        return self.base.replace("http://", "ws://") + "/api/ws"

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_server(ws: Any, *, token: str | None = TOKEN, extra_env: dict[str, str] | None = None) -> Served:
    env = ws.env(**({"KIRO_SERVE_TOKEN": token} if token else {}), **(extra_env or {}))
    proc = ws.spawn("serve", "--port", "0", env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = ws.output(proc)
        m = re.search(r"kiro serve: (http://127\.0\.0\.1:\d+)/(?:\?token=(\S+))?", text)
        if m:
            return Served(proc, m.group(1), token or m.group(2), ws.root)
        if proc.poll() is not None:
            raise AssertionError(f"kiro serve exited ({proc.returncode}): {text}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"kiro serve did not start: {ws.output(proc)}")


def stop_loops(root: Path) -> None:
    """End the background loops a test started in its workspace (by the pids in their lock files)."""
    for lock in (root / ".state").glob("autonomous_loop_*.lock"):
        pid = locks.holder_pid(lock)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and loops_alive(root):
        time.sleep(0.05)


def loops_alive(root: Path) -> bool:
    """Some loop of the workspace is running: a process holds its lock."""
    return any(locks.is_held(lock) for lock in (root / ".state").glob("autonomous_loop_*.lock"))


@dataclass
class SSE:
    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def sse_stream(served: Served, *, last_event_id: str | None = None, query: str = "",
               read_timeout: float = 30.0) -> Iterator[SSE]:
    """The server's event stream, parsed as a browser's EventSource does (fields, blank line ends one)."""
    headers = dict(served.auth)
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    timeout = httpx.Timeout(10.0, read=read_timeout)
    with httpx.Client(base_url=served.base, timeout=timeout) as c, \
            c.stream("GET", "/api/events" + query, headers=headers) as r:
        assert r.status_code == 200, r.status_code
        assert r.headers["content-type"].startswith("text/event-stream")
        ev_id: str | None = None
        name, data = "message", []
        for line in r.iter_lines():
            if line == "":
                if data:
                    yield SSE(ev_id, name, "\n".join(data))
                name, data = "message", []
                continue
            if line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "id":
                ev_id = value
            elif key == "event":
                name = value
            elif key == "data":
                data.append(value)
