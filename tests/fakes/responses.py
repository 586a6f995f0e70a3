"""A fake OpenAI Responses API (`POST /v1/responses`, SSE streaming), for Codex CLI.

    with FakeResponses(brain) as fake:        # brain(request) -> Reply | HttpError
        base_url = fake.url + "/v1"           # a model provider in $CODEX_HOME/config.toml

A `Reply` is the model's output items: assistant `message` text, `function_call`s (Codex's shell
tools take JSON arguments) and `custom_tool_call`s (its freeform `apply_patch`), plus the usage to
report. The stream is written as the API does: response.created, response.output_item.added /
.done per item, response.completed with the usage. `outputs(body)` lists the tool outputs the
request carries, so a brain can play a fixed sequence (run a command, then say done).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import FakeServer, Handler, HttpError, Recorded

MODEL = "gpt-5-codex"

_ids = itertools.count(1)


@dataclass
class Reply:
    items: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 100
    output_tokens: int = 20
    model: str = MODEL


def message(value: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{next(_ids):04d}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": value, "annotations": []}]}


def function_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    n = next(_ids)
    return {"type": "function_call", "id": f"fc_{n:04d}", "call_id": f"call_{n:04d}", "name": name,
            "arguments": json.dumps(args), "status": "completed"}


def custom_tool_call(name: str, text: str) -> dict[str, Any]:
    n = next(_ids)
    return {"type": "custom_tool_call", "id": f"ctc_{n:04d}", "call_id": f"call_{n:04d}", "name": name,
            "input": text, "status": "completed"}


def error(status: int, message: str, code: str | None = None) -> HttpError:
    kind = {401: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
    return HttpError(status, {"error": {"message": message, "type": kind, "param": None,
                                        "code": code or ("invalid_api_key" if status == 401 else None)}})


def outputs(body: Any) -> list[dict[str, Any]]:
    """The tool results the request carries (function_call_output / custom_tool_call_output)."""
    items = body.get("input", []) if isinstance(body, dict) else []
    return [i for i in items if isinstance(i, dict) and i.get("type", "").endswith("_call_output")]


def user_text(body: Any) -> str:
    items = body.get("input", []) if isinstance(body, dict) else []
    texts = []
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    return "\n".join(texts)


def tool_names(body: Any) -> list[str]:
    tools = body.get("tools", []) if isinstance(body, dict) else []
    return [str(t.get("name") or t.get("type")) for t in tools if isinstance(t, dict)]


class FakeResponses(FakeServer):
    name = "fake-responses"

    def __init__(self, brain: Callable[[Recorded], Reply | HttpError]) -> None:
        super().__init__()
        self.brain = brain

    def calls(self) -> list[Recorded]:
        return self.posts("/responses")

    def answer(self, handler: Handler, rec: Recorded) -> None:
        path = rec.path.split("?")[0]
        if not path.endswith("/responses"):
            handler.send_json(404, {"error": {"message": f"no {path} here", "type": "invalid_request_error"}})
            return
        reply = self.brain(rec)
        if isinstance(reply, HttpError):
            handler.send_http_error(reply)
            return
        resp_id = f"resp_{next(_ids):06d}"
        usage = {"input_tokens": reply.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": reply.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": reply.input_tokens + reply.output_tokens}
        base = {"id": resp_id, "object": "response", "model": reply.model, "created_at": 1700000000}
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("response.created", {"type": "response.created", "sequence_number": 0,
                                  "response": {**base, "status": "in_progress", "output": []}}),
        ]
        for i, item in enumerate(reply.items):
            events.append(("response.output_item.added", {"type": "response.output_item.added", "output_index": i,
                                                           "item": {**item, "status": "in_progress"}}))
            events.append(("response.output_item.done", {"type": "response.output_item.done", "output_index": i,
                                                          "item": item}))
        events.append(("response.completed", {"type": "response.completed", "response": {
            **base, "status": "completed", "output": reply.items, "usage": usage}}))
        for n, (_, data) in enumerate(events):
            data.setdefault("sequence_number", n)
        handler.send_sse(events)


def usage_limit(resets_at: float, plan: str = "plus") -> HttpError:
    """What the ChatGPT backend answers Codex when the plan's usage window is used up: HTTP 429 with
    `"type": "usage_limit_reached"`, the plan and the reset (`resets_at` in seconds since 1970,
    `resets_in_seconds`), and the `x-codex-primary-*` headers of the window."""
    wait = max(int(resets_at - time.time()), 0)
    return HttpError(429, {"error": {"type": "usage_limit_reached", "message": "The usage limit has been reached",
                                     "plan_type": plan, "resets_at": int(resets_at), "resets_in_seconds": wait}},
                     {"x-codex-primary-used-percent": "100.0", "x-codex-primary-window-minutes": "300",
                      "x-codex-primary-reset-after-seconds": str(wait),
                      "x-codex-primary-reset-at": str(int(resets_at))})
