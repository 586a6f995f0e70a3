"""Agents kiro speaks the Agent Client Protocol to (ACP: JSON-RPC over the agent's stdin and stdout;
the client is kiro.executors.acp). What a preset here knows: the command line that starts the agent
in ACP mode, and what its transcript (the JSON-RPC messages of the attempt, one a line) says about
tokens, cost and failures. The rest (its credentials, its files under $HOME, its environment) is the
agent CLI's own preset's.

- `acp`: any ACP agent, started by `acp_command` (a list: `[kiro-cli, acp]`).
- `claude-acp`: `claude-agent-acp` (npm `@agentclientprotocol/claude-agent-acp`, the maintained
  successor of `@zed-industries/claude-code-acp`), Claude Code through the Claude Agent SDK, which
  brings its own `claude` binary. It asks permission for edits and commands (`session/request_permission`,
  answered by kiro) and reads and writes files itself. As root it would pass
  `--allow-dangerously-skip-permissions` when IS_SANDBOX is set, which its `claude` refuses to run
  with (exit 1 at `session/new`): kiro does not pass IS_SANDBOX to it (kiro answers permissions anyway).
  Reports tokens in the `session/prompt` result's `usage`, and the session's cost in `usage_update`.
- `gemini-acp`: `gemini --acp` (Gemini CLI 0.61; `--experimental-acp` is its deprecated spelling). Its
  edit tools (write_file, replace) read and write project files through kiro when kiro offers `fs`
  (its read_file reads them itself); it asks permission for edits and commands, and reports tokens in
  the result's `_meta.quota`. It cannot create a file through `fs`: it takes a missing file for one
  only when the error it gets is a JavaScript Error saying ENOENT, and its ACP SDK hands it the bare
  JSON-RPC error object, so kiro answers its read of a file that does not exist with "" instead.
  Its permission requests carry no command (only a title, which may be the model's description of
  it): kiro refuses the commands it asks for. kiro starts it with GEMINI_CLI_NO_RELAUNCH set: else
  Gemini CLI starts a second node process of itself (to raise its heap limit to half the machine's
  memory) under a first one that only waits for it, which made each step's start 7-9 s (a third)
  longer at load 20.
- The mode: kiro sets each session to the agent's most asking mode (`asking_modes`, read from each
  adapter's bundle) with `session/set_mode`, and holds it: a `current_mode_update` (or `mode` config
  option update) to any other mode ends the attempt, failed closed; an agent that offers none of them
  is not run (kiro.executors.acp.hold_mode). claude-agent-acp 0.101: `default` ("Always ask before
  making changes"), `acceptEdits`, `plan`, `auto` (its own opening mode when its model supports it:
  "Claude handles permission decisions", edits inside the project never asked) and, where allowed,
  `bypassPermissions`; kiro holds `default`, or `plan` (its EnterPlanMode; ExitPlanMode answered
  `allow_once` goes back to `default`). Gemini CLI 0.61: `default` ("Prompts for approval"), `autoEdit`,
  `yolo`, `plan`; kiro holds `default` or `plan`. `agent: acp`: `default` or `read-only` (the asking
  modes' names among the known adapters).
- `codex-acp` and `opencode-acp` have modules of their own (kiro.executors.agents.codex_acp,
  kiro.executors.agents.opencode_acp): what they send, and the mode and permissions kiro starts them with.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Iterator
from typing import Any

from kiro.executors.agents import Failure, Preset, clean, error_line, json_lines, last_line, tail
from kiro.executors.agents.claude import _LIMIT_TEXT, ClaudePreset
from kiro.executors.agents.gemini import GeminiPreset
from kiro.executors.base import Usage

PROMPT_METHOD = "session/prompt"
MODE_REFUSAL = "kiro refused the agent's mode"
_AUTH = re.compile(r"auth|login|api[ _-]?key|credential|unauthori[sz]ed|\b401\b|\b403\b", re.I)
_FAILED_STOPS = {"max_tokens": "the model's output token limit", "max_turn_requests": "its turn request limit",
                 "refusal": "the model refused"}


class AcpPreset(Preset):
    """`agent: acp`: an ACP agent started by `acp_command`."""

    name = "acp"
    install = "any agent that speaks ACP: set acp_command to the command line that starts it in ACP mode"
    idle_timeout_seconds = 600.0
    speaks_acp = True
    asking_modes: tuple[str, ...] = ("default", "read-only")  # its modes that ask kiro, most asking first

    def acp_modes(self, boxed: bool) -> tuple[str, ...]:
        return self.asking_modes

    def template(self) -> list[str]:
        """`acp_command` when set, else the preset's own line; then agent_args."""
        line = list(self.config.acp_command) if self.config.acp_command else shlex.split(self.command)
        return [*line, *self.config.agent_args] if line else []

    def extra_args(self) -> list[str]:
        return []

    def installed(self) -> str | None:
        """The program `acp_command` (or the preset) starts, found on PATH."""
        line = self.template()
        return shutil.which(self.program or line[0]) if self.program or line else None

    def version(self, timeout: float) -> str | None:
        return super().version(timeout) if self.program else None  # an unknown agent's flags are unknown

    def boxed_argv(self, argv: list[str]) -> list[str]:
        return argv

    # -- what its transcript says ------------------------------------------------------------

    def parse_usage(self, stdout: str) -> Usage | None:
        """Tokens from each turn's result (`usage`, or Gemini CLI's `_meta.quota`; kiro prompts a session
        again after a refusal that ended the turn: kiro.executors.acp), money from the last `usage_update`
        with a cost in USD (a session's running total)."""
        cost = 0.0
        for update in _updates(stdout):
            amount = update.get("cost") if update.get("sessionUpdate") == "usage_update" else None
            if isinstance(amount, dict) and amount.get("currency") == "USD" and _number(amount.get("amount")):
                cost = float(amount["amount"])
        turns = [u for u in map(self._turn_usage, _prompt_results(stdout)) if u is not None]
        if not turns:
            return Usage(cost_usd=cost) if cost else None
        total = Usage()
        for turn in turns:
            total.add(turn)
        total.cost_usd = cost or total.cost_usd
        return total

    def _turn_usage(self, result: dict[str, Any]) -> Usage | None:
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else None
        if usage is not None:
            prompt = sum(_int(usage.get(k)) for k in ("inputTokens", "cachedReadTokens", "cachedWriteTokens"))
            completion = _int(usage.get("outputTokens")) + _int(usage.get("thoughtTokens"))
            return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        meta = result.get("_meta")
        quota = meta.get("quota") if isinstance(meta, dict) else None
        rows = quota.get("model_usage") if isinstance(quota, dict) else None
        if not isinstance(rows, list):
            return None
        total = Usage()
        for row in rows:
            count = row.get("token_count") if isinstance(row, dict) else None
            if not isinstance(count, dict):
                continue
            prompt, completion = _int(count.get("input_tokens")), _int(count.get("output_tokens"))
            price = self.config.llm.prices.get(str(row.get("model")))
            spent = (prompt * price.input_per_1m + completion * price.output_per_1m) / 1_000_000 if price else 0.0
            total.add(Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                            cost_usd=spent))
        return total

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        """The turn ended well when `session/prompt` answered with stop reason `end_turn` (or `cancelled`:
        kiro asked). An agent that never answered `initialize`, or refused `initialize` or `session/new`,
        cannot work however often it is retried: a usage error (an auth error when it says so)."""
        refused = _kiro_refused(stdout)
        if refused is not None:
            return Failure("usage_error", refused)
        said = _last_error(stdout)
        result = _prompt_result(stdout)
        if said is None and result is not None:
            stop = result.get("stopReason")
            if stop in (None, "end_turn", "cancelled"):
                return None
            return Failure("failure", f"the agent ended its turn: {_FAILED_STOPS.get(str(stop), str(stop))} "
                                      f"(stopReason {stop})")
        printed = error_line(stderr) or last_line(stderr)
        if said is None and next(_messages(stdout), None) is None:
            how = f"it exited with status {exit_code}" if exit_code is not None else "it said nothing"
            return Failure("usage_error", f"the agent did not answer ACP's initialize ({how})"
                                          + (f": {printed}" if printed else ""))
        if said is not None:
            method, line = said
            if method in ("initialize", "session/new"):
                return Failure("auth_error" if _AUTH.search(line) else "usage_error", line)
        else:
            line = printed or (f"the agent exited (status {exit_code}) before its turn ended" if exit_code is not None
                               else "the agent's turn did not end")
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def fix(self, failure: Failure) -> str:
        if failure.line.startswith(MODE_REFUSAL):
            return (f"run a version of {self.program or 'the agent'} that offers such a mode and keeps it "
                    "(.ci/install-agent-clis pins the ones kiro is tested with)")
        if failure.kind == "usage_error":
            return ("acp_command (or the preset's command line with agent_args) must start an agent that speaks "
                    "ACP on its stdin and stdout, e.g. acp_command: [gemini, --acp]")
        return super().fix(failure)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        return None

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        """The agent's last message (its `agent_message_chunk`s joined), else what it printed on stderr."""
        said: list[str] = []
        current: list[str] = []
        last_id: Any = None
        for update in _updates(stdout):
            kind = update.get("sessionUpdate")
            content = update.get("content")
            if kind == "agent_message_chunk" and isinstance(content, dict) and isinstance(content.get("text"), str):
                if update.get("messageId") != last_id and current:
                    said.append("".join(current))
                    current = []
                last_id = update.get("messageId")
                current.append(content["text"])
            elif kind == "tool_call" and current:
                said.append("".join(current))
                current = []
        if current:
            said.append("".join(current))
        said = [s for s in said if s.strip()]
        if said:
            return tail(clean(said[-1]))
        return tail(clean(stderr))

    def reported_error(self, stdout: str, stderr: str) -> str | None:
        """The last tool call the agent reported failed (its title), else an error line on stderr."""
        titles: dict[Any, str] = {}
        failed = None
        for update in _updates(stdout):
            call = update.get("toolCallId")
            if isinstance(update.get("title"), str):
                titles[call] = update["title"]
            if update.get("status") == "failed":
                failed = f"{titles.get(call, 'a tool call')} failed"
        return failed or error_line(stderr)


