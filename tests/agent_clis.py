"""Running the REAL agent CLIs (Claude Code, Codex) under kiro against the scripted API servers in
tests/fakes: the harness that tests/test_agent_clis.py and bench/agent_clis.py share.

Each `Cli` knows how to point its program at a fake (environment, config home in tmp), and plays a
model that does what kiro's prompt asks: it reads the task file's path and the exact line to
change from the prompt, and checks that box with the CLI's own tools (Claude: Read then Edit;
Codex: `apply_patch` through its exec_command tool), then says it is done. `extra` tool calls can
be scripted before that (to write kiro's control files, say).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kiro.fs.locks import Flock, Timeout
from tests.conftest import AGENTS_CACHE, Workspace
from tests.fakes import FakeServer, HttpError, Recorded
from tests.fakes import anthropic as fa
from tests.fakes import responses as fr

INSTALL = ".ci/install-agent-clis"
PROMPT_RE = re.compile(r"check its box in the task file `(?P<file>[^`]+)`: change this line:\s*\n\s*\n\s*"
                       r"(?P<old>- \[-\][^\n]*)\n\s*\n\s*to\s*\n\s*\n\s*(?P<new>- \[x\][^\n]*)\n")


def filled(extra: list[Any], path: str) -> list[Any]:
    """`extra`'s tool calls with `{task}` in their arguments replaced by the file the prompt says to check
    the box in (the agent's copy of the task file, kiro.executors.control.StepCopy)."""
    return [(name, {k: v.replace("{task}", path) if isinstance(v, str) else v for k, v in args.items()})
            for name, args in extra]


def parse_prompt(text: str) -> tuple[str, str, str]:
    """The task file and the line to change, as kiro's prompt gives them: the last such instruction (a
    reinjected prompt quotes the previous step's before it)."""
    *_, m = [None, *PROMPT_RE.finditer(text)]
    assert m, f"the prompt does not say which line to change:\n{text[-1500:]}"
    return m["file"], m["old"], m["new"]


_versions: dict[str, str] = {}  # program path -> its version, asked once a test run


def ran(program: str, path: str, name: str | None = None) -> str:
    """Print (in the test's output) the version of the real CLI the test runs, e.g. `claude 2.1.332`: the
    first version number its `--version` prints, asked once a test run (a node CLI's `--version` takes seconds
    on a loaded machine). When kiro's preset `name` runs that very executable, it is asked through kiro's own
    version cache, the test run's (`kept_version`): what `kiro agents` in a later test finds kept, or found
    kept by one before; else by the first worker that needs it (`run_once`)."""

    def probe() -> dict[str, str]:
        try:
            # Gemini CLI would start a second node process of itself to print it (kiro.executors.agents.acp)
            said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "GEMINI_CLI_NO_RELAUNCH": "true"}).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            said = f"? ({exc})"
        return {"version": said}

    if path not in _versions:
        said = kept_version(name, path)
        if said is None:
            where = hashlib.sha256(path.encode()).hexdigest()[:12]
            said = str(run_once(f"version-{program}-{where}", probe)["version"])
        found = re.search(r"\d+\.\d+(?:\.\d+)?\S*", said)
        _versions[path] = found[0] if found else (said.strip().splitlines() or ["?"])[0]
    print(f"{program} {_versions[path]}")
    return _versions[path]


def kept_version(name: str | None, path: str) -> str | None:
    """What kiro's preset `name` says its CLI's `--version` printed (kiro.executors.agents.versions), in the
    test run's version cache (AGENTS_CACHE; asked now, one at a time across workers as `kiro_agents` does,
    unless kept); None when kiro has no such preset or it would run another executable than `path`."""
    from unittest import mock

    from kiro.errors import KiroError
    from kiro.executors.agents import get
    from kiro.executors.agents.versions import TimedOut, versions

    try:
        preset = get(name) if name else None
    except KiroError:
        return None
    mine = preset.installed() if preset is not None else None
    if preset is None or mine is None or os.path.realpath(mine) != os.path.realpath(path):
        return None
    cache = Path(AGENTS_CACHE["XDG_CACHE_HOME"])
    cache.mkdir(parents=True, exist_ok=True)
    with Flock(cache / "probing.lock") as lock, mock.patch.dict(os.environ, AGENTS_CACHE):
        lock.acquire(timeout=None)
        said = versions([preset])[0]
    return f"? ({said})" if isinstance(said, TimedOut) else said or "?"


