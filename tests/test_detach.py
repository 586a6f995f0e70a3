"""`kiro loop start|resume --detach` (kiro.core.api.in_background): the command takes the loop's lock and
writes its state as a foreground start does, then hands the held lock to the loop's own process as an
inherited descriptor and returns without waiting for that process's start.

Some tests hold the background process still at its very first line, before any kiro code runs: a
`sitecustomize` on its PYTHONPATH (a real interpreter, a real process) waits there until the test lets it go
or kills it. That makes "the moment after the command returned" a state the test can look at, not a race.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Workspace, shell_task

HOLD = """\
import os, sys, time
if "-w" in sys.argv:  # the loop's own process, started by --detach (-w ROOT): wait here, before any kiro code
    here = os.environ["HELD_AT"]
    with open(here + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(here + ".tmp", here)
    while not os.path.exists(os.environ["LET_GO"]):
        time.sleep(0.02)
"""


Held = tuple[dict[str, str], Path, Path]


@pytest.fixture
def held(ws: Workspace, tmp_path: Path) -> Iterator[Held]:
    """The environment of a `--detach` whose background process waits at its start; the file it writes its pid
    to when it is there, and the file that lets it go on (touched at the end of the test whatever happened: no
    process is left waiting)."""
    hook = tmp_path / "hold"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD)
    held_at, let_go = tmp_path / "held.pid", tmp_path / "let_go"
    env = ws.env(PYTHONPATH=os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]),
                 HELD_AT=str(held_at), LET_GO=str(let_go))
    try:
        yield env, held_at, let_go
    finally:
        let_go.touch()


def status_json(ws: Workspace, tid: str) -> dict[str, object]:
    r = ws.kiro("loop", "status", "--task-id", tid, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    return data[0] if isinstance(data, list) else data  # type: ignore[no-any-return]


def test_detach_prints_the_id_and_the_loop_runs_to_its_end_in_its_own_process(ws: Workspace) -> None:
    ws.task(shell_task(2, cmd='echo "$KIRO_STEP_ID $PPID" >> side_effects.log'))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bg", "--detach")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "bg"
    assert (ws.root / ".state" / "autonomous_loop_bg.json").exists()  # its state is on disk when the command returns
    state = ws.wait_for(lambda: (s := ws.state("bg"))["status"] == "completed" and s, what="the loop to complete")
    assert [line.split()[0] for line in (ws.root / "side_effects.log").read_text().splitlines()] == ["1", "2"]
    events = [e["event"] for e in ws.events("bg")]
    assert events.count("loop_started") == 1 and "loop_resumed" not in events  # a start, run once
    assert "loop bg started" in (ws.root / "Logs" / "bg.out").read_text()  # its own output went to its file
    assert state["runs"] == 1


def test_the_loop_is_held_from_the_moment_detach_returns(ws: Workspace, held: Held) -> None:
    """No moment in which a second start, resume or --fresh start could take the loop: the lock is held
    across the hand-over, also while the loop's process has not run a line of kiro yet. A `kiro loop stop`
    then is the loop's to obey (not removed as a resume removes a hook): it pauses before its first step."""
    ws.task(shell_task(1))
    env, held_at, let_go = held
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bg", "--detach", env=env)
    assert r.returncode == 0, r.stderr
    ws.wait_for(held_at.exists, what="the loop's process to be at its start")
    tried = {
        "start": ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md"),
        "start --fresh": ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--fresh"),
        "start --detach": ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--detach"),
        "resume": ws.kiro("loop", "resume", "--task-id", "bg"),
        "resume --detach": ws.kiro("loop", "resume", "--task-id", "bg", "--detach"),
    }
    refused = {what: r.returncode != 0 and "already running" in r.stderr for what, r in tried.items()}
    print(f"tried {len(tried)} ways to take the detached loop before its process began: "
          f"{sum(refused.values())} refused ({refused})")
    assert all(refused.values()), {what: (r.returncode, r.stderr) for what, r in tried.items()}
    assert status_json(ws, "bg")["alive"] is True
    assert ws.kiro("loop", "stop", "--task-id", "bg").returncode == 0
    let_go.touch()
    state = ws.wait_for(lambda: (s := ws.state("bg"))["status"] == "paused" and s, what="the loop to pause")
    assert state["stop_reason"] == "stop_hook"
    assert not (ws.root / "side_effects.log").exists()  # paused before its step


def test_a_loop_whose_process_dies_before_its_first_step_is_not_running_and_resumes_once(
        ws: Workspace, held: Held) -> None:
    ws.task(shell_task(1))
    env, held_at, _let_go = held
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bg", "--detach", env=env)
    assert r.returncode == 0, r.stderr
    pid = int(ws.wait_for(lambda: held_at.exists() and held_at.read_text(), what="the loop's process"))
    os.kill(pid, signal.SIGKILL)
    row = ws.wait_for(lambda: (s := status_json(ws, "bg"))["alive"] is False and s, what="the lock to be let go")
    assert row["status"] != "running", row
    r = ws.kiro("loop", "status")
    assert "running" not in r.stdout, r.stdout
    r = ws.kiro("loop", "resume", "--task-id", "bg")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "side_effects.log").read_text().split() == ["1"]  # the step ran once
    assert ws.state("bg")["status"] == "completed"