class ClaudeAcpPreset(AcpPreset, ClaudePreset):
    """Claude Code over ACP: claude's credentials, files and environment, the adapter's command line."""

    name = "claude-acp"
    asking_modes = ("default", "plan")
    program = "claude-agent-acp"
    install = "npm install -g @agentclientprotocol/claude-agent-acp"
    command = "claude-agent-acp"
    env_unset = ("IS_SANDBOX",)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        """A used-up subscription window: `session/prompt` answers with an error whose details are Claude
        Code's own words ("You've hit your session limit · resets 9:42am (UTC)"). No reset time is read
        from them (the ACP adapter passes no `resetsAt`): the loop probes again after 5 minutes, doubling."""
        said = _last_error(stdout)
        found = _LIMIT_TEXT.search(said[1]) if said is not None and said[0] == PROMPT_METHOD else None
        return Failure("usage_limit", said[1][found.start():]) if said is not None and found is not None else None


class GeminiAcpPreset(AcpPreset, GeminiPreset):
    """Gemini CLI in ACP mode: gemini's credentials, files and environment."""

    name = "gemini-acp"
    program = "gemini"
    install = "npm install -g @google/gemini-cli"
    command = "gemini --acp"
    empty_when_missing = True
    asking_modes = ("default", "plan")


def _messages(stdout: str, sender: str = "agent") -> Iterator[dict[str, Any]]:
    """The JSON-RPC messages `sender` (agent, kiro) sent: the transcript tags each with `"from"`."""
    for message in json_lines(stdout):
        if message.get("from") == sender:
            yield message


