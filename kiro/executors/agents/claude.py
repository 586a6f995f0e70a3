"""Claude Code (`npm install -g @anthropic-ai/claude-code`), run headless with `claude -p`.

- The prompt goes on stdin; `--output-format stream-json --verbose` prints one JSON event per line
  as the session goes (so a silent stretch means a stuck request), ending with a `result` event
  that carries `is_error`, `usage` and `total_cost_usd`.
- `--permission-mode acceptEdits` lets it edit files in the project without asking;
  `--permission-mode bypassPermissions` (and `--dangerously-skip-permissions`) exit 1 when run as
  root, so kiro does not use them. Bash needs `--allowedTools`: kiro allows `Bash(<cmd>:*)` for
  each entry of `tools.shell.allow` when `tools.shell.enabled`, and the file tools always.
- Endpoint and auth: `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY` (or a logged-in `claude`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kiro.executors.agents import (
    Failure,
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

FILE_TOOLS = ("Read", "Edit", "MultiEdit", "Write", "Glob", "Grep", "LS")


class ClaudePreset(Preset):
    name = "claude"
    program = "claude"
    install = "npm install -g @anthropic-ai/claude-code"
    command = "claude -p --output-format stream-json --verbose --permission-mode acceptEdits"
    idle_timeout_seconds = 600.0
    env_keys = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL")
    home_files = (".claude", ".claude.json")

    def extra_args(self) -> list[str]:
        tools = list(FILE_TOOLS)
        shell = self.config.tools.shell
        if shell.enabled:
            tools += [f"Bash({entry.strip()}:*)" for entry in shell.allow if entry.strip()]
        return ["--allowedTools", ",".join(tools)]

    def argv(self, inv: Invocation, template: Sequence[str] | None = None) -> list[str]:
        argv = super().argv(inv, template)
        # The task file may live outside the project directory (project_dir: src): let Claude edit it.
        folder = inv.task_file.parent
        try:
            folder.relative_to(inv.project_dir)
        except ValueError:
            if "--add-dir" not in argv:
                argv[1:1] = ["--add-dir", str(folder)]
        return argv

    def home_paths(self, env: Mapping[str, str]) -> list[Path]:
        """`CLAUDE_CONFIG_DIR` when set (its `.claude.json` is in it), else `~/.claude` and `~/.claude.json`."""
        folder = env.get("CLAUDE_CONFIG_DIR")
        if folder and os.path.isabs(folder):
            return [Path(folder)]
        return super().home_paths(env)

    def env(self, inv: Invocation) -> dict[str, str]:
        return {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "NO_COLOR": "1"}

    @staticmethod
    def _result(stdout: str) -> dict[str, Any] | None:
        return last_event(stdout, "result")

    def parse_usage(self, stdout: str) -> Usage | None:
        result = self._result(stdout)
        if result is None:
            return None
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        assert isinstance(usage, dict)

        def n(key: str) -> int:
            value = usage.get(key)
            return int(value) if isinstance(value, int | float) else 0

        prompt = n("input_tokens") + n("cache_creation_input_tokens") + n("cache_read_input_tokens")
        completion = n("output_tokens")
        cost = result.get("total_cost_usd")
        turns = result.get("num_turns")
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                         api_calls=int(turns) if isinstance(turns, int) else 0,
                         cost_usd=float(cost) if isinstance(cost, int | float) else 0.0)

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        result = self._result(stdout)
        if result is not None and not result.get("is_error") and exit_code == 0:
            return None
        if result is None and exit_code == 0:
            return None
        line = None
        if result is not None and result.get("is_error"):
            text = result.get("result")
            if isinstance(text, str) and text.strip():
                line = clean(text).strip().splitlines()[0][:300]
            else:
                errors = result.get("errors")
                if isinstance(errors, list) and errors:
                    line = str(errors[0])[:300]
                else:
                    line = f"claude reported an error ({result.get('subtype', 'error')})"
        line = line or error_line(stderr) or last_line(stderr) or error_line(stdout) or last_line(stdout) \
            or f"exit status {exit_code}"
        status = result.get("api_error_status") if result is not None else None
        if isinstance(status, int) and str(status) not in line:
            line = f"{line} (HTTP {status})"
        if status in (401, 403):
            return Failure("auth_error", line)
        if status in (429, 529):
            return Failure("rate_limit", line)
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def fatal_line(self, line: str) -> Failure | None:
        """Claude retries a refused key up to 10 times with backoff (minutes); its `api_retry`
        events say so at the first try."""
        if '"api_retry"' not in line:
            return None
        event = next(json_lines(line), None)
        if event is None or event.get("subtype") != "api_retry" or event.get("error_status") not in (401, 403):
            return None
        status, kind, retries = event.get("error_status"), event.get("error", "auth"), event.get("max_retries", "")
        return Failure("auth_error", f"API error {status} ({kind}) on the first request; claude would retry it "
                                     f"{retries} times")

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        result = self._result(stdout)
        if result is not None and isinstance(result.get("result"), str) and result["result"].strip():
            return tail(clean(result["result"]))
        said = [block.get("text", "") for event in json_lines(stdout) if event.get("type") == "assistant"
                for block in _content(event) if block.get("type") == "text"]
        if said:
            return tail(clean(said[-1]))
        return super().summary("" if stdout.lstrip().startswith("{") else stdout, stderr, prompt)


def _content(event: dict[str, Any]) -> list[dict[str, Any]]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
