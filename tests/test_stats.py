"""`kiro loop stats`: figures across loops, from real runs' state files and event logs."""

from __future__ import annotations

import json
import re
import signal

from kiro.views.stats import percentile
from tests.conftest import Workspace, shell_task

FLAKY = 'if [ -f "tried_$KIRO_STEP_ID" ]; then exit 0; fi; touch "tried_$KIRO_STEP_ID"; exit 1'


def _stats(ws: Workspace, *args: str) -> dict:  # type: ignore[type-arg]
    r = ws.run("loop", "stats", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_stats_across_completed_retried_and_failed_loops(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml",
             "autonomous_loop:\n  backoff_base_seconds: 0.3\n  backoff_max_seconds: 0.4\n")
    ws.task(shell_task(3, title="Plain"), "Specs/plain/tasks.md")
    ws.task(shell_task(2, cmd=FLAKY, title="Flaky"), "Specs/flaky/tasks.md")
    ws.task(shell_task(1, cmd="exit 1", title="Broken", extra_frontmatter="failure_threshold: 2"),
            "Specs/broken/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/plain/tasks.md", "--task-id", "plain").returncode == 0
    assert ws.kiro("loop", "start", "--task", "Specs/flaky/tasks.md", "--task-id", "flaky").returncode == 0
    assert ws.kiro("loop", "start", "--task", "Specs/broken/tasks.md", "--task-id", "broken").returncode == 5
    events = [e for tid in ("plain", "flaky", "broken") for e in ws.events(tid)]

    s = _stats(ws)
    assert s["loops"] == 3 and s["runs"] == 3
    assert s["by_status"] == {"completed": 2, "failed": 1}
    started = [e for e in events if e["event"] == "step_started"]
    assert s["steps"]["attempts"] == len(started)
    assert s["steps"]["completed"] == 5
    assert s["steps"]["failed"] == sum(1 for e in events if e["event"] == "step_failed") == 4  # 2 flaky + 2 broken
    assert s["steps"]["retries"] == sum(1 for e in started if e["attempt"] > 1) >= 2
    assert s["steps"]["success_rate"] == round(5 / len(started), 4)
    durations = [e["duration_seconds"] for e in events if e["event"] == "step_completed"]
    assert s["step_seconds"]["count"] == 5
    assert s["step_seconds"]["p50"] == percentile(durations, 0.5)
    assert s["step_seconds"]["p95"] == percentile(durations, 0.95)
    slept = sum(e["seconds"] for e in events if e["event"] == "wait_ended" and e["limit"] == "backoff")
    assert slept > 0 and abs(s["waiting_seconds"]["backoff"] - slept) < 1e-6  # what was slept, not planned
    assert s["stop_reasons"] == {"completed: all_steps_done": 2, "failed: failure_threshold": 1}

    text = ws.run("loop", "stats")
    assert text.returncode == 0
    for heading in ("Loops", "Steps", "Step duration", "Usage", "Time spent waiting", "Stop reasons"):
        assert f"\n{heading}" in "\n" + text.stdout
    assert "failed: failure_threshold  1" in text.stdout


def test_stats_usage_per_step_and_since(ws: Workspace) -> None:
    """Tokens and cost come from the states; --since drops older events and loops not updated since."""
    ws.task(shell_task(2), "Specs/a/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/a/tasks.md", "--task-id", "recent").returncode == 0
    state_file = ws.root / ".state" / "archive" / "autonomous_loop_recent.json"
    st = json.loads(state_file.read_text())
    st["usage"] = {"prompt_tokens": 900, "completion_tokens": 100, "total_tokens": 1000, "api_calls": 4,
                   "cost_usd": 0.02}
    state_file.write_text(json.dumps(st))
    # an old loop: its state and events are from 2020
    old = dict(st, task_id="old", updated_at="2020-01-01T00:00:00+00:00", status="completed",
               usage={"total_tokens": 5000, "cost_usd": 1.0})
    (ws.root / ".state" / "autonomous_loop_old.json").write_text(json.dumps(old))
    (ws.root / "Logs" / "old.jsonl").write_text(
        json.dumps({"ts": "2020-01-01T00:00:00+00:00", "task_id": "old", "iteration": 1, "event": "step_started",
                    "step_id": "1", "attempt": 1}) + "\n"
        + json.dumps({"ts": "2020-01-01T00:00:05+00:00", "task_id": "old", "iteration": 1,
                      "event": "step_completed", "step_id": "1", "duration_seconds": 5.0}) + "\n"
        + '{"ts": "2020-01-01T00:00:06+00:00", "torn": \n')

    everything = _stats(ws)
    assert everything["loops"] == 2 and everything["steps"]["completed"] == 3
    assert everything["usage"]["total_tokens"] == 6000

    recent = _stats(ws, "--since", "2025-01-01")
    assert recent["loops"] == 1 and recent["steps"]["completed"] == 2
    assert recent["usage"]["total_tokens"] == 1000 and recent["usage"]["api_calls"] == 4
    assert recent["usage"]["tokens_per_step"] == 500.0 and recent["usage"]["cost_per_step_usd"] == 0.01

    bad = ws.run("loop", "stats", "--since", "last tuesday")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "--since" in bad.stderr
    assert "Traceback" not in bad.stderr


INTERRUPTED_ONCE = 'if [ -f tried ]; then exit 0; fi; touch tried; sleep 120'  # the first attempt is stopped


def test_an_interrupted_attempt_is_no_failure_and_stats_and_status_say_the_same_rate(ws: Workspace) -> None:
    """Issue #38 item 10: `stats` said "failed 0" but "success rate 93%" while `status` said 100% (stats
    counted an interrupted attempt as a non-success). One definition: completed / (completed + failed); and
    a loop that has finished nothing shows `-`, not 0%."""
    ws.task(shell_task(2, cmd=INTERRUPTED_ONCE), "Specs/a/tasks.md")
    proc = ws.spawn("loop", "start", "--task", "Specs/a/tasks.md", "--task-id", "cut")
    try:
        ws.wait_for(lambda: (ws.root / "tried").exists(), what="step 1 to run")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 3, ws.output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    row = json.loads(ws.run("loop", "status", "--task-id", "cut", "--json").stdout)
    row = row[0] if isinstance(row, list) else row
    print("status of a stopped loop that finished nothing:", row["success_rate"], "stats:",
          _stats(ws)["steps"]["success_rate"])
    assert row["success_rate"] is None and _stats(ws)["steps"]["success_rate"] is None
    assert "0%" not in ws.run("loop", "status", "--task-id", "cut").stdout
    assert ws.kiro("loop", "resume", "--task-id", "cut").returncode == 0

    s = _stats(ws)
    row = json.loads(ws.run("loop", "status", "--task-id", "cut", "--json").stdout)
    row = row[0] if isinstance(row, list) else row
    print("attempts", s["steps"]["attempts"], "completed", s["steps"]["completed"], "failed", s["steps"]["failed"],
          "-> stats", s["steps"]["success_rate"], "status", row["success_rate"])
    assert s["steps"]["attempts"] == 3 and s["steps"]["completed"] == 2 and s["steps"]["failed"] == 0
    assert s["steps"]["success_rate"] == row["success_rate"] == 1.0
    assert re.search(r"success rate\s+100%", ws.run("loop", "stats").stdout)


def test_stats_of_an_empty_workspace(ws: Workspace) -> None:
    s = _stats(ws)
    assert s["loops"] == 0 and s["steps"]["success_rate"] is None and s["step_seconds"]["p50"] is None


def test_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile(list(map(float, range(1, 101))), 0.95) == 95.05


def test_tokens_per_step_spread_comes_from_the_model_calls_of_each_step(ws: Workspace) -> None:
    def ev(kind: str, **fields: object) -> str:
        return json.dumps({"ts": "2026-11-22T08:00:00+00:00", "task_id": "ai", "iteration": 1, "event": kind,
                           **fields}) + "\n"

    (ws.root / "Logs" / "ai.jsonl").write_text(
        ev("loop_started")
        + ev("step_started", step_id="1", attempt=1) + ev("model_called", prompt_tokens=100, completion_tokens=20)
        + ev("step_failed", step_id="1", attempt=1) + ev("step_started", step_id="1", attempt=2)
        + ev("model_called", prompt_tokens=150, completion_tokens=30) + ev("step_completed", step_id="1",
                                                                             duration_seconds=3.0)
        + ev("step_started", step_id="2", attempt=1) + ev("model_called", prompt_tokens=1000, completion_tokens=0)
        + ev("step_completed", step_id="2", duration_seconds=1.0)
        + ev("step_started", step_id="3", attempt=1) + ev("model_called", prompt_tokens=7, completion_tokens=7))
    u = _stats(ws)["usage"]
    assert (u["tokens_per_step_p50"], u["tokens_per_step_p95"]) == (650.0, percentile([300.0, 1000.0], 0.95))
    text = ws.run("loop", "stats").stdout
    assert "(p50 650, p95 965)" in text
