"""Crash safety under SIGKILL: kill `kiro` at random moments, many times, and count what broke.

    python bench/crash_kills.py [--kills 1000] [--seed 20261122] [--steps 60]

Each round starts (or resumes) a loop on a task of shell steps whose command appends its step id
to side_effects.log, then SIGKILLs the process at a random moment: during start-up, or at a random
point while it runs its steps. After each kill it reads the state as kiro does (the state file with its
journal replayed, kiro.store.journal) and records:

    unparsable states      the state file (or state file + journal) does not parse as a LoopState (must be 0)
    completed steps re-run a step the state recorded as completed ran again later (must be 0)
    boxes lost             a step the state recorded as completed whose box is not checked (must be 0)
    reserves left          disk-full reserve files (.state/.kiro-reserve-*) left once every task is
                           finished and one more loop has started and ended in each workspace: a
                           killed process's file is removed by the next start or resume there (must be
                           0; the files of processes killed after their loop completed, which no later
                           command had removed yet, are printed as "reserves of killed processes")

When a task completes, a new one starts, until the number of kills is reached; every task is then
finished with `resume` and checked whole. Prints the counts; asserts nothing (tests/test_properties.py
runs 50 kills of this same routine in CI and asserts the counts are zero).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiro.store import journal, tasks
from kiro.store.state import LoopState

CONFIG = """\
autonomous_loop:
  backup_state_every_n_iterations: 3
  backoff_base_seconds: 0.01
  max_iterations: 100000
