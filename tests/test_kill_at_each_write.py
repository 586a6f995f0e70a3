"""A completed step is in its loop's log exactly once, whatever instant kiro is killed at (SPEC §4 with P-1).

Not random instants (tests/crashgit.py): strace kills kiro at each call, in turn, of the system calls that
write what a loop keeps (`-e inject=SYSCALL:signal=KILL:when=N`: SIGKILL on entering the Nth call, which is not
made), N = 1, 2, ... until a run ends unkilled. One loop writes on its own thread (kiro.fs.writer runs a lone
loop's writes at once), so the Nth call is the Nth of the run. Each killed run is resumed to its end; then:

- the state parses, both after the kill and at the end, and records each step completed once, with its
  receipt (kiro.core.evidence);
- the log holds exactly one completion record (`step_completed` or `step_recovered`) a step, and no
  `step_started` of a step after it (the log begins with an earlier loop's on the same task id, whose steps
  completed at the same iterations: they are not this loop's);
- a step whose box was checked when kiro was killed never ran again (each step appends its id to a side log
  beside the workspace);
- every box of the task file is checked.

A kill between a step's `step_completed` line and the state record that follows it (the box's fdatasync, the
journal's append) once left the log saying the step completed, and the resume then recovered it: a second
completion record (session 29's `test_sigkill_around_auto_merges_finishes_each_merge_once`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from kiro import timeutil
from kiro.store import journal, tasks
from tests.conftest import Workspace, new_workspace, shell_task

STEPS = 2
TASK = "Specs/feature/tasks.md"
# write: every log line, journal record and file written whole (36 calls); fdatasync: the journal's records (6).
# The renames (the state's snapshots at the start and the end, the reports) are left to the random kills
# (tests/test_properties.py): each kill here costs a cold kiro under strace and its resume, ~2 s of CPU
SYSCALLS = ("fdatasync", "write")


def _strace_works() -> str | None:
    """Why strace cannot kill a traced kiro here, or None."""
    if shutil.which("strace") is None:
        return "strace is not installed (.ci/run installs it)"
    probe = subprocess.run(["strace", "-o", "/dev/null", "-e", "trace=none", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace refused?): {probe.stderr.strip()[:200]}"
    return None


def _template(base: Path) -> None:
    """The workspace each kill starts from. `sandbox: off`: what is killed is kiro's own writes, the same in
    and out of the box, and a run without it costs a quarter less (each kill is a cold kiro under strace)."""
    ws = new_workspace(base / "vault")
    (base / "side").mkdir()
    cfg = ws.root / "config/autonomous_loop.yaml"
    cfg.write_text(cfg.read_text() + "sandbox: off\n")
    ws.task(shell_task(STEPS, cmd='echo "$KIRO_STEP_ID" >> "$CRASH_SIDE_LOG"'))
    (ws.root / "Logs/c.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EARLIER))


# The log of an earlier loop on the same task id, an hour ago: its steps completed at the iterations this one's
# will (a resume must not take them for the records of this loop's attempts)
_AGO = timeutil.iso(timeutil.now() - timedelta(hours=1))
EARLIER = [
    {"ts": _AGO, "task_id": "c", "iteration": 0, "event": "loop_started", "task_path": TASK, "executor": "shell",
     "max_iterations": 100},
    *({"ts": _AGO, "task_id": "c", "iteration": i, "event": kind, "step_id": str(i)}
      for i in range(1, STEPS + 1) for kind in ("iteration_started", "step_started", "step_completed")),
    {"ts": _AGO, "task_id": "c", "iteration": STEPS, "event": "loop_finished", "status": "completed",
     "reason": "all_steps_done", "exit_code": 0, "message": "done", "iterations": STEPS},
]


def _side(base: Path) -> Counter[str]:
    path = base / "side" / "side.log"
    return Counter(path.read_text().split()) if path.exists() else Counter()


def _state_path(root: Path) -> Path | None:
    for p in (root / ".state/autonomous_loop_c.json", root / ".state/archive/autonomous_loop_c.json"):
        if p.exists():
            return p
    return None


def _task_file(root: Path) -> Path:
    done = root / "Done/feature/tasks.md"
    return done if done.exists() else root / TASK


def _one_kill(template: Path, base: Path, syscall: str, n: int) -> list[str] | None:
    """Run the loop in a copy of the template, killed at the `n`th `syscall`, then resume it to its end: what
    went wrong, or None when the run completed first (there is no `n`th call)."""
    shutil.copytree(template, base)
    root = base / "vault"
    ws = Workspace(root)
    env = ws.env(CRASH_SIDE_LOG=str(base / "side" / "side.log"))
    killed = subprocess.run(
        ["strace", "-o", "/dev/null", "-e", f"trace={syscall}", "-e", f"inject={syscall}:signal=KILL:when={n}",
         sys.executable, "-m", "kiro", "loop", "start", "--task", TASK, "--task-id", "c", "--quiet"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    where = f"{syscall} #{n}"
    if killed.returncode == 0:
        return None
    if killed.returncode != -9:
        return [f"{where}: the traced run ended with {killed.returncode}: {killed.stderr[-800:]}"]
    problems = []
    path = _state_path(root)
    if path is not None:
        try:
            journal.read_state_dict(path)
        except Exception as exc:  # the check: a state left by any kill parses
            problems.append(f"{where}: the state does not parse after the kill: {exc}")
    checked_at_kill = {st.id for st in tasks.load(_task_file(root)).steps if st.done}
    ran_at_kill = _side(base)
    # killed before its first state was written, the loop does not exist: it is started again
    again = ("resume", "--task-id", "c") if path is not None else ("start", "--task", TASK, "--task-id", "c")
    resumed = ws.kiro("loop", *again, "--quiet", env=env, timeout=300)
    if resumed.returncode != 0:
        return [*problems, f"{where}: the resume ended with {resumed.returncode}: "
                                 f"{(resumed.stdout + resumed.stderr)[-800:]}"]
    kinds = [(e["event"], e.get("step_id")) for e in ws.events("c")[len(EARLIER):]]  # this loop's
    for i in range(1, STEPS + 1):
        sid = str(i)
        done = [k for k, (kind, step) in enumerate(kinds)
                if step == sid and kind in ("step_completed", "step_recovered")]
        if len(done) != 1:
            problems.append(f"{where}: step {sid} has {len(done)} completion records: "
                            f"{[kind for kind, step in kinds if step == sid]}")
        elif ("step_started", sid) in kinds[done[0]:]:
            problems.append(f"{where}: step {sid} started again after its completion record")
        if sid in checked_at_kill and _side(base)[sid] != ran_at_kill[sid]:
            problems.append(f"{where}: step {sid}, checked when kiro was killed, ran again")
    path = _state_path(root)
    state = journal.read_state_dict(path) if path is not None else {}
    recorded = [c["step_id"] for c in state.get("completed_steps", [])]
    if state.get("status") != "completed" or sorted(recorded) != [str(i) for i in range(1, STEPS + 1)]:
        problems.append(f"{where}: the state ends {state.get('status')} with steps {recorded} recorded completed")
    unreceipted = [c["step_id"] for c in state.get("completed_steps", []) if not c.get("receipt")]
    if unreceipted:
        problems.append(f"{where}: steps recorded completed without a receipt: {unreceipted}")
    left = [st.id for st in tasks.load(_task_file(root)).steps if not st.done]
    if left:
        problems.append(f"{where}: boxes left open: {left}")
    return problems


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("syscall", SYSCALLS)
def test_a_kill_at_each_write_leaves_each_step_completed_once(syscall: str, tmp_path: Path) -> None:
    why = _strace_works()
    if why is not None:
        pytest.skip(why)
    template = tmp_path / "template"
    _template(template)
    problems: list[str] = []
    kills = 0
    held = 0
    for n in range(1, 400):
        found = _one_kill(template, tmp_path / f"kill{n}", syscall, n)
        if found is None:
            break
        kills += 1
        held += not found
        problems += found
        if any("ended with" in p for p in found):
            break  # a run that fails without a kill fails them all
        shutil.rmtree(tmp_path / f"kill{n}", ignore_errors=True)
    print(f"kiro killed at each of the {kills} {syscall} calls of a {STEPS}-step run, each resumed to its end: "
          f"{held} held")
    assert kills >= 2, f"no {syscall} call to kill kiro at"
    assert problems == [], "\n".join(problems)
