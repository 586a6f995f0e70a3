"""An honest fake of an OpenAI-compatible endpoint: a real HTTP server on 127.0.0.1, scripted per test.

The real `openai` client talks to it over a socket, so retries, Retry-After, timeouts, status
errors and response parsing are the client's own, not a mock's. It serves

    POST /v1/chat/completions   (non-streaming) replies from a queue the test fills
    GET  /v1/models             the known models

and records every request (headers and body) for assertions. It is a `tests.fakes.FakeServer`, as the
fakes of the APIs the agent CLIs speak are: the same start/stop, request record, `hang` and HTTPS.

In a test (the `fake` fixture of tests/conftest.py, or `with FakeOpenAI() as fake:`):

    fake.reply(tool_calls=[call("write_file", {"path": "a.txt", "content": "x"})],
               usage=usage(100, 20))
    fake.reply("All steps COMPLETE!")                       # prose only
    fake.error(429, retry_after=1)                          # then the next scripted item
    fake.error(500, times=3, retry_after_ms=10)
    fake.reply(call("complete_step", {"summary": "done"}), delay=2.0)   # a slow reply
    fake.responder = lambda body: {...}                     # replies computed from the request

The server runs in a thread, so a `kiro` subprocess can use it as well: give it `fake.base_url`
(as `llm.base_url` or OPENAI_BASE_URL). Run standalone with a JSON script:

    python -m tests.fake_openai script.json    # prints the base URL, serves until killed

where the script is a list of items as accepted by `FakeOpenAI.script()`.

The second half of this module builds what the engine would hand an executor, for executor and
tool tests: `make_harness(tmp_path / "ws", llm={...}, tools={...})` makes a workspace with a
task file and a config; `harness.context()` a StepContext (events collected and checked against
the known event names); `harness.tool_env()` and `invoke(env, "write_file", {...})` call one tool
the way the executor does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import ssl
import struct
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiro.executors import prompts
from kiro.executors.base import Guard, StepContext
from kiro.executors.tools import ToolEnv, ToolError, ToolResult, toolset
from kiro.executors.tools.base import execute
from kiro.executors.tools.paths import Confinement
from kiro.store import tasks
from kiro.store.config import Config
from kiro.store.events import Event
from kiro.store.memory import MemoryStore
from kiro.store.state import LoopState
from kiro.store.transcript import Redactor
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.fakes import FakeServer, Handler, HttpError, Recorded

DEFAULT_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def call(name: str, arguments: Mapping[str, Any] | str, id: str | None = None) -> dict[str, Any]:
    """A tool call to script. `arguments` as a dict (sent as JSON) or a raw string (sent as is,
    for malformed-JSON tests)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"name": name, "arguments": args, "id": id}


def usage(prompt: int, completion: int, total: int | None = None) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion if total is None else total}


@dataclass
class Item:
    """One scripted answer: a reply, an error (`error`) or a body sent verbatim (`raw_body`, `status`)."""

    status: int = 200
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    error: HttpError | None = None
    raw_body: bytes | None = None
    fault: str | None = None  # "reset": the connection is reset; "close": closed unanswered; "truncate": half the body


