"""Qwen Code (`npm install -g @qwen-code/qwen-code`), headless (prompt on stdin).

- `--output-format stream-json` prints Claude Code's stream-json shape (`system`/`init` with the
  model, `assistant` and `user` messages with content blocks, a final `result` with `is_error`,
  `num_turns` and `usage`: input/output/total tokens), so it shares the Claude preset's reading of
  the stream; it reports tokens, not money: kiro prices them with `llm.prices[<model>]`.
- `--approval-mode yolo` approves its tools (edits, shell) in a headless run.
- An API error does not fail the run: qwen 0.15 exits 0 with `result` "[API Error: 401 Incorrect API
  key provided ...]" (and `is_error` false), so kiro reads that text; it retries a 429 itself, with
  backoff, for minutes. An unknown flag: `Unknown arguments: ...` and its help, exit 1.
- Endpoint and auth (its bundle: `argv.authType || settings.security.auth.selectedType ||
  getAuthTypeFromEnv()`): `--auth-type`, else `security.auth.selectedType` in `~/.qwen/settings.json`
  (`qwen-oauth` is the login kept in `~/.qwen/oauth_creds.json`), else the environment: QWEN_OAUTH,
  then OPENAI_API_KEY + OPENAI_MODEL + OPENAI_BASE_URL (any OpenAI-compatible Chat Completions
  server), then GEMINI_API_KEY + GEMINI_MODEL, ANTHROPIC_API_KEY + ANTHROPIC_MODEL + ANTHROPIC_BASE_URL.
  A key is never billed over a login its settings select.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from kiro.executors.agents import (
    Credential,
    Failure,
    FailureKind,
    Invocation,
    clean,
    error_line,
    json_lines,
    last_line,
    read_json,
    shown,
)
from kiro.executors.agents.claude import ClaudePreset
from kiro.executors.base import Usage

_API_ERROR = re.compile(r"^\[API Error: (?:(?P<status>\d{3})\b)?(?P<rest>.*)\]\s*$", re.S)
_UNKNOWN = re.compile(r"^(Unknown arguments?|Not enough arguments|Invalid values|Missing required argument)\b.*",
                      re.M)
_RATE = re.compile(r"rate[ _-]?limit|quota|too many requests|overloaded", re.I)


class QwenPreset(ClaudePreset):
    name = "qwen"
    program = "qwen"
    install = "npm install -g @qwen-code/qwen-code"
    command = "qwen --output-format stream-json --approval-mode yolo"
    idle_timeout_seconds = 600.0
    env_keys: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "QWEN_OAUTH")
    key_vars: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY",)

    def extra_args(self) -> list[str]:
        return []  # its tools are approved by --approval-mode, not Claude's --allowedTools

    def env(self, inv: Invocation) -> dict[str, str]:
        return {"NO_COLOR": "1"}

    # -- credentials -------------------------------------------------------------------------

    @staticmethod
    def _folder(env: Mapping[str, str]) -> Path:
        return Path(env.get("HOME") or Path.home()) / ".qwen"

    def _selected(self, env: Mapping[str, str]) -> str | None:
        data = read_json(self._folder(env) / "settings.json")
        security = data.get("security") if isinstance(data, dict) else None
        auth = security.get("auth") if isinstance(security, dict) else None
        chosen = auth.get("selectedType") if isinstance(auth, dict) else None
        return chosen if isinstance(chosen, str) else None

    def login(self, env: Mapping[str, str]) -> str | None:
        path = self._folder(env) / "oauth_creds.json"
        return f"Qwen OAuth login in {shown(path, env)}" if path.is_file() else None

    def keys_over_login(self, env: Mapping[str, str]) -> list[str]:
        return []  # its settings or QWEN_OAUTH choose the login before any key variable

    def credential(self, env: Mapping[str, str]) -> Credential:
        chosen = self._selected(env)
        if chosen is None:
            if env.get("QWEN_OAUTH"):
                chosen = "qwen-oauth"
            elif all(env.get(v) for v in ("OPENAI_API_KEY", "OPENAI_MODEL", "OPENAI_BASE_URL")):
                chosen = "openai"
        if chosen == "qwen-oauth":
            return Credential("login", self.login(env) or "Qwen OAuth (no login cached: it will fail unattended)")
        if chosen == "openai":
            return Credential("api_key", "OPENAI_API_KEY") if env.get("OPENAI_API_KEY") else Credential(
                "unknown", "has its settings select openai with OPENAI_API_KEY not set (a key in its settings, if any)")
        if chosen is not None:
            return Credential("unknown", f"uses auth type {chosen!r} (its settings)")
        return Credential("unknown", "has no auth type kiro can see (set OPENAI_API_KEY, OPENAI_MODEL and "
                                     "OPENAI_BASE_URL, or log it in)")

    # -- what came out -------------------------------------------------------------------------

    def _model(self, stdout: str) -> str | None:
        for event in json_lines(stdout):
            if event.get("type") == "system" and isinstance(event.get("model"), str):
                return str(event["model"])
        return None

    def parse_usage(self, stdout: str) -> Usage | None:
        result = self._result(stdout)
        usage = result.get("usage") if result is not None else None
        if not isinstance(usage, dict):
            return None

        def n(key: str) -> int:
            value = usage.get(key)
            return int(value) if isinstance(value, int | float) else 0

        prompt, completion = n("input_tokens"), n("output_tokens")  # input already counts the cached part
        turns = result.get("num_turns") if result is not None else None
        total = Usage(prompt_tokens=prompt, completion_tokens=completion,
                      total_tokens=n("total_tokens") or prompt + completion,
                      api_calls=int(turns) if isinstance(turns, int) else 0)
        model = self._model(stdout)
        price = self.config.llm.prices.get(model) if model else None
        if price is not None:
            total.cost_usd = (prompt * price.input_per_1m + completion * price.output_per_1m) / 1_000_000
        return total

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        result = self._result(stdout)
        text = result.get("result") if result is not None else None
        m = _API_ERROR.match(text.strip()) if isinstance(text, str) else None
        if exit_code == 0 and m is None and not (result is not None and result.get("is_error")):
            return None
        unknown = _UNKNOWN.search(clean(stderr))
        if unknown is not None:
            return Failure("usage_error", unknown.group(0).strip()[:300])
        if m is not None:
            assert isinstance(text, str)
            line = clean(text).strip().splitlines()[0][:300]
            status = int(m["status"]) if m["status"] else None
            kind: FailureKind = ("auth_error" if status in (401, 403) else "rate_limit" if status == 429
                                 or _RATE.search(line) else self.kind_of(exit_code, line, line))
            return Failure(kind, line)
        if result is not None and isinstance(text, str) and text.strip():
            line = clean(text).strip().splitlines()[0][:300]
        else:
            line = error_line(stderr) or last_line(stderr) or last_line(stdout) or f"exit status {exit_code}"
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def fatal_line(self, line: str) -> Failure | None:
        return None  # a refused key ends qwen's run at once