def processes(home: Path) -> list[tuple[int, list[str]]]:
    """The processes running with HOME at `home` and their command lines (a test's CLI has a home of its own:
    these are its processes, whichever worker or box runs them)."""
    found = []
    want = b"HOME=" + bytes(home)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if want not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        found.append((int(proc.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def node_processes(home: Path) -> list[list[str]]:
    """The command lines of the node processes running with HOME at `home` (`processes`)."""
    return [argv for _, argv in processes(home) if argv and argv[0].rsplit("/", 1)[-1] == "node"]


@dataclass
class Cli:
    name: str
    program: str
    package: str
    tmp: Path
    extra: list[Any] = field(default_factory=list)  # tool calls to make before checking the box
    error: HttpError | None = None  # answer calls with this error...
    error_times: int | None = None  # ...this many times (None: every call)
    input_tokens: int = 100
    output_tokens: int = 20
    server: FakeServer | None = None
    retries: bool = False
    said: str | None = None  # the model's last reply, instead of "Checked the box: ..."
    nodes: list[list[list[str]]] = field(default_factory=list)  # its node processes at each agent call (`saw_nodes`)

    def saw_nodes(self, home: Path) -> None:
        """Note the CLI's node processes (HOME at `home`) while it waits for this model call."""
        self.nodes.append(node_processes(home))

    def reply(self, new: str) -> str:
        """What the model says once the box is checked (its last message of the step)."""
        return self.said if self.said is not None else f"Checked the box: {new}"

    @property
    def installed(self) -> bool:
        """Whether the CLI is there; when it is, the test prints the version it runs (`ran`)."""
        found = self.where()
        if found is not None:
            ran(self.program, found, self.name)
        return found is not None

    def where(self) -> str | None:
        return shutil.which(self.program)

    def skip_reason(self) -> str:
        return (f"{self.program} CLI is not installed (npm {self.package}); install it with {INSTALL} "
                f"to run this test")

    def start(self) -> FakeServer:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def calls(self) -> int:
        raise NotImplementedError

    def failing(self) -> HttpError | None:
        """The scripted error for this call, if any (counting down `error_times`)."""
        if self.error is None or self.error_times == 0:
            return None
        if self.error_times is not None:
            self.error_times -= 1
        return self.error

    def default_retries(self) -> None:
        """Let the CLI retry failed requests as it does out of the box (the fixture turns that off)."""
        self.retries = True


class Claude(Cli):
    def __init__(self, tmp: Path) -> None:
        super().__init__("claude", "claude", "@anthropic-ai/claude-code", tmp)

    def brain(self, rec: Recorded) -> fa.Turn | HttpError:
        usage = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if not fa.is_agent_call(rec.body):
            return self.error if self.error is not None and self.error_times is None else fa.Turn([fa.text("ok")],
                                                                                                 **usage)
        failing = self.failing()
        if failing is not None:
            return failing
        done = len(fa.tool_results(rec.body))
        path, old, new = parse_prompt(fa.first_user_text(rec.body))
        plan = [*filled(self.extra, path), ("Read", {"file_path": path}),
                ("Edit", {"file_path": path, "old_string": old, "new_string": new})]
        if done < len(plan):
            name, args = plan[done]
            return fa.Turn([fa.tool_use(name, args)], **usage)
        return fa.Turn([fa.text(self.reply(new))], **usage)

    def start(self) -> FakeServer:
        self.server = fa.FakeAnthropic(self.brain).start()
        return self.server

    def env(self) -> dict[str, str]:
        assert self.server is not None
        home = self.tmp / "claude-home"
        home.mkdir(exist_ok=True)
        return {"HOME": str(home), "ANTHROPIC_BASE_URL": self.server.url, "ANTHROPIC_API_KEY": "sk-ant-test-key",
                "ANTHROPIC_MODEL": fa.MODEL, **({} if self.retries else {"CLAUDE_CODE_MAX_RETRIES": "0"})}

    def calls(self) -> int:
        assert isinstance(self.server, fa.FakeAnthropic)
        return len(self.server.agent_calls())


class Codex(Cli):
    def __init__(self, tmp: Path) -> None:
        super().__init__("codex", "codex", "@openai/codex", tmp)

    def brain(self, rec: Recorded) -> fr.Reply | HttpError:
        failing = self.failing()
        if failing is not None:
            return failing
        usage = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        done = len(fr.outputs(rec.body))
        path, old, new = parse_prompt(fr.user_text(rec.body))
        patch = (f"apply_patch <<'PATCH'\n*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n"
                 f"*** End Patch\nPATCH\n")
        plan = [*filled(self.extra, path), ("exec_command", {"cmd": patch})]
        if done < len(plan):
            name, args = plan[done]
            return fr.Reply([fr.function_call(name, args)], **usage)
        return fr.Reply([fr.message(self.reply(new))], **usage)

    def start(self) -> FakeServer:
        self.server = fr.FakeResponses(self.brain).start()
        home = self.codex_home
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'model = "{fr.MODEL}"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
            f'base_url = "{self.server.url}/v1"\nenv_key = "OPENAI_API_KEY"\nwire_api = "responses"\n'
            f'request_max_retries = 0\nstream_max_retries = 0\n')
        return self.server

    def default_retries(self) -> None:
        super().default_retries()
        config = self.codex_home / "config.toml"
        config.write_text(config.read_text().replace("request_max_retries = 0\nstream_max_retries = 0\n", ""))

    @property
    def codex_home(self) -> Path:
        """Where a person has it: ~/.codex (in kiro's box only this folder of HOME is there)."""
        return self.tmp / "codex-home" / ".codex"

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.tmp / "codex-home"), "CODEX_HOME": str(self.codex_home),
                "OPENAI_API_KEY": "sk-test-key"}

    def calls(self) -> int:
        assert isinstance(self.server, fr.FakeResponses)
        return len(self.server.calls())


