"""Seed 004's correctness properties P-1..P-6, tested on real runs of `kiro` as a subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import cli_forkserver
from tests.conftest import Workspace, shell_task


def _bench(name: str) -> Any:
    """A module of bench/ (not a package): the CI test runs the same routine as the benchmark."""
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _forked(args: list[str], cwd: Path, env: dict[str, str], out: int) -> cli_forkserver.ForkedProcess:
    return cli_forkserver.ForkedProcess(args, cwd=cwd, env=env, stdout=out, stderr=out)


@pytest.mark.slow
def test_p1_state_survives_sigkill_at_random_points(tmp_path: Path) -> None:
    """P-1: kill -9 at random points, 50 times (bench/crash_kills.py does 1,000). Each time the state
    file parses; no step the state recorded as completed runs again, none loses its box; in the end
    resume finishes every task. Each kiro is forked from the test process's fork server, as `ws.kiro` is:
    the same 50 kills, none spent on a cold interpreter's start and imports (no state exists there yet)."""
    counts = _bench("crash_kills").crash_run(tmp_path, 50, seed=20261122, steps=60, kiro=_forked)
    print(counts.line())
    assert counts.kills == 50
    assert counts.unparsable_states == 0 and counts.completed_steps_rerun == 0 and counts.boxes_lost == 0, \
        counts.problems
    assert not counts.problems, counts.problems
    assert counts.tasks_completed == counts.tasks


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
