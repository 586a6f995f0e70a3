"""`resource_limits.max_cpu_percent` and `max_disk_writes_per_minute` (SPEC §11: no key accepted and
ignored) are enforced as waits: measured with getrusage (kiro's process and its ended step processes),
logged as `guardrail_triggered`, shown as `sleeping` in the state and `status`, ended by a stop hook.

The arithmetic is checked in process with a scripted clock and meter; the end-to-end tests make a step
burn CPU or write to disk for real and check that the next step waits. Nothing asserts a duration."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kiro.core.guardrails import LoopGuardrails, SharedLimits, UsageMeter, cpu_seconds, disk_writes
from kiro.store.config import Config
from kiro.store.state import LoopState
from tests.conftest import FAST_CONFIG, Workspace, shell_task


class Scripted:
    """A clock and a growing figure the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.value = 0.0

    def clock(self) -> float:
        return self.now

    def read(self) -> float:
        return self.value


def _guardrails(limits: dict[str, object], script: Scripted) -> LoopGuardrails:
    cfg = Config.model_validate({"resource_limits": {"max_api_calls_per_minute": None, **limits}})
    shared = SharedLimits(cfg)
    if shared.cpu is not None:
        shared.cpu = UsageMeter(script.read, script.clock)
    if shared.disk is not None:
        shared.disk = UsageMeter(script.read, script.clock)
    return LoopGuardrails(cfg, LoopState(task_id="t", task_path="Specs/t/tasks.md"), shared)


def test_cpu_is_a_budget_of_cpu_seconds_per_rolling_minute() -> None:
    s = Scripted()
    g = _guardrails({"max_cpu_percent": 50}, s)  # 30 CPU seconds in any minute
    s.now += 10
    s.value += 20.0  # a burst: 200% for 10 s, but 20 of the minute's 30 s
    assert g.wait_needed() is None
    s.now += 10
    s.value += 15.0  # 35 s in the last 20 s
    t = g.wait_needed()
    assert t is not None and t.limit == "max_cpu_percent" and t.action == "wait" and t.value == 50
    assert t.figure == round(35 / 60 * 100, 1)
    # the first 20 s leave the window 60 s after they were seen (t=10): 50 s from now
    assert abs(t.seconds - 50.0) < 1e-6
    s.now += t.seconds  # the loop slept, using nothing
    assert g.wait_needed() is None  # 15 s in the window


def test_kiro_s_own_start_up_is_not_a_reason_to_wait() -> None:
    s = Scripted()
    g = _guardrails({"max_cpu_percent": 1}, s)  # 0.6 CPU seconds a minute
    s.now += 0.5
    s.value += 0.3  # 60% for half a second: kiro starting a loop
    assert g.wait_needed() is None


def test_disk_writes_wait_until_old_writes_leave_the_window() -> None:
    s = Scripted()
    g = _guardrails({"max_disk_writes_per_minute": 100}, s)
    s.now += 5
    s.value += 60
    assert g.wait_needed() is None  # 60 in the last minute
    s.now += 20
    s.value += 50  # 110 in 25 s
    t = g.wait_needed()
    assert t is not None and t.limit == "max_disk_writes_per_minute" and t.figure == 110 and t.value == 100
    # the first 60 leave the window 60 s after they were seen (t=5): 40 s from now
    assert abs(t.seconds - 40.0) < 1e-6
    s.now += t.seconds
    assert g.wait_needed() is None  # 50 in the window
    # also checked before a tool call that writes, not before one that only reads
    s.value += 60
    assert g.before_tool_call("read_file", {"path": "a"}) is None
    trig = g.before_tool_call("write_file", {"path": "a", "content": "x"})
    assert trig is not None and trig.limit == "max_disk_writes_per_minute"


