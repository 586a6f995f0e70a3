"""Qwen Code (`npm install -g @qwen-code/qwen-code`), headless (prompt on stdin).

- `--output-format stream-json` prints Claude Code's stream-json shape (`system`/`init` with the
  model, `assistant` and `user` messages with content blocks, a final `result` with `is_error`,
  `num_turns` and `usage`: input/output/total tokens), so it shares the Claude preset's reading of
  the stream; it reports tokens, not money: kiro prices them with `llm.prices[<model>]`.
- `--approval-mode yolo` approves its tools (edits, shell) in a headless run.
- An API error ends the run (qwen 0.24): exit 1 and a final `result` with `is_error` true, subtype
  `error_during_execution` and `error.message` "[API Error: 401 Incorrect API key provided ...]". kiro
  reads failures only from that structured error (written by qwen, never by the model): the same
  words in the model's reply (its `assistant` text, the `result` text of a successful run) are what the
  model said, not a limit or a refused key. (qwen 0.15 ended an API error with exit 0 and the error as
  the `result` text, which kiro cannot tell from a model's reply: such a run is taken as the reply it
  looks like, and the step's unchecked box fails the attempt.) It retries a 429 itself, with backoff
  (below). An unknown flag: `Unknown arguments: ...` and its help, exit 1.
- Endpoint and auth (its bundle: `argv.authType || settings.security.auth.selectedType ||
  getAuthTypeFromEnv()`): `--auth-type`, else `security.auth.selectedType` in `~/.qwen/settings.json`
  (`qwen-oauth` is the login kept in `~/.qwen/oauth_creds.json`), else the environment: QWEN_OAUTH,
  then OPENAI_API_KEY + OPENAI_MODEL + OPENAI_BASE_URL (any OpenAI-compatible Chat Completions
  server), then GEMINI_API_KEY + GEMINI_MODEL, ANTHROPIC_API_KEY + ANTHROPIC_MODEL + ANTHROPIC_BASE_URL.
  A key is never billed over a login its settings select.
- Its own settings (0.15's bundle, `loadSettings`): `$QWEN_HOME/settings.json` (`~/.qwen/`), whose `hooks`
  run commands on its events (`getUserHooks()`: loaded whatever the folder's trust), then the project's
  `.qwen/settings.json` (its `hooks` too, in a trusted folder). No flag or variable leaves out the user's
  file alone (`--bare` drops the project's settings and auth settings too), so kiro runs it with
  QWEN_HOME at `~/.qwen/kiro-step/`: the person's settings less what runs programs unasked (`hooks`,
  `tools.discoveryCommand`/`callCommand`, `mcp.serverCommand`, `ui.statusLine`), links to everything
  else in `~/.qwen` (login, memory, skills), QWEN_RUNTIME_DIR at `~/.qwen` (sessions stay where they
  were). Their MCP servers stay: tools they chose, as with claude. In kiro's box `~/.qwen` (or
  $QWEN_HOME, and QWEN_RUNTIME_DIR) is its read-write folder.
- Usage limits: qwen 0.24 ends the run at once, with the error "Quota exhausted: <the provider's
  message>", when a 429's message says the quota is exceeded and when it resets: a usage limit until
  then. Other 429s: qwen retries a 429 itself (7 tries over ~77 s, then, unless
  `model.generationConfig.maxRetries` says otherwise, 10 more rounds of 1-5 min: about an hour with no
  output, past kiro's idle timeout). kiro's settings above set `maxRetries: 0` when the person set
  none, so a 429 that outlasts its 77 s ends the run with the error "[API Error: 429 <the provider's
  message>]\nPossible quota limitations in place or slow response times detected. ..." (exit 1): a
  usage limit, reset at the time the message states (a provider's "It will reset at 2026-08-29
  23:59:59 +0800 CST."), else kiro's probe schedule. Qwen OAuth's "free allocated quota exceeded" is
  its "Qwen OAuth free tier has been discontinued" (an auth error: it does not reset).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from kiro.errors import ExecutorError
from kiro.executors.agents import (
    Credential,
    Failure,
    FailureKind,
    Invocation,
    clean,
    env_folder,
    error_line,
    flag_value,
    json_lines,
    last_line,
    read_json,
    reset_said,
    shown,
)
from kiro.executors.agents.claude import ClaudePreset
from kiro.executors.base import Usage
from kiro.fs.atomic import atomic_write

_API_ERROR = re.compile(r"^\[API Error: (?:(?P<status>\d{3})\b)?(?P<rest>.*)\]\s*$")  # the first line of its error text
_UNKNOWN = re.compile(r"^(Unknown arguments?|Not enough arguments|Invalid values|Missing required argument)\b.*",
                      re.M)
_RATE = re.compile(r"rate[ _-]?limit|quota|too many requests|overloaded", re.I)
_DISCONTINUED = "Qwen OAuth free tier has been discontinued"
_QUOTA = "Quota exhausted: "  # qwen 0.24's own prefix for a provider's used-up quota that says when it resets
_JSONC = re.compile(r'("(?:\\.|[^"\\])*")|//[^\n]*|/\*.*?\*/', re.S)  # its settings may hold comments
STEP_HOME = "kiro-step"  # the QWEN_HOME kiro gives a step, inside the person's ~/.qwen
# what in the person's settings runs a program without being asked for in the step
UNASKED = (("hooks",), ("tools", "discoveryCommand"), ("tools", "callCommand"), ("mcp", "serverCommand"),
           ("ui", "statusLine"))


def qwen_dir(env: Mapping[str, str]) -> Path | None:
    """The person's qwen folder: $QWEN_HOME, else ~/.qwen (not the step's QWEN_HOME kiro made in it)."""
    folder = env_folder(env, "QWEN_HOME", ".qwen")
    return folder.parent if folder is not None and folder.name == STEP_HOME else folder


def step_settings(text: str | None) -> dict[str, Any]:
    """The settings a step's qwen reads as its user's: the person's (comments and all), less what runs
    programs unasked, with qwen's own hour of 429 retries turned off unless the person set them."""
    try:
        data = json.loads(_JSONC.sub(lambda m: m.group(1) or "", text)) if text else {}
    except ValueError:
        data = {}  # qwen itself sets an unreadable file aside and runs with none
    if not isinstance(data, dict):
        data = {}
    for *parents, key in UNASKED:
        scope: Any = data
        for name in parents:
            scope = scope.get(name) if isinstance(scope, dict) else None
        if isinstance(scope, dict):
            scope.pop(key, None)
    model = data.setdefault("model", {})
    if isinstance(model, dict):
        generation = model.setdefault("generationConfig", {})
        if isinstance(generation, dict):
            generation.setdefault("maxRetries", 0)
    return data


