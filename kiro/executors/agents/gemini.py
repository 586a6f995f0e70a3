"""Gemini CLI (`npm install -g @google/gemini-cli`), headless.

- The prompt goes on stdin (headless mode when stdin is not a terminal); `--output-format
  stream-json` prints JSONL events as they happen (`init`, `message`, `tool_use`, `tool_result`,
  `error`, and a final `result` with `status` and `stats`: input/output/total tokens per model).
- `--approval-mode yolo` approves its tools (edits, shell); a folder it does not trust silently
  downgrades that to "default" (and every edit is refused), so `--skip-trust` trusts the project
  for this run.
- Endpoint and auth: `GEMINI_API_KEY` (with `security.auth.selectedType: "gemini-api-key"` in
  `~/.gemini/settings.json`), or Vertex AI (`GOOGLE_GENAI_USE_VERTEXAI`, `GOOGLE_CLOUD_PROJECT`), or
  a cached Google login; `GOOGLE_GEMINI_BASE_URL` points it at another Gemini API server (https,
  or http on localhost); `GEMINI_MODEL` / `-m` picks the model (without one it routes each request
  between models with an extra model call). `GEMINI_CLI_HOME` moves its config folder.
- Credentials (its bundle's `validateNonInteractiveAuth`: `configuredAuthType || getAuthTypeFromEnv()`):
  `security.auth.selectedType` in settings.json decides (`oauth-personal` is the Google login in
  `~/.gemini/oauth_creds.json`, `gemini-api-key` is GEMINI_API_KEY); without one, the environment in
  this order: GOOGLE_GENAI_USE_GCA=true (login), GOOGLE_GENAI_USE_VERTEXAI=true, GOOGLE_GEMINI_BASE_URL
  (a gateway), GEMINI_API_KEY. So a key is billed before a login only when no type is selected.
- It reports tokens, not money: kiro prices them with `llm.prices[<model>]` (the model names in the
  result's stats).
- Exit codes: 0 ok, 1 general or API error, 41 auth, 42 bad input, 52 bad config, 53 turn limit;
  an unknown flag prints `Unknown arguments: ...` and the help, exit 1.
- Quotas: a 429 RESOURCE_EXHAUSTED whose RetryInfo asks for more than 300 s, or a per-day
  QuotaFailure, is a TerminalQuotaError (no retry; exit 173): the `result` event's error says
  "[API Error: You exceeded your current quota, ... Please retry in 3600.5s.\nSuggested retry
  after 3600s.]" or "[API Error: You have exhausted your daily quota on this model.]" (no time).
  Shorter delays it waits out itself.
- What kiro reads for a failure (never the model's text: its `message` events): the exit code, stderr,
  and gemini's own `error` events and the `result` event's `status` and `error`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kiro.executors.agents import (
    Credential,
    Failure,
    FailureKind,
    Preset,
    ToolCall,
    after,
    clean,
    env_folder,
    error_line,
    flag_value,
    json_lines,
    last_event,
    last_line,
    read_json,
    shown,
    tail,
    tool_call,
)
from kiro.executors.base import Usage

_UNKNOWN = re.compile(r"^(Unknown arguments?|Not enough arguments|Invalid values|Missing required argument)\b.*",
                      re.M)
_AUTH = re.compile(r"API[_ ]key[_ ]not[_ ]valid|API_KEY_INVALID|UNAUTHENTICATED|PERMISSION_DENIED|\b401\b|\b403\b|"
                   r"auth method|GEMINI_API_KEY|login required|Invalid API key", re.I)
_RATE = re.compile(r"RESOURCE_EXHAUSTED|\b429\b|quota|rate limit", re.I)
EXIT_KINDS: dict[int, FailureKind] = {41: "auth_error", 42: "usage_error", 52: "usage_error"}


_QUOTA = re.compile(r"exhausted your (daily )?quota|exceeded your current quota|Quota exceeded|"
                    r"exhausted your capacity|TerminalQuotaError", re.I)
_RETRY = re.compile(r"(?:Suggested retry after|Please retry in) (\d+(?:\.\d+)?(?:ms|s))\b")


class GeminiPreset(Preset):
    name = "gemini"
    program = "gemini"
    install = "npm install -g @google/gemini-cli"
    command = "gemini --output-format stream-json --approval-mode yolo --skip-trust"
    idle_timeout_seconds = 600.0
    env_prefixes = ("GEMINI_", "GOOGLE_")
    env_keys = ("GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GEMINI_MODEL", "GOOGLE_API_KEY",
                "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_CLOUD_PROJECT", "GEMINI_CLI_HOME")

    prices_tokens = True

    def model_name(self) -> str | None:
        return flag_value(self.template(), "-m", "--model") or os.environ.get("GEMINI_MODEL") or None

    key_vars = ("GEMINI_API_KEY",)

    @staticmethod
    def _folder(env: Mapping[str, str]) -> Path:
        return Path(env.get("GEMINI_CLI_HOME") or env.get("HOME") or Path.home()) / ".gemini"

    def _selected(self, env: Mapping[str, str]) -> str | None:
        data = read_json(self._folder(env) / "settings.json")
        if not isinstance(data, dict):
            return None
        auth = data.get("security", {}).get("auth", {}) if isinstance(data.get("security"), dict) else {}
        chosen = auth.get("selectedType") if isinstance(auth, dict) else None
        chosen = chosen or data.get("selectedAuthType")  # the older settings layout
        return chosen if isinstance(chosen, str) else None

    def login(self, env: Mapping[str, str]) -> str | None:
        path = self._folder(env) / "oauth_creds.json"
        return f"Google login in {shown(path, env)}" if path.is_file() else None

    def keys_over_login(self, env: Mapping[str, str]) -> list[str]:
        if self._selected(env) is not None:  # its settings choose: nothing is billed by surprise
            return []
        return super().keys_over_login(env)

    def credential(self, env: Mapping[str, str]) -> Credential:
        chosen = self._selected(env)
        if chosen is None:
            if env.get("GOOGLE_GENAI_USE_GCA") == "true":
                chosen = "oauth-personal"
            elif env.get("GOOGLE_GENAI_USE_VERTEXAI") == "true":
                chosen = "vertex-ai"
            elif env.get("GOOGLE_GEMINI_BASE_URL"):
                chosen = "gateway"
            elif env.get("GEMINI_API_KEY"):
                chosen = "gemini-api-key"
        if chosen == "oauth-personal":
            return Credential("login", self.login(env) or "Google login (none cached yet: it will fail unattended)")
        if chosen == "gemini-api-key":
            return Credential("api_key", "GEMINI_API_KEY") if env.get("GEMINI_API_KEY") else Credential(
                "unknown", "has no credential: its settings select gemini-api-key and GEMINI_API_KEY is not set")
        if chosen == "vertex-ai":
            return Credential("api_key", "GOOGLE_API_KEY (Vertex AI)") if env.get("GOOGLE_API_KEY") else Credential(
                "login", "Google Cloud credentials (Vertex AI)")
        if chosen is not None:
            return Credential("unknown", f"uses auth type {chosen!r} (its settings or environment)")
        return super().credential(env)

    def env(self, inv: Any) -> dict[str, str]:
        """No colours, and one node process a step: left to itself Gemini CLI starts a second node process of
        itself (to raise its heap limit to half the machine's memory) under a first one that only waits for
        it, a third more CPU a step."""
        return {"NO_COLOR": "1", "GEMINI_CLI_NO_RELAUNCH": "true"}

    def home_paths(self, env: Mapping[str, str]) -> list[Path]:
        """`~/.gemini`, or the folder `GEMINI_CLI_HOME` names (gemini keeps its `.gemini` in it)."""
        folder = env_folder(env, "GEMINI_CLI_HOME", ".gemini")
        return [folder] if folder is not None else []

    @staticmethod
    def _result(stdout: str) -> dict[str, Any] | None:
        return last_event(stdout, "result")

    def parse_usage(self, stdout: str) -> Usage | None:
        result = self._result(stdout)
        stats = result.get("stats") if result else None
        if not isinstance(stats, dict):
            return None
        models = stats.get("models") if isinstance(stats.get("models"), dict) else {}
        total = Usage()
        rows = [(name, row) for name, row in models.items() if isinstance(row, dict)] if models else [(None, stats)]
        for name, row in rows:
            prompt = int(row.get("input_tokens") or 0)
            completion = int(row.get("output_tokens") or 0)
            tokens = int(row.get("total_tokens") or prompt + completion)
            cost = 0.0
            price = self.config.llm.prices.get(name) if name else None
            if price is not None:
                cost = (prompt * price.input_per_1m + completion * price.output_per_1m) / 1_000_000
            total.add(Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=tokens,
                                api_calls=0, cost_usd=cost))
        total.api_calls = self._model_calls(stdout)
        return total

    tool_marker = '"tool_use"'

    def tool_calls(self, event: dict[str, Any]) -> list[ToolCall]:
        """stream-json: `{"type": "tool_use", "tool_name": ..., "parameters": {...}}` as each call starts."""
        if event.get("type") != "tool_use":
            return []
        found = tool_call(event.get("tool_name"), event.get("parameters"))
        return [found] if found is not None else []

    @staticmethod
    def _model_calls(stdout: str) -> int:
        """The stream does not count requests: one to start, and one more after each batch of tool
        results (the model answers them)."""
        calls, previous = 1, None
        for event in json_lines(stdout):
            kind = event.get("type")
            if kind == "tool_result" and previous != "tool_result":
                calls += 1
            previous = kind
        return calls

    @staticmethod
    def _errors(stdout: str) -> list[str]:
        found = []
        for event in json_lines(stdout):
            err = event.get("error")
            if event.get("type") in ("result", "error") and isinstance(err, dict) \
                    and isinstance(err.get("message"), str):
                found.append(err["message"])
            elif event.get("type") == "error" and isinstance(event.get("message"), str):
                found.append(event["message"])
        return found

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        result = self._result(stdout)
        failed_result = result is not None and result.get("status") not in (None, "success")
        if exit_code == 0 and not failed_result:
            return None
        m = _UNKNOWN.search(clean(stderr))
        if m is not None:
            return Failure("usage_error", m.group(0).strip()[:300])
        errors = self._errors(stdout)
        line = (clean(errors[-1]).strip().splitlines() or [""])[0][:300] if errors else None
        line = line or error_line(stderr) or last_line(stderr) or f"exit status {exit_code}"  # not stdout: the model's
        kind: FailureKind
        if exit_code in EXIT_KINDS:
            kind = EXIT_KINDS[exit_code]
        elif _AUTH.search(line):
            kind = "auth_error"
        elif _RATE.search(line):
            kind = "rate_limit"
        else:
            kind = self.kind_of(exit_code, f"{stderr}\n{line}", line)
        return Failure(kind, line)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        said = next((e for e in reversed(self._errors(stdout)) if _QUOTA.search(e)), None)
        if said is None:
            return None
        result = self._result(stdout) or {}
        try:
            since = datetime.fromisoformat(str(result.get("timestamp")).replace("Z", "+00:00"))
        except ValueError:
            since = datetime.now(UTC)
        delays = _RETRY.findall(said)
        line = clean(said).strip().splitlines()[0][:300]
        return Failure("usage_limit", line, after(delays[-1], since) if delays else None)

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        """The model's last message (its deltas joined), or the error it ended with (an `error` event
        in a run that succeeded was a warning)."""
        result = self._result(stdout)
        errors = self._errors(stdout)
        if errors and (result is None or result.get("status") != "success"):
            return tail(clean(errors[-1]))
        said: list[str] = []
        current: list[str] = []
        for event in json_lines(stdout):
            if event.get("type") == "message" and event.get("role") == "assistant" \
                    and isinstance(event.get("content"), str):
                current.append(event["content"])
            elif event.get("type") in ("tool_use", "result") and current:
                said.append("".join(current))
                current = []
        if current:
            said.append("".join(current))
        if said:
            return tail(clean(said[-1]))
        return super().summary("" if stdout.lstrip().startswith("{") else stdout, stderr, prompt)