def _updates(stdout: str) -> Iterator[dict[str, Any]]:
    """The `session/update` notifications' updates, in order."""
    for message in _messages(stdout):
        params = message.get("params")
        if message.get("method") == "session/update" and isinstance(params, dict) \
                and isinstance(params.get("update"), dict):
            yield params["update"]


def _kiro_refused(stdout: str) -> str | None:
    """Why kiro refused to go on with the agent (kiro.executors.acp: its mode), if it did."""
    said = [m["refused"] for m in _messages(stdout, "kiro") if isinstance(m.get("refused"), str)]
    return f"{MODE_REFUSAL}: {said[-1]}" if said else None


def _prompt_ids(stdout: str) -> set[Any]:
    return {m.get("id") for m in _messages(stdout, "kiro") if m.get("method") == PROMPT_METHOD and "id" in m}


def _prompt_results(stdout: str) -> list[dict[str, Any]]:
    """The results `session/prompt` answered with (each turn's end), in order."""
    ids = _prompt_ids(stdout)
    return [m["result"] for m in _messages(stdout)
            if "method" not in m and m.get("id") in ids and isinstance(m.get("result"), dict)]


def _prompt_result(stdout: str) -> dict[str, Any] | None:
    """The result the last `session/prompt` answered with (the attempt's end), if it did."""
    return next(reversed(_prompt_results(stdout)), None)


def _last_error(stdout: str) -> tuple[str | None, str] | None:
    """The JSON-RPC error the agent answered kiro's last request with (initialize, session/new,
    session/prompt), if it did: the method and the error, as one line. An error a later answer
    followed is not it (`session/new` refused until kiro authenticated, then made)."""
    asked = {m.get("id"): m.get("method") for m in _messages(stdout, "kiro") if "method" in m and "id" in m}
    found = None
    for message in _messages(stdout):
        error = message.get("error")
        if "method" in message:
            continue
        if not isinstance(error, dict):
            found = None
            continue
        data = error.get("data")
        detail = data.get("details") or data.get("message") if isinstance(data, dict) else data
        detail = _api_message(detail) if isinstance(detail, str) else detail
        text = _api_message(str(error.get("message") or "error")) + (f": {detail}" if isinstance(detail, str) and detail
                                                                     else "")
        method = asked.get(message.get("id"))
        text = (f"{method}: {text}" if method else text).strip()
        found = (method, (text.splitlines() or ["error"])[0][:300])
    return found


def _api_message(text: str) -> str:
    """An API's JSON error body, as an agent passes it on (`{"error": {"message": ...}}`), as its message."""
    if not text.lstrip().startswith("{"):
        return text
    try:
        body = json.loads(text)
    except ValueError:
        return text
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message.strip() else text


def _int(value: Any) -> int:
    return int(value) if _number(value) else 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