def test_a_resume_detached_dies_at_its_start_and_the_loop_stays_resumable(ws: Workspace, held: Held) -> None:
    ws.task(shell_task(2))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bg",
                   "--max-iterations", "1").returncode == 4
    env, held_at, _let_go = held
    r = ws.kiro("loop", "resume", "--task-id", "bg", "--max-iterations", "10", "--detach", env=env)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "bg", r.stderr
    os.kill(int(ws.wait_for(lambda: held_at.exists() and held_at.read_text(), what="the loop's process")),
            signal.SIGKILL)
    ws.wait_for(lambda: status_json(ws, "bg")["alive"] is False, what="the lock to be let go")
    assert ws.kiro("loop", "resume", "--task-id", "bg").returncode == 0
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2"]  # step 1 once, step 2 once
    assert ws.state("bg")["max_iterations"] == 10  # what the detached resume set was saved before it returned


def test_what_refuses_the_loop_is_said_by_the_command_itself(ws: Workspace) -> None:
    """A bad config, a task with nothing to run: one line, exit 1, no loop made, no Logs/<id>.out."""
    ws.task(shell_task(1))
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  max_iterations: many\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bg", "--detach")
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "max_iterations" in r.stderr, r.stderr
    assert not (ws.root / "Logs" / "bg.out").exists() and not (ws.root / ".state" / "autonomous_loop_bg.json").exists()


def test_a_held_lock_that_is_not_the_loops_is_refused_in_one_line(ws: Workspace) -> None:
    """`--held-lock` is how `--detach` hands a loop's lock over; given by hand, a descriptor that holds no lock of
    that loop is one clear line, exit 1, and the loop is left as it was."""
    ws.task(shell_task(2))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "fg",
                   "--max-iterations", "1").returncode == 4
    before = (ws.root / ".state" / "autonomous_loop_fg.json").read_bytes()
    for cmd in (("loop", "start", "--task-id", "fg"), ("loop", "resume", "--task-id", "fg")):
        r = ws.kiro(*cmd, "--held-lock", "0")
        assert r.returncode == 1 and r.stdout == "", (cmd, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "--held-lock 0" in r.stderr, (cmd, r.stderr)
    assert (ws.root / ".state" / "autonomous_loop_fg.json").read_bytes() == before
    assert (ws.root / "side_effects.log").read_text().split() == ["1"]  # no step ran


PROBE = """\
import runpy, sys
from kiro.processes import sandbox
boxes = []
box_for = sandbox.box_for
def counted(*args, **kwargs):
    boxes.append(1)  # the box of a loop's steps worked out (kiro.executors.shell.loop_box)
    return box_for(*args, **kwargs)
sandbox.box_for = counted
sys.argv = ["kiro", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("kiro", run_name="__main__")
except SystemExit as e:
    code = e.code
sys.stdout.flush()
sys.stderr.write("\\n@@" + " ".join([str(code), str(len(boxes)), *sorted(sys.modules)]) + "\\n")
"""
"""A cold `kiro ARGS` (not the tests' fork server, which holds every module already) that says last on stderr,
after "@@", its exit code, how many boxes it worked out, and the modules it imported."""

RUNS_THE_LOOP = ("kiro.core.engine", "kiro.core.features", "kiro.core.listeners", "kiro.core.precheck",
                 "kiro.core.scheduled", "kiro.core.parallel", "kiro.core.review", "kiro.core.evidence",
                 "kiro.core.guardrails", "kiro.core.supervisor", "kiro.executors.verify", "kiro.serve",
                 "kiro.temporal", "openai", "watchfiles")
"""What only a running loop needs: its own process imports them, not the `--detach` command that prepares it."""
GIT_AND_EVENTS = ("kiro.git", "kiro.store.events")


def detach_probed(ws: Workspace, task: str, tid: str) -> tuple[subprocess.CompletedProcess[str], str, list[str]]:
    """A cold `kiro loop start --detach` (`PROBE`): its run, the boxes it worked out and the modules it imported
    (its loop's process not counted); waits for the loop to complete."""
    r = subprocess.run([sys.executable, "-c", PROBE, "loop", "start", "--detach", "--task", task, "--task-id", tid],
                       cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=300)
    code, boxes, *modules = r.stderr.rsplit("@@", 1)[1].split()
    assert code == "0" and r.stdout.strip().splitlines()[-1] == tid, r.stdout + r.stderr
    ws.wait_for(lambda: ws.state(tid)["status"] == "completed", what=f"loop {tid} to complete")
    return r, boxes, modules


def test_the_detach_command_imports_nothing_only_the_running_loop_needs(ws: Workspace) -> None:
    """Issue #41: `start --detach` returns once its loop is prepared (config, state, lock) and handed over; the
    engine, its features and listeners, git, the event models, the server are imported by the loop's own
    process, which runs it. (The first start in a workspace also keeps kiro's folders out of git,
    kiro.git.ignore: here a loop ran before.)"""
    ws.task(shell_task(1))
    ws.task(shell_task(1, title="Other task"), "Specs/other/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md").returncode == 0
    _r, _boxes, modules = detach_probed(ws, "Specs/other/tasks.md", "bg")
    ran = [m for m in modules if m.startswith(RUNS_THE_LOOP + GIT_AND_EVENTS)]
    print(f"--detach: {len([m for m in modules if m.startswith('kiro')])} kiro modules imported, of the running "
          f"loop's, git's or the events': {ran or 'none'}")
    assert ran == []
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "1"]  # each loop ran its step


