"""A fake Gemini API (generativelanguage `v1beta`), for Gemini CLI:

    POST /v1beta/models/{model}:streamGenerateContent?alt=sse   the agent's turns (SSE)
    POST /v1beta/models/{model}:generateContent                 side calls (routing, checks): JSON
    POST /v1beta/models/{model}:countTokens

    with FakeGemini(brain) as fake:           # brain(request) -> Turn | HttpError
        env["GOOGLE_GEMINI_BASE_URL"] = fake.url

A `Turn` is the model's content: `text` and `functionCall` parts, and the usage to report
(`usageMetadata`: promptTokenCount, candidatesTokenCount, totalTokenCount). A stream is written as
the API does: one `GenerateContentResponse` per `data:` event, the text in pieces, function calls
whole, `finishReason` and the final usage on the last event. Errors use Google's error format
(`{"error": {"code", "message", "status"}}`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import FakeServer, Handler, HttpError, Recorded

MODEL = "gemini-2.5-flash"

STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


@dataclass
class Turn:
    parts: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 100
    output_tokens: int = 20


def text(value: str) -> dict[str, Any]:
    return {"text": value}


def function_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"functionCall": {"name": name, "args": args}}


def error(status: int, message: str, reason: str | None = None) -> HttpError:
    body: dict[str, Any] = {"code": status, "message": message, "status": STATUS.get(status, "UNKNOWN")}
    if reason:
        body["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                            "domain": "googleapis.com"}]
    return HttpError(status, {"error": body})


def contents(body: Any) -> list[dict[str, Any]]:
    return list(body.get("contents", [])) if isinstance(body, dict) else []


def user_text(body: Any) -> str:
    return "\n".join(p.get("text", "") for c in contents(body) if c.get("role") == "user"
                     for p in c.get("parts", []) if isinstance(p, dict))


def function_responses(body: Any) -> list[dict[str, Any]]:
    return [p["functionResponse"] for c in contents(body) for p in c.get("parts", [])
            if isinstance(p, dict) and "functionResponse" in p]


def declared_tools(body: Any) -> list[str]:
    tools = body.get("tools") if isinstance(body, dict) else None
    return [d.get("name", "") for t in tools or [] if isinstance(t, dict)
            for d in t.get("functionDeclarations", []) or []]


class FakeGemini(FakeServer):
    name = "fake-gemini"

    def __init__(self, brain: Callable[[Recorded], Turn | HttpError]) -> None:
        super().__init__()
        self.brain = brain

    def agent_calls(self) -> list[Recorded]:
        """The agent's streamed turns (side calls such as model routing are not streamed)."""
        return self.posts(":streamGenerateContent")

    def answer(self, handler: Handler, rec: Recorded) -> None:
        path = rec.path.split("?")[0]
        model, _, method = path.rpartition("/")[2].partition(":")
        if method == "countTokens":
            handler.send_json(200, {"totalTokens": 100})
            return
        if method not in ("generateContent", "streamGenerateContent"):
            handler.send_json(404, error(404, f"method {method or path} is not found").body)
            return
        reply = self.brain(rec)
        if isinstance(reply, HttpError):
            handler.send_http_error(reply)
            return
        usage = {"promptTokenCount": reply.prompt_tokens, "candidatesTokenCount": reply.output_tokens,
                 "totalTokenCount": reply.prompt_tokens + reply.output_tokens}

        def response(parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
            if last:
                candidate["finishReason"] = "STOP"
            return {"candidates": [candidate], "usageMetadata": usage if last else
                    {"promptTokenCount": reply.prompt_tokens}, "modelVersion": model, "responseId": "fake"}

        if method == "generateContent":
            handler.send_json(200, response(reply.parts, True))
            return
        pieces: list[list[dict[str, Any]]] = []
        for part in reply.parts:
            if "text" in part:
                value = part["text"]
                pieces += [[{"text": value[i:i + 40]}] for i in range(0, max(len(value), 1), 40)]
            else:
                pieces.append([part])
        pieces = pieces or [[{"text": ""}]]
        events: list[tuple[str | None, dict[str, Any]]] = [
            (None, response(p, i == len(pieces) - 1)) for i, p in enumerate(pieces)]
        handler.send_sse(events)


def side_call_answer(body: Any) -> str:
    """What a side call (not the agent's turn) gets: Gemini CLI asks for JSON there (model routing's
    complexity score, the next-speaker check); an honest minimal answer of that shape."""
    config = body.get("generationConfig", {}) if isinstance(body, dict) else {}
    if isinstance(config, dict) and config.get("responseMimeType") == "application/json":
        return json.dumps({"complexity_reasoning": "a single edit", "complexity_score": 10,
                           "reasoning": "the model finished its turn", "next_speaker": "user"})
    return "ok"


def quota(retry_seconds: int, per: str = "Minute") -> HttpError:
    """The Gemini API's answer to a used-up quota: 429 RESOURCE_EXHAUSTED with a QuotaFailure (the
    quota id says per minute or per day), a Help link and a RetryInfo `retryDelay`."""
    message = ("You exceeded your current quota, please check your plan and billing details. For more information "
               "on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for "
               "metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 50, model: "
               f"{MODEL}\nPlease retry in {retry_seconds}.5s.")
    return HttpError(429, {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": f"GenerateRequestsPer{per}PerProjectPerModel-FreeTier",
            "quotaDimensions": {"location": "global", "model": MODEL}, "quotaValue": "50"}]},
        {"@type": "type.googleapis.com/google.rpc.Help", "links": [
            {"description": "Learn more about Gemini API quotas",
             "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_seconds}s"}]}})