class FakeOpenAI(FakeServer):
    name = "fake-openai"

    def __init__(self, *, known_models: Iterable[str] | None = None, require_key: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls=tls)
        self.known_models = list(known_models) if known_models is not None else None
        self.require_key = require_key
        self.responder: Callable[[dict[str, Any]], Mapping[str, Any] | None] | None = None
        self._queue: deque[Item] = deque()
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    # -- scripting -------------------------------------------------------------------------

    def reply(self, content: str | dict[str, Any] | None = None, *,
              tool_calls: Iterable[dict[str, Any]] | None = None, usage: dict[str, int] | None = None,
              finish_reason: str | None = None, delay: float = 0.0) -> None:
        """Queue an assistant reply. A dict as `content` is taken as a single tool call."""
        self._push(_reply(content, tool_calls=tool_calls, usage=usage, finish_reason=finish_reason,
                          delay=delay))

    def error(self, status: int, message: str | None = None, *, code: str | None = None,
              type: str | None = None, retry_after: float | str | None = None,
              retry_after_ms: int | None = None, headers: Mapping[str, str] | None = None,
              times: int = 1, delay: float = 0.0) -> None:
        """Queue an HTTP error (`times` of them), in the OpenAI error body format."""
        for _ in range(times):
            self._push(_error(status, message, code=code, type=type, retry_after=retry_after,
                              retry_after_ms=retry_after_ms, headers=headers, delay=delay))

    def raw(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        """Queue a response body sent verbatim (for malformed responses)."""
        self._push(Item(status=status, raw_body=body, headers=dict(headers or {})))

    def fault(self, kind: str, *, times: int = 1, content: str = "ok") -> None:
        """Queue a transport fault: "reset" (TCP RST instead of an answer), "close" (the connection
        closed without an answer), "truncate" (a reply
        whose body stops half-way, then the connection closes) or "unbounded" (a reply without a
        Content-Length whose body, a JSON string, runs on for 80 MiB until the connection closes)."""
        assert kind in ("reset", "close", "truncate", "unbounded"), kind
        for _ in range(times):
            self._push(replace(_reply(content), fault=kind))

    def script(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Queue items given as plain dicts (the JSON script format):
        {"content": "...", "tool_calls": [{"name": ..., "arguments": {...}}], "usage": {...}, "delay": 0}
        or {"status": 429, "message": "...", "retry_after": 1, "times": 2}."""
        for d in items:
            for item in _items(d):
                self._push(item)

    def _push(self, item: Item) -> None:
        with self._lock:
            self._queue.append(item)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- what was sent ---------------------------------------------------------------------

    @property
    def chat_requests(self) -> list[Recorded]:
        return self.posts("/chat/completions")

    def all_bodies(self) -> bytes:
        with self._lock:
            return b"\n".join(r.raw for r in self.requests)

    def wait_for_requests(self, n: int, timeout: float = 60.0) -> None:
        self.wait_until(lambda: len(self.chat_requests) >= n, timeout, what=f"{n} chat requests")

    # -- serving (called from handler threads) ---------------------------------------------

    def _auth_ok(self, handler: Handler) -> bool:
        key = self.require_key
        if key is None or handler.headers.get("Authorization") == f"Bearer {key}":
            return True
        handler.send_http_error(HttpError(401, {"error": {"message": "Incorrect API key provided.",
                                                          "type": "invalid_request_error", "param": None,
                                                          "code": "invalid_api_key"}}))
        return False

    def answer_get(self, handler: Handler, rec: Recorded) -> None:
        if not self._auth_ok(handler):
            return
        if rec.path.rstrip("/").endswith("/models"):
            models = self.known_models or ["fake-model"]
            handler.send_json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in models]})
        else:
            handler.send_json(404, NOT_FOUND)

    def answer(self, handler: Handler, rec: Recorded) -> None:
        if not self._auth_ok(handler):
            return
        if not rec.path.rstrip("/").endswith("/chat/completions"):
            handler.send_json(404, NOT_FOUND)
            return
        body = rec.body if isinstance(rec.body, dict) else {}
        model = str(body.get("model", "fake-model"))
        if self.known_models is not None and model not in self.known_models:
            msg = f"The model `{model}` does not exist or you do not have access to it."
            handler.send_http_error(HttpError(404, {"error": {"message": msg, "type": "invalid_request_error",
                                                              "param": None, "code": "model_not_found"}}))
            return
        item = self._next(body)
        if item.delay and self.pause(item.delay):
            handler.close_connection = True
            return
        if item.fault is not None:
            self._fault(handler, item, model)
        elif item.raw_body is not None:
            handler.send_bytes(item.status, item.raw_body, item.headers)
        elif item.error is not None:
            handler.send_http_error(item.error)
        else:
            handler.send_json(200, self._completion(item, model), item.headers)

    def _fault(self, handler: Handler, item: Item, model: str) -> None:
        handler.close_connection = True
        if item.fault == "reset":
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.connection.close()
        elif item.fault == "close":
            handler.connection.shutdown(socket.SHUT_RDWR)
        elif item.fault == "truncate":
            payload = json.dumps(self._completion(item, model)).encode()
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload[: len(payload) // 2])
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)
        else:  # "unbounded"
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Connection", "close")
            handler.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped reading
                handler.wfile.write(b'"')
                for _ in range(80):
                    handler.wfile.write(b"x" * (1 << 20))
                handler.wfile.write(b'"')

    def _next(self, body: dict[str, Any]) -> Item:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            d = self.responder(body)
            if d is not None:
                return _items(d)[0]
        n = len(self.chat_requests)
        return _error(500, f"fake_openai: no scripted reply left (chat request #{n})",
                      headers={"x-should-retry": "false"})

    def _completion(self, item: Item, model: str) -> dict[str, Any]:
        n = next(self._ids)
        tool_calls = [
            {"id": c.get("id") or f"call_{n}_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(item.tool_calls)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": item.content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = item.finish_reason or ("tool_calls" if tool_calls else "stop")
        body: dict[str, Any] = {
            "id": f"chatcmpl-fake-{n}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        }
        body["usage"] = dict(item.usage) if item.usage is not None else dict(DEFAULT_USAGE)
        return body


def _reply(content: str | dict[str, Any] | None = None, *, tool_calls: Iterable[dict[str, Any]] | None = None,
           usage: dict[str, int] | None = None, finish_reason: str | None = None, delay: float = 0.0) -> Item:
    calls = list(tool_calls or [])
    if isinstance(content, dict):
        calls.insert(0, content)
        content = None
    return Item(content=content, tool_calls=calls, usage=usage, finish_reason=finish_reason, delay=delay)


def _error(status: int, message: str | None = None, *, code: str | None = None, type: str | None = None,
           retry_after: float | str | None = None, retry_after_ms: int | None = None,
           headers: Mapping[str, str] | None = None, delay: float = 0.0) -> Item:
    h = dict(headers or {})
    if retry_after is not None:
        h["Retry-After"] = str(retry_after)
    if retry_after_ms is not None:
        h["retry-after-ms"] = str(retry_after_ms)
    body = {"message": message or f"fake error {status}", "type": type or _error_type(status),
            "param": None, "code": code}
    return Item(status=status, error=HttpError(status, {"error": body}, h), delay=delay)


def _items(d: Mapping[str, Any]) -> list[Item]:
    """Script-format dict -> items (an error with "times" gives several)."""
    if int(d.get("status", 200)) != 200:
        return [_error(int(d["status"]), d.get("message"), code=d.get("code"), type=d.get("type"),
                       retry_after=d.get("retry_after"), retry_after_ms=d.get("retry_after_ms"),
                       headers=d.get("headers"), delay=float(d.get("delay", 0)))
                for _ in range(int(d.get("times", 1)))]
    calls = [call(c["name"], c.get("arguments", {}), c.get("id")) for c in d.get("tool_calls", [])]
    return [_reply(d.get("content"), tool_calls=calls, usage=d.get("usage"),
                   finish_reason=d.get("finish_reason"), delay=float(d.get("delay", 0)))]


NOT_FOUND = {"error": {"message": "not found", "type": "invalid_request_error"}}


def _error_type(status: int) -> str:
    return {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
            404: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")


# -- a step to run: workspace, task file, StepContext (for executor and tool tests) ---------------

TASK_TEXT = """\
---
title: Demo task
---
# Implementation Plan
- [ ] 1. Create hello.txt
  - It must contain the word hello
- [ ] 2. Write the notes
"""


@dataclass
class StepHarness:
    """A temp workspace (project dir = workspace root) with a task file, and what it takes to build
    the StepContext the engine would pass: config, events, guard, sleep, cancel."""

    root: Path
    config: Config
    task_id: str = "t1"
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ws(self) -> KiroWorkspace:
        return KiroWorkspace(self.root)

    @property
    def task_path(self) -> Path:
        return self.root / "Specs" / "demo" / "tasks.md"

    def emit(self, event: Event, /) -> None:
        event.task_id, event.iteration = self.task_id, 1
        self.events.append(event.to_record())

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]

    def context(self, *, step_id: str = "1", attempt: int = 1, guard: Guard | None = None,
                sleep: Callable[[float], Awaitable[str | None]] | None = None,
                cancel: asyncio.Event | None = None, timeout: float = 60.0,
                config: Config | None = None) -> StepContext:
        cfg = config or self.config
        task = tasks.load(self.task_path)
        step = task.find(step_id)
        assert step is not None
        state = LoopState(task_id=self.task_id, task_path=self.ws.relative(self.task_path), iteration=1)

        async def real_sleep(seconds: float) -> str | None:
            await asyncio.sleep(seconds)
            return None

        return StepContext(
            task_id=self.task_id, workspace=self.ws, project_dir=(self.root / cfg.project_dir).resolve(),
            task_path=self.task_path, task=task, step=step, iteration=1, attempt=attempt,
            prompt=prompts.step_prompt(task, step, state, attempt=attempt, workspace=self.ws),
            system_prompt=prompts.system_prompt(task, state, self.ws), reinjected=False, continuation=None,
            previous_error=None, verify_output=None, timeout_seconds=timeout, config=cfg, state=state,
            cancel=cancel or asyncio.Event(), emit=self.emit, sleep=sleep or real_sleep,
            guard=guard or Guard(),
        )

    def tool_env(self, **kwargs: Any) -> ToolEnv:
        """The ToolEnv the openai executor would build for this step (for calling tools directly)."""
        ctx = self.context(**kwargs)
        return ToolEnv(
            ctx=ctx,
            confinement=Confinement(ctx.project_dir, self.root, task_file=self.task_path,
                                    state_dir=self.ws.state_dir),
            memory=MemoryStore(self.ws.memory_db()), redact=Redactor.from_environment(None),
            memory_source=f"loop:{self.task_id}", api_key_env=ctx.config.llm.api_key_env,
        )


def make_harness(root: Path, *, task_text: str = TASK_TEXT, **config: Any) -> StepHarness:
    """A workspace at `root` with the standard folders, the task file, and a config built from
    keyword sections (`llm={...}`, `tools={...}`)."""
    ws = KiroWorkspace(root)
    ws.ensure_folders()
    (root / "config").mkdir(exist_ok=True)
    task = root / "Specs" / "demo" / "tasks.md"
    task.parent.mkdir(parents=True, exist_ok=True)
    task.write_text(task_text, encoding="utf-8")
    return StepHarness(root=root, config=Config.model_validate(config))


async def invoke(env: ToolEnv, name: str, arguments: Mapping[str, Any] | str) -> ToolResult:
    """Call one tool the way the executor does: parse (errors to the result), then execute."""
    tool = toolset(env.ctx.config).get(name)
    if tool is None:
        return ToolResult.error(f"no tool {name!r}")
    try:
        args = tool.parse(arguments if isinstance(arguments, str) else json.dumps(arguments))
    except ToolError as exc:
        return ToolResult.error(str(exc))
    return await execute(tool, args, env)


def main(argv: list[str]) -> int:
    fake = FakeOpenAI()
    if argv:
        with open(argv[0], encoding="utf-8") as fh:
            fake.script(json.load(fh))
    fake.start()
    print(fake.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        fake.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
