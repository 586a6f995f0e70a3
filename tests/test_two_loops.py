"""Several loops side by side in one workspace (issue "What a new user hit", item 1).

An agent CLI's attempt is followed by a check of kiro's control files (kiro.executors.control). It took
another loop's writes for the agent's: a shell loop that finished while the agent ran had its archived
state "restored" away (gone from `status`), `.state/.starts` was written back, and the agent's good
attempt was failed, its box unchecked and its paid work done again. Here agent-CLI loops (a scripted
`executor_command` agent) and shell loops run together, under one `kiro loop watch` and as
`start --detach`, one of them killed (SIGKILL) and resumed; at the end every loop's state, report and
boxes are there, no attempt was blamed for another loop's writes, and no step ran twice.

Each step appends its id to `work/<task_id>.log` (the step's side effect): one line per run.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from kiro.executors.control import ControlSnapshot
from kiro.fs import locks
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import FAST_CONFIG, Workspace, shell_task
from tests.test_command_executor import PRELUDE, agent_task

BLAME = "the agent changed kiro's files"

AGENT = PRELUDE + '''\
WORK = pathlib.Path(sys.argv[2])
TID = os.environ["KIRO_TASK_ID"]
with open(WORK / f"{TID}.log", "a") as fh:
    fh.write(f"{STEP}\\n")
hold = WORK / f"hold_{TID}_{STEP}"  # the test holds this step until the file is gone (or 20 s pass)
deadline = time.time() + 20
while hold.exists() and time.time() < deadline:
    time.sleep(0.02)
time.sleep(float(sys.argv[3]))  # the agent's work
check_box()
'''


def setup(ws: Workspace, agent_seconds: float = 0.3) -> Path:
    """The agent script and a config that runs it for `executor: command` tasks; returns the work folder."""
    work = ws.root.parent / "work"
    work.mkdir(exist_ok=True)
    out = ws.root.parent / "agent_out"
    out.mkdir(exist_ok=True)
    script = ws.root.parent / "agent.py"
    script.write_text(AGENT)
    cmd = " ".join(shlex.quote(a) for a in (sys.executable, str(script), str(out), str(work), str(agent_seconds)))
    # the steps note what they did beside the workspace: the config grants their box those two folders
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"executor_command: {json.dumps(cmd)}\n"
             f"sandbox_paths: {{rw: [{json.dumps(str(work))}, {json.dumps(str(out))}]}}\n")
    return work


def add_loops(ws: Workspace, work: Path, agents: int, shells: int, steps: int) -> list[str]:
    """Task files Specs/<name>/tasks.md; returns the names (agent1.., shell1..), used as task ids."""
    names = [f"agent{i}" for i in range(1, agents + 1)] + [f"shell{i}" for i in range(1, shells + 1)]
    for name in names:
        if name.startswith("agent"):
            ws.task(agent_task(steps), f"Specs/{name}/tasks.md")
        else:
            w = shlex.quote(str(work))
            cmd = (f'echo "$KIRO_STEP_ID" >> {w}/"$KIRO_TASK_ID.log"; '
                   f'while [ -e {w}/"hold_${{KIRO_TASK_ID}}_$KIRO_STEP_ID" ]; do sleep 0.02; done; sleep 0.2')
            ws.task(shell_task(steps, cmd=cmd), f"Specs/{name}/tasks.md")
    return names


def side_effects(work: Path, tid: str) -> list[str]:
    p = work / f"{tid}.log"
    return p.read_text().split() if p.exists() else []


def archived(ws: Workspace, tid: str) -> bool:
    return (ws.root / f".state/archive/autonomous_loop_{tid}.json").exists()


def archived_ids(ws: Workspace) -> dict[str, str]:
    """Task folder name -> task id, of the archived loops (`kiro loop watch` names its loops itself)."""
    found = {}
    for p in (ws.root / ".state/archive").glob("autonomous_loop_*.json"):
        found[json.loads(p.read_text())["task_path"].split("/")[1]] = p.name[len("autonomous_loop_"):-len(".json")]
    return found


def kiro_files_unknown_to_the_check(ws: Workspace) -> list[str]:
    """Files in .state/ that the check would take for strays (a name kiro never writes): kiro's own
    must all be known, or a loop's write is one day removed as the agent's."""
    snap = ControlSnapshot(KiroWorkspace(ws.root), "nobody", ws.root / "none.md")
    state_dir = ws.root / ".state"
    inside = [p for p in snap._walk() if p.startswith(f"{state_dir}{os.sep}")]
    return sorted(str(Path(p).relative_to(state_dir)) for p in inside if snap.owner(p) is None)


class Checks:
    """The end-of-run checks, counted for the printed summary."""

    def __init__(self, ws: Workspace, work: Path) -> None:
        self.ws, self.work, self.count = ws, work, 0

    def ok(self, cond: bool, what: str) -> None:
        self.count += 1
        assert cond, what

    def loop(self, tid: str, steps: int, *, name: str = "", killed_in: str | None = None) -> None:
        """`killed_in`: the step that was running when the loop was killed, which may run again once
        (kiro cannot know whether a killed attempt finished); every other step ran exactly once."""
        ws = self.ws
        self.ok(archived(ws, tid), f"{tid}: archived state")
        st = ws.state(tid)
        self.ok(st["status"] == "completed", f"{tid}: {st['status']} {st.get('failed_steps')}")
        done = [c["step_id"] for c in st["completed_steps"]]
        self.ok(sorted(done, key=int) == [str(i) for i in range(1, steps + 1)], f"{tid}: completed {done}")
        errors = [f.get("error") or "" for f in st.get("failed_steps", [])]
        self.ok(not any(BLAME in e for e in errors), f"{tid}: blamed: {errors}")
        if killed_in is None:  # (a killed attempt may be recorded as failed)
            self.ok(st["total_failures"] == 0, f"{tid}: failures {errors}")
        self.ok((ws.root / f"Logs/completion_reports/{tid}.md").is_file(), f"{tid}: report")
        text = (ws.root / f"Done/{name or tid}/tasks.md").read_text()
        self.ok(text.count("- [x]") == steps, f"{tid}: boxes\n{text}")
        ran = side_effects(self.work, tid)
        twice = sorted({s for s in ran if ran.count(s) > 1})
        self.ok(sorted(set(ran), key=int) == [str(i) for i in range(1, steps + 1)], f"{tid}: ran {ran}")
        self.ok(twice in ([], [killed_in]) and len(ran) <= steps + 1, f"{tid}: ran twice {twice} ({ran})")

    def workspace(self, tids: list[str]) -> None:
        ws = self.ws
        logs = [p for p in (ws.root / "Logs").rglob("*") if p.is_file() and not p.name.endswith(".kiro.tmp")]
        blamed = [str(p) for p in logs if BLAME in p.read_text(errors="replace")]
        self.ok(not blamed, f"an attempt was blamed for another loop's writes: {blamed}")
        r = ws.run("loop", "status", "--json")
        self.ok(r.returncode == 0, r.stdout + r.stderr)
        listed = {s["task_id"] for s in json.loads(r.stdout)}
        for tid in tids:
            one = ws.run("loop", "status", "--task-id", tid)
            self.ok(one.returncode == 0 and "no loop with task id" not in one.stdout + one.stderr,
                    f"status {tid}: {one.stdout}{one.stderr}")
        self.ok(set(tids) <= listed, f"status --json lists {sorted(listed)}")
        unknown = kiro_files_unknown_to_the_check(ws)
        self.ok(not unknown, f"kiro's files the check does not know as kiro's: {unknown}")


def test_a_loop_that_finishes_while_an_agent_runs_keeps_its_archive_and_the_agent_its_attempt(
        ws: Workspace) -> None:
    """The issue's case, made certain: the agent's step 1 runs until a whole shell loop has started,
    run and been archived (in another process). Before the fix the check after the attempt removed
    the shell loop's archive, wrote `.state/.starts` back and failed the attempt; step 1 ran twice."""
    work = setup(ws, agent_seconds=0)
    add_loops(ws, work, agents=1, shells=1, steps=2)
    (work / "hold_agent1_1").touch()
    r = ws.kiro("loop", "start", "--task", "Specs/agent1/tasks.md", "--task-id", "agent1", "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    ws.wait_for(lambda: side_effects(work, "agent1"), what="the agent's step 1 running")
    r = ws.kiro("loop", "start", "--task", "Specs/shell1/tasks.md", "--task-id", "shell1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert archived(ws, "shell1")
    (work / "hold_agent1_1").unlink()
    ws.wait_for(lambda: archived(ws, "agent1"), what="the agent's loop done", timeout=60)
    checks = Checks(ws, work)
    for tid in ("agent1", "shell1"):
        checks.loop(tid, 2)
    checks.workspace(["agent1", "shell1"])
    log = (ws.root / "Logs/agent1/1-1.log").read_text()
    assert "# unchecked:" in log and ".state/archive/autonomous_loop_shell1.json" in log  # warned, not undone


def test_other_loops_files_are_never_undone_and_this_loops_still_are(ws: Workspace) -> None:
    """The check itself: between the snapshot and the check, another loop (task id "a.b", a prefix
    of which is this loop's id "a") saves, backs up, archives and writes its transcript, a loop
    starts (`.starts`), a disk reserve comes; and the agent changes this loop's state, backup and
    config, and drops a stray file in .state/. Only the agent's are named and put back."""
    task = ws.task(agent_task(1), "Specs/a/tasks.md")
    state = ws.root / ".state"
    other = {
        "autonomous_loop_a.b.json": "{}", "autonomous_loop_a.b.summary": "s", "autonomous_loop_a.b.journal": "j",
        "backups/autonomous_loop_a.b.20260101T000000000000.i000001.json": "{}", "transcripts/a.b.jsonl": "t\n",
        "precheck/a.b.json": "{}", ".starts": ".",
    }
    mine = {"autonomous_loop_a.json": '{"x": 1}', "backups/autonomous_loop_a.20260101T000000000000.i000001.json": "{}"}
    for rel, text in {**other, **mine}.items():
        ws.write(f".state/{rel}", text)
    kws = KiroWorkspace(ws.root)
    snap = ControlSnapshot.take(kws, "a", task)
    # the other loops, meanwhile
    (state / "autonomous_loop_a.b.json").unlink()  # archived: its state goes, its archive comes
    (state / "autonomous_loop_a.b.summary").unlink()
    ws.write(".state/archive/autonomous_loop_a.b.json", '{"done": true}')
    ws.write(".state/archive/autonomous_loop_a.b.summary", "s2")
    ws.write(".state/backups/autonomous_loop_a.b.20260101T000000000001.i000002.json", "{}")
    (state / "backups/autonomous_loop_a.b.20260101T000000000000.i000001.json").unlink()  # pruned
    ws.write(".state/transcripts/a.b.jsonl", "t\nt\n")
    ws.write(".state/.starts", "..")
    ws.write(".state/.kiro-reserve-123", "")
    ws.write(".state/autonomous_loop_c.journal", "j")  # a loop starting
    # the agent
    ws.write(".state/autonomous_loop_a.json", '{"x": 2}')
    ws.write(".state/backups/autonomous_loop_a.20260101T000000000000.i000001.json", '{"x": 3}')
    ws.write(".state/injected.json", "{}")
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  max_iterations: 999999\n")
    touched = snap.restore()
    assert sorted(touched) == sorted([
        ".state/autonomous_loop_a.json (changed; restored)",
        ".state/backups/autonomous_loop_a.20260101T000000000000.i000001.json (changed; restored)",
        ".state/injected.json (created; removed)", "config/autonomous_loop.yaml (changed; restored)"]), touched
    assert (state / "autonomous_loop_a.json").read_text() == '{"x": 1}'
    assert not (state / "injected.json").exists()
    assert (state / "archive/autonomous_loop_a.b.json").read_text() == '{"done": true}'
    assert (state / "archive/autonomous_loop_a.b.summary").read_text() == "s2"
    assert not (state / "autonomous_loop_a.b.json").exists()
    assert not (state / "backups/autonomous_loop_a.b.20260101T000000000000.i000001.json").exists()
    assert (state / "backups/autonomous_loop_a.b.20260101T000000000001.i000002.json").exists()
    assert (state / "transcripts/a.b.jsonl").read_text() == "t\nt\n"
    assert (state / ".starts").read_text() == ".."
    assert (state / ".kiro-reserve-123").exists() and (state / "autonomous_loop_c.journal").exists()
    assert len(snap.unchecked) == 10, snap.unchecked


def test_in_one_process_a_change_written_over_in_another_loops_state_is_that_loops_to_name(
        ws: Workspace) -> None:
    """Under `kiro loop watch` loops share a process, and kiro's note of an agent's change that the
    timer's snapshot wrote over (kiro.store.journal.take_overwritten). Loop a's check took loop b's note:
    a's attempt was failed for b's agent's change, and b's check no longer saw it."""
    from kiro.status import Status
    from kiro.store.state import LoopState

    kws = KiroWorkspace(ws.root)
    store = StateStore(kws)
    task_files = {}
    for tid in ("a", "b"):
        task_files[tid] = ws.task(agent_task(1), f"Specs/{tid}/tasks.md")
        loop = LoopState(task_id=tid, task_path=f"Specs/{tid}/tasks.md", status=Status.RUNNING)
        store.open_journal(loop)
        store.save(loop)
    snaps = {tid: ControlSnapshot.take(kws, tid, task_files[tid]) for tid in ("a", "b")}
    path = ws.root / ".state/autonomous_loop_b.json"
    path.write_text(path.read_text().replace('"consecutive_failures": 0', '"consecutive_failures": 9'))  # b's agent
    store.journals["b"].flush()  # b's timer's snapshot, over it
    assert snaps["a"].restore() == []
    assert snaps["b"].restore() == [".state/autonomous_loop_b.json (changed; restored)"]
    for tid in ("a", "b"):
        store.close_journal(tid)


def _wait_all(ws: Workspace, tids: list[str], timeout: float = 60) -> None:
    for tid in tids:
        ws.wait_for(lambda tid=tid: archived(ws, tid), what=f"{tid} archived", timeout=timeout)
        lock = ws.root / f".state/autonomous_loop_{tid}.lock"  # its process ended too (its digest is written last)
        ws.wait_for(lambda lock=lock: not locks.is_held(lock), what=f"{tid}'s process ended", timeout=timeout)


def test_loops_side_by_side_under_watch_and_detached_with_a_kill_lose_nothing(ws: Workspace) -> None:
    """The suite: agent-CLI and shell loops together, first under one `kiro loop watch` (killed with its
    loops at a random moment and started again), then as `start --detach` (one loop killed at a random
    step and resumed). `KIRO_TWO_LOOPS_SEED` replays a run."""
    seed = int(os.environ.get("KIRO_TWO_LOOPS_SEED", random.randrange(1 << 16)))
    rng = random.Random(seed)
    steps = 3
    work = setup(ws)
    checks = Checks(ws, work)
    ran: list[str] = []

    # 1. under one watcher: 2 agent loops, 2 shell loops, all at once; the watcher is killed (SIGKILL, its
    # loops with it) at a random moment and a new one continues them
    watched = add_loops(ws, work, agents=2, shells=2, steps=steps)
    runs_before_kill = rng.randrange(2, 4 * steps - 2)
    watch = ws.spawn("loop", "watch", "--max-parallel", "4")
    try:
        ws.wait_for(lambda: sum(len(side_effects(work, p.stem)) for p in work.glob("*.log")) >= runs_before_kill,
                    what=f"{runs_before_kill} steps begun under watch", timeout=60)
        watch.kill()
        watch.wait(timeout=30)
        in_flight = {p.stem: side_effects(work, p.stem)[-1] for p in work.glob("*.log")}
        watch = ws.spawn("loop", "watch", "--max-parallel", "4")
        ids = ws.wait_for(lambda: (found := archived_ids(ws)).keys() == set(watched) and found,
                          what="every watched loop archived", timeout=60)
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(timeout=30)
    for name in watched:
        checks.loop(ids[name], steps, name=name, killed_in=in_flight.get(ids[name]))
    ran.append(f"watch: {', '.join(watched)} ({steps} steps each); the watcher killed after {runs_before_kill} "
               f"step runs, a new one continued")

    # 2. detached, each its own process: 2 agent loops, 2 shell loops; one is killed and resumed
    for name in watched:  # the same names again, as new task files (the first ones are in Done/)
        ws.task((ws.root / f"Done/{name}/tasks.md").read_text().replace("[x]", "[ ]"), f"Specs/{name}_d/tasks.md")
    detached = [f"{name}_d" for name in watched]
    victim, at = rng.choice(detached), rng.randrange(1, steps + 1)  # killed in step `at`, held there till then
    holds = [work / f"hold_{tid}_1" for tid in detached] + [work / f"hold_{victim}_{at}"]
    for hold in holds:  # every loop waits in its step 1 until all have started: each attempt spans the others'
        hold.touch()
    for tid in detached:
        r = ws.kiro("loop", "start", "--task", f"Specs/{tid}/tasks.md", "--task-id", tid, "--detach")
        assert r.returncode == 0, r.stdout + r.stderr
    ws.wait_for(lambda: all(side_effects(work, tid) for tid in detached), what="every loop in its step 1")
    for hold in set(holds) - {holds[-1]}:
        hold.unlink()
    ws.wait_for(lambda: len(side_effects(work, victim)) == at, what=f"{victim} in step {at}", timeout=60)
    lock = ws.root / f".state/autonomous_loop_{victim}.lock"
    pid = StateStore(KiroWorkspace(ws.root)).holder_pid(victim)
    assert pid is not None and locks.is_held(lock), (victim, pid)
    os.kill(pid, signal.SIGKILL)
    ws.wait_for(lambda: not locks.is_held(lock), what=f"{victim}'s lock let go")
    (work / f"hold_{victim}_{at}").unlink()  # the killed step's process, left behind, may now finish too
    r = ws.kiro("loop", "resume", "--task-id", victim, "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    _wait_all(ws, detached)
    for tid in detached:
        checks.loop(tid, steps, killed_in=str(at) if tid == victim else None)
    ran.append(f"detached: {', '.join(detached)}; killed {victim} (pid {pid}) in step {at}, resumed")
    checks.workspace([ids[name] for name in watched] + detached)
    others = subprocess.run(["pgrep", "-f", str(ws.root.parent / "agent.py")], capture_output=True, text=True)
    assert not others.stdout.strip(), f"agent processes left: {others.stdout}"
    print(f"\ntwo loops (seed {seed}): {len(watched) + len(detached)} loops, 2 kills, {checks.count} checks held: "
          f"no state, archive or report lost, no attempt blamed for another loop's writes, no step run twice "
          f"(but a step a kill cut short, at most once more)")
    for line in ran:
        print(f"  {line}")
    tids = [ids[name] for name in watched] + detached
    print(textwrap.indent(f"side effects: {sum(len(side_effects(work, t)) for t in tids)} step runs "
                          f"for {len(tids) * steps} steps", "  "))
