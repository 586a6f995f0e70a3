"""`codex-acp`: Codex spoken to over ACP (kiro.executors.acp). npm `@agentclientprotocol/codex-acp`
(2.6), the maintained successor of the archived `@zed-industries/codex-acp` (0.16, a Rust fork of
Codex): a TypeScript adapter that starts the Codex App Server (`codex app-server`, from the
`@openai/codex` it bundles; `CODEX_PATH` runs another) and translates. Codex's credentials, files
and price come from the codex preset (kiro.executors.agents.codex).

What it sends, seen against the scripted OpenAI Responses server (tests/agent_clis_codex_opencode_acp.py):

- `initialize`: protocol 1; `loadSession`, prompts with images and embedded context, MCP over HTTP
  (not SSE), session list / fork / resume / close; auth methods `api-key` and `chat-gpt` (NO_BROWSER=1
  hides the browser login). Then an `auth/status_update` extension notification. With a model
  provider in `$CODEX_HOME/config.toml` (or a ChatGPT login in auth.json) it needs no `authenticate`
  ("Custom model gateway"); with only CODEX_API_KEY or OPENAI_API_KEY, `session/new` answers
  "Authentication required" (-32000) until the client calls `authenticate` with `api-key`, which kiro
  does (`acp_auth`). The built-in provider's endpoint is `openai_base_url` in config.toml
  (OPENAI_BASE_URL is not read); it tries a WebSocket first and falls back to HTTPS.
- `session/new`: the modes `read-only`, `workspace-write`, `agent` (its default, "Auto review"),
  `agent-full-access`, and one `permission-profile:<id>` per profile of config.toml; config options
  for the mode, the model and the reasoning effort; then `available_commands_update`.
- It never calls the client's `fs/*` or `terminal/*`: the App Server reads, writes and runs commands
  itself, so what kiro decides is what it asks.
  - An edit (the model's `apply_patch`, also through its shell tool) is a `tool_call` of kind `edit`
    with a `diff` per file, then `session/request_permission` with each file in `locations` and the
    options `allow_once`, `allow_for_session` and `cancel` (kind `reject_once`, "No, and tell Codex
    what to do differently"). There is no decline that goes on: `cancel` ends its turn
    (`stopReason: cancelled`); the model sees "aborted by user" as that call's output when the same
    session is prompted again.
  - A command is a `tool_call` of kind `execute` (the command as its title, `rawInput.command` and
    `cwd`), its output in `_meta.terminal_output_delta` of the `tool_call_update`. In `read-only` it
    runs in Codex's own sandbox without asking: it reads anything (a planted ~/.ssh key included) and
    writes nothing ("Read-only file system"); it asks only when the model asks to leave the sandbox.
  - Messages are `agent_message_chunk`s (a missing model metadata is one too: "Warning: Model
    metadata for `gpt-5-codex` not found"), progress `session_info_update` with
    `_meta.codex.threadStatus`, tokens `usage_update` (`used` / `size`, no cost).
- The turn's result has `usage` (the turn's tokens: input, output, thought, cached) and
  `_meta.quota.model_usage` (per model, camelCase token counts); no money: kiro prices the tokens with
  `llm.prices[<model>]`, the model named there (else config.toml's, as the codex preset does).
- A refused key (HTTP 401) is a `session/prompt` error "Authentication required" (-32000), with
  nothing of the API's own message.
- It does not exit when its stdin is closed (kiro SIGTERMs it after the turn: `exits_on_eof`).
- `session/cancel` ends the turn at once (`stopReason: cancelled`, in ~15 ms while the model was
  still answering). A dead endpoint: it sends nothing more and never ends its turn (kiro's idle
  timeout ends the attempt).

The mode kiro sets and holds (`session/set_mode` after `session/new`: kiro.executors.acp.hold_mode):
- out of kiro's box (`sandbox: off`): `read-only`. Every edit asks kiro, which answers by its path
  rules (kiro.executors.acp); commands run in Codex's own read-only sandbox, which would read any file
  the user can, without asking. So kiro passes, in `CODEX_CONFIG`, a PreToolUse hook of this run only
  (kiro.processes.codex_hook): each command is refused unless `tools.shell` allows it, as
  kiro's own agent's are, and the model reads kiro's reason. A refused command is not reported to
  kiro as a tool call (Codex stops it before it starts one). Codex offers no other way short of the
  person's config.toml: restricted reads need a permission profile, and codex-acp offers only those
  of the config files (one given in `CODEX_CONFIG` is not listed, and its mode falls back to `agent`);
  a mode's `approvalPolicy` goes with each turn, so `approval_policy` there changes nothing.
- in kiro's box: Codex's own sandbox cannot start there (its bwrap: "setting up uid map: Operation
  not permitted", and with `features.use_legacy_landlock` the App Server refuses: "filesystem-
  restricted execution requires bubblewrap"), so every command would fail, and not even be reported
  as a tool call. kiro's box confines whatever it runs, as for the codex preset's
  `danger-full-access`: `agent-full-access`. Codex then asks nothing; kiro sees every tool call.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiro.executors.agents import Credential, Invocation
from kiro.executors.agents.acp import AcpPreset, _prompt_result
from kiro.executors.agents.codex import CodexPreset
from kiro.executors.base import Usage

if TYPE_CHECKING:
    from kiro.store.config import ShellToolSettings

HOOK_MATCHER = "^Bash$"  # Codex's name for its shell tools in hooks
HOOK_TIMEOUT_SECONDS = 30


def codex_config(settings: ShellToolSettings) -> dict[str, object]:
    """codex-acp's CODEX_CONFIG: kiro's hook (kiro.processes.codex_hook) for every shell command, trusted by
    its hash."""
    # Codex runs a command that fails otherwise (exit 1: kiro cannot start) as if the hook allowed it
    hook = shlex.join([sys.executable, "-m", "kiro.processes.codex_hook", settings.model_dump_json()])
    handler = {"type": "command", "command": f"{hook} || exit 2", "timeout": HOOK_TIMEOUT_SECONDS, "async": False}
    # Codex trusts a hook whose identity (its event, matcher and handler as sorted compact JSON) hashes so
    identity = {"event_name": "pre_tool_use", "matcher": HOOK_MATCHER, "hooks": [handler]}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    key = "/<session-flags>/config.toml:pre_tool_use:0:0"  # its first group's first handler, given with -c
    return {"hooks": {"PreToolUse": [{"matcher": HOOK_MATCHER, "hooks": [handler]}],
                      "state": {key: {"trusted_hash": f"sha256:{digest}", "enabled": True}}}}


API_KEY_METHOD = "api-key"  # its auth method that takes CODEX_API_KEY, else OPENAI_API_KEY
ASKING_MODE = "read-only"  # out of kiro's box: every edit is asked of kiro
BOXED_MODE = "agent-full-access"  # in kiro's box, which confines what Codex runs


class CodexAcpPreset(AcpPreset, CodexPreset):
    """Codex over ACP: codex's credentials, files and price, the adapter's command line and modes."""

    name = "codex-acp"
    program = "codex-acp"
    install = "npm install -g @agentclientprotocol/codex-acp"
    command = "codex-acp"
    env_keys = ("OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_HOME", "CODEX_PATH")
    key_vars = ("CODEX_API_KEY", "OPENAI_API_KEY")  # its `api-key` method's, in its order
    exits_on_eof = False  # it stays up with its stdin closed: SIGTERM ends it (1.3 s a step less than waiting)

    def acp_auth(self, env: Mapping[str, str]) -> str | None:
        """Its `api-key` auth method when a key is set: it asks for it only without a login or a model
        provider of its own (`session/new` answers "Authentication required")."""
        return API_KEY_METHOD if any(env.get(name) for name in self.key_vars) else None

    def keys_over_login(self, env: Mapping[str, str]) -> list[str]:
        return []  # its login (or config.toml's provider) is used; kiro authenticates with a key only without one

    def credential(self, env: Mapping[str, str]) -> Credential:
        login = self.login(env)
        if login is not None:
            return Credential("login", login)
        return super().credential(env)

    def acp_modes(self, boxed: bool) -> tuple[str, ...]:
        return (BOXED_MODE,) if boxed else (ASKING_MODE,)

    def env(self, inv: Invocation) -> dict[str, str]:
        """Out of kiro's box: kiro's hook on each command (kiro.processes.codex_hook)."""
        hook = json.dumps(codex_config(self.config.tools.shell))
        return {**super().env(inv), "NO_BROWSER": "1", "CODEX_CONFIG": hook}

    def boxed_env(self, env: Mapping[str, str], project_dir: Path) -> dict[str, str]:
        return {"CODEX_CONFIG": "{}"}  # kiro's box confines its commands

    def parse_usage(self, stdout: str) -> Usage | None:
        """The turn's tokens (AcpPreset), priced by `llm.prices` for the model the result names."""
        usage = super().parse_usage(stdout)
        if usage is None or usage.cost_usd:
            return usage
        result = _prompt_result(stdout)
        meta = result.get("_meta") if result is not None else None
        quota: Any = meta.get("quota") if isinstance(meta, dict) else None
        rows = quota.get("model_usage") if isinstance(quota, dict) else None
        named = [row.get("model") for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []
        model = next((m for m in named if isinstance(m, str)), None) or self.model()
        price = self.config.llm.prices.get(model) if model else None
        if price is not None:
            usage.cost_usd = (usage.prompt_tokens * price.input_per_1m
                              + usage.completion_tokens * price.output_per_1m) / 1_000_000
        return usage
