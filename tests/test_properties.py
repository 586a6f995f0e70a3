"""Seed 004's correctness properties P-1..P-6, tested on real runs of `kiro` as a subprocess."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

from kiro import tasks
from kiro.state import LoopState
from tests.conftest import Workspace, shell_task


def _side_effects(ws: Workspace) -> Counter[str]:
    p = ws.root / "side_effects.log"
    return Counter(p.read_text().split()) if p.exists() else Counter()


def _state_file(ws: Workspace, tid: str) -> Path | None:
    for p in (ws.root / ".state" / f"autonomous_loop_{tid}.json",
              ws.root / ".state" / "archive" / f"autonomous_loop_{tid}.json"):
        if p.exists():
            return p
    return None


def test_p1_state_survives_sigkill_at_random_points(ws: Workspace) -> None:
    """P-1: kill -9 at random points, 50 times, across a 60-step run. Each time the state file parses;
    in the end resume finishes the task and no step the state recorded as completed ran again."""
    steps = 60
    ws.task(shell_task(steps, cmd='echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.15'))
    ws.write("config/autonomous_loop.yaml", """\
        autonomous_loop:
          backup_state_every_n_iterations: 3
          backoff_base_seconds: 0.01
          max_iterations: 1000
        """)
    rng = random.Random(20261122)
    tid = "crashy"
    frozen: dict[str, int] = {}  # step id -> side-effect count when the state first recorded it completed
    kills = 0
    started = False
    while kills < 50:
        args = (["loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", tid] if not started
                else ["loop", "resume", "--task-id", tid])
        proc = ws.spawn(*args)
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.4))  # somewhere in start-up
        else:  # somewhere in the loop proper: wait until this process runs, then a random moment
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                p = _state_file(ws, tid)
                try:
                    if p is not None and json.loads(p.read_text()).get("pid") == proc.pid:
                        break
                except ValueError:
                    pass
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        code = proc.wait(timeout=30)
        p = _state_file(ws, tid)
        if p is None:
            continue  # killed before the loop was created; start again
        started = True
        state = LoopState.model_validate_json(p.read_bytes())  # always parses
        counts = _side_effects(ws)
        for c in state.completed_steps:
            frozen.setdefault(c.step_id, counts[c.step_id])
        task_file = ws.root / state.task_path
        if task_file.exists():
            checked = {s.id for s in tasks.load(task_file).steps if s.done}
            assert {c.step_id for c in state.completed_steps} <= checked
        if state.status == "completed":
            assert code == 0
            break
    assert kills >= 50 or state.status == "completed"
    if state.status != "completed":
        r = ws.kiro("loop", "resume", "--task-id", tid)
        assert r.returncode == 0, r.stdout + r.stderr
    final = LoopState.model_validate_json(_state_file(ws, tid).read_bytes())  # type: ignore[union-attr]
    assert final.status == "completed"
    counts = _side_effects(ws)
    for sid, n in frozen.items():
        assert counts[sid] == n, f"step {sid} ran again after the state recorded it completed"
    assert set(counts) == {str(i) for i in range(1, steps + 1)}
    assert {c.step_id for c in final.completed_steps} == {str(i) for i in range(1, steps + 1)}  # P-5 too
    done = tasks.load(ws.root / "Done/feature/tasks.md")
    assert all(s.done for s in done.steps)
    assert kills >= 50, f"only {kills} kills before the task finished"


def test_p2_each_stop_condition_stops_within_one_iteration(ws: Workspace) -> None:
    ws.task(shell_task(40, cmd="sleep 0.1"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "p2")
    ws.wait_for(lambda: ws.state("p2")["iteration"] >= 2, what="two iterations")
    at_hook = ws.state("p2")["iteration"]
    (ws.root / ".hooks/stop_autonomous_loop_p2.md").write_text("stop\n")
    assert proc.wait(timeout=30) == 3
    assert ws.state("p2")["iteration"] <= at_hook + 1


def test_p3_failures_do_not_crash_the_loop(ws: Workspace) -> None:
    """A step that fails twice, then succeeds: the loop carries on and completes."""
    cmd = 'n=$(cat tries 2>/dev/null || echo 0); echo $((n+1)) > tries; [ "$n" -ge 2 ]'
    ws.task(shell_task(1, cmd=cmd) + "- [ ] 2. After\n  ```sh\n  echo 2 >> side_effects.log\n  ```\n")
    # a backoff long enough to outlast saving the failure on a busy machine, so the wait really happens
    ws.write("config/autonomous_loop.yaml",
             "autonomous_loop:\n  backoff_base_seconds: 0.3\n  backoff_max_seconds: 0.6\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "p3")
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("p3")
    assert st["total_failures"] == 2 and st["total_successes"] == 2 and st["iteration"] == 4
    assert [f["retry_count"] for f in st["failed_steps"]] == [0, 1]
    events = [e["event"] for e in ws.events("p3")]
    assert events.count("step_failed") == 2 and events.count("backoff") >= 1


def test_p4_iteration_limit_holds_with_failures_and_resumes(ws: Workspace) -> None:
    ws.task(shell_task(3, cmd="exit 1"))
    ws.write("config/autonomous_loop.yaml", """\
        autonomous_loop:
          max_iterations: 3
          failure_threshold: 100
          max_step_retries: 100
          backoff_base_seconds: 0.01
        guardrails:
          loop_detection_repeats: 100
        """)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "p4")
    assert r.returncode == 4
    assert ws.state("p4")["iteration"] == 3
    for _ in range(2):
        assert ws.kiro("loop", "resume", "--task-id", "p4").returncode == 4
        assert ws.state("p4")["iteration"] == 3
    assert ws.kiro("loop", "resume", "--task-id", "p4", "--max-iterations", "5").returncode == 4
    assert ws.state("p4")["iteration"] == 5


def test_p5_every_executed_step_is_tracked(ws: Workspace) -> None:
    ws.task(shell_task(6))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "p5")
    assert r.returncode == 0
    st = ws.state("p5")
    ran = (ws.root / "side_effects.log").read_text().split()
    assert [c["step_id"] for c in st["completed_steps"]] == ran == [str(i) for i in range(1, 7)]
    assert all(c["duration_seconds"] >= 0 and c["completed_at"] for c in st["completed_steps"])
    assert st["total_successes"] == 6 and st["metrics"]["success_rate"] == 1.0
    ev = [e for e in ws.events("p5") if e["event"] == "step_completed"]
    assert [e["step_id"] for e in ev] == ran


def test_p6_reinjected_prompts_carry_the_current_context(ws: Workspace, tmp_path: Path) -> None:
    """The command executor hands the prompt to an agent; a fake agent saves each one. Reinjected
    prompts carry seed 004's continuation context with the state as it is at that moment."""
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import os, pathlib, sys\n"
        "prompt = sys.stdin.read()\n"
        "it = os.environ['KIRO_ITERATION']\n"
        "pathlib.Path(f'prompt_{it}.txt').write_text(prompt)\n"
        "step = os.environ['KIRO_STEP_ID']\n"
        "if step == '3' and not os.path.exists('failed_once'):\n"
        "    open('failed_once', 'w').close(); print('could not reach the database'); sys.exit(2)\n"
        "task = pathlib.Path(os.environ['KIRO_TASK_FILE'])\n"
        "text = task.read_text()\n"
        "task.write_text(text.replace(f'- [-] {step}. ', f'- [x] {step}. ', 1))\n"
        "print(f'did step {step}')\n"
    )
    ws.task("\n".join(f"- [ ] {i}. Do thing {i}" for i in range(1, 6)) + "\n")
    ws.write("config/autonomous_loop.yaml", f"""\
        executor: command
        executor_command: {json.dumps(os.sys.executable + ' ' + str(agent))}
        autonomous_loop:
          reinject_every_n_iterations: 2
          backoff_base_seconds: 0.01
        """)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "p6")
    assert r.returncode == 0, r.stdout + r.stderr
    prompts = {int(p.stem.split("_")[1]): p.read_text() for p in ws.root.glob("prompt_*.txt")}
    assert sorted(prompts) == [1, 2, 3, 4, 5, 6]
    assert "Task Continuation Context" not in prompts[1]
    every_n = prompts[2]
    assert "# Task Continuation Context" in every_n
    assert "**Iteration**: 2/100" in every_n and "**Step**: 2" in every_n
    assert "did step 1" in every_n  # the last response is carried over
    after_failure = prompts[4]  # iteration 3 failed on step 3; iteration 4 retries it
    assert "**Step**: 3" in after_failure and "could not reach the database" in after_failure
    assert "**Failed Steps**: 1" in after_failure
    reasons = [e["reason"] for e in ws.events("p6") if e["event"] == "reinjected"]
    assert reasons[:2] == ["every_n_iterations", "every_n_iterations"]
