"""guardrails.max_consecutive_turns (SPEC §11, seed 000): a forced sleep after N model turns without a
`sleep` call, which a stop hook still interrupts; against the scripted OpenAI-compatible server."""

from __future__ import annotations

import subprocess

from tests.conftest import Workspace, openai_config
from tests.fake_openai import FakeOpenAI, call

TASK = "---\ntitle: Busy agent\n---\n- [ ] 1. Write files\n- [ ] 2. Write more\n"


def _config(ws: Workspace, fake: FakeOpenAI, guardrails: str) -> None:
    openai_config(ws, fake, extra=f"guardrails:\n{guardrails}")


def _write(n: int) -> dict[str, object]:
    return call("write_file", {"path": f"f{n}.txt", "content": f"{n}\n"})


def test_forced_sleep_after_max_turns_is_interrupted_by_a_stop_hook(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task(TASK)
    _config(ws, fake, "  max_consecutive_turns: 2\n  forced_sleep_seconds: 600\n")
    fake.reply(_write(1))
    fake.reply(_write(2))
    fake.reply(call("complete_step", {"summary": "never reached"}))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    ws.wait_for(lambda: ws.state("ai")["status"] == "sleeping", what="the forced sleep")
    assert len(fake.chat_requests) == 2  # the third model call waits for the end of the forced sleep
    r = ws.run("loop", "stop", "--task-id", "ai")
    assert r.returncode == 0, r.stderr
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the stop hook did not end the forced sleep:\n" + ws.output(proc)) from None
    assert code == 3, ws.output(proc)
    assert len(fake.chat_requests) == 2
    t = [e for e in ws.events("ai") if e["event"] == "guardrail_triggered"]
    assert len(t) == 1 and t[0]["limit"] == "max_consecutive_turns" and t[0]["figure"] == 2
    assert t[0]["action"] == "wait" and t[0]["seconds"] == 600
    assert ws.state("ai")["stop_reason"] == "stop_hook"


def test_a_sleep_call_resets_the_count_and_a_forced_sleep_ends_on_its_own(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task(TASK)
    _config(ws, fake, "  max_consecutive_turns: 2\n  forced_sleep_seconds: 0.3\n")
    fake.reply(_write(1))
    fake.reply(call("sleep", {"seconds": 0.1, "reason": "let CI catch up"}))  # turn 2 calls sleep: count reset
    fake.reply(_write(2))
    fake.reply(call("complete_step", {"summary": "step 1"}))  # turn 2 since the sleep: forced sleep next
    fake.reply(call("complete_step", {"summary": "step 2"}))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    assert r.returncode == 0, r.stdout + r.stderr
    events = ws.events("ai")
    t = [e for e in events if e["event"] == "guardrail_triggered"]
    assert [e["limit"] for e in t] == ["max_consecutive_turns"]
    # it fell between the turns of step 1's complete_step and step 2's first model call
    names = [(e["event"], e.get("step_id")) for e in events]
    assert names.index(("guardrail_triggered", None)) > names.index(("step_completed", "1"))
    assert len(fake.chat_requests) == 5


TASK3 = "---\ntitle: Busy agent\n---\n- [ ] 1. Write files\n- [ ] 2. Write more\n- [ ] 3. And more\n"


def test_the_count_survives_a_restart_and_a_rest_cut_short_is_taken_again(ws: Workspace, fake: FakeOpenAI) -> None:
    """Two turns, a stop, a resume: the third turn since the last sleep is the limit, so the loop
    rests before a fourth. Stopped mid-rest and resumed at once, it rests again before any call: the
    count starts again only when a forced rest is over."""
    ws.task(TASK3)
    _config(ws, fake, "  max_consecutive_turns: 3\n  forced_sleep_seconds: 600\n")
    hook = ws.root / ".hooks" / "stop_autonomous_loop_ai.md"
    fake.reply(_write(1))

    def second_turn(body: dict[str, object]) -> dict[str, object]:
        hook.parent.mkdir(exist_ok=True)
        hook.write_text("---\ntype: stop_hook\n---\n")  # a person stops the loop while step 1 finishes
        return {"tool_calls": [{"name": "complete_step", "arguments": {"summary": "step 1"}}]}

    fake.responder = second_turn
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    assert r.returncode == 3, r.stdout + r.stderr
    assert len(fake.chat_requests) == 2
    assert ws.state("ai")["guardrails"]["consecutive_turns"]["count"] == 2
    fake.responder = None

    fake.reply(_write(2))  # turn 3 since the last sleep
    fake.reply(call("complete_step", {"summary": "never reached"}))
    proc = ws.spawn("loop", "resume", "--task-id", "ai")
    ws.wait_for(lambda: ws.state("ai")["status"] == "sleeping", what="the forced sleep after the restart")
    assert len(fake.chat_requests) == 3  # not 2 + 3: the count did not start again at 0
    assert ws.run("loop", "stop", "--task-id", "ai").returncode == 0
    assert proc.wait(timeout=60) == 3, ws.output(proc)
    t = [e for e in ws.events("ai") if e["event"] == "guardrail_triggered"]
    assert [(e["limit"], e["figure"]) for e in t] == [("max_consecutive_turns", 3)]

    # resumed at once: the rest the stop cut short is taken again before any model call
    proc = ws.spawn("loop", "resume", "--task-id", "ai")
    ws.wait_for(lambda: ws.state("ai")["status"] == "sleeping", what="the owed rest")
    assert ws.run("loop", "stop", "--task-id", "ai").returncode == 0
    assert proc.wait(timeout=60) == 3, ws.output(proc)
    assert len(fake.chat_requests) == 3
    t = [e for e in ws.events("ai") if e["event"] == "guardrail_triggered"]
    assert [(e["limit"], e["figure"], e["seconds"]) for e in t] == [("max_consecutive_turns", 3, 600)] * 2


def test_a_loop_stopped_longer_than_the_rest_starts_counting_again(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task(TASK)
    _config(ws, fake, "  max_consecutive_turns: 2\n  forced_sleep_seconds: 0.2\n")
    hook = ws.root / ".hooks" / "stop_autonomous_loop_ai.md"

    def first_turn(body: dict[str, object]) -> dict[str, object]:
        hook.parent.mkdir(exist_ok=True)
        hook.write_text("---\ntype: stop_hook\n---\n")
        return {"tool_calls": [{"name": "complete_step", "arguments": {"summary": "step 1"}}]}

    fake.responder = first_turn
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai").returncode == 3
    fake.responder = None
    state = ws.state("ai")
    assert state["guardrails"]["consecutive_turns"]["count"] == 1
    # the loop stayed stopped longer than forced_sleep_seconds: written as if its last turn were long ago
    path = ws.root / ".state" / "autonomous_loop_ai.json"
    state["guardrails"]["consecutive_turns"]["last_turn_at"] -= 3600
    path.write_text(__import__("json").dumps(state))
    fake.reply(call("complete_step", {"summary": "step 1"}))  # the stop cut step 1 short: it runs again
    fake.reply(call("complete_step", {"summary": "step 2"}))  # a kept count (1 + 1) would force a rest here
    r = ws.kiro("loop", "resume", "--task-id", "ai")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [e for e in ws.events("ai") if e["event"] == "guardrail_triggered"]
    assert len(fake.chat_requests) == 3
