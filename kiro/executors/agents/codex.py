"""Codex CLI (`npm install -g @openai/codex`), run headless with `codex exec`.

- The prompt goes on stdin (`-`); `--json` prints JSONL events (`thread.started`, `item.*`,
  `turn.completed` with `usage`, `turn.failed` / `error` with the message).
- `--full-auto` is gone from current Codex: `--sandbox workspace-write` lets it edit the project
  and run commands in it; `--skip-git-repo-check` lets it run outside a git repository.
- `--disable goals`: current Codex offers the model `create_goal`/`get_goal`/`update_goal` tools in
  `codex exec` and keeps goals in `$CODEX_HOME/goals_1.sqlite`; kiro's step is the goal, so the model
  gets no tools to set a standing objective of its own. (A fresh `codex exec` starts a new thread and
  did not take up an earlier thread's active goal in our tests; `codex exec resume` would, and kiro
  never runs it.)
- Endpoint and auth: `OPENAI_API_KEY`, or a model provider in `$CODEX_HOME/config.toml`
  (`model_provider`, `[model_providers.NAME] base_url = ..., wire_api = "responses"`).
- Credentials (Codex 0.171, tried against a scripted server): with the built-in `openai` provider
  `codex exec` takes CODEX_API_KEY first, then `$CODEX_HOME/auth.json` (a ChatGPT login, or a key
  saved by `codex login --with-api-key`); OPENAI_API_KEY is not read by it (only by a custom provider
  whose `env_key` names it, and such a provider uses that variable alone).
- Codex reports tokens, not money: kiro prices them with `llm.prices[<model>]`, where the model is
  the `-m/--model` of the command line, else `model` in `$CODEX_HOME/config.toml`.
- Usage limits: a 429 whose body says `"type": "usage_limit_reached"` (with `resets_at` /
  `resets_in_seconds`) is not retried; Codex prints an `error` and a `turn.failed` saying "You've
  hit your usage limit. ... try again at 6:27 AM." (local time; "Nov 30th, 2026 6:27 AM" when the
  reset is another day), or "... try again later." without a reset time.
- What kiro reads for a failure (never the model's text: its `agent_message` items): the exit code,
  stderr, and codex's own `error` / `turn.failed` events.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kiro.executors.agents import (
    Credential,
    Failure,
    Invocation,
    Preset,
    ToolCall,
    clean,
    env_folder,
    error_line,
    json_lines,
    last_line,
    local_clock,
    read_json,
    shown,
    tail,
    tool_call,
)
from kiro.executors.base import Usage

if TYPE_CHECKING:
    from kiro.store.config import Config


_LIMIT = re.compile(r"You’ve hit your usage limit|You've hit your usage limit|usage limit reached", re.I)
_TRY_AGAIN = re.compile(r"try again at (?P<when>.+?)\.?\s*$", re.I)
BOXED_MODE = "danger-full-access"  # codex's sandbox mode inside kiro's (see CodexPreset.boxed_argv)


class CodexPreset(Preset):
    name = "codex"
    program = "codex"
    install = "npm install -g @openai/codex"
    command = "codex exec --json --color never --sandbox workspace-write --skip-git-repo-check --disable goals"
    idle_timeout_seconds = 600.0
    env_prefixes: ClassVar[tuple[str, ...] | None] = ("CODEX_", "OPENAI_")
    env_keys: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_HOME")
    key_vars: ClassVar[tuple[str, ...]] = ("CODEX_API_KEY",)

    def __init__(self, config: Config | None = None) -> None:
        super().__init__(config)
        self._argv: list[str] | None = None  # the last command line run, for the model's name

    def template(self) -> list[str]:
        return [*super().template(), "-"]  # the prompt from stdin, after any agent_args

    def argv(self, inv: Invocation, template: Sequence[str] | None = None) -> list[str]:
        argv = super().argv(inv, template)
        folder = inv.task_file.parent
        try:
            folder.relative_to(inv.project_dir)
        except ValueError:  # the task file lives outside the project: make it writable in the sandbox
            if "--add-dir" not in argv and len(argv) > 1 and argv[1] == "exec":
                argv[2:2] = ["--add-dir", str(folder)]
        self._argv = argv
        return argv

    def env(self, inv: Invocation) -> dict[str, str]:
        return {"NO_COLOR": "1"}

    @staticmethod
    def _home(env: Mapping[str, str]) -> Path:
        return Path(env.get("CODEX_HOME") or Path(env.get("HOME") or Path.home()) / ".codex")

    def _auth(self, env: Mapping[str, str]) -> tuple[Path, dict[str, Any]]:
        path = self._home(env) / "auth.json"
        data = read_json(path)
        return path, data if isinstance(data, dict) else {}

    def _provider_key(self, env: Mapping[str, str]) -> str | None:
        """The `env_key` of a custom model provider that config.toml selects (it uses that variable alone)."""
        try:
            data = tomllib.loads((self._home(env) / "config.toml").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        name = data.get("model_provider")
        providers = data.get("model_providers")
        if not isinstance(name, str) or name == "openai" or not isinstance(providers, dict):
            return None
        provider = providers.get(name)
        key = provider.get("env_key") if isinstance(provider, dict) else None
        return key if isinstance(key, str) else None

    def login(self, env: Mapping[str, str]) -> str | None:
        if self._provider_key(env) is not None:
            return None
        path, data = self._auth(env)
        tokens = data.get("tokens")
        if isinstance(tokens, dict) and tokens.get("access_token"):
            return f"ChatGPT login in {shown(path, env)}"
        return None

    def credential(self, env: Mapping[str, str]) -> Credential:
        key = self._provider_key(env)
        if key is not None:
            return Credential("api_key", key) if env.get(key) else Credential(
                "unknown", f"has no credential: its model provider reads {key}, which is not set")
        found = super().credential(env)
        if found.kind == "unknown":
            path, data = self._auth(env)
            if data.get("OPENAI_API_KEY"):
                return Credential("api_key", f"{shown(path, env)} (saved by codex login --with-api-key)")
        return found

    def home_paths(self, env: Mapping[str, str]) -> list[Path]:
        folder = env_folder(env, "CODEX_HOME", ".codex")
        return [folder] if folder is not None else []

    def boxed_argv(self, argv: list[str]) -> list[str]:
        """Inside kiro's box codex cannot make its own (its bwrap needs namespaces the box does not
        give: "Creating new namespace failed"), and kiro's box already confines every command it runs
        to the project: `--sandbox danger-full-access` in place of the mode asked for (in its place on the
        command line). Out of the box, codex keeps its own (`workspace-write`)."""
        out = list(argv)
        for i, arg in enumerate(out):
            if arg in ("-s", "--sandbox") and i + 1 < len(out):
                out[i + 1] = BOXED_MODE
                return out
            if arg.startswith("--sandbox="):
                out[i] = f"--sandbox={BOXED_MODE}"
                return out
        at = 2 if len(out) > 1 and out[1] == "exec" else 1
        out[at:at] = ["--sandbox", BOXED_MODE]
        return out

    prices_tokens = True

    def model_name(self) -> str | None:
        return self.model()

    def model(self, argv: list[str] | None = None) -> str | None:
        argv = argv if argv is not None else self._argv or self.template()
        for i, arg in enumerate(argv):
            if arg in ("-m", "--model") and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith("--model="):
                return arg.split("=", 1)[1]
        home = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
        try:
            data = tomllib.loads((home / "config.toml").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        model = data.get("model")
        return str(model) if isinstance(model, str) else None

    def parse_usage(self, stdout: str) -> Usage | None:
        found = False
        total = Usage()
        for event in json_lines(stdout):
            if event.get("type") != "turn.completed" or not isinstance(event.get("usage"), dict):
                continue
            found = True
            usage: dict[str, Any] = event["usage"]
            prompt = int(usage.get("input_tokens") or 0)
            completion = int(usage.get("output_tokens") or 0)
            total.add(Usage(prompt_tokens=prompt, completion_tokens=completion,
                                total_tokens=prompt + completion, api_calls=1))
        if not found:
            return None
        model = self.model()
        price = self.config.llm.prices.get(model) if model else None
        if price is not None:
            total.cost_usd = (total.prompt_tokens * price.input_per_1m
                              + total.completion_tokens * price.output_per_1m) / 1_000_000
        return total

    @staticmethod
    def _errors(stdout: str) -> list[str]:
        found: list[str] = []
        for event in json_lines(stdout):
            kind = event.get("type")
            if kind == "error" and isinstance(event.get("message"), str):
                found.append(event["message"])
            elif kind == "turn.failed" and isinstance(event.get("error"), dict):
                message = event["error"].get("message")
                if isinstance(message, str):
                    found.append(message)
        return found

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        errors = self._errors(stdout)
        if exit_code == 0 and not any(e.get("type") == "turn.failed" for e in json_lines(stdout)):
            return None
        line = (clean(errors[-1]).strip().splitlines() or [""])[0][:300] if errors else None
        line = line or error_line(stderr) or last_line(stderr) or f"exit status {exit_code}"  # not stdout: the model's
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        said = next((e for e in reversed(self._errors(stdout)) if _LIMIT.search(e)), None)
        if said is None:
            return None
        line = clean(said).strip().splitlines()[0][:300]
        m = _TRY_AGAIN.search(line)
        return Failure("usage_limit", line, local_clock(m["when"]) if m else None)

    def fatal_line(self, line: str) -> Failure | None:
        """Codex reconnects five times, with backoff, after a refused key; the first
        `Reconnecting... (unexpected status 401 Unauthorized ...)` says so."""
        if "Reconnecting" not in line:
            return None
        event = next(json_lines(line), None)
        message = event.get("message") if event is not None and event.get("type") == "error" else None
        if not isinstance(message, str) or not ("401 Unauthorized" in message or "403 Forbidden" in message):
            return None
        inner = message.split("(", 1)[1].rstrip(")") if "(" in message else message
        return Failure("auth_error", inner[:300])

    tool_marker = '"item.started"'

    def tool_calls(self, event: dict[str, Any]) -> list[ToolCall]:
        """`--json`: each `item.started` of a command, a file change, an MCP tool call or a web search."""
        item = event.get("item")
        if event.get("type") != "item.started" or not isinstance(item, dict):
            return []
        kind = item.get("type")
        found = None
        if kind == "command_execution":
            found = tool_call("shell", item.get("command"))
        elif kind == "file_change" and isinstance(item.get("changes"), list):
            paths = [str(c.get("path")) for c in item["changes"] if isinstance(c, dict)]
            found = tool_call("edit", " ".join(paths))
        elif kind == "mcp_tool_call":
            found = tool_call(f"{item.get('server')}.{item.get('tool')}", item.get("arguments"))
        elif kind == "web_search":
            found = tool_call("web_search", item.get("query"))
        return [found] if found is not None else []

    def reported_error(self, stdout: str, stderr: str) -> str | None:
        """The last command of codex's that failed (its last line of output: `bwrap: execvp
        codex-linux-sandbox ...` when its sandbox cannot start), else the error it reported, else an
        error line on stderr. Its `error` items are warnings (a model's missing metadata): not these."""
        failed = None
        for event in json_lines(stdout):
            item = event.get("item")
            if event.get("type") == "item.completed" and isinstance(item, dict) \
                    and item.get("type") == "command_execution" and item.get("status") == "failed":
                output = last_line(str(item.get("aggregated_output") or ""))
                failed = f"`{item.get('command')}` exited {item.get('exit_code')}" + (f": {output}" if output else "")
        if failed:
            return failed
        errors = self._errors(stdout)
        said = clean(errors[-1]).strip().splitlines() if errors else []
        return said[0] if said else error_line(stderr)

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        said = []
        for event in json_lines(stdout):
            item = event.get("item")
            if event.get("type") == "item.completed" and isinstance(item, dict) \
                    and item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                said.append(item["text"])
        errors = self._errors(stdout)
        if errors:
            return tail(clean(errors[-1]))
        if said:
            return tail(clean(said[-1]))
        return super().summary("" if stdout.lstrip().startswith("{") else stdout, stderr, prompt)
