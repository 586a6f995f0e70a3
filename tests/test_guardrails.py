"""Guardrails (issue: live control): each one triggers, logs `guardrail_triggered` with the limit's
name, value and the figure that hit it, and leaves the state it should. Budgets survive a restart.

Most tests drive the real engine in-process with a scripted executor that spends tokens through the
same `Guard` hooks the openai executor uses; a few run `kiro` as a subprocess.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta
from typing import Any

import pytest

from kiro.core.guardrails import LoopGuardrails, RateLimiter, SharedLimits, seconds_until_active
from kiro.core.runner import prepare_resume, prepare_start, run_loops
from kiro.executors.base import ExecutorBase, StepContext, StepResult, Usage
from kiro.store.config import Config, Guardrails
from kiro.store.state import LoopState
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace, shell_task


class TokenSpender(ExecutorBase):
    """An executor that makes `calls` model calls per attempt of `tokens` each, then completes."""

    name = "openai"

    def __init__(self, tokens: int = 100, calls: int = 1, cost: float = 0.0, fail: str | None = None,
                 tool: tuple[str, dict[str, Any]] | None = None) -> None:
        self.tokens, self.calls, self.cost, self.fail, self.tool = tokens, calls, cost, fail, tool
        self.model_calls = 0

    async def run_step(self, ctx: StepContext) -> StepResult:
        usage = Usage()
        for _ in range(self.calls):
            reason = await ctx.guard.before_model_call()
            if reason:
                return StepResult("interrupted", usage=usage, stop_reason=reason)
            one = Usage(prompt_tokens=self.tokens // 2, completion_tokens=self.tokens - self.tokens // 2,
                            total_tokens=self.tokens, api_calls=1, cost_usd=self.cost)
            self.model_calls += 1
            usage.add(one)
            ctx.guard.after_model_call(one)
            if self.tool is not None:
                name, args = self.tool
                reason = await ctx.guard.before_tool_call(name, args)
                if reason:
                    return StepResult("interrupted", usage=usage, stop_reason=reason)
                ctx.guard.after_tool_call(name, args, None)
        if self.fail:
            return StepResult("failed", error=self.fail, usage=usage)
        return StepResult("completed", summary="ok", usage=usage)

    async def aclose(self) -> None:
        return None


def _run(ws: Workspace, executor: Any, *, resume: bool = False, task_id: str = "g",
         during: Any = None) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    kws = KiroWorkspace(ws.root)
    run = (prepare_resume(kws, task_id, executor=executor) if resume
           else prepare_start(kws, "Specs/feature/tasks.md", task_id=task_id, executor=executor))
    events: list[dict[str, Any]] = []
    helper = threading.Thread(target=during, args=(events,)) if during else None
    if helper:
        helper.start()
    [outcome] = asyncio.run(run_loops([run], [events.append]))
    if helper:
        helper.join()
    return outcome, ws.state(task_id), events


def _triggers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "guardrail_triggered"]


def _config(ws: Workspace, text: str) -> None:
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  backoff_base_seconds: 0.01\n" + text)


def test_max_total_tokens_stops_with_exit_4_and_names_the_limit(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n- [ ] 2. b\n- [ ] 3. c\n- [ ] 4. d\n")
    _config(ws, "guardrails:\n  max_total_tokens: 250\n")
    outcome, st, events = _run(ws, TokenSpender(tokens=100))
    assert outcome.exit_code == 4 and st["stop_reason"] == "max_total_tokens"
    [t] = _triggers(events)
    assert (t["limit"], t["value"], t["figure"]) == ("max_total_tokens", 250, 300)
    assert st["usage"]["total_tokens"] == 300  # the call that crossed the line is counted, no more
    assert (ws.root / "Needs_Action/intervention_g.md").read_text().count("max_total_tokens") >= 1


def test_max_cost_usd(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n- [ ] 2. b\n- [ ] 3. c\n- [ ] 4. d\n")
    _config(ws, "guardrails:\n  max_cost_usd: 0.25\n")
    outcome, st, events = _run(ws, TokenSpender(tokens=10, cost=0.1))
    assert outcome.exit_code == 4 and st["stop_reason"] == "max_cost_usd"
    assert _triggers(events)[0]["figure"] == pytest.approx(0.3)


def test_token_budget_per_hour_sleeps_and_the_budget_survives_a_restart(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n- [ ] 2. b\n- [ ] 3. c\n")
    _config(ws, "guardrails:\n  token_budget_per_hour: 150\n")
    hook = ws.root / ".hooks/stop_autonomous_loop_g.md"

    def stop_when_sleeping(events: list[dict[str, Any]]) -> None:
        ws.wait_for(lambda: any(e["event"] == "guardrail_triggered" for e in events), what="budget wait")
        ws.wait_for(lambda: ws.state("g")["status"] == "sleeping", what="sleeping")
        hook.write_text("stop\n")

    outcome, st, events = _run(ws, TokenSpender(tokens=100), during=stop_when_sleeping)
    assert outcome.exit_code == 3 and st["status"] == "paused"
    [t] = _triggers(events)
    assert t["limit"] == "token_budget_per_hour" and t["figure"] == 200 and t["seconds"] > 3000
    assert len(st["completed_steps"]) == 2

    # A restart does not get a fresh budget: the loop sleeps again at once, spending nothing.
    spender = TokenSpender(tokens=100)
    outcome, st, events = _run(ws, spender, resume=True, during=stop_when_sleeping)
    assert outcome.exit_code == 3 and spender.model_calls == 0
    assert _triggers(events)[0]["figure"] == 200


def test_api_calls_per_minute_waits(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n- [ ] 2. b\n")
    _config(ws, "resource_limits:\n  max_api_calls_per_minute: 2\n")
    hook = ws.root / ".hooks/stop_autonomous_loop_g.md"

    def stop_when_waiting(events: list[dict[str, Any]]) -> None:
        ws.wait_for(lambda: any(e["event"] == "guardrail_triggered" for e in events), what="rate wait")
        hook.write_text("stop\n")

    outcome, st, events = _run(ws, TokenSpender(tokens=1, calls=3), during=stop_when_waiting)
    assert outcome.exit_code == 3
    t = _triggers(events)[0]
    assert (t["limit"], t["value"], t["figure"], t["action"]) == ("max_api_calls_per_minute", 2, 2, "wait")


def test_actions_per_minute_waits_for_side_effect_tools(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n")
    _config(ws, "guardrails:\n  max_actions_per_minute: 1\n  loop_detection_repeats: 50\n")
    hook = ws.root / ".hooks/stop_autonomous_loop_g.md"

    def stop_when_waiting(events: list[dict[str, Any]]) -> None:
        ws.wait_for(lambda: any(e["event"] == "guardrail_triggered" for e in events), what="action wait")
        hook.write_text("stop\n")

    outcome, _st, events = _run(ws, TokenSpender(tokens=1, calls=2, tool=("write_file", {"path": "a"})),
                                during=stop_when_waiting)
    assert outcome.exit_code == 3
    assert _triggers(events)[0]["limit"] == "max_actions_per_minute"


def test_same_tool_call_repeated_escalates(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n")
    _config(ws, "guardrails:\n  loop_detection_repeats: 3\n")
    outcome, st, events = _run(ws, TokenSpender(tokens=1, calls=5, tool=("read_file", {"path": "same.txt"})))
    assert outcome.exit_code == 5 and st["status"] == "failed" and st["stop_reason"] == "loop_detection_repeats"
    t = _triggers(events)[0]
    assert (t["value"], t["figure"], t["action"]) == (3, 3, "escalate")
    assert "read_file" in (ws.root / "Needs_Action/escalation_g.md").read_text()


def test_same_error_repeated_escalates_instead_of_burning_iterations(ws: Workspace) -> None:
    ws.task(shell_task(1, cmd="echo 'connection refused to db:5432'; exit 1"))
    _config(ws, "  failure_threshold: 50\n  max_step_retries: 50\n  max_iterations: 50\n"
                "guardrails:\n  loop_detection_repeats: 3\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "g")
    assert r.returncode == 5, r.stderr
    st = ws.state("g")
    assert st["stop_reason"] == "loop_detection_repeats" and st["iteration"] == 3
    [t] = [e for e in ws.events("g") if e["event"] == "guardrail_triggered"]
    assert t["limit"] == "loop_detection_repeats" and t["figure"] == 3


def test_idle_timeout_stops_a_loop_that_gets_nothing_done(ws: Workspace) -> None:
    ws.task(shell_task(1, cmd="sleep 0.3; echo attempt $RANDOM; exit 1"))
    _config(ws, "  failure_threshold: 50\n  max_step_retries: 50\n"
                "guardrails:\n  idle_timeout_seconds: 1\n  loop_detection_repeats: 50\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "g")
    assert r.returncode == 4, r.stderr
    st = ws.state("g")
    assert st["status"] == "timed_out" and st["stop_reason"] == "idle_timeout_seconds"
    assert (ws.root / "Needs_Action/intervention_g.md").exists()


def test_max_memory_mb(ws: Workspace) -> None:
    ws.task(shell_task(2))
    _config(ws, "resource_limits:\n  max_memory_mb: 1\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "g")
    assert r.returncode == 4, r.stderr
    st = ws.state("g")
    assert st["stop_reason"] == "max_memory_mb" and st["iteration"] == 0
    [t] = [e for e in ws.events("g") if e["event"] == "guardrail_triggered"]
    assert t["value"] == 1 and t["figure"] > 1


def test_outside_active_hours_the_loop_sleeps_and_a_hook_stops_it_at_once(ws: Workspace) -> None:
    now = datetime.now()
    start = (now + timedelta(hours=2)).strftime("%H:%M")
    end = (now + timedelta(hours=3)).strftime("%H:%M")
    ws.task(shell_task(2))
    _config(ws, f"guardrails:\n  active_hours: {{start: '{start}', end: '{end}'}}\n")
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "g")
    ws.wait_for(lambda: ws.state("g")["status"] == "sleeping", what="sleeping outside active hours")
    assert ws.state("g")["iteration"] == 0
    (ws.root / ".hooks/stop_autonomous_loop_g.md").write_text("stop\n")
    assert proc.wait(timeout=30) == 3  # the sleep would last 2 hours: the hook ended it
    [t] = [e for e in ws.events("g") if e["event"] == "guardrail_triggered"]
    assert t["limit"] == "active_hours" and t["value"] == f"{start}-{end}"
    assert not (ws.root / "side_effects.log").exists()


# -- units -----------------------------------------------------------------------------------


def test_active_hours_window_arithmetic() -> None:
    class W:
        start, end = "09:00", "17:30"

    day = datetime(2026, 11, 23, 12, 0)
    assert seconds_until_active(W, day) == 0
    assert seconds_until_active(W, day.replace(hour=8, minute=0)) == 3600
    assert seconds_until_active(W, day.replace(hour=18, minute=0)) == 15 * 3600

    class Night:
        start, end = "22:00", "06:00"

    assert seconds_until_active(Night, day.replace(hour=23)) == 0
    assert seconds_until_active(Night, day.replace(hour=3)) == 0
    assert seconds_until_active(Night, day.replace(hour=21)) == 3600


def test_token_window_keeps_only_the_last_hour_without_a_budget() -> None:
    """The window is kept without a budget (one set later counts the hour before), but what left the hour is
    dropped as calls are made: a long run's state does not grow by a pair a model call."""
    cfg = Config()
    assert cfg.guardrails.token_budget_per_hour is None
    st = LoopState(task_id="t", task_path="x")
    clock = [1000.0]
    g = LoopGuardrails(cfg, st, SharedLimits(cfg), clock=lambda: clock[0])
    for _ in range(50):
        g.record_model_call(Usage(total_tokens=10))
        clock[0] += 120  # 50 calls over 100 minutes
    g.record_side_call(Usage(total_tokens=7))
    window = st.guardrails["token_window"]
    assert [n for _, n in window] == [10] * 29 + [7]  # the last hour: from the 22nd call on
    assert all(clock[0] - t < 3600 for t, _ in window)
    later = Config(guardrails=Guardrails(token_budget_per_hour=100))  # a budget set on a resume counts that hour
    again = LoopGuardrails(later, LoopState.model_validate_json(st.model_dump_json()), SharedLimits(later),
                           clock=lambda: clock[0])
    assert again.tokens_last_hour() == 297


def test_rate_limiter_window() -> None:
    now = [0.0]
    rl = RateLimiter(2, clock=lambda: now[0])
    rl.record()
    rl.record()
    assert rl.delay() == 60.0
    now[0] = 30.0
    assert rl.delay() == 30.0
    now[0] = 60.0
    assert rl.delay() == 0.0


def test_token_window_is_sliding_and_lives_in_the_state() -> None:
    cfg = Config(guardrails=Guardrails(token_budget_per_hour=100))
    st = LoopState(task_id="t", task_path="x")
    clock = [1000.0]
    g = LoopGuardrails(cfg, st, SharedLimits(cfg), clock=lambda: clock[0])
    g.record_model_call(Usage(total_tokens=60))
    clock[0] += 1800
    g.record_model_call(Usage(total_tokens=60))
    t = g.wait_needed()
    assert t is not None and t.figure == 120 and t.seconds == pytest.approx(1800)
    again = LoopGuardrails(cfg, LoopState.model_validate_json(st.model_dump_json()), SharedLimits(cfg),
                           clock=lambda: clock[0])
    assert again.tokens_last_hour() == 120  # a reloaded state keeps the window
    clock[0] += 1801
    assert g.wait_needed() is None
