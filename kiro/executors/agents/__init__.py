"""Agent presets for the command executor (SPEC §5, "Agent presets").

A preset is what kiro knows about one agent CLI: the command line for an unattended run (current
flags, how the prompt goes in), the environment it needs, how long it may stay silent, how to read
tokens and cost from its machine-readable output, and what its failures look like. `agent: NAME`
(config, task frontmatter, `--agent`, `KIRO_AGENT`) picks one; `executor_command` still overrides
the command line, and the preset's parser is kept when the command runs the preset's program.

A command line is a template, split like a shell would (`shlex`); these placeholders are replaced
in each argument: `{prompt_file}` (the prompt written to a file; without it the prompt goes on
stdin), `{task_file}`, `{step_id}`, `{project_dir}`.

Adding a preset: a module in this package with a `Preset` subclass, and one line in `PRESETS`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from kiro.errors import ExecutorError
from kiro.executors.base import Usage

if TYPE_CHECKING:
    from kiro.processes.sandbox import Box
    from kiro.store.config import Config

FailureKind = Literal["usage_error", "auth_error", "rate_limit", "failure"]

# name -> "module:class". `clis` adds aider, gemini and opencode here.
PRESETS: dict[str, str] = {
    "claude": "kiro.executors.agents.claude:ClaudePreset",
    "codex": "kiro.executors.agents.codex:CodexPreset",
    "aider": "kiro.executors.agents.aider:AiderPreset",
    "gemini": "kiro.executors.agents.gemini:GeminiPreset",
    "opencode": "kiro.executors.agents.opencode:OpencodePreset",
}
NAMES = tuple(PRESETS)
PLACEHOLDERS = ("{prompt_file}", "{task_file}", "{step_id}", "{project_dir}")

# What to tell a person for each fatal kind, unless the preset says better.
FIX = {
    "usage_error": "the agent's command line is wrong: check executor_command / agent_args against `{program} --help`",
    "auth_error": "the agent CLI could not authenticate: set its API key or log it in (see the README's setup for it)",
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


@dataclass(frozen=True)
class Failure:
    """What went wrong in an attempt, in the agent CLI's own words (`line`)."""

    kind: FailureKind
    line: str

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
    version_args: ClassVar[tuple[str, ...]] = ("--version",)

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

    def boxed_argv(self, argv: list[str]) -> list[str]:
        """The command line to run inside kiro's box (codex picks another sandbox mode of its own)."""
        return argv

    def boxed_env(self, env: Mapping[str, str], project_dir: Path) -> dict[str, str]:
        """Variables to set inside kiro's box, on top of `env` (aider's git identity)."""
        return {}

    # -- what came out ---------------------------------------------------------------------

    def parse_usage(self, stdout: str) -> Usage | None:
        """Tokens and cost from the CLI's machine-readable output; None when it reported none."""
        return None

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        """None when the CLI reports success; else the kind of failure and the CLI's own error line.
        A CLI that exits 0 but reports an error in its output (claude's `is_error`) has failed too."""
        if exit_code == 0:
            return None
        line = error_line(stderr, stdout) or last_line(stderr) or last_line(stdout) or f"exit status {exit_code}"
        return Failure(self.kind_of(exit_code, f"{stderr}\n{stdout}", line), line)

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

    def fatal_line(self, line: str) -> Failure | None:
        """A line of output, as it arrives, that shows the attempt cannot succeed however long the
        CLI keeps retrying (an API key refused): kiro ends the attempt at once."""
        return None

    def watch(self) -> LineWatch:
        return LineWatch(self)

    def fix(self, failure: Failure) -> str:
        return FIX.get(failure.kind, "").format(program=self.program or "the agent")

    # -- the installed CLI -----------------------------------------------------------------

    def installed(self) -> str | None:
        return shutil.which(self.program) if self.program else None

    def version(self, timeout: float = 20.0) -> str | None:
        path = self.installed()
        if path is None:
            return None
        try:
            done = subprocess.run([path, *self.version_args], capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
        except (OSError, subprocess.SubprocessError):
            return None
        return last_line(done.stdout) or last_line(done.stderr)


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
    """Feeds a preset's `fatal_line` one line of stdout at a time, as the output arrives."""

    def __init__(self, preset: Preset) -> None:
        self.preset = preset
        self.failure: Failure | None = None
        self._partial = b""

    def __call__(self, data: bytes) -> bool:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-65536:]
        for raw in lines:
            failure = self.preset.fatal_line(raw.decode("utf-8", "replace"))
            if failure is not None:
                self.failure = failure
                return True
        return False


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
    try:
        spec = PRESETS[name]
    except KeyError:
        raise ExecutorError(f"unknown agent {name!r}; choose one of {', '.join(NAMES)}") from None
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ExecutorError(f"agent {name!r} has no preset in this build of kiro yet; set executor_command "
                            f"to its command line instead") from None
    cls = getattr(module, attr)
    assert isinstance(cls, type) and issubclass(cls, Preset)
    return cls


def get(name: str, config: Config | None = None) -> Preset:
    return preset_class(name)(config)


def available() -> list[type[Preset]]:
    """The presets this build has, in registry order."""
    found = []
    for name in NAMES:
        try:
            found.append(preset_class(name))
        except ExecutorError:
            continue
    return found


def for_program(argv0: str) -> str | None:
    """The preset whose program an `executor_command` runs (`claude`, `/usr/bin/codex`), if any."""
    base = Path(argv0).name
    for cls in available():
        if cls.program and base == cls.program:
            return cls.name
    return None


def resolve(config: Config) -> tuple[Preset, list[str]]:
    """The preset and the command-line template the command executor runs for `config`:
    `executor_command` when set (with the preset's parser when it runs the preset's program),
    else the preset's own line. Raises ExecutorError when neither is configured."""
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
        "the command executor needs an agent CLI: `agent: claude` (or codex, aider, gemini, opencode; "
        "see `kiro agents`) or `executor_command: \"my-agent ...\"` in config/autonomous_loop.yaml, "
        "--agent NAME, or KIRO_AGENT / KIRO_EXECUTOR_COMMAND"
    )


def describe(config: Config | None = None, box: Box | None = None) -> list[dict[str, Any]]:
    """What `kiro agents` shows: each preset, whether its CLI is installed, its version, and the
    exact command line kiro would run with this config (the configured agent's executor_command
    override included). `box`: the workspace's step box (kiro.processes.sandbox) when steps run in one;
    each row then names what its CLI may write in it (the project, and its own files under $HOME)."""
    from concurrent.futures import ThreadPoolExecutor

    presets = [cls(config) for cls in available()]
    with ThreadPoolExecutor(max_workers=max(1, len(presets))) as pool:
        versions = list(pool.map(lambda p: p.version(), presets))
    rows: list[dict[str, Any]] = []
    for preset, version in zip(presets, versions, strict=True):
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
            "path": preset.installed(), "version": version,
            "command": shlex.join(preset.boxed_argv(shlex.split(line))) if boxed else line,
            "prompt": "file" if "{prompt_file}" in line else "stdin",
            "idle_timeout_seconds": idle, "env": list(preset.env_keys), "install": preset.install,
            "selected": chosen,
            "sandbox": None if box is None else {
                "rw": [str(p) for p in box.rw] + [str(p) for p in preset.home_paths(os.environ)
                                                   if str(p) not in {str(q) for q in box.rw}],
                "ro": [str(p) for p in box.ro], "home": str(box.home) if box.home else None},
        })
    return rows
