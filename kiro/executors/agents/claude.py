"""Claude Code (`npm install -g @anthropic-ai/claude-code`), run headless with `claude -p`.

- The prompt goes on stdin; `--output-format stream-json --verbose` prints one JSON event per line
  as the session goes (so a silent stretch means a stuck request), ending with a `result` event
  that carries `is_error`, `usage` and `total_cost_usd`.
- `--permission-mode acceptEdits` lets it edit files in the project without asking;
  `--permission-mode bypassPermissions` (and `--dangerously-skip-permissions`) exit 1 when run as
  root, so kiro does not use them. Bash needs `--allowedTools`: kiro allows `Bash(<cmd>:*)` for
  each entry of `tools.shell.allow` when `tools.shell.enabled`, and the file tools always.
- Usage limits: a subscription (a login, `CLAUDE_CODE_OAUTH_TOKEN`) answered HTTP 429 with the
  `anthropic-ratelimit-unified-*` headers prints a `rate_limit_event` whose `rate_limit_info` has
  `status: "rejected"`, `rateLimitType` and `resetsAt` (seconds since 1970), then a result with
  `is_error`, `api_error_status: 429` and the text "You've hit your session limit · resets 6:27am
  (UTC)"; it does not retry it. An API key's 429 ("API Error: Request rejected (429) · ...") is a
  rate limit, retried by the loop as a failed attempt.
- `--setting-sources project,local`: the person's own `~/.claude/settings.json` is not loaded, so
  their global hooks (a Stop hook that keeps a session going), plugins and permission rules do not
  run inside an unattended step; the project's `.claude/settings.json` and `settings.local.json` still
  apply. (`--bare` would skip the project's too and never read a login; `--safe-mode` drops CLAUDE.md.)
- Endpoint and auth: `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY` (or a logged-in `claude`). In `-p`
  mode (Claude Code 2.1.197's bundle, its `Ty()`/`dI()`: `if (nonInteractive && ANTHROPIC_API_KEY)
  return {source: "ANTHROPIC_API_KEY"}`) it takes ANTHROPIC_AUTH_TOKEN (a bearer token), then
  ANTHROPIC_API_KEY (x-api-key), then CLAUDE_CODE_OAUTH_TOKEN (a subscription token from `claude
  setup-token`), then the login in `$CLAUDE_CONFIG_DIR/.credentials.json` (`~/.claude/`; the keychain
  on macOS, which kiro cannot see): a key variable is billed before a subscription.
- What kiro reads for a failure (never the model's text): the exit code, stderr, the `result` event
  when claude set its `is_error` (with the `api_error_status` it reports), `api_retry` and
  `rate_limit_event` records. A usage limit needs the rejected `rate_limit_event` or that 429.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from kiro.executors.agents import (
    Failure,
    Invocation,
    Preset,
    ToolCall,
    clean,
    epoch,
    error_line,
    home_path,
    json_lines,
    last_event,
    last_line,
    read_json,
    shown,
    tail,
    tool_call,
)
from kiro.executors.base import Usage

# Claude Code's own words for a used-up subscription window (its messages for a rejected unified limit)
_LIMIT_TEXT = re.compile(r"You've (hit|reached) your .*limit|You're out of (extra )?usage|Your org is out of usage")

FILE_TOOLS = ("Read", "Edit", "MultiEdit", "Write", "Glob", "Grep", "LS")


class ClaudePreset(Preset):
    name = "claude"
    program = "claude"
    install = "npm install -g @anthropic-ai/claude-code"
    command = ("claude -p --output-format stream-json --verbose --permission-mode acceptEdits "
               "--setting-sources project,local")
    idle_timeout_seconds = 600.0
    env_prefixes: ClassVar[tuple[str, ...] | None] = ("ANTHROPIC_", "CLAUDE_", "DISABLE_")
    env_keys: ClassVar[tuple[str, ...]] = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL")
    home_files = (".claude", ".claude.json")
    key_vars: ClassVar[tuple[str, ...]] = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY")

    def login(self, env: Mapping[str, str]) -> str | None:
        if env.get("CLAUDE_CODE_OAUTH_TOKEN"):
            return "the subscription token in CLAUDE_CODE_OAUTH_TOKEN"
        folder = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home_path(env, ".claude")
        path = folder / ".credentials.json"
        data = read_json(path)
        oauth = data.get("claudeAiOauth") if isinstance(data, dict) else None
        if isinstance(oauth, dict) and oauth.get("accessToken"):
            return shown(path, env)
        return None

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
        line = line or error_line(stderr) or last_line(stderr) or f"exit status {exit_code}"  # not stdout: the model's
        status = result.get("api_error_status") if result is not None else None
        if isinstance(status, int) and str(status) not in line:
            line = f"{line} (HTTP {status})"
        if status in (401, 403):
            return Failure("auth_error", line)
        if status in (429, 529):
            return Failure("rate_limit", line)
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        rejected = None
        for event in json_lines(stdout):
            info = event.get("rate_limit_info")
            if event.get("type") == "rate_limit_event" and isinstance(info, dict) and info.get("status") == "rejected":
                rejected = info
        result = self._result(stdout)
        failed = result is not None and result.get("is_error") is True
        said = result.get("result") if result is not None and failed else None
        said = clean(said).strip().splitlines()[0][:300] if isinstance(said, str) and said.strip() else None
        status = result.get("api_error_status") if result is not None else None
        # its own words count only with the 429 it reports: a reply of the model's may say the same
        if rejected is None and not (said and status == 429 and _LIMIT_TEXT.match(said)):
            return None
        kind = rejected.get("rateLimitType") if rejected is not None else None
        line = said or f"claude {kind or 'usage'} limit reached"
        return Failure("usage_limit", line, epoch(rejected.get("resetsAt")) if rejected is not None else None)

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

    tool_marker = '"tool_use"'

    def tool_calls(self, event: dict[str, Any]) -> list[ToolCall]:
        """stream-json: each `assistant` event's `tool_use` blocks, as the model asks for them."""
        if event.get("type") != "assistant":
            return []
        found = (tool_call(b.get("name"), b.get("input")) for b in _content(event) if b.get("type") == "tool_use")
        return [c for c in found if c is not None]

    def reported_error(self, stdout: str, stderr: str) -> str | None:
        """The last tool call claude was told failed (`is_error`), with what it was (`Read <file>`,
        `Bash <command>`) and the result's last line (a command's error); else an error line on stderr."""
        said = None
        asked: dict[Any, ToolCall] = {}
        for event in json_lines(stdout):
            for block in _content(event):
                if block.get("type") == "tool_use":
                    call = tool_call(block.get("name"), block.get("input"))
                    if call is not None:
                        asked[block.get("id")] = call
                elif block.get("type") == "tool_result" and block.get("is_error"):
                    text = _result_text(block.get("content"))
                    call = asked.get(block.get("tool_use_id"))
                    said = (f"{call[0]} {call[1]}: {text}" if call else text) or said
        return said or error_line(stderr)

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        result = self._result(stdout)
        if result is not None and isinstance(result.get("result"), str) and result["result"].strip():
            return tail(clean(result["result"]))
        said = [block.get("text", "") for event in json_lines(stdout) if event.get("type") == "assistant"
                for block in _content(event) if block.get("type") == "text"]
        if said:
            return tail(clean(said[-1]))
        return super().summary("" if stdout.lstrip().startswith("{") else stdout, stderr, prompt)


def _result_text(content: Any) -> str | None:
    """A tool result's text (a string, or text blocks), its last line that says something."""
    if isinstance(content, list):
        content = "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return last_line(content) if isinstance(content, str) else None


def _content(event: dict[str, Any]) -> list[dict[str, Any]]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
