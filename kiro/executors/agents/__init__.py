"""Agent presets for the command executor (SPEC §5, "Agent presets").

A preset is what kiro knows about one agent CLI: the command line for an unattended run (current
flags, how the prompt goes in), the environment it needs, how long it may stay silent, how to read
tokens and cost from its machine-readable output, and what its failures look like. `agent: NAME`
(config, task frontmatter, `--agent`, `KIRO_AGENT`) picks one; `executor_command` still overrides
the command line, and the preset's parser is kept when the command runs the preset's program.

A command line is a template, split like a shell would (`shlex`); these placeholders are replaced
in each argument: `{prompt_file}` (the prompt written to a file; without it the prompt goes on
stdin), `{task_file}`, `{step_id}`, `{project_dir}`.

Adding a preset: a module with a `Preset` subclass, registered as an entry point of group `kiro.agents`
(kiro.plugins.AGENTS): kiro's own in its pyproject.toml, any other in its own package's (`kiro-agent-<x>`).
The config's accepted names, its schema, errors and `kiro agents` read that registry.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from kiro.errors import ExecutorError
from kiro.executors.base import Usage
from kiro.plugins import AGENTS, UnknownName
from kiro.store.redact import looks_like_token, looks_secret
from kiro.store.statestore import SERVE_TOKEN_ENV

if TYPE_CHECKING:
    from kiro.processes.sandbox import Box
    from kiro.store.config import Config

# usage_limit: the subscription's or the key's usage window is used up (Claude Code's "You've hit your
# session limit", Codex's usage_limit_reached, a Gemini daily quota): the loop waits for the reset
# instead of counting a failure (kiro.executors.command).
FailureKind = Literal["usage_error", "auth_error", "rate_limit", "usage_limit", "failure"]

LINE_KEPT = 1024 * 1024  # of a line of stdout being read as it arrives (a tool call's whole arguments)
PLACEHOLDERS = ("{prompt_file}", "{task_file}", "{step_id}", "{project_dir}")

# What to tell a person for each fatal kind, unless the preset says better.
FIX = {
    "usage_error": "the agent's command line is wrong: check executor_command / agent_args against `{program} --help`",
    "auth_error": "the agent CLI could not authenticate: set its API key or log it in (docs/guides/agents.md)",
}

_ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
_ERROR_LINE = re.compile(r"^\s*(error|fatal|panic|exception)\b|^\s*\w*(Error|Exception)\b[:\s]|\berror:", re.I)
_USAGE_LINE = re.compile(r"unknown (option|argument|command|flag)|unrecognized (option|argument|arguments)|"
                         r"unexpected argument|invalid (value|choice) .*for|requires an argument|"
                         r"missing required argument|no such option|^usage:", re.I)
_AUTH_LINE = re.compile(r"\b401\b.{0,20}unauthori[sz]ed|\bunauthori[sz]ed\b|invalid[ _-]?(x-)?api[ _-]?key|"
                        r"incorrect api key|api key not valid|authentication[ _](failed|error|required)|not logged in|"
                        r"please run /login|\b403\b.{0,5}forbidden|permission_error", re.I)
_RATE_LINE = re.compile(r"\b429\b|rate[ _-]?limit|too many requests|quota|overloaded|\b529\b", re.I)
# What every agent CLI gets of kiro's environment (with its own variables: Preset.passes): where programs
# are, who and where the person is, language, terminal, proxy and certificates, the runtime that runs
# it, git's identity, and the step's own KIRO_ variables. Anything else (AWS_SECRET_ACCESS_KEY,
# GITHUB_TOKEN, a database URL) is withheld unless agent_env.pass names it; the start line says so.
ENV_ALLOWED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM", "NO_COLOR",
    "FORCE_COLOR", "COLUMNS", "LINES", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_OPTIONS", "NODE_PATH", "VIRTUAL_ENV", "PYENV_ROOT", "PYENV_VERSION",
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_NOSYSTEM", "KIRO_TASK_ID", "KIRO_STEP_ID", "KIRO_TASK_FILE", "KIRO_ITERATION", "KIRO_ATTEMPT",
    "KIRO_WORKSPACE", "KIRO_PROMPT_FILE"})
ENV_ALLOWED_PREFIXES = ("LC_", "XDG_")
PROXY_VARS = frozenset({"http_proxy", "https_proxy", "no_proxy", "all_proxy", "ftp_proxy"})  # either case
_LOOPBACK_URL = re.compile(r"://(?:localhost|127(?:\.\d{1,3}){3}|\[::1\]):(\d{1,5})(?![\d])", re.I)
CONFIG_SUFFIXES = (".json", ".jsonc", ".toml", ".yaml", ".yml")  # a CLI's config file, read for its endpoint
CONFIG_MAX_BYTES = 1 << 20
TOOL_ARGUMENT_CHARS = 120  # of a tool call's main argument in its event line
# a tool call's main argument, by the names the CLIs give it (a shell command, a file, a search)
MAIN_ARGUMENTS = ("command", "cmd", "file_path", "absolute_path", "filePath", "path", "pattern", "query", "url",
                  "prompt", "description")
ToolCall = tuple[str, str]  # (tool name, its main argument, cut)


@dataclass(frozen=True)
class Failure:
    """What went wrong in an attempt, in the agent CLI's own words (`line`)."""

    kind: FailureKind
    line: str
    resets_at: datetime | None = None  # usage_limit: when the CLI says the window resets (None: it did not say)

    @property
    def fatal(self) -> bool:
        """Retrying cannot help: the run ends (exit 1) and the person fixes the setup."""
        return self.kind in ("usage_error", "auth_error")


