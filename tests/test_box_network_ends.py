"""pasta, which connects a boxed step's own network (`sandbox_network: on`), ends with the step: when the step
is done, and when kiro is killed mid-step, however it is killed. A pasta that outlived a SIGKILLed kiro ran
forever, each holding an inotify instance, until the machine had none left (fs.inotify.max_user_instances:
agent CLIs stop answering, kiro's watcher polls).

The pastas are told apart from those of other runs on the machine by a variable only this test's kiro has in
its environment (pasta inherits kiro's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiro.processes import sandbox
from tests.conftest import Workspace

pytestmark = pytest.mark.skipif(sandbox.unusable() is not None or sandbox.pasta_path() is None,
                                reason="needs a usable bwrap and pasta (Debian's passt)")

TASK = "Specs/feature/tasks.md"
MARK_VAR = "KIRO_TEST_BOX_NETWORK"
CONFIG = "sandbox: bwrap\nsandbox_network: on\nautonomous_loop:\n  failure_threshold: 1\n  max_step_retries: 0\n"


def marked(mark: str) -> dict[int, bool]:
    """The processes that carry `mark` in their environment: {pid: is it a pasta}."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    program = (entry / "cmdline").read_bytes().split(b"\0")[0]
                    found[int(entry.name)] = os.path.basename(program) in (b"pasta", b"pasta.avx2")
    return found


def pastas(mark: str) -> list[int]:
    return [pid for pid, is_pasta in marked(mark).items() if is_pasta]


@pytest.fixture
def mark() -> Iterator[str]:
    """This test's mark; a pasta that still carries it afterwards is killed (a failing run leaks none). Not the
    other processes that carry it: the tests' kiro fork server may have taken it from its first command line."""
    value = uuid.uuid4().hex
    yield value
    for pid in pastas(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (bwrap, the box's init, the step's shell...), by their parent in /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
    found, todo = [], [pid]
    while todo:
        below = [child for child, parent in parents.items() if parent == todo[-1]]
        todo.pop()
        found += below
        todo += below
    return found


def default_routes(ws: Workspace) -> int:
    """How many default routes the boxed steps saw (/proc/net/route, written by each): pasta configured their
    network (a box without it has only its loopback)."""
    text = (ws.root / "route").read_text() if (ws.root / "route").exists() else ""
    return sum(line.split("\t")[1:2] == ["00000000"] for line in text.splitlines())


def test_pasta_ends_when_kiro_is_killed_mid_step(ws: Workspace, cli_home: Path, mark: str) -> None:
    ws.write("config/autonomous_loop.yaml", CONFIG)
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Wait\n  ```sh\n  cat /proc/net/route > route; echo go > started; "
            "sleep 600\n  ```\n")
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(HOME=str(cli_home), **{MARK_VAR: mark}))
    ws.wait_for(lambda: (ws.root / "started").exists() and pastas(mark), what="the boxed step and its pasta")
    assert default_routes(ws) == 1, "pasta connected the box"
    print(f"kiro {proc.pid} mid-step, its pasta: {pastas(mark)}; SIGKILL to kiro and to every process it started "
          f"but pasta (the step's, its reaper)")
    step = [pid for pid in descendants(proc.pid) if pid not in pastas(mark)]
    os.kill(proc.pid, signal.SIGKILL)
    for pid in step:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    ws.wait_for(lambda: not pastas(mark), timeout=60, what="pasta to end with the kiro that started it")


def test_pasta_ends_with_each_step_of_a_loop(ws: Workspace, cli_home: Path, mark: str) -> None:
    ws.write("config/autonomous_loop.yaml", CONFIG)
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. One\n  ```sh\n  cat /proc/net/route > route\n  ```\n"
            "- [ ] 2. Two\n  ```sh\n  cat /proc/net/route >> route\n  ```\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(HOME=str(cli_home), **{MARK_VAR: mark}))
    assert r.returncode == 0, r.stdout + r.stderr
    assert default_routes(ws) == 2, "pasta connected both steps' boxes"
    ws.wait_for(lambda: not pastas(mark), timeout=60, what="no pasta left once the loop is done")
