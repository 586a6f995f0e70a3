"""pasta, which connects the network namespace a loop's boxed steps join (`sandbox_network: on`), and the process
that holds that namespace end with the loop: when the loop is done, and when kiro is killed mid-step, however it
is killed. A pasta that outlived a SIGKILLed kiro ran forever, each holding an inotify instance, until the
machine had none left (fs.inotify.max_user_instances: agent CLIs stop answering, kiro's watcher polls).

A loop's boxed steps share its one namespace and pasta (kiro.processes.sandbox.Network): two loops running in
one process have two, each ended when its loop ends; a step's processes still end with the step (a listener one
step leaves behind is not there for the next); a pasta that dies mid-loop is replaced at the next step. The steps
wait on files the test makes, so that it looks at what runs while a step runs.

The pastas and holders are told apart from those of other runs on the machine by a variable only this test's kiro
has in its environment (they inherit kiro's).
"""

from __future__ import annotations

import contextlib
import ctypes
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


def marked(mark: str) -> dict[int, str]:
    """The processes that carry `mark` in their environment: {pid: "pasta", "holder" (of the loop's network
    namespace: kiro.processes.sandbox.Network) or "other"}."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    found[int(entry.name)] = ("pasta" if os.path.basename(argv[0]) in (b"pasta", b"pasta.avx2") else
                                              "holder" if b"echo; read _" in argv else "other")
    return found


def pastas(mark: str) -> list[int]:
    return [pid for pid, what in marked(mark).items() if what == "pasta"]


def network(mark: str) -> list[int]:
    """The loop's network: its pasta and its namespace's holder."""
    return [pid for pid, what in marked(mark).items() if what != "other"]


@pytest.fixture
def mark() -> Iterator[str]:
    """This test's mark; a pasta that still carries it afterwards is killed (a failing run leaks none). Not the
    other processes that carry it: the tests' kiro fork server may have taken it from its first command line."""
    value = uuid.uuid4().hex
    yield value
    for pid in network(value):
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
    ws.wait_for(lambda: (ws.root / "started").exists() and len(network(mark)) == 2,
                what="the boxed step, its pasta and its namespace's holder")
    assert default_routes(ws) == 1, "pasta connected the box"
    held = network(mark)
    print(f"kiro {proc.pid} mid-step, its network (pasta, holder): {held}; SIGKILL to kiro and to every process "
          f"it started but those (the step's, its reaper)")
    step = [pid for pid in descendants(proc.pid) if pid not in held]
    os.kill(proc.pid, signal.SIGKILL)
    for pid in step:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    ws.wait_for(lambda: not network(mark), timeout=60, what="pasta and the holder to end with the kiro that made them")


def test_pasta_ends_with_the_loop(ws: Workspace, cli_home: Path, mark: str) -> None:
    ws.write("config/autonomous_loop.yaml", CONFIG)
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. One\n  ```sh\n  cat /proc/net/route > route\n  ```\n"
            "- [ ] 2. Two\n  ```sh\n  cat /proc/net/route >> route\n  ```\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(HOME=str(cli_home), **{MARK_VAR: mark}))
    assert r.returncode == 0, r.stdout + r.stderr
    assert default_routes(ws) == 2, "pasta connected both steps' boxes"
    ws.wait_for(lambda: not network(mark), timeout=60, what="no pasta nor holder left once the loop is done")


def waiting_step(n: int, name: str) -> str:
    """Step `n` of a shell task: saves its routes and its namespace, says it runs, waits for the test's go."""
    return (f"- [ ] {n}. Step {n}\n  ```sh\n  cat /proc/net/route > {name}.route{n}; "
            f"readlink /proc/self/ns/net > {name}.ns{n}; touch {name}.started{n}; "
            f"while [ ! -e {name}.go{n} ]; do sleep 0.05; done\n  ```\n")


def default_route(ws: Workspace, name: str) -> bool:
    """pasta configured the step's network: a default route (a namespace without it has only its loopback)."""
    return any(line.split("\t")[1:2] == ["00000000"] for line in (ws.root / name).read_text().splitlines())


def traced(pid: int) -> bool:
    """Trace `pid` (PTRACE_SEIZE: it runs on, unstopped): once it has ended its parent cannot collect it, nor see
    it ended, until this process, its tracer, has collected it first (`untraced`). False: tracing not allowed."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0


def untraced(pid: int) -> None:
    """Collect the traced `pid` as its tracer (it has ended): its parent now sees it ended and collects it."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


PTRACE_SEIZE = 0x4206