@dataclass(frozen=True)
class Invocation:
    """The facts of one attempt that go into a command line."""

    prompt_file: Path
    task_file: Path
    step_id: str
    project_dir: Path

    def fill(self, arg: str) -> str:
        return (arg.replace("{prompt_file}", str(self.prompt_file)).replace("{task_file}", str(self.task_file))
                .replace("{step_id}", self.step_id).replace("{project_dir}", str(self.project_dir)))


CredentialKind = Literal["api_key", "login", "unknown"]


@dataclass(frozen=True)
class Credential:
    """What an agent CLI will authenticate with, as far as kiro can tell before it runs: an API key
    (`source` names the variable or file, never the value), a login the CLI keeps (a subscription),
    or `unknown` (none found, or one kiro cannot see, such as a keychain)."""

    kind: CredentialKind
    source: str

    def said(self) -> str:
        if self.kind == "api_key":
            return f"bills the API key in {self.source}"
        if self.kind == "login":
            return f"uses its login ({self.source})"
        return self.source


@dataclass(frozen=True)
class Billing:
    """The credential an agent CLI will use once kiro has shaped its environment (`agent_env`), and the
    variables kept from it. Never holds a variable's value."""

    agent: str
    credential: Credential
    dropped: tuple[str, ...] = ()  # variables of kiro's environment the CLI does not get
    kept_from_login: tuple[str, ...] = ()  # of those, the API keys it would have billed before its login
    withheld: tuple[str, ...] = ()  # of those, the ones not its own (Preset.passes), agent_env.pass aside

    def line(self) -> str:
        """The start line's account: `claude uses its login (~/.claude/.credentials.json); kiro keeps
        ANTHROPIC_API_KEY from it (agent_env: {pass: [ANTHROPIC_API_KEY]} bills the key instead)`."""
        text = f"{self.agent} {self.credential.said()}"
        if self.kept_from_login:
            names = ", ".join(self.kept_from_login)
            text += (f"; kiro keeps {names} from it, which it would bill before its login "
                     f"(agent_env: {{pass: [{self.kept_from_login[0]}]}} bills the key instead)")
        other = [v for v in self.dropped if v not in self.kept_from_login and v not in self.withheld]
        if other:
            text += f"; not passed to it (agent_env.drop): {', '.join(other)}"
        if self.withheld:
            secret = [name for name in self.withheld if looks_secret(name)]
            rest = len(self.withheld) - len(secret)
            said = [f"the secrets {', '.join(secret)}" if secret else "",
                    f"{rest} other variable{'s' if rest != 1 else ''}" if rest else ""]
            text += (f"; withheld from it, not being its own: {' and '.join(w for w in said if w)} "
                     f"(agent_env: {{pass: [NAME]}} lets one through)")
        return text

    def apply(self, env: dict[str, str]) -> dict[str, str]:
        for name in self.dropped:
            env.pop(name, None)
        return env


def home_path(env: Mapping[str, str], *parts: str) -> Path:
    """A path under the HOME the CLI will see (its HOME variable, else this process's)."""
    return Path(env.get("HOME") or Path.home(), *parts)


def shown(path: Path, env: Mapping[str, str]) -> str:
    """A path as a person reads it: `~/.claude/.credentials.json`."""
    home = env.get("HOME") or str(Path.home())
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        return str(path)


