"""Loop detection stops stuck agents, not healthy ones (issue 7 item 7): steps that each complete are
progress even when every one ends with the same `complete_step {"summary": "Done."}`; the same call
repeated on one step with nothing completed in between is still a loop."""

from __future__ import annotations

from tests.conftest import Workspace, openai_config
from tests.fake_openai import FakeOpenAI, call
from tests.test_guardrails import TokenSpender, _config, _run, _triggers


def test_three_steps_completed_with_the_same_summary_are_progress_not_a_loop(ws: Workspace,
                                                                            fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. Write a\n- [ ] 2. Write b\n- [ ] 3. Write c\n- [ ] 4. Write d\n")
    openai_config(ws, fake, extra="guardrails:\n  loop_detection_repeats: 3\n")
    for _ in range(4):
        fake.reply(call("complete_step", {"summary": "Done."}))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ld")
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("ld")
    assert st["status"] == "completed" and len(st["completed_steps"]) == 4
    assert not [e for e in ws.events("ld") if e["event"] == "guardrail_triggered"]


def test_same_call_on_every_step_in_process(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n- [ ] 2. b\n- [ ] 3. c\n- [ ] 4. d\n- [ ] 5. e\n")
    _config(ws, "guardrails:\n  loop_detection_repeats: 2\n")
    outcome, st, events = _run(ws, TokenSpender(tokens=1, calls=1, tool=("complete_step", {"summary": "Done."})))
    assert outcome.exit_code == 0 and st["status"] == "completed"
    assert not _triggers(events)


def test_the_same_call_repeated_within_one_step_is_still_a_loop(ws: Workspace) -> None:
    ws.task("- [ ] 1. a\n- [ ] 2. b\n")
    _config(ws, "guardrails:\n  loop_detection_repeats: 3\n")
    outcome, st, events = _run(ws, TokenSpender(tokens=1, calls=3, tool=("read_file", {"path": "x.txt"})))
    assert outcome.exit_code == 5 and st["stop_reason"] == "loop_detection_repeats"
    assert _triggers(events)[0]["figure"] == 3