def test_a_start_in_no_git_work_tree_imports_no_checkpoints_and_makes_no_kind_it_does_not_emit(ws: Workspace) -> None:
    """Issue #41: a loop of passing shell steps in a project that is no git work tree runs without
    kiro.git.checkpoints, kiro.git.stepbranches and the steps side by side (kiro.core.sidebyside), and makes
    no event kind of a family (the failure, recovery and person kinds its listeners ask about by tag)."""
    ws.task(shell_task(2))
    r = subprocess.run([sys.executable, "-c", PROBE, "loop", "start", "--task", "Specs/feature/tasks.md"],
                       cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=300)
    code, _boxes, *modules = r.stderr.rsplit("@@", 1)[1].split()
    assert code == "0", r.stdout + r.stderr
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2"]  # both steps ran
    assert "kiro.core.engine" in modules and "kiro.store.events" in modules  # the loop ran in this process
    unneeded = [m for m in modules if m in ("kiro.git.checkpoints", "kiro.git.stepbranches", "kiro.core.sidebyside")
                or m.startswith("kiro.store.events.")]
    assert unneeded == []


def test_a_plain_loop_imports_no_schedule_or_pre_check_code(ws: Workspace) -> None:
    """Issue #41: a loop of a task without `schedule:` or `stateful:` runs without kiro.core.schedule,
    kiro.core.scheduled and kiro.core.precheck (a scheduled task's and the pre-check gate's code, ~15 M
    instructions of a start)."""
    ws.task(shell_task(1))
    r = subprocess.run([sys.executable, "-c", PROBE, "loop", "start", "--task", "Specs/feature/tasks.md"],
                       cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=300)
    code, _boxes, *modules = r.stderr.rsplit("@@", 1)[1].split()
    assert code == "0", r.stdout + r.stderr
    assert "kiro.core.features" in modules  # the loop ran in this process, with its features
    assert [m for m in modules if m in ("kiro.core.schedule", "kiro.core.scheduled", "kiro.core.precheck")] == []


def test_a_first_detach_in_a_git_work_tree_keeps_kiro_out_of_git_without_the_event_models_or_the_box(
        ws: Workspace) -> None:
    """Issue #41: the first start in a workspace keeps kiro's folders out of git (kiro.git.ignore, the command's
    own job, said on its stderr) without importing the event models (kiro.git.checkpoints makes its events where
    git acts), and the line naming the box the steps run in is worked out by the loop's own process, which
    shows it in Logs/<id>.out, not by the command, which never showed it."""
    from tests.gitutil import init_repo

    init_repo(ws.root)
    ws.task(shell_task(1))
    r, boxes, modules = detach_probed(ws, "Specs/feature/tasks.md", "first")
    kept_out = "kept kiro's own folders out of git commits" in r.stderr
    exclude = (ws.root / ".git" / "info" / "exclude").read_text()
    shown = (ws.root / "Logs" / "first.out").read_text().splitlines()
    said = [line for line in [*shown, *r.stderr.splitlines()]  # the box; or, where bwrap is missing, the warning
            if line.startswith("sandbox: bwrap (") or "steps run unconfined" in line]
    events = [m for m in modules if m == "kiro.store.events"]
    print(f"first --detach in a git work tree: kept out of git {kept_out} ({'/.state/' in exclude} in "
          f".git/info/exclude); event models imported: {events or 'none'}; boxes worked out by the command: "
          f"{boxes}; the loop's own output names its box: {said or 'no'}")
    assert kept_out and "/.state/" in exclude and "kiro.git.ignore" in modules
    assert events == [] and boxes == "0"
    assert said  # the box (or why there is none) is said where the loop runs
    assert (ws.root / "side_effects.log").read_text().split() == ["1"]