def read_json(path: Path) -> Any:
    """A small JSON file the CLI keeps (settings, a login's metadata), or None; never raises."""
    try:
        if path.stat().st_size > 1_000_000:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def clean(text: str) -> str:
    """Output as a person or a model should read it: no ANSI escapes, no carriage-return redraws."""
    text = _ANSI.sub("", text)
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.splitlines())


def error_line(*texts: str) -> str | None:
    """The line that says what went wrong: the first error-looking line of the first text that has
    one (stderr before stdout), not the last line (`For more information, try '--help'`)."""
    for text in texts:
        for raw in clean(text).splitlines():
            if _ERROR_LINE.search(raw):
                return raw.strip()[:300]
    return None


def tool_call(name: Any, arguments: Any) -> ToolCall | None:
    """A tool call a CLI reported: the tool's name and its main argument on one line (see `shown_call`)."""
    if not isinstance(name, str) or not name:
        return None
    main: Any = arguments
    if isinstance(arguments, dict):
        main = next((arguments[k] for k in MAIN_ARGUMENTS if isinstance(arguments.get(k), str | list)),
                    next((v for v in arguments.values() if isinstance(v, str)), ""))
    if isinstance(main, list):
        main = " ".join(str(m) for m in main)
    return name[:80], " ".join(str(main or "")[:LINE_KEPT].split())


def shown_call(call: ToolCall, project: Path) -> ToolCall:
    """A tool call as its event shows it: a path in the project relative to it (a deep project must not
    hide the file), the argument cut to TOOL_ARGUMENT_CHARS."""
    name, argument = call
    argument = argument.replace(f"{str(project).rstrip('/')}/", "")
    if len(argument) > TOOL_ARGUMENT_CHARS:
        argument = argument[: TOOL_ARGUMENT_CHARS - 1] + "…"
    return name, argument


def last_line(text: str) -> str | None:
    for raw in reversed(clean(text).splitlines()):
        if raw.strip():
            return raw.strip()[:300]
    return None


def last_event(text: str, kind: str) -> dict[str, Any] | None:
    """The last JSONL event of `kind` (its "type") in a CLI's output: the run's final record."""
    found = None
    for event in json_lines(text):
        if event.get("type") == kind:
            found = event
    return found