def test_the_real_meters_grow_with_real_work(tmp_path: Path) -> None:
    before_cpu, before_disk = cpu_seconds(), disk_writes()
    subprocess.run(["python3", "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"],
                   check=True)
    for i in range(20):
        with open(tmp_path / f"f{i}", "wb") as fh:
            fh.write(b"x" * 8192)
            fh.flush()
            os.fsync(fh.fileno())
    grown_cpu, grown_disk = cpu_seconds() - before_cpu, disk_writes() - before_disk
    print(f"meters: {grown_cpu:.3f} CPU s for a 0.2 s child; {grown_disk:.0f} pages for 20 fsync'd 8 KiB files")
    assert grown_cpu >= 0.2  # the ended child's CPU is counted
    assert grown_disk >= 20 * 2  # each 8 KiB file is at least two pages


# -- end to end --------------------------------------------------------------------------------------

BURN = "python3 -c \"import time; t = time.process_time()\nwhile time.process_time() - t < 2.0: pass\""
WRITE = "python3 -c \"import os\nfor i in range(64):\n  fd = os.open(f'w{i}', os.O_WRONLY | os.O_CREAT, 0o644); " \
        "os.write(fd, b'x' * 16384); os.fsync(fd); os.close(fd)\""


def _run_until_waiting(ws: Workspace, script: str, limits: str, limit: str) -> None:
    ws.write("heavy.sh", f'if [ "$1" = 1 ]; then\n{script}\nfi\necho "$1" >> side_effects.log\n')
    ws.task(shell_task(2, cmd="bash heavy.sh $KIRO_STEP_ID"))  # step 1 does the heavy work, step 2 is light
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "resource_limits:\n" + limits)
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "rl")
    try:
        ws.wait_for(lambda: ws.state("rl")["status"] == "sleeping", timeout=60, what=f"the {limit} wait")
        state = ws.state("rl")
        assert state["sleep_until"] and state["history"][-1]["reason"] == limit
        trig = [e for e in ws.events("rl") if e["event"] == "guardrail_triggered"]
        assert [e["limit"] for e in trig] == [limit] and trig[0]["action"] == "wait" and trig[0]["seconds"] > 0
        print(f"{limit}: {trig[0]['message']}")
        # the next step waits: step 2 has not started
        assert [e["step_id"] for e in ws.events("rl") if e["event"] == "step_started"] == ["1"]
        assert (ws.root / "side_effects.log").read_text().split() == ["1"]
        st = ws.run("loop", "status", "--task-id", "rl", "--json")
        row = json.loads(st.stdout)
        assert row["status"] == "sleeping" and row["sleeping_because"] == limit and row["sleep_until"], st.stdout
        plain = ws.run("loop", "status", "--task-id", "rl", env=ws.env(COLUMNS="200")).stdout
        assert f"Sleeping      {limit} until" in plain, plain
        r = ws.run("loop", "stop", "--task-id", "rl")
        assert r.returncode == 0, r.stderr
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 3, ws.output(proc)
    assert ws.state("rl")["stop_reason"] == "stop_hook"
    assert (ws.root / "side_effects.log").read_text().split() == ["1"]


def test_a_step_that_burns_cpu_makes_the_next_one_wait_and_a_stop_hook_ends_the_wait(ws: Workspace) -> None:
    _run_until_waiting(ws, BURN, "  max_cpu_percent: 2\n", "max_cpu_percent")  # 1.2 CPU s a minute


def test_a_step_that_writes_a_lot_makes_the_next_one_wait_and_a_stop_hook_ends_it(ws: Workspace) -> None:
    _run_until_waiting(ws, WRITE, "  max_disk_writes_per_minute: 100\n", "max_disk_writes_per_minute")


def test_resource_limits_are_no_longer_reported_as_unbuilt(ws: Workspace) -> None:
    ws.task(shell_task(1))
    ws.write("config/autonomous_loop.yaml",
             FAST_CONFIG + "resource_limits:\n  max_cpu_percent: 99999\n  max_disk_writes_per_minute: 1000000\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "rl")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not enforced" not in r.stdout + r.stderr
