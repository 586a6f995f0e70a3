"""Typed events (kiro.store.events): one model per kind, one adapter for reading, the JSONL format on disk
unchanged, and readers that never crash on what they find in a log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kiro.store import events
from kiro.store.events import EVENT_NAMES, GenericEvent, parse, read_typed
from tests.conftest import Workspace, shell_task

ENVELOPE = ["ts", "task_id", "iteration", "event"]

# What kiro wrote before events were typed, one line per kind, taken from real logs: the keys (and
# their order) each kind has on disk. Old logs must keep reading, and new lines must look the same.
OLD_LOG = [
    {"event": "loop_started", "task_path": "Specs/f/tasks.md", "executor": "shell", "max_iterations": 100,
     "pid": 4242, "workspace": "/w"},
    {"event": "state_changed", "from": "pending", "to": "running", "reason": "started"},
    {"event": "iteration_started", "step_id": "1"},
    {"event": "reinjected", "reason": "resumed", "step_id": "1", "chars": 812},
    {"event": "step_started", "step_id": "1", "description": "Step number 1", "attempt": 1},
    {"event": "model_called", "turn": 1, "model": "gpt-4o-mini", "seconds": 0.12, "prompt_tokens": 10,
     "completion_tokens": 5, "tool_calls": ["write_file"]},
    {"event": "tool_called", "tool": "write_file", "arguments": {"path": "a.py"}, "ok": False, "seconds": 0.01,
     "error": "denied"},
    {"event": "context_wrapped", "tokens": 9000, "threshold": 8000, "window": 10000, "turn": 4, "restart": 1},
    {"event": "verify_failed", "step_id": "1", "command": "pytest", "output": "1 failed"},
    {"event": "step_failed", "step_id": "1", "attempt": 1, "error": "verify failed", "consecutive_failures": 1},
    {"event": "backoff", "step_id": "1", "seconds": 1.5, "attempts": 1},
    {"event": "guardrail_triggered", "limit": "max_total_tokens", "value": 100, "figure": 120, "action": "stop",
     "message": "budget"},
    {"event": "step_completed", "step_id": "1", "description": "Step number 1", "duration_seconds": 0.2,
     "attempt": 2, "checked": ["1"]},
    {"event": "step_interrupted", "step_id": "2", "reason": "stop_hook"},
    {"event": "step_recovered", "step_id": "2", "description": "Step 2"},
    {"event": "human_requested", "step_id": "3", "question": "which db?", "path": "Needs_Action/x.md"},
    {"event": "task_moved", "from": "Specs/f/tasks.md", "to": "Done/f/tasks.md", "area": "Done"},
    {"event": "warning", "message": "duplicate step ids"},
    {"event": "report_written", "kind": "completion_reports", "path": "Logs/completion_reports/t.md"},
    {"event": "notifier_failed", "kind": "completed", "error": "exit status 1"},
    {"event": "stop_condition", "status": "max_iterations", "reason": "max_iterations", "message": "cap",
     "exit_code": 4, "limit": "max_iterations", "value": 3, "figure": 3},
    {"event": "loop_finished", "status": "completed", "reason": "all_steps_done", "exit_code": 0,
     "message": "all 3 steps done", "iterations": 3, "report": None},
    {"event": "loop_resumed", "task_path": "Specs/f/tasks.md", "executor": "shell", "max_iterations": 100,
     "pid": 4243, "workspace": "/w"},
]


def _line(i: int, fields: dict[str, Any]) -> dict[str, Any]:
    return {"ts": f"2026-11-22T03:15:{i:02d}.000+00:00", "task_id": "t", "iteration": 1, **fields}


@pytest.mark.parametrize("fields", OLD_LOG, ids=[f["event"] for f in OLD_LOG])
def test_an_old_line_reads_as_its_model_and_writes_back_byte_for_byte(fields: dict[str, Any]) -> None:
    record = _line(1, fields)
    event = parse(record)
    assert type(event) is events.MODELS[fields["event"]]
    assert json.dumps(event.to_record()) == json.dumps(record)  # same keys, same order, same values


def test_a_line_from_before_the_redactor_still_reads_typed() -> None:
    old = _line(1, {"event": "notifier_failed", "kind": "completed", "command": "false", "error": "exit 1"})
    assert isinstance(parse(old), events.NotifierFailed) and parse(old).to_record() == old


def test_every_kind_kiro_emits_has_a_model_and_the_old_log_covers_the_spec_names() -> None:
    spec_8 = {"loop_started", "iteration_started", "step_started", "tool_called", "step_completed", "step_failed",
              "verify_failed", "reinjected", "backoff", "guardrail_triggered", "stop_condition", "state_changed",
              "loop_finished"}
    assert spec_8 <= EVENT_NAMES
    assert spec_8 <= {f["event"] for f in OLD_LOG}


def test_every_kind_is_read_by_name_from_the_events_module_and_a_family_is_made_when_first_asked_for() -> None:
    for kind in events.KINDS:  # the kinds of every family, made in kiro.store.events.<family> or here
        assert getattr(events, kind.__name__) is kind
        assert events.MODELS[kind.model_fields["event"].default] is kind
    assert len(events.KINDS) == len(EVENT_NAMES) == len({kind.__name__ for kind in events.KINDS})
    with pytest.raises(AttributeError, match="NoSuchKind"):
        events.NoSuchKind  # noqa: B018
    with pytest.raises(ImportError):
        exec("from kiro.store.events import NoSuchKind", {})
    script = ("import sys\nfrom kiro.store import events\n"
              "before = sorted(m for m in sys.modules if m.startswith('kiro.store.events.'))\n"
              "from kiro.store.events import CheckpointCreated\n"
              "print(before, sorted(m for m in sys.modules if m.startswith('kiro.store.events.')), "
              "CheckpointCreated(step_id='1', commit='c').to_record()['event'])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "['kiro.store.events.git']", "checkpoint_created"]


def test_the_warnings_are_made_when_first_emitted_not_by_a_run_that_has_none() -> None:
    script = ("import sys\nfrom kiro.store import events\n"
              "made = lambda: 'kiro.store.events.warning' in sys.modules\n"
              "print(made(), events.LoopWarning(message='x').to_record()['event'], made(),\n"
              "      events.NotifierFailed(kind='completed', error='e').to_record()['event'])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "warning", "True", "notifier_failed"]


def test_a_log_with_unknown_kinds_misfits_and_a_torn_tail_reads_without_crashing(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(_line(1, OLD_LOG[0])),
             json.dumps(_line(2, {"event": "checkpoint_created", "sha": "abc123"})),  # a newer kiro's kind
             json.dumps(_line(3, {"event": "step_started", "attempt": "many"})),  # does not fit its model
             "[1, 2]",
             json.dumps(_line(4, OLD_LOG[-2]))[:25]]  # torn by a crash
    path.write_text("\n".join(lines))
    read = list(read_typed(path))
    tried = ["known", "unknown kind", "misfit", "not an object", "torn"]
    print(f"tried {tried}: read {len(read)} events, none raised")
    assert [type(e).__name__ for e in read] == ["LoopStarted", "GenericEvent", "GenericEvent"]
    assert read[1].to_record() == _line(2, {"event": "checkpoint_created", "sha": "abc123"})
    assert read[1].get("sha") == "abc123"


def test_a_typed_event_fails_loudly_on_a_typo() -> None:
    assert events.LoopWarning(message="x").to_record()["message"] == "x"
    with pytest.raises(ValidationError, match="atempt\n  Extra inputs are not permitted"):
        events.StepStarted(step_id="1", atempt=2)
    with pytest.raises(ValidationError, match="attempt\n  Field required"):
        events.StepFailed(step_id="1")  # attempt and error are required
    with pytest.raises(ValidationError, match="attempt\n  Input should be a valid integer"):
        events.StepFailed(step_id="1", attempt="many", error="x")


def test_typed_events_read_like_the_dict_records_for_older_listeners() -> None:
    e = events.StepStarted(step_id="1.2", description="x", attempt=2)
    assert e["step_id"] == "1.2" and e.get("attempt") == 2 and e.get("nope") is None and "event" in e
    assert isinstance(parse(e.to_record()), events.StepStarted)
    for odd in ({"event": 3}, {"event": ["a"]}, {"event": {"x": 1}}, {}, {"event": "warning", "message": 7},
                {"event": "x", "model_config": 1}):
        assert isinstance(parse(odd), GenericEvent), odd


def test_the_record_an_emit_keeps_follows_a_field_set_later_and_is_no_reader_s_to_change() -> None:
    e = events.StepStarted(step_id="1", description="x", attempt=1)
    record = e.stamped("task_1", 3)
    assert record == e.to_record() and record["task_id"] == "task_1" and e["iteration"] == 3
    e.step_id = "2"  # a field set after the loop made the record: every reader sees the new value
    assert e["step_id"] == "2" and e.get("step_id") == "2" and e.to_record()["step_id"] == "2"
    copy = e.to_record()
    copy["step_id"] = "changed by a reader"
    assert e["step_id"] == "2" and e.to_record()["step_id"] == "2"
    assert e.model_copy() == e and e.model_copy().to_record() == e.to_record()


def test_a_real_run_writes_the_same_keys_as_before(ws: Workspace) -> None:
    ws.task(shell_task(2))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 0, r.stderr
    written = ws.events(ws.only_task_id())
    old_keys = {f["event"]: ENVELOPE + [k for k in f if k != "event"] for f in OLD_LOG}
    old_keys["report_written"] = ENVELOPE + ["kind", "path"]
    seen = set()
    for record in written:
        kind = record["event"]
        seen.add(kind)
        if kind == "stop_condition":  # limit/value/figure only when a limit stopped the loop
            assert list(record) == ENVELOPE + ["status", "reason", "message", "exit_code"]
        else:
            assert list(record) == old_keys[kind], kind
        assert type(parse(record)) is events.MODELS[kind]
    assert {"loop_started", "step_started", "step_completed", "state_changed", "stop_condition",
            "task_moved", "report_written", "loop_finished"} <= seen


def test_values_are_taken_as_pydantic_s_lax_mode_takes_them_and_misfits_are_refused() -> None:
    """What an event's lax model takes is written as plain values; what it refuses is refused, and read
    back from a log as a GenericEvent."""
    from kiro.status import Status

    changed = events.StateChanged(from_=Status.RUNNING, to=Status.COMPLETED).to_record()
    assert json.dumps([changed["from"], changed["to"]]) == '["running", "completed"]'  # a StrEnum: its value
    assert events.Backoff(step_id="1", seconds=1).to_record()["seconds"] == 1.0
    assert json.dumps(events.Backoff(step_id="1", seconds=1).to_record()["seconds"]) == "1.0"
    assert json.dumps(events.ContextWrapped(tokens=1, threshold=5).threshold) == "5"
    assert json.dumps(events.ContextWrapped(tokens=1, threshold=5.5).threshold) == "5.5"
    assert events.StepStarted(step_id="1", attempt="3").attempt == 3
    assert events.StepStarted(step_id="1", attempt=True).attempt == 1
    assert events.StepStarted(step_id="1", attempt=2.0).attempt == 2
    assert events.StepCompleted(step_id="1", checked=("a", "b")).checked == ["a", "b"]
    assert events.ToolCalled(tool="x", ok="yes").ok is True and events.ToolCalled(tool="x", ok=0).ok is False
    assert events.LoopFinished(status="completed", reason="r", exit_code=0, message="m", iterations=1).report is None
    assert events.ModelCalled(turn=1, model="m", seconds=0.5).tool_calls == []  # a fresh list each time
    misfits = [
        (events.StepStarted, {"step_id": "1", "attempt": 3.5}),
        (events.StepStarted, {"step_id": 1}),
        (events.StepStarted, {"step_id": "1", "attempt": "many"}),
        (events.StepCompleted, {"step_id": "1", "checked": "a"}),
        (events.ToolCalled, {"tool": "x", "ok": "perhaps"}),
        (events.StepStarted, {"step_id": "1", "event": "step_failed"}),
        (events.Backoff, {"step_id": "1", "seconds": "soon"}),
        (events.StepStarted, {"step_id": b"\xff"}),
    ]
    for kind, fields in misfits:
        with pytest.raises(ValidationError):
            kind(**fields)
        assert isinstance(parse({"event": kind.model_fields["event"].default, **fields}), GenericEvent), fields
    print(f"{len(misfits)} misfits refused, each read back as a GenericEvent")
