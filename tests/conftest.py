"""Shared fixtures: real workspaces in tmp_path, and `kiro` run as a process of its own the way a person
or a script runs it (`ws.kiro`, forked from a server that imported kiro once: tests/cli_forkserver.py),
or in the test's own process where no process of its own is the point (`ws.run`: tests/cli_inprocess.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests import cli_forkserver, cli_inprocess

if TYPE_CHECKING:
    from tests.fake_openai import FakeOpenAI

# Every test runs with KIRO_RAISE_ERRORS=1: an unexpected exception in the engine, a tool or the CLI
# re-raises instead of becoming a failed attempt, a tool error text or an "internal error" line, so a
# bug fails the test that provoked it. `Workspace.env()` passes it to every `kiro` subprocess.
os.environ["KIRO_RAISE_ERRORS"] = "1"


@pytest.fixture(autouse=True)
def _raise_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIRO_RAISE_ERRORS", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before the workers start, compile kiro's modules once (a machine with PYTHONDONTWRITEBYTECODE, as CI's,
    otherwise compiles every module again in every `python -m kiro` the tests start: ~0.15-0.2 s of CPU each).
    In an xdist worker (`pytest -n 2`), start the fork server now: it imports kiro while the worker
    collects the tests, not in the first test that runs `kiro`."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        cli_forkserver.start(Workspace(Path.cwd()).env())
    else:
        import compileall

        compileall.compile_dir(Path(__file__).resolve().parents[1] / "kiro", quiet=1)


_early: subprocess.Popen[bytes] | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Begin the runs of the tests marked `made_early` (tests/agent_clis.py) this worker collected, in a
    process of its own (tests/early.py): they mostly wait, and wait while the workers run the tests before
    them. (Without xdist, the process names the run's folder by this process's id, as the tests do.)"""
    global _early
    specs = list(dict.fromkeys(":".join(spec) for item in session.items
                               if (spec := getattr(getattr(item, "function", None), "made_early", None))))
    if not specs or session.config.option.collectonly:
        return
    env = {**os.environ, "PYTEST_XDIST_TESTRUNUID": os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())}
    from tests.agent_clis import run_folder

    with open(run_folder() / f"early-{os.getpid()}.out", "wb") as out:
        _early = subprocess.Popen([sys.executable, "-m", "tests.early", *specs], cwd=Path(__file__).parents[1],
                                  env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A `made_early` process still making runs when the worker ends (its tests not run) ends with it."""
    if _early is not None and _early.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(_early.pid, signal.SIGKILL)
        _early.wait()


# `kiro agents` keeps the agent CLIs' versions in the user's cache (kiro.executors.agents.versions): a test
# that lists the real CLIs points it at this one folder of the test run (`env=ws.env(**AGENTS_CACHE)`), so
# the CLIs are asked once per run, not once per test, and the real home's cache is left alone.
AGENTS_CACHE = {"XDG_CACHE_HOME": os.path.join(
    tempfile.gettempdir(), f"kiro-test-agent-versions-{os.environ.get('PYTEST_XDIST_TESTRUNUID') or os.getpid()}")}

FAST_CONFIG = """\
autonomous_loop:
  backoff_base_seconds: 0.01
  backoff_max_seconds: 0.05
"""


@dataclass
class Workspace:
    root: Path

    def write(self, rel: str, text: str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
        return p

    def task(self, text: str, rel: str = "Specs/feature/tasks.md") -> Path:
        return self.write(rel, text)

    def state(self, task_id: str) -> dict[str, Any]:
        for p in (self.root / ".state" / f"autonomous_loop_{task_id}.json",
                  self.root / ".state" / "archive" / f"autonomous_loop_{task_id}.json"):
            if p.exists():
                # as kiro reads it: the state file with the loop's journal replayed (kiro.store.journal); the
                # bare file alone may be up to a second behind a running loop
                from kiro.store import journal

                return journal.read_state_dict(p)
        raise AssertionError(f"no state file for {task_id}")

    def events(self, task_id: str) -> list[dict[str, Any]]:
        p = self.root / "Logs" / f"{task_id}.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_"))}
        env["PYTHONUNBUFFERED"] = "1"
        env["KIRO_RAISE_ERRORS"] = "1"
        env.pop("PYTEST_CURRENT_TEST", None)
        env.update(extra)
        return env

    def kiro(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
             input: str | None = None) -> subprocess.CompletedProcess[str]:
        """`python -m kiro *args` in the workspace: as subprocess.run(capture_output=True, text=True)."""
        return cli_forkserver.run(args, cwd=self.root, env=env or self.env(), timeout=timeout, input=input)

    def run(self, *args: str, env: dict[str, str] | None = None, input: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`kiro *args` in the workspace (or `cwd`), run in this process (tests/cli_inprocess.py), with what
        `kiro()` gives back: for a command that needs no process of its own (no loop run, no signal, kill,
        detach, watch or serve), at a fraction of a process's cost."""
        return cli_inprocess.run(args, cwd=cwd or self.root, env=env or self.env(), input=input)

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> cli_forkserver.ForkedProcess:
        """Start kiro in the background; its output goes to a file beside the workspace (`output()`).
        What tests use of a Popen: pid (the kiro process), poll, wait, send_signal, kill."""
        self._spawned = getattr(self, "_spawned", 0) + 1
        out = self.root.parent / f"kiro_{self._spawned}.out"
        with open(out, "w") as fh:
            proc = cli_forkserver.ForkedProcess(args, cwd=self.root, env=env or self.env(), stdout=fh.fileno(),
                                                stderr=fh.fileno())
        proc.output_path = out  # type: ignore[attr-defined]
        return proc

    @staticmethod
    def output(proc: cli_forkserver.ForkedProcess) -> str:
        return proc.output_path.read_text()  # type: ignore[attr-defined,no-any-return]

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 120, what: str = "condition") -> Any:
        """Poll `predicate` until it is truthy. The default timeout is for a loaded machine (a kiro start
        takes seconds there); it costs nothing when the event comes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except (FileNotFoundError, json.JSONDecodeError, KeyError, AssertionError):
                value = None
            if value:
                return value
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

    def only_task_id(self) -> str:
        ids = [p.name[len("autonomous_loop_"):-5] for p in (self.root / ".state").rglob("autonomous_loop_*.json")
               if "backups" not in p.parts]
        assert len(set(ids)) == 1, ids
        return ids[0]


def new_workspace(root: Path) -> Workspace:
    """kiro's folders under `root`, and a config with short backoffs."""
    for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True)
    (root / "config" / "autonomous_loop.yaml").write_text(FAST_CONFIG)
    return Workspace(root)


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    yield new_workspace(tmp_path / "vault")


