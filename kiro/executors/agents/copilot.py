"""GitHub Copilot CLI (`npm install -g @github/copilot`), headless: the prompt on stdin.

- `--output-format json` prints JSONL session events (`user.message`, `assistant.message` with
  `content`, `tool.execution_*`, `model.call_finished`, `session.error` with `errorType` and
  `statusCode`, and a final `result` with `exitCode` and `usage`); `--allow-all-tools` approves its
  tools (needed headless), `--no-auto-update` keeps it from fetching a newer CLI.
- Usage: its stdout has no token counts (its `result.usage` holds `premiumRequests` and durations), but
  the session it names there (`result.sessionId`) is recorded in `$COPILOT_HOME/session-state/<id>/
  events.jsonl` (`~/.copilot/`), one `session.usage_record` per model call with the model's
  `inputTokens` (for an OpenAI-compatible provider its prompt_tokens, cached part included),
  `outputTokens`, `cacheReadTokens` and `cacheWriteTokens` (`--usage-output-file` writes the same
  totals). kiro reads those records and prices them with `llm.prices[<model>]` (a custom provider's
  `cost` is 0); api_calls are its `model.call_finished` events. In kiro's box ~/.copilot is its own
  folder, read-write, so the session file is there after the run.
- Limits: a provider's 429 is retried by copilot 5 times, each after the server's `Retry-After` when
  that is at most about 3 minutes (150 s was waited, 200 s was not), then ends the run with
  `session.error` {errorType "rate_limit", statusCode 429, message "Failed to get response from the AI
  model; retried 5 times (total retry wait time: 21.90 seconds) Last error: 429 <the provider's
  message>"}; a longer Retry-After ends it at once ("429 <message>"). Its stdout gives no reset time;
  its log (`$COPILOT_HOME/logs/process-*.log`, the one that says "Workspace initialized: <session>")
  has each failure's `retry_after_ms`: kiro takes the last one's time plus that wait as the reset.
  GitHub's own limits come as messages of its runtime ("You've hit your rate limit. Please wait for
  your limit to reset", "You've reached your weekly rate limit.", "You've run out of your included AI
  credits for the month", "You've reached your additional usage limit for your plan"): usage limits
  too, reset when the message states a time, else kiro's probe schedule. (Not run here: only its
  custom provider can be pointed at 127.0.0.1.) "You've reached the spending limit for this session.
  Start a new session to continue." is not one: the next attempt is a new session.
- Endpoint and auth (`copilot help environment`): with COPILOT_PROVIDER_BASE_URL it uses that
  provider (BYOK; `COPILOT_PROVIDER_TYPE` openai/azure/anthropic) with COPILOT_PROVIDER_API_KEY_COMMAND,
  else COPILOT_PROVIDER_BEARER_TOKEN, else COPILOT_PROVIDER_API_KEY, and needs no GitHub login
  (COPILOT_OFFLINE=true skips GitHub entirely); otherwise GitHub Copilot, billed to the account of
  COPILOT_GITHUB_TOKEN, GH_TOKEN or GITHUB_TOKEN (in that order, before a stored `/login`).
- An unknown flag: clap's `error: unexpected argument '--x' found`, exit 1.
- It unpacks itself into `~/.cache/copilot/pkg` (`$XDG_CACHE_HOME/copilot/pkg`, about 235 MB) on a HOME's
  first run; kiro's box shows that folder read-only (`read_paths`), else it unpacked itself at every step.
- What kiro reads for a failure (never the model's text: its `assistant.message` events): the exit code,
  stderr, copilot's `session.error` events (`errorType`, `statusCode`), the `result`'s `exitCode`, and
  its process log for the Retry-After.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kiro.executors.agents import (
    Credential,
    Failure,
    FailureKind,
    Invocation,
    Preset,
    clean,
    env_folder,
    error_line,
    flag_value,
    json_lines,
    last_event,
    last_line,
    reset_said,
    tail,
)
from kiro.executors.base import Usage

PROVIDER_KEYS = ("COPILOT_PROVIDER_API_KEY_COMMAND", "COPILOT_PROVIDER_BEARER_TOKEN", "COPILOT_PROVIDER_API_KEY")
GITHUB_TOKENS = ("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN")
_KINDS: dict[str, FailureKind] = {"authentication": "auth_error", "authorization": "auth_error",
                                  "rate_limit": "rate_limit", "quota": "rate_limit", "quota_exhausted": "rate_limit"}
# GitHub Copilot's own limit messages (its runtime's strings)
_LIMIT_TEXT = re.compile(r"You've (?:hit|reached) your (?:rate|weekly rate|session rate|additional usage) limit|"
                         r"You've hit the rate limit for this model|You've run out of your included AI credits|"
                         r"AI credit limit reached|No remaining quota for premium requests")
_SESSION_SPEND = "spending limit for this session"
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_FAILED = re.compile(r"^(?P<at>\S+) \[WARNING\] .*Model provider request failed (?P<data>\{.*\})\s*$", re.M)
FILE_KEPT = 32 * 1024 * 1024  # of a session's events or a process log read after a run
LOGS_LOOKED_AT = 20  # the newest process logs searched for a session


class CopilotPreset(Preset):
    name = "copilot"
    program = "copilot"
    install = "npm install -g @github/copilot"
    command = "copilot --output-format json --allow-all-tools --no-auto-update"
    idle_timeout_seconds = 600.0
    env_prefixes = ("COPILOT_", "GH_", "GITHUB_TOKEN")
    env_keys = ("COPILOT_PROVIDER_BASE_URL", "COPILOT_PROVIDER_API_KEY", "COPILOT_MODEL", "COPILOT_OFFLINE",
                "COPILOT_GITHUB_TOKEN", "GH_TOKEN", "COPILOT_HOME")

    prices_tokens = True

    def model_name(self) -> str | None:
        return flag_value(self.template(), "--model") or os.environ.get("COPILOT_MODEL") or None

    def version_line(self, stdout: str) -> str | None:
        """`GitHub Copilot CLI 1.0.102.` is its first line (the last one says how to update)."""
        lines = [line.strip() for line in clean(stdout).splitlines() if line.strip()]
        return lines[0].rstrip(".") if lines else None

    def argv(self, inv: Invocation, template: Any = None) -> list[str]:
        argv = super().argv(inv, template)
        folder = inv.task_file.parent
        try:
            folder.relative_to(inv.project_dir)
        except ValueError:  # the task file lives outside the project: let it edit there
            if "--add-dir" not in argv:
                argv[1:1] = ["--add-dir", str(folder)]
        return argv

    def env(self, inv: Invocation) -> dict[str, str]:
        folder = env_folder(os.environ, "COPILOT_HOME", ".copilot")
        if folder is not None:  # made now, so kiro's box binds it and its session records outlive the run
            try:
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError:
                pass  # it runs without them: kiro then counts model calls only
        return {"NO_COLOR": "1", "COPILOT_AUTO_UPDATE": "false"}

    def home_paths(self, env: Mapping[str, str]) -> list[Path]:
        """$COPILOT_HOME (`~/.copilot`): its config, login, session records and logs."""
        folder = env_folder(env, "COPILOT_HOME", ".copilot")
        return [folder] if folder is not None else []

    def read_paths(self, env: Mapping[str, str]) -> list[Path]:
        """Also the package it unpacked itself into on its first run (`~/.cache/copilot/pkg`, ~235 MB), read-only:
        in kiro's box, where the rest of $HOME is empty, it unpacked it again at every step (a third of its CPU,
        and 235 MB of the box's memory). Read-only: the agent cannot change the program it runs outside the box."""
        cache = env_folder(env, "XDG_CACHE_HOME", ".cache")
        unpacked = cache / "copilot" / "pkg" if cache is not None else None
        return [*super().read_paths(env), *([unpacked] if unpacked is not None and unpacked.is_dir() else [])]

    def credential(self, env: Mapping[str, str]) -> Credential:
        if env.get("COPILOT_PROVIDER_BASE_URL"):
            for name in PROVIDER_KEYS:
                if env.get(name):
                    return Credential("api_key", f"{name} (its provider at COPILOT_PROVIDER_BASE_URL)")
            return Credential("unknown", "uses its provider at COPILOT_PROVIDER_BASE_URL with no key variable set")
        for name in GITHUB_TOKENS:
            if env.get(name):
                return Credential("login", f"the GitHub Copilot account of the token in {name}")
        return Credential("login", "a stored GitHub /login, if there is one: kiro cannot see it")

    # -- what came out -------------------------------------------------------------------------

    @staticmethod
    def _session(stdout: str) -> tuple[Path, str] | None:
        """Its home, as kiro's environment gives it (the CLI's own), and the session its `result` names."""
        result = last_event(stdout, "result")
        sid = result.get("sessionId") if result is not None else None
        folder = env_folder(os.environ, "COPILOT_HOME", ".copilot")
        if not isinstance(sid, str) or not _SESSION_ID.match(sid) or folder is None:
            return None
        return folder, sid

    def parse_usage(self, stdout: str) -> Usage | None:
        calls = sum(1 for e in json_lines(stdout) if e.get("type") == "model.call_finished")
        if not calls:
            return None
        total = Usage(api_calls=calls)
        session = self._session(stdout)
        events = _tail(session[0] / "session-state" / session[1] / "events.jsonl") if session is not None else None
        for event in json_lines(events or ""):
            data = event.get("data")
            record = data.get("usage") if event.get("type") == "session.usage_record" and isinstance(data, dict) \
                else None
            if not isinstance(record, dict):
                continue

            def n(key: str, record: dict[str, Any] = record) -> int:
                value = record.get(key)
                return int(value) if isinstance(value, int | float) else 0

            prompt, completion = n("inputTokens"), n("outputTokens")
            price = self.config.llm.prices.get(str(record.get("model")))
            cost = (prompt * price.input_per_1m + completion * price.output_per_1m) / 1_000_000 if price else 0.0
            total.add(Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                            cost_usd=cost))
        return total

    @staticmethod
    def _errors(stdout: str) -> list[dict[str, Any]]:
        return [e["data"] for e in json_lines(stdout)
                if e.get("type") == "session.error" and isinstance(e.get("data"), dict)]

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        result = last_event(stdout, "result")
        code = result.get("exitCode") if result is not None else None
        errors = self._errors(stdout)
        if exit_code == 0 and code in (None, 0) and not errors:
            return None
        if errors:
            data = errors[-1]
            message = data.get("message") if isinstance(data.get("message"), str) else "session error"
            line = (clean(str(message)).strip().splitlines() or [""])[0][:300]
            status = data.get("statusCode")
            kind = _KINDS.get(str(data.get("errorType")))
            if kind is None:
                kind = ("auth_error" if status in (401, 403) else "rate_limit" if status == 429
                        else self.kind_of(exit_code, line, line))
            return Failure(kind, line)
        line = error_line(stderr) or last_line(stderr) or f"exit status {exit_code}"  # not stdout: the model's
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        """A 429 (or GitHub's limit message) that outlasted its own retries: reset when the message states
        a time, else at the last failure's time plus the Retry-After its log recorded."""
        errors = self._errors(stdout)
        message = errors[-1].get("message") if errors else None
        if not isinstance(message, str) or _SESSION_SPEND in message:
            return None
        if errors[-1].get("statusCode") != 429 and not _LIMIT_TEXT.search(message):
            return None
        line = (clean(message).strip().splitlines() or ["copilot: usage limit (HTTP 429)"])[0][:300]
        return Failure("usage_limit", line, reset_said(message) or self._retry_after(stdout))

    def _retry_after(self, stdout: str) -> datetime | None:
        """The last "Model provider request failed" of the session's process log: its time plus its
        `retry_after_ms`."""
        session = self._session(stdout)
        if session is None:
            return None
        folder, sid = session
        try:
            logs = sorted((folder / "logs").glob("process-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return None
        for log in logs[:LOGS_LOOKED_AT]:
            text = _tail(log) or ""
            if f"Workspace initialized: {sid}" not in text:
                continue
            for m in reversed(list(_FAILED.finditer(text))):
                wait = _json(m["data"]).get("retry_after_ms")
                try:
                    at = datetime.fromisoformat(m["at"].replace("Z", "+00:00"))
                except ValueError:
                    continue
                if isinstance(wait, int | float) and not isinstance(wait, bool):
                    return at + timedelta(milliseconds=wait)
                return None
            return None
        return None

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        errors = self._errors(stdout)
        if errors and isinstance(errors[-1].get("message"), str):
            return tail(clean(errors[-1]["message"]))
        said = [e["data"]["content"] for e in json_lines(stdout) if e.get("type") == "assistant.message"
                and isinstance(e.get("data"), dict) and isinstance(e["data"].get("content"), str)
                and e["data"]["content"].strip()]
        if said:
            return tail(clean(said[-1]))
        return super().summary("" if stdout.lstrip().startswith("{") else stdout, stderr, prompt)


def _tail(path: Path) -> str | None:
    """A file's text, at most FILE_KEPT of its end; None when it cannot be read."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - FILE_KEPT))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