class QwenPreset(ClaudePreset):
    name = "qwen"
    program = "qwen"
    install = "npm install -g @qwen-code/qwen-code"
    command = "qwen --output-format stream-json --approval-mode yolo"
    idle_timeout_seconds = 600.0
    env_prefixes: ClassVar[tuple[str, ...] | None] = ("QWEN_", "OPENAI_", "DASHSCOPE_")
    env_keys: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "QWEN_OAUTH")
    key_vars: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY",)

    prices_tokens = True

    def model_name(self) -> str | None:
        return flag_value(self.template(), "-m", "--model") or os.environ.get("OPENAI_MODEL") or None

    def extra_args(self) -> list[str]:
        return []  # its tools are approved by --approval-mode, not Claude's --allowedTools

    def env(self, inv: Invocation) -> dict[str, str]:
        """No colours, one node process fewer (qwen's entry starts the CLI in a second one, which would start
        a third to raise its heap limit: QWEN_CODE_NO_RELAUNCH), and its settings for the step."""
        plain = {"NO_COLOR": "1", "QWEN_CODE_NO_RELAUNCH": "true"}
        real = qwen_dir(os.environ)
        if real is None:
            return plain
        try:
            home = self.step_home(real)
        except OSError as exc:  # never a run with the person's hooks because their folder could not be read
            raise ExecutorError(f"cannot prepare qwen's settings for the step in {real / STEP_HOME}: "
                                f"{exc.strerror or exc}") from None
        return {**plain, "QWEN_HOME": str(home),
                "QWEN_RUNTIME_DIR": os.environ.get("QWEN_RUNTIME_DIR") or str(real)}

    @staticmethod
    def step_home(real: Path) -> Path:
        """`<real>/kiro-step/`: the step's settings (`step_settings`) and a link to each other entry of
        the person's folder, made again before each run (links are kept, so runs may overlap)."""
        home = real / STEP_HOME
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        for entry in real.iterdir():
            if entry.name in (STEP_HOME, "settings.json", "settings.json.orig"):
                continue
            try:
                (home / entry.name).symlink_to(Path("..") / entry.name)
            except FileExistsError:
                pass
        try:
            text: str | None = (real / "settings.json").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = None
        atomic_write(home / "settings.json", json.dumps(step_settings(text), indent=2), fsync=False, mode=0o600)
        return home

    def home_paths(self, env: Mapping[str, str]) -> list[Path]:
        """The person's qwen folder (the step's QWEN_HOME is inside it), and QWEN_RUNTIME_DIR when elsewhere."""
        found = [folder] if (folder := qwen_dir(env)) is not None else []
        runtime = env.get("QWEN_RUNTIME_DIR")
        if runtime and os.path.isabs(runtime) and Path(runtime) not in found:
            found.append(Path(runtime))
        return found

    # -- credentials -------------------------------------------------------------------------

    @staticmethod
    def _folder(env: Mapping[str, str]) -> Path:
        return qwen_dir(env) or Path(Path.home(), ".qwen")

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

    def _said(self, stdout: str) -> tuple[str, re.Match[str] | None] | None:
        """The error qwen ended the run with (the `error.message` of a `result` whose `is_error` qwen set):
        its first line and, for an API error, the match of "[API Error: <status> ...]". Never the
        `result` text of a run that did not fail: the model writes that."""
        result = self._result(stdout)
        error = result.get("error") if result is not None and result.get("is_error") is True else None
        text = error.get("message") if isinstance(error, dict) else None
        if not isinstance(text, str) or not text.strip():
            return None
        line = clean(text).strip().splitlines()[0]
        return line[:300], _API_ERROR.match(line)

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        result = self._result(stdout)
        failed = result is not None and result.get("is_error") is True
        if exit_code == 0 and not failed:
            return None
        unknown = _UNKNOWN.search(clean(stderr))
        if unknown is not None:
            return Failure("usage_error", unknown.group(0).strip()[:300])
        said = self._said(stdout)
        if said is not None:
            api = said[1]
            status = int(api["status"]) if api is not None and api["status"] else None
            kind: FailureKind = "auth_error" if status in (401, 403) or said[0].startswith(_DISCONTINUED) \
                else "rate_limit" if status == 429 or said[0].startswith(_QUOTA) \
                or (api is not None and _RATE.search(said[0])) \
                else self.kind_of(exit_code, said[0], said[0])
            return Failure(kind, said[0])
        line = error_line(stderr) or last_line(stderr) or f"exit status {exit_code}"  # stdout is the model's
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        """A 429 that outlasted qwen's own retries (the "[API Error: 429 ...]" it ended the run with), or a
        provider's quota that says when it resets, which qwen 0.24 ends the run with at once ("Quota
        exhausted: ... It will reset at ..."): reset at the time the message states, if it states one."""
        said = self._said(stdout)
        if said is not None and said[0].startswith(_QUOTA):
            return Failure("usage_limit", said[0], reset_said(said[0]))
        api = said[1] if said is not None else None
        if said is None or api is None or api["status"] != "429":
            return None
        return Failure("usage_limit", said[0], reset_said(api["rest"]))

    def fatal_line(self, line: str) -> Failure | None:
        return None  # a refused key ends qwen's run at once