class Kept:
    """A workspace built once for the tests of a module (a module-scoped fixture) that each test may change
    and is then put back for the next: for tests that need the same loop run beforehand (a loop costs
    seconds; putting back, milliseconds). `lent()` gives it to one test; after it, what appeared in it is
    removed and what changed is written back in place with its bytes and modification time, so every file keeps its
    inode (kiro knows a task file or a log by its inode). A file the test removed or replaced cannot be put
    back so: the workspace is then built again, before the next test that borrows it."""

    def __init__(self, base: Path, build: Callable[[Workspace], None]) -> None:
        self.base, self.build, self.builds = base, build, 0
        self.ws: Workspace | None = None

    def lent(self) -> contextlib.AbstractContextManager[Workspace]:
        return self._lent()

    @contextlib.contextmanager
    def _lent(self) -> Iterator[Workspace]:
        if self.ws is None:
            self.builds += 1
            self.ws = new_workspace(self.base / f"build{self.builds}" / "vault")
            self.build(self.ws)
            self.files, self.dirs = _tree(self.ws.root)
        yield self.ws
        if not self._put_back(self.ws.root):
            self.ws = None

    def _put_back(self, root: Path) -> bool:
        files, dirs = _tree(root)
        for rel in sorted(files.keys() - self.files.keys(), reverse=True):
            (root / rel).unlink()
        for rel in sorted(dirs - self.dirs, reverse=True):
            shutil.rmtree(root / rel, ignore_errors=True)
        for rel, (ino, mtime, data) in self.files.items():
            now = files.get(rel)
            if now is None or now[0] != ino:
                return False
            if now[1:] != (mtime, data):
                (root / rel).write_bytes(data)
                os.utime(root / rel, ns=(mtime, mtime))
        return not self.dirs - dirs


def _tree(root: Path) -> tuple[dict[str, tuple[int, int, bytes]], set[str]]:
    """The files under `root` (inode, modification time and bytes by relative path) and its folders."""
    files, dirs = {}, set()
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        st = p.lstat()
        if p.is_dir() and not p.is_symlink():
            dirs.add(rel)
        else:
            files[rel] = (st.st_ino, st.st_mtime_ns, os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
    return files, dirs


def shell_task(n: int, *, cmd: str = 'echo "$KIRO_STEP_ID" >> side_effects.log', title: str = "Test task",
               extra_frontmatter: str = "") -> str:
    """A task file of n steps, each with a ```sh block running `cmd` (its lines indented under the step)."""
    lines = ["---", f"title: {title}", "executor: shell"]
    if extra_frontmatter:
        lines.append(extra_frontmatter.rstrip("\n"))
    lines += ["---", "# Plan", ""]
    for i in range(1, n + 1):
        lines += [f"- [ ] {i}. Step number {i}", "  ```sh", *[f"  {line}" for line in cmd.splitlines()], "  ```"]
    return "\n".join(lines) + "\n"


def deep_tree(root: Path, depth: int) -> None:
    """`depth` nested folders `d/d/...` under `root`, made through descriptors (deeper than PATH_MAX
    lets a path name), with `leaf.txt` ("needle") at the bottom."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    with open(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as fh:
        fh.write("needle\n")


@pytest.fixture
def cli_home() -> Iterator[Path]:
    """A folder for an agent CLI's HOME and config files, outside the temp directory: codex refuses to
    make its sandbox helper under it, and its sandboxed commands then fail (`bwrap: execvp
    codex-linux-sandbox`) wherever bubblewrap is installed. `$KIRO_TEST_HOMES` moves it."""
    home = new_cli_home()
    yield home
    shutil.rmtree(home, ignore_errors=True)


def cli_homes() -> Path:
    """Where the agent CLIs' test homes are made (outside the temp directory, see `cli_home`)."""
    base = Path(os.environ.get("KIRO_TEST_HOMES") or Path.home() / ".cache" / "kiro-test-homes")
    base.mkdir(parents=True, exist_ok=True)
    return base


def new_cli_home() -> Path:
    """A new folder for the `cli_home` fixture (a module-scoped fixture removes it itself)."""
    return Path(tempfile.mkdtemp(dir=cli_homes()))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py), closed after the test."""
    from tests.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        yield server


def openai_config(ws: Workspace, fake: FakeOpenAI, *, model: str = "fake-model", max_retries: int = 0,
                  llm: str = "", loop: str = "", extra: str = "") -> None:
    """The workspace's config for the openai executor against `fake`: `llm` and `loop` are more
    lines of those sections (indented by two), `extra` more sections."""
    ws.write("config/autonomous_loop.yaml",
             f"executor: openai\nllm:\n  base_url: {fake.base_url}\n  model: {model}\n  max_retries: {max_retries}\n"
             f"{llm}autonomous_loop:\n  backoff_base_seconds: 0.01\n{loop}{extra}")