def json_lines(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects among the lines of some output (JSONL event streams); other lines skipped."""
    for raw in text.splitlines():
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def without_echo(text: str, prompt: str) -> str:
    """`text` minus the lines that repeat the prompt (some CLIs echo it on stderr): what the agent
    said, not what kiro told it, so a retry prompt never nests the previous prompt."""
    echoed = {line.strip() for line in prompt.splitlines() if len(line.strip()) >= 12}
    return "\n".join(line for line in text.splitlines() if line.strip() not in echoed)


_CLOCK = re.compile(r"^(?:(?P<month>[A-Z][a-z]{2}) (?P<day>\d{1,2})(?:st|nd|rd|th)?, (?P<year>\d{4}) )?"
                    r"(?P<hour>\d{1,2}):(?P<minute>\d{2}) ?(?P<ampm>[AaPp][Mm])$")
_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)$")


def local_clock(text: str, now: datetime | None = None) -> datetime | None:
    """A wall-clock time as a CLI prints it in the machine's local time zone ("6:27 AM", "Nov 30th,
    2026 6:27 AM"), as an aware datetime; None when it does not read as one."""
    m = _CLOCK.match(text.strip())
    if m is None:
        return None
    now = (now or datetime.now(UTC)).astimezone()
    hour = int(m["hour"]) % 12 + (12 if m["ampm"].lower() == "pm" else 0)
    try:
        if m["month"]:
            month = datetime.strptime(m["month"], "%b").month
            return now.replace(year=int(m["year"]), month=month, day=int(m["day"]), hour=hour,
                               minute=int(m["minute"]), second=0, microsecond=0)
        return now.replace(hour=hour, minute=int(m["minute"]), second=0, microsecond=0)
    except ValueError:
        return None


def after(seconds_text: str, since: datetime | None = None) -> datetime | None:
    """`since` (now) plus a delay as Google's APIs write it ("3600s", "37.5s", "900ms")."""
    m = _DURATION.match(seconds_text.strip())
    if m is None:
        return None
    seconds = float(m["n"]) / (1000 if m["unit"] == "ms" else 1)
    return (since or datetime.now(UTC)) + timedelta(seconds=seconds)


_RESET_AT = re.compile(r"\breset(?:s)?\s+(?:at|on)\s+(?P<when>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?)(?:\.\d+)?"
                       r"\s*(?P<zone>Z|[+-]\d{2}:?\d{2})?", re.I)


def reset_said(text: str) -> datetime | None:
    """The reset time a provider's limit message states ("It will reset at 2026-08-29 23:59:59 +0800
    CST.", "resets at 2026-11-27T10:00:00Z"), in UTC; a time with no offset is the machine's local time."""
    m = _RESET_AT.search(text)
    if m is None:
        return None
    zone = m["zone"] or ""
    if zone and zone != "Z" and ":" not in zone:
        zone = f"{zone[:3]}:{zone[3:]}"
    try:
        when = datetime.fromisoformat(m["when"].replace(" ", "T") + zone.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo is not None else when.astimezone()).astimezone(UTC)


def epoch(value: Any) -> datetime | None:
    """Seconds since 1970 (an API's reset time) as a datetime; None when not a plausible number."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (ValueError, OverflowError, OSError):
        return None


def tail(text: str, limit: int = 1200) -> str:
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


class Preset:
    """One agent CLI. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str] = "command"
    program: ClassVar[str] = ""
    install: ClassVar[str] = ""  # how to install it, for `kiro agents`
    command: ClassVar[str] = ""  # the command-line template
    idle_timeout_seconds: ClassVar[float | None] = 600.0
    env_keys: ClassVar[tuple[str, ...]] = ()  # the variables it reads (auth, endpoint), for docs and `kiro agents`
    key_vars: ClassVar[tuple[str, ...]] = ()  # API key variables it uses before its own login, in its order
    version_args: ClassVar[tuple[str, ...]] = ("--version",)
    speaks_acp: ClassVar[bool] = False  # kiro talks to it over the Agent Client Protocol (kiro.executors.acp)
    empty_when_missing: ClassVar[bool] = False  # ACP: it reads a file that does not exist as "" (see agents.acp)
    exits_on_eof: ClassVar[bool] = True  # ACP: it exits when kiro closes its stdin after a turn (else: SIGTERM)
    env_unset: ClassVar[tuple[str, ...]] = ()  # variables of kiro's environment it must not get
    # The prefixes of the variables it reads (its credentials, endpoint and settings: `ANTHROPIC_`, `CLAUDE_`):
    # with `env_keys`, `key_vars` and ENV_ALLOWED, all of kiro's environment it gets (`billing`). None: kiro
    # does not know the program (a bare executor_command, `agent: acp`): it gets all but the secrets.
    env_prefixes: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, config: Config | None = None) -> None:
        if config is None:
            from kiro.store.config import Config

            config = Config()
        self.config = config

    # -- the command line ------------------------------------------------------------------

    def template(self) -> list[str]:
        """The command line with its placeholders, agent_args included."""
        return [*shlex.split(self.command), *self.extra_args(), *self.config.agent_args]

    def extra_args(self) -> list[str]:
        """Arguments the preset derives from the config (claude's allowed tools, say)."""
        return []

    def argv(self, inv: Invocation, template: Sequence[str] | None = None) -> list[str]:
        return [inv.fill(a) for a in (template if template is not None else self.template())]

    def env(self, inv: Invocation) -> dict[str, str]:
        """Variables to set for the CLI, on top of the step's environment."""
        return {}

    def command_line(self) -> str:
        return shlex.join(self.template())

    # -- the sandbox (kiro.processes.sandbox) ----------------------------------------------

    home_files: ClassVar[tuple[str, ...]] = ()  # its config and auth under $HOME, read-write in the box

    def home_paths(self, env: Mapping[str, str]) -> list[Path]:
        """The CLI's own config, auth and cache files and folders, read-write in kiro's box (the
        rest of $HOME is an empty tmpfs there). `env`: the environment the CLI runs with."""
        home = _home(env)
        return [home / name for name in self.home_files] if home is not None else []

    def read_paths(self, env: Mapping[str, str]) -> list[Path]:
        """Files and folders the CLI's own variables name (`AIDER_MODEL_METADATA_FILE`, `OPENCODE_CONFIG`:
        those of `env_keys` and those that start with its program's name): the person pointed the CLI
        at them, so they stay readable in kiro's box, also under the emptied $HOME."""
        own = f"{self.program.upper()}_" if self.program else None
        found = []
        for name, value in env.items():
            if (name in self.env_keys or (own and name.startswith(own))) and os.path.isabs(value) \
                    and os.path.exists(value):
                found.append(Path(value))
        return found

    def endpoints(self, env: Mapping[str, str]) -> list[int]:
        """The ports of the host's 127.0.0.1 its model endpoint is at, as the person gave them to it: a
        loopback base URL (`http://127.0.0.1:11434`, `localhost`, `[::1]`) in the environment it runs
        with or in its own config files (those of `home_paths` and `read_paths`, top level, small ones).
        kiro's box forwards just these into its own network (kiro.processes.sandbox)."""
        texts = list(env.values())
        for path in [*self.home_paths(env), *self.read_paths(env)]:
            files = [path] if path.is_file() else sorted(path.glob("*")) if path.is_dir() else []
            for one in files:
                if one.suffix in CONFIG_SUFFIXES and one.is_file() and not one.is_symlink():
                    with contextlib.suppress(OSError):
                        if one.stat().st_size <= CONFIG_MAX_BYTES:
                            texts.append(one.read_text(errors="replace"))
        ports = {int(m.group(1)) for text in texts for m in _LOOPBACK_URL.finditer(text)}
        return sorted(port for port in ports if 0 < port < 65536)

    def passes(self, name: str) -> bool:
        """Whether the variable `name` of kiro's environment is one this CLI needs (a known preset):
        its own (`env_keys`, `key_vars`, `env_prefixes`) or what any program needs (ENV_ALLOWED)."""
        if name in ENV_ALLOWED or name.startswith(ENV_ALLOWED_PREFIXES) or name.lower() in PROXY_VARS:
            return True
        return name in self.env_keys or name in self.key_vars or name.startswith(self.env_prefixes or ())

    def acp_auth(self, env: Mapping[str, str]) -> str | None:
        """ACP: the auth method (its id in `initialize`'s authMethods) kiro authenticates with when the
        agent says authentication is required, for a credential in `env` (codex-acp's API key)."""
        return None

    def acp_modes(self, boxed: bool) -> tuple[str, ...]:
        """ACP: the agent's session modes in which it asks kiro before each edit and command, most asking
        first; kiro sets the first one offered and holds it (kiro.executors.acp.hold_mode)."""
        return ()

    def boxed_argv(self, argv: list[str]) -> list[str]:
        """The command line to run inside kiro's box (codex picks another sandbox mode of its own)."""
        return argv

    def boxed_env(self, env: Mapping[str, str], project_dir: Path) -> dict[str, str]:
        """Variables to set inside kiro's box, on top of `env` (aider's git identity)."""
        return {}

    # -- what it costs ---------------------------------------------------------------------

    prices_tokens: ClassVar[bool] = False  # it reports tokens, not money: kiro prices them with llm.prices[<model>]

    def model_name(self) -> str | None:
        """The model its runs use, as far as kiro can tell before one (its command line, its variables)."""
        return None

    def unpriced(self) -> str | None:
        """Why kiro cannot put a price on this CLI's runs (so `max_cost_usd` could never fire), or None:
        a CLI that reports tokens only, with no `llm.prices` entry for its model (or none at all)."""
        if not self.prices_tokens:
            return None
        prices, model = self.config.llm.prices, self.model_name()
        if prices and (model is None or model in prices):
            return None
        which = f"its model {model!r}" if model else "any model"
        return (f"{self.name} reports tokens, not money, and llm.prices has no price for {which}: give it one "
                f"(llm: {{prices: {{{model or '<model>'}: {{input_per_1m: ..., output_per_1m: ...}}}}}}, dollars "
                f"per million tokens)")

    # -- what came out ---------------------------------------------------------------------

    def parse_usage(self, stdout: str) -> Usage | None:
        """Tokens and cost from the CLI's machine-readable output; None when it reported none."""
        return None

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        """None when the CLI reports success; else the kind of failure and the CLI's own error line.
        A CLI that exits 0 but reports an error in its output (claude's `is_error`) has failed too.

        What the model writes (its replies, on stdout) never decides the kind: a failure is read from
        channels the model cannot write, the exit code, stderr, and the structured error events and
        HTTP status the CLI reports (each preset reads its own). Here, for a command kiro knows nothing
        of, stdout's line is shown but read as a plain failure."""
        if exit_code == 0:
            return None
        said = error_line(stderr)
        if said is not None:
            return Failure(self.kind_of(exit_code, stderr, said), said)
        shown = error_line(stdout)
        if shown is not None:
            return Failure("failure", shown)
        said = last_line(stderr)
        if said is not None:
            return Failure(self.kind_of(exit_code, stderr, said), said)
        return Failure("failure", last_line(stdout) or f"exit status {exit_code}")

    def kind_of(self, exit_code: int | None, output: str, line: str) -> FailureKind:
        """Generic reading of an error: an argument parser's complaint is a usage error (clap and
        argparse exit 2, commander 1), then auth, then rate limits."""
        first = "\n".join(clean(output).splitlines()[:12])
        if _USAGE_LINE.search(line) or (exit_code == 2 and _USAGE_LINE.search(first)):
            return "usage_error"
        if _AUTH_LINE.search(line):
            return "auth_error"
        if _RATE_LINE.search(line):
            return "rate_limit"
        return "failure"

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        """A short, cleaned account of the attempt for the next prompt and the state: what the agent
        said last (for JSON streams, its final message), never the prompt it was given."""
        return tail(without_echo(clean(stdout), prompt)) or tail(without_echo(clean(stderr), prompt))

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        """The CLI stopped because its usage window or quota is used up (a Failure of kind
        "usage_limit", with the reset time when the CLI printed one); None otherwise. Asked only of an
        attempt that failed."""
        return None

    def fatal_line(self, line: str) -> Failure | None:
        """A line of output, as it arrives, that shows the attempt cannot succeed however long the
        CLI keeps retrying (an API key refused): kiro ends the attempt at once."""
        return None

    tool_marker: ClassVar[str | None] = None  # a text in every stdout line that reports a tool call

    def tool_calls(self, event: dict[str, Any]) -> list[ToolCall]:
        """The tool calls one event of the CLI's JSON stream reports as they start (`tool_marker`
        is in its line); none for a CLI that does not stream them."""
        return []

    def reported_error(self, stdout: str, stderr: str) -> str | None:
        """The CLI's own account of what went wrong in an attempt that exited 0 without doing the
        step (a command of the agent's that failed, an error it printed), one line; None when it
        said none."""
        return error_line(stderr) or (None if stdout.lstrip().startswith("{") else error_line(stdout))

    def watch(self, on_tool: Callable[[ToolCall], None] | None = None) -> LineWatch:
        return LineWatch(self, on_tool)

    def fix(self, failure: Failure) -> str:
        return FIX.get(failure.kind, "").format(program=self.program or "the agent")

    # -- which credential it bills ---------------------------------------------------------

    def login(self, env: Mapping[str, str]) -> str | None:
        """The login the CLI keeps (a subscription), as a person would name it, if kiro can see one."""
        return None

    def keys_over_login(self, env: Mapping[str, str]) -> list[str]:
        """The API key variables set in `env` that the CLI would bill although it has a login."""
        if self.login(env) is None:
            return []
        return [name for name in self.key_vars if env.get(name)]

    def credential(self, env: Mapping[str, str]) -> Credential:
        """What the CLI will authenticate with, given the environment it gets: the first of its key
        variables that is set, else its login."""
        for name in self.key_vars:
            if env.get(name):
                return Credential("api_key", name)
        login = self.login(env)
        if login is not None:
            return Credential("login", login)
        return Credential("unknown", f"has no credential kiro can see (set {self.key_vars[-1]} or log it in)"
                          if self.key_vars else "takes its credential from its own config (kiro cannot tell which)")

    # -- the installed CLI -----------------------------------------------------------------

    def installed(self) -> str | None:
        return shutil.which(self.program) if self.program else None

    def version(self, timeout: float) -> str | None:
        """What `<program> --version` says (None: not installed). OSError or subprocess.SubprocessError
        (a timeout) when it could not say; `kiro agents` asks through kiro.executors.agents.versions."""
        path = self.installed()
        if path is None:
            return None
        done = subprocess.run([path, *self.version_args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
        return self.version_line(done.stdout) or last_line(done.stderr)

    def version_line(self, stdout: str) -> str | None:
        """The version in what `--version` printed: its last line, unless the CLI says otherwise."""
        return last_line(stdout)


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of a flag in a command line (`-m gpt-5`, `--model=gpt-5`), or None."""
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        for name in names:
            if name.startswith("--") and arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
    return None


def _home(env: Mapping[str, str]) -> Path | None:
    home = env.get("HOME")
    return Path(home) if home and os.path.isabs(home) else None


def env_folder(env: Mapping[str, str], variable: str, default: str) -> Path | None:
    """`$variable` when set (CODEX_HOME, XDG_CONFIG_HOME...), else `default` under $HOME."""
    value = env.get(variable)
    if value and os.path.isabs(value):
        return Path(value)
    home = _home(env)
    return home / default if home is not None else None


class LineWatch:
    """Feeds a preset's `fatal_line` one line of stdout at a time, as the output arrives, and hands
    each tool call the line reports to `on_tool` (the step's `tool_called` event)."""

    def __init__(self, preset: Preset, on_tool: Callable[[ToolCall], None] | None = None) -> None:
        self.preset = preset
        self.on_tool = on_tool if preset.tool_marker else None
        self.failure: Failure | None = None
        self._partial = b""
        self._long = False  # the line being read is longer than kept: not one to read as JSON

    def __call__(self, data: bytes) -> bool:
        lines = (self._partial + data).split(b"\n")
        partial = lines.pop()
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if self.on_tool is not None and not self._long:
                self._tools(line)
            self._long = False
            failure = self.preset.fatal_line(line)
            if failure is not None:
                self.failure = failure
                return True
        if len(partial) > LINE_KEPT:
            partial, self._long = partial[-LINE_KEPT:], True
        self._partial = partial
        return False

    def _tools(self, line: str) -> None:
        marker = self.preset.tool_marker
        if marker is None or marker not in line or self.on_tool is None:
            return
        for event in json_lines(line):
            for call in self.preset.tool_calls(event):
                self.on_tool(call)


class CommandLine(Preset):
    """A bare `executor_command` with no preset: kiro knows nothing of its output beyond the generic
    error reading, and it may stay silent as long as it likes (`step_idle_timeout_seconds` null)."""

    name = "command"
    idle_timeout_seconds = None

    def __init__(self, config: Config | None = None, command: str = "") -> None:
        super().__init__(config)
        self.command_text = command

    def template(self) -> list[str]:
        return shlex.split(self.command_text)


def preset_class(name: str) -> type[Preset]:
    """The preset registered as `name` (kiro.plugins.AGENTS), imported now."""
    try:
        cls = AGENTS.load(name)
    except UnknownName as exc:
        raise ExecutorError(str(exc)) from None
    except ModuleNotFoundError as exc:  # its package is broken or half uninstalled
        raise ExecutorError(f"agent {name!r} cannot be loaded ({exc}); reinstall the package that adds it, or set "
                            f"executor_command to its command line instead") from None
    if not (isinstance(cls, type) and issubclass(cls, Preset)):
        raise ExecutorError(f"agent {name!r} is registered as {cls!r}, not a kiro.executors.agents.Preset subclass")
    return cls


def get(name: str, config: Config | None = None) -> Preset:
    return preset_class(name)(config)


def available() -> list[type[Preset]]:
    """The presets this build has, in registry order."""
    found = []
    for name in AGENTS.names():
        try:
            found.append(preset_class(name))
        except ExecutorError:
            continue
    return found


def for_program(argv0: str) -> str | None:
    """The preset whose program an `executor_command` runs (`claude`, `/usr/bin/codex`), if any."""
    base = Path(argv0).name
    for cls in available():
        if cls.program and base == cls.program and not cls.speaks_acp:
            return cls.name
    return None


def resolve(config: Config) -> tuple[Preset, list[str]]:
    """The preset and the command-line template the command executor runs for `config`:
    `executor_command` when set (with the preset's parser when it runs the preset's program),
    else the preset's own line. Raises ExecutorError when neither is configured."""
    if config.agent and preset_class(config.agent).speaks_acp:
        if config.executor_command:
            raise ExecutorError(f"executor_command is the command line of a one-shot agent CLI; agent {config.agent!r} "
                                f"speaks ACP: set its command line as acp_command (a list), or remove executor_command")
        preset = get(config.agent, config)
        template = preset.template()
        if not template:
            raise ExecutorError(f"agent {config.agent!r} needs acp_command: the command line that starts the ACP "
                                f"agent, as a list, e.g. acp_command: [gemini, --acp]")
        return preset, template
    if config.executor_command:
        try:
            template = shlex.split(config.executor_command)
        except ValueError as exc:
            raise ExecutorError(f"executor_command {config.executor_command!r} cannot be split: {exc}") from None
        if not template:
            raise ExecutorError("executor_command is empty")
        name = config.agent if config.agent and Path(template[0]).name == preset_class(config.agent).program \
            else for_program(template[0])
        if name is None:
            return CommandLine(config, config.executor_command), template
        return get(name, config), template
    if config.agent:
        preset = get(config.agent, config)
        return preset, preset.template()
    raise ExecutorError(
        f"the command executor needs an agent CLI: `agent: NAME` (one of {', '.join(AGENTS.names())}; "
        "see `kiro agents`) or `executor_command: \"my-agent ...\"` in config/autonomous_loop.yaml, "
        "--agent NAME, or KIRO_AGENT / KIRO_EXECUTOR_COMMAND"
    )


def billing(preset: Preset, config: Config, environ: Mapping[str, str] | None = None) -> Billing:
    """Which credential `preset`'s CLI will bill, and which of kiro's variables it does not get.

    The default never bills a key silently: when the CLI has a login and an API key variable that it
    would use before that login is set (Claude Code's ANTHROPIC_API_KEY, Codex's CODEX_API_KEY), the
    variable is kept from it and the login is used; `agent_env.pass` lets such a variable through.
    With no login the key is used. Either way the start line and `kiro agents` say which.
    `agent_env.drop` keeps any variable from the CLI."""
    environ = os.environ if environ is None else environ
    passed = set(config.agent_env.pass_)
    dropped = [name for name in config.agent_env.drop if name in environ]
    over = [name for name in preset.keys_over_login(environ) if name not in passed and name not in dropped]
    dropped += over
    withheld = sorted(name for name in environ if name not in passed and name not in dropped and not kept(preset, name,
                                                                                                         environ[name]))
    dropped += withheld
    env = {k: v for k, v in environ.items() if k not in dropped}
    return Billing(preset.name, preset.credential(env), tuple(dropped), tuple(over), tuple(withheld))


def kept(preset: Preset, name: str, value: str) -> bool:
    """Whether kiro's variable `name` reaches `preset`'s CLI: for a known CLI, one of its own or what
    every program needs (Preset.passes); for a program kiro does not know, every variable but those
    named or shaped like a secret (and the server's token, never)."""
    if name == SERVE_TOKEN_ENV:
        return False
    if preset.env_prefixes is None:
        return not looks_secret(name) and not looks_like_token(value)
    return preset.passes(name)


def describe(config: Config | None = None, box: Box | None = None, name: str | None = None) -> list[dict[str, Any]]:
    """What `kiro agents` shows: each preset (only `name`'s, when given: only its CLI is asked its version),
    whether its CLI is installed, its version, and the exact command line kiro would run with this config
    (the configured agent's executor_command override included). `box`: the workspace's step box
    (kiro.processes.sandbox) when steps run in one; each row then names what its CLI may write in it (the
    project, and its own files under $HOME). A version whose probe timed out is None, with
    `version_timed_out` true."""
    from kiro.executors.agents.versions import TimedOut, versions

    presets = [cls(config) for cls in available() if name is None or cls.name == name]
    rows: list[dict[str, Any]] = []
    for preset, said in zip(presets, versions(presets), strict=True):
        version = None if isinstance(said, TimedOut) else said
        line = preset.command_line()
        chosen = config is not None and config.agent == preset.name
        if chosen and config is not None and config.executor_command:
            line = config.executor_command
        idle = preset.idle_timeout_seconds
        if config is not None and config.step_idle_timeout_seconds is not None:
            idle = config.step_idle_timeout_seconds
        boxed = box is not None
        rows.append({
            "name": preset.name, "program": preset.program, "installed": preset.installed() is not None,
            "path": preset.installed(), "version": version, "version_timed_out": isinstance(said, TimedOut),
            "command": shlex.join(preset.boxed_argv(shlex.split(line))) if boxed else line,
            "prompt": "ACP" if preset.speaks_acp else "file" if "{prompt_file}" in line else "stdin",
            "idle_timeout_seconds": idle, "env": list(preset.env_keys), "install": preset.install,
            "selected": chosen,
            "sandbox": None if box is None else {
                "rw": [str(p) for p in box.rw] + [str(p) for p in preset.home_paths(os.environ)
                                                   if p.exists() and p not in box.rw],  # as the box binds them
                "ro": [str(p) for p in box.ro], "home": str(box.home) if box.home else None},
        })
        bill = billing(preset, preset.config)
        rows[-1].update({"credential": bill.credential.kind, "credential_source": bill.credential.source,
                         "billing": bill.line(), "kept_from_agent": [n for n in bill.dropped if n not in bill.withheld],
                         "withheld": list(bill.withheld)})
    return rows