CLIS: dict[str, Callable[[Path], Cli]] = {"claude": Claude, "codex": Codex}

# Codex reports tokens only; kiro prices them with llm.prices (the tests and bench set this price).
CODEX_PRICE = "llm:\n  prices:\n    gpt-5-codex: {input_per_1m: 1.25, output_per_1m: 10.0}\n"


def task_text(n: int) -> str:
    lines = ["---", "title: Greeting", "---", "# Implementation Plan", ""]
    lines += [f"- [ ] {i}. Write part {i} of the greeting" for i in range(1, n + 1)]
    return "\n".join(lines) + "\n"


def kiro_agents(ws: Workspace, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`kiro agents ARGS` in `ws` (in-process: it needs no process of its own) with `env` and the test
    run's version cache (AGENTS_CACHE). One at a time across the run's workers: the first asks the
    installed CLIs their versions (eleven node CLIs, a minute or more on a loaded machine; `kiro agents
    NAME` asks NAME's alone), the next find them kept. Run side by side, two workers' cold caches each
    asked them all, and each took twice as long."""
    cache = Path(AGENTS_CACHE["XDG_CACHE_HOME"])
    cache.mkdir(parents=True, exist_ok=True)
    with Flock(cache / "probing.lock") as lock:
        lock.acquire(timeout=None)
        r = ws.run("agents", *args, env={**env, **AGENTS_CACHE})
    assert r.returncode == 0, r.stderr
    return r


def run_folder() -> Path:
    """Where the test run's workers share what one of them made (`run_once`, tests/agent_clis_acp.dead_run)."""
    folder = Path(tempfile.gettempdir()) / f"kiro-test-runs-{os.environ.get('PYTEST_XDIST_TESTRUNUID') or os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run_once(name: str, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`make()`'s answer (JSON), made once in the test run: by the first xdist worker that asks, the others
    wait for it and read it. What a module-scoped fixture is when two of its tests land on two workers (the
    run's `--dist load` sends tests where there is room): each worker would make its own."""
    folder = run_folder()
    made = folder / f"{name}.json"
    with Flock(folder / f"{name}.lock") as lock:
        lock.acquire(timeout=None)
        if not made.exists():
            made.write_text(json.dumps(make()))
        return json.loads(made.read_text())  # type: ignore[no-any-return]


T = TypeVar("T")

# The runs begun early (`made_early`), by key: registered as their test modules are imported
EARLY: dict[str, Callable[[], None]] = {}


def made_early(key: str, make: Callable[[], None]) -> Callable[[T], T]:
    """A test decorator: `make()` (a run that mostly waits: a CLI's own fixed retry schedule, an idle timeout)
    is begun as soon as a worker has collected the test (tests/conftest.py `pytest_collection_finish`), in a
    process of its own (tests/early.py: it sees none of the environment the tests change meanwhile), so it
    waits while the workers run other tests. One process a test run makes them all, one after another, in
    the tests' order. `make` takes the lock its test takes (`run_once`, tests/agent_clis_acp.dead_run) without
    waiting, and leaves a run another worker (or its test) makes; the test then reads the answer, waiting for
    it if it is still being made, or making it, if nothing began it."""

    def mark(test: T) -> T:
        EARLY[key] = make
        test.made_early = (test.__module__, key)  # type: ignore[attr-defined]
        return test

    return mark


def once_early(key: str, make: Callable[[], dict[str, Any]]) -> Callable[[], None]:
    """A `made_early` maker for `early(key, make)`'s answer: made unless another process makes or made it."""

    def begin() -> None:
        folder = run_folder()
        with Flock(folder / f"{key}.lock") as lock:
            try:
                lock.acquire()
            except Timeout:
                return
            if not (folder / f"{key}.json").exists():
                (folder / f"{key}.json").write_text(json.dumps(make()))

    return begin


def early(key: str, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run_once(key, make)`, made early (`made_early(key, once_early(key, make))`): skipped, saying why, or
    failed as `make` failed. `make` returns its answer with no exception: {"skip": why} or {"failed":
    traceback} when it could not make it."""
    answer = run_once(key, make)
    if "skip" in answer:
        pytest.skip(answer["skip"])
    assert "failed" not in answer, answer["failed"]
    return answer


def listed_agents(ws: Workspace, env: dict[str, str], name: str | None = None) -> tuple[dict[str, dict[str, Any]], str]:
    """`kiro agents [NAME] --json` (`kiro_agents`): its rows by name (NAME's alone: only its CLI is asked its
    version), and its stderr."""
    r = kiro_agents(ws, env, *([name] if name else []), "--json")
    return {row["name"]: row for row in json.loads(r.stdout)}, r.stderr


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


C = TypeVar("C", bound=Cli)


def serving(cli: C) -> Iterator[C]:
    """A fixture's CLI with its scripted server running, closed afterwards; skipped, saying why, when the
    CLI is not installed."""
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    cli.start()
    yield cli
    cli.close()