def test_one_pasta_serves_a_loops_steps_and_a_dead_one_is_replaced(ws: Workspace, cli_home: Path, mark: str) -> None:
    """A killed pasta closes its files, its tap device among them, before kiro can collect it: slow where other
    namespaces come and go. In a run under load it had left /proc's view, kiro still saw it run, and step 3
    joined the namespace no pasta served. The test holds that while open (where it may trace the pasta: once
    ended, it waits for the test to collect it before kiro can) until step 3 runs: kiro does not join a
    namespace whose pasta the kernel is ending."""
    ws.write("config/autonomous_loop.yaml", CONFIG)
    ws.task("---\nexecutor: shell\n---\n" + "".join(waiting_step(n, "a") for n in (1, 2, 3)))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md",
                    env=ws.env(HOME=str(cli_home), **{MARK_VAR: mark}))
    seen, held, traces = {}, None, False
    try:
        for n in (1, 2, 3):
            ws.wait_for(lambda n=n: (ws.root / f"a.started{n}").exists(), what=f"step {n} running")
            seen[n] = pastas(mark)
            if n == 2:  # pasta dies mid-loop: the next step must get a new one
                traces = traced(seen[2][0])
                held = seen[2][0] if traces else None
                os.kill(seen[2][0], signal.SIGKILL)
                if held is not None:  # it has ended, and kiro cannot collect it until the test has
                    os.waitid(os.P_PID, held, os.WEXITED | os.WNOWAIT)
                    assert Path(f"/proc/{held}/stat").read_text().rpartition(")")[2].split()[0] == "Z", "held"
                ws.wait_for(lambda: seen[2][0] not in pastas(mark), timeout=60, what="the killed pasta gone")
            if n == 3 and held is not None:
                untraced(held)
                held = None
            (ws.root / f"a.go{n}").touch()
        assert proc.wait(timeout=120) == 0, ws.output(proc)
    finally:
        if held is not None:
            untraced(held)
        if proc.poll() is None:
            proc.kill()
    print(f"pastas while each step ran: {seen}; the killed one kept from kiro until step 3 ran: {traces}")
    assert len(seen[1]) == 1 and seen[2] == seen[1], "steps 1 and 2 shared the loop's one pasta"
    assert len(seen[3]) == 1 and seen[3] != seen[1], "step 3 got a new pasta after the first one was killed"
    assert all(default_route(ws, f"a.route{n}") for n in (1, 2, 3)), "pasta connected every step's network"
    namespaces = [(ws.root / f"a.ns{n}").read_text() for n in (1, 2, 3)]
    assert namespaces[0] == namespaces[1] != namespaces[2], namespaces
    ws.wait_for(lambda: not network(mark), timeout=60, what="no pasta nor holder left once the loop is done")


def test_two_loops_in_one_process_have_two_networks_each_ended_with_its_loop(ws: Workspace, cli_home: Path,
                                                                             mark: str) -> None:
    ws.write("config/autonomous_loop.yaml", CONFIG)
    for name in ("a", "b"):
        ws.task("---\nexecutor: shell\n---\n" + waiting_step(1, name), f"Specs/{name}/tasks.md")
    proc = ws.spawn("loop", "watch", env=ws.env(HOME=str(cli_home), **{MARK_VAR: mark}))
    try:
        ws.wait_for(lambda: all((ws.root / f"{n}.started1").exists() for n in ("a", "b")), what="both loops' steps")
        both = pastas(mark)
        namespaces = {n: (ws.root / f"{n}.ns1").read_text() for n in ("a", "b")}
        (ws.root / "a.go1").touch()
        ws.wait_for(lambda: (ws.root / "Done/a/tasks.md").exists(), what="loop a done")
        ws.wait_for(lambda: len(pastas(mark)) == 1, timeout=60, what="loop a's pasta gone with loop a")
        left = pastas(mark)
        (ws.root / "b.go1").touch()
        ws.wait_for(lambda: (ws.root / "Done/b/tasks.md").exists(), what="loop b done")
        ws.wait_for(lambda: not network(mark), timeout=60, what="loop b's pasta and holder gone with loop b")
        assert proc.poll() is None, "watch still runs: the networks ended with their loops, not with kiro"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    print(f"two loops at once: pastas {both}, namespaces {namespaces}; after loop a ended: {left}")
    assert len(both) == 2 and set(left) < set(both), both
    assert namespaces["a"] != namespaces["b"], "each loop its own namespace"
    assert default_route(ws, "a.route1") and default_route(ws, "b.route1")


def test_a_listener_a_step_leaves_is_gone_for_the_next_step(ws: Workspace, cli_home: Path, mark: str) -> None:
    """Both steps in the loop's one namespace; the first starts a server in the background, reaches it, and ends:
    its PID namespace ends with it, the server too, and the second step finds nothing listening."""
    ws.write("config/autonomous_loop.yaml", CONFIG)
    serve = ("python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &\n"
             "  for i in $(seq 600); do if (echo > /dev/tcp/127.0.0.1/8765) 2>/dev/null; then echo reached > first; "
             "break; fi; sleep 0.1; done\n  readlink /proc/self/ns/net > ns1\n")
    probe = ("readlink /proc/self/ns/net > ns2\n  if (echo > /dev/tcp/127.0.0.1/8765) 2>/dev/null; then echo reached > "
             "second; else echo refused > second; fi\n")
    ws.task(f"---\nexecutor: shell\n---\n- [ ] 1. Serve\n  ```sh\n  {serve}  ```\n"
            f"- [ ] 2. Probe\n  ```sh\n  {probe}  ```\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", env=ws.env(HOME=str(cli_home), **{MARK_VAR: mark}))
    assert r.returncode == 0, r.stdout + r.stderr
    said = {name: (ws.root / name).read_text().strip() for name in ("first", "second", "ns1", "ns2")}
    print(f"the first step's own server: {said['first']}; the next step: {said['second']} (namespaces "
          f"{said['ns1']} {said['ns2']})")
    assert said["ns1"] == said["ns2"], "one namespace for the loop's steps"
    assert (said["first"], said["second"]) == ("reached", "refused")
