"""GitHub Copilot CLI (`npm install -g @github/copilot`), headless: the prompt on stdin.

- `--output-format json` prints JSONL session events (`user.message`, `assistant.message` with
  `content`, `tool.execution_*`, `model.call_finished`, `session.error` with `errorType` and
  `statusCode`, and a final `result` with `exitCode` and `usage`); `--allow-all-tools` approves its
  tools (needed headless), `--no-auto-update` keeps it from fetching a newer CLI.
- Usage: Copilot CLI 1.0.102 prints no token counts in this output for a custom provider (its
  `result.usage` has `premiumRequests` and durations; its `assistant.usage` event did not appear
  against an OpenAI-compatible server that reported usage), so kiro counts model calls
  (`model.call_finished`) and records no tokens or cost; `premiumRequests` is not money kiro can price.
- Endpoint and auth (`copilot help environment`): with COPILOT_PROVIDER_BASE_URL it uses that
  provider (BYOK; `COPILOT_PROVIDER_TYPE` openai/azure/anthropic) with COPILOT_PROVIDER_API_KEY_COMMAND,
  else COPILOT_PROVIDER_BEARER_TOKEN, else COPILOT_PROVIDER_API_KEY, and needs no GitHub login
  (COPILOT_OFFLINE=true skips GitHub entirely); otherwise GitHub Copilot, billed to the account of
  COPILOT_GITHUB_TOKEN, GH_TOKEN or GITHUB_TOKEN (in that order, before a stored `/login`).
- An unknown flag: clap's `error: unexpected argument '--x' found`, exit 1.
- It unpacks itself into `~/.cache/copilot/pkg` (about 235 MB) on a HOME's first run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiro.executors.agents import (
    Credential,
    Failure,
    FailureKind,
    Invocation,
    Preset,
    clean,
    error_line,
    json_lines,
    last_event,
    last_line,
    tail,
)
from kiro.executors.base import Usage

PROVIDER_KEYS = ("COPILOT_PROVIDER_API_KEY_COMMAND", "COPILOT_PROVIDER_BEARER_TOKEN", "COPILOT_PROVIDER_API_KEY")
GITHUB_TOKENS = ("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN")
_KINDS: dict[str, FailureKind] = {"authentication": "auth_error", "authorization": "auth_error",
                                  "rate_limit": "rate_limit", "quota": "rate_limit"}


class CopilotPreset(Preset):
    name = "copilot"
    program = "copilot"
    install = "npm install -g @github/copilot"
    command = "copilot --output-format json --allow-all-tools --no-auto-update"
    idle_timeout_seconds = 600.0
    env_keys = ("COPILOT_PROVIDER_BASE_URL", "COPILOT_PROVIDER_API_KEY", "COPILOT_MODEL", "COPILOT_OFFLINE",
                "COPILOT_GITHUB_TOKEN", "GH_TOKEN", "COPILOT_HOME")

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
        return {"NO_COLOR": "1", "COPILOT_AUTO_UPDATE": "false"}

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

    def parse_usage(self, stdout: str) -> Usage | None:
        calls = sum(1 for e in json_lines(stdout) if e.get("type") == "model.call_finished")
        if not calls:
            return None
        return Usage(api_calls=calls)

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
        line = error_line(stderr) or last_line(stderr) or last_line(stdout) or f"exit status {exit_code}"
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

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