"""


def shell_task(n: int, cmd: str) -> str:
    lines = ["---", "title: crash", "executor: shell", "---", "# Plan", ""]
    for i in range(1, n + 1):
        lines += [f"- [ ] {i}. Step number {i}", "  ```sh", f"  {cmd}", "  ```"]
    return "\n".join(lines) + "\n"


@dataclass
class Counts:
    kills: int = 0
    rounds: int = 0
    tasks: int = 0
    tasks_completed: int = 0
    unparsable_states: int = 0
    completed_steps_rerun: int = 0
    boxes_lost: int = 0
    steps_recorded: int = 0
    reserves_left: int = 0
    reserves_killed: int = 0
    kills_after_a_step: int = 0  # kills of a process that had run a step of its own by then
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"SIGKILLs: {self.kills}; rounds: {self.rounds}; tasks: {self.tasks} "
                f"({self.tasks_completed} completed); unparsable states: {self.unparsable_states}; "
                f"completed steps re-run: {self.completed_steps_rerun}; boxes lost: {self.boxes_lost}; "
                f"steps recorded completed: {self.steps_recorded}; reserves of killed processes: "
                f"{self.reserves_killed}, left after the next start: {self.reserves_left}; kills after the killed "
                f"process had run a step: {self.kills_after_a_step}")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_"))}
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["KIRO_RAISE_ERRORS"] = "1"
    return env


class _Task:
    def __init__(self, root: Path, tid: str, steps: int) -> None:
        self.root = root
        self.tid = tid
        self.steps = steps
        self.started = False
        self.frozen: dict[str, int] = {}  # step id -> side-effect count when first recorded completed
        self.done = False

    def side_effects(self) -> Counter[str]:
        p = self.root / "side_effects.log"
        return Counter(p.read_text().split()) if p.exists() else Counter()

    def state_file(self) -> Path | None:
        for p in (self.root / ".state" / f"autonomous_loop_{self.tid}.json",
                  self.root / ".state" / "archive" / f"autonomous_loop_{self.tid}.json"):
            if p.exists():
                return p
        return None

    def args(self) -> list[str]:
        if not self.started:
            return ["loop", "start", "--task", "Specs/crash/tasks.md", "--task-id", self.tid]
        return ["loop", "resume", "--task-id", self.tid]


def _new_task(base: Path, n: int, steps: int) -> _Task:
    root = base / f"ws{n:04d}"
    for name in ("Specs/crash", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "config/autonomous_loop.yaml").write_text(CONFIG)
    (root / "Specs/crash/tasks.md").write_text(
        shell_task(steps, 'echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.05'))
    return _Task(root, f"crash{n:04d}", steps)


def _check(task: _Task, counts: Counts) -> None:
    p = task.state_file()
    if p is None:
        return
    task.started = True
    try:
        LoopState.model_validate_json(p.read_bytes())  # the bare file alone parses (a snapshot)
        state = LoopState.model_validate(journal.read_state_dict(p))  # and with its journal: the last save
    except Exception as exc:  # noqa: BLE001 - counted, whatever it is
        counts.unparsable_states += 1
        counts.problems.append(f"{task.tid}: unparsable state: {type(exc).__name__}: {str(exc)[:120]}")
        return
    effects = task.side_effects()
    for c in state.completed_steps:
        if c.step_id not in task.frozen:
            task.frozen[c.step_id] = effects[c.step_id]
        elif effects[c.step_id] != task.frozen[c.step_id]:
            counts.completed_steps_rerun += 1
            counts.problems.append(f"{task.tid}: step {c.step_id} ran again after it was recorded completed")
            task.frozen[c.step_id] = effects[c.step_id]
    task_file = task.root / state.task_path
    if task_file.exists():
        checked = {s.id for s in tasks.load(task_file).steps if s.done}
        lost = {c.step_id for c in state.completed_steps} - checked
        if lost:
            counts.boxes_lost += len(lost)
            counts.problems.append(f"{task.tid}: recorded completed but unchecked: {sorted(lost)}")
    if state.status == "completed":
        task.done = True


def cold_kiro(args: list[str], cwd: Path, env: dict[str, str], out: int) -> Any:
    """`python -m kiro *args` in `cwd`, its stdout and stderr to the file descriptor `out`: a Popen."""
    return subprocess.Popen([sys.executable, "-m", "kiro", *args], cwd=cwd, env=env, stdout=out,
                            stderr=subprocess.STDOUT)


def crash_run(base: Path, kills: int, *, seed: int = 20261122, steps: int = 60,
              progress: bool = False, after_step: float = 0.0,
              kiro: Callable[[list[str], Path, dict[str, str], int], Any] = cold_kiro) -> Counts:
    """Kill kiro `kills` times at random moments across tasks of `steps` steps under `base`. With
    `after_step` (a probability), a round in the loop proper first waits until the process has run a step
    of its own: on a loaded machine a process's start-up outlasts the random moment, and without it no
    kill lands where steps complete (`kills after the killed process had run a step` says how many did).
    `kiro` starts each kiro process (a Popen or what behaves as one: pid, poll, wait, send_signal); the
    tests pass one forked from their fork server (tests/cli_forkserver.py), which skips the interpreter's
    start and imports (3-7 s a process on a loaded machine), and so also kills that land in them."""
    rng = random.Random(seed)
    counts = Counts()
    everything: list[_Task] = []
    task = _new_task(base, 0, steps)
    everything.append(task)
    while counts.kills < kills:
        if task.done:
            task = _new_task(base, len(everything), steps)
            everything.append(task)
        counts.rounds += 1
        ran_before = sum(task.side_effects().values())
        with open(task.root.parent / f"{task.tid}.out", "ab") as out:
            proc = kiro(task.args(), task.root, _env(), out.fileno())
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.4))  # somewhere in start-up
        else:  # somewhere in the loop proper: wait until this process runs, then a random moment
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                p = task.state_file()
                try:
                    if p is not None and json.loads(p.read_text()).get("pid") == proc.pid:
                        break
                except ValueError:
                    pass
                time.sleep(0.01)
            if after_step and rng.random() < after_step:
                while time.monotonic() < deadline + 60 and proc.poll() is None \
                        and sum(task.side_effects().values()) == ran_before:
                    time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            counts.kills += 1
            counts.kills_after_a_step += sum(task.side_effects().values()) > ran_before
        proc.wait(timeout=60)
        _check(task, counts)
        if progress and counts.kills and counts.kills % 50 == 0 and proc.returncode == -signal.SIGKILL:
            print(f"  ... {counts.line()}", flush=True)
    for t in everything:  # finish every task and check it whole
        if not t.done:
            code, said = _run(kiro, t.args(), t.root)
            if code != 0:
                counts.problems.append(f"{t.tid}: final resume exited {code}: {said[-300:]}")
            _check(t, counts)
        counts.tasks += 1
        counts.tasks_completed += t.done
        effects = t.side_effects()
        missing = {str(i) for i in range(1, t.steps + 1)} - set(effects)
        if t.done and missing:
            counts.problems.append(f"{t.tid}: completed but steps never ran: {sorted(missing)[:5]}")
        counts.steps_recorded += len(t.frozen)
        counts.reserves_killed += len(list((t.root / ".state").glob(".kiro-reserve-*")))
        (t.root / "Specs/after").mkdir(exist_ok=True)  # the next loop in the workspace: it removes them
        (t.root / "Specs/after/tasks.md").write_text(shell_task(1, "true"))
        code, said = _run(kiro, ["loop", "start", "--task", "Specs/after/tasks.md"], t.root)
        if code != 0:
            counts.problems.append(f"{t.tid}: the start after the run exited {code}: {said[-300:]}")
        left = sorted(p.name for p in (t.root / ".state").glob(".kiro-reserve-*"))
        if left:
            counts.reserves_left += len(left)
            counts.problems.append(f"{t.tid}: reserve files left after the next start: {left}")
    return counts


def _run(kiro: Callable[[list[str], Path, dict[str, str], int], Any], args: list[str], root: Path) -> tuple[int, str]:
    """Run kiro to its end (300 s at most): its exit code and what it printed."""
    out = root.parent / f"{root.name}.final.out"
    with open(out, "wb") as fh:
        proc = kiro(args, root, _env(), fh.fileno())
    try:
        code = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        raise
    return int(code), out.read_text(errors="replace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--after-step", type=float, default=0.5, metavar="P",
                    help="the share of rounds in the loop proper that wait for a step of the process first")
    args = ap.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kiro-crash-") as tmp:
        counts = crash_run(Path(tmp), args.kills, seed=args.seed, steps=args.steps, progress=True,
                           after_step=args.after_step)
    print(f"crash-safety run (seed {args.seed}, {args.steps}-step tasks, "
          f"{time.monotonic() - started:.0f} s): {counts.line()}")
    for problem in counts.problems[:20]:
        print(f"  problem: {problem}")


if __name__ == "__main__":
    main()
