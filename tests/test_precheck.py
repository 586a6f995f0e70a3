"""The pre-check gate (SPEC §11, seed 000) end to end against the scripted OpenAI-compatible server:
a cheap model that answers "nothing changed" skips the turn (event logged, no full-model call in the
server's request log), a waiting message always passes, and a failing pre-check never blocks work."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from tests.conftest import Workspace, openai_config
from tests.fake_openai import FakeOpenAI, call

TASK = "---\ntitle: Nightly fixes\n---\n- [ ] 1. Fix the flaky build\n- [ ] 2. Write the notes\n"
FULL, CHEAP = "full-model", "cheap-model"


def _config(ws: Workspace, fake: FakeOpenAI) -> None:
    openai_config(ws, fake, model=FULL, llm=f"  precheck_model: {CHEAP}\n  precheck: every_iteration\n"
                                            f"  precheck_sleep_seconds: 600\n")


def _models(fake: FakeOpenAI) -> list[str]:
    return [r.body["model"] for r in fake.chat_requests]


def _verdict(material: bool, reason: str) -> dict[str, Any]:
    return call("precheck_result", {"material_change": material, "reason": reason})


def _named(ws: Workspace, kind: str) -> list[dict[str, Any]]:
    return [e for e in ws.events("ai") if e["event"] == kind]


def test_nothing_changed_skips_the_turn_and_a_message_passes_the_gate(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task(TASK)
    _config(ws, fake)
    fake.error(500, "the build server is down")  # attempt 1 at step 1 fails (no baseline yet: not gated)
    fake.reply(_verdict(False, "nothing new since the failed attempt"))  # the retry is gated: skipped
    fake.reply(call("complete_step", {"summary": "fixed, as the message said"}))  # after the message
    fake.reply(call("complete_step", {"summary": "notes written"}))  # step 2 is new work: not gated
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    try:
        ws.wait_for(lambda: _named(ws, "precheck_skipped"), what="precheck_skipped")
        # the sleep of the skipped turn on disk: the status alone may still be the first attempt's backoff
        # (its `backoff_over` is saved with the pre-check's own sleep, after `precheck_skipped` is logged)
        ws.wait_for(lambda: (st := ws.state("ai"))["status"] == "sleeping"
                    and st["history"][-1]["reason"] == "precheck_skipped", what="the sleep after a skipped turn")
        assert _models(fake) == [FULL, CHEAP]  # the skipped turn made no full-model call
        skipped = _named(ws, "precheck_skipped")
        assert len(skipped) == 1 and skipped[0]["scope"] == "iteration" and skipped[0]["model"] == CHEAP
        assert skipped[0]["reason"] == "nothing new since the failed attempt"
        assert skipped[0]["next_check_seconds"] == 600
        assert ws.state("ai")["history"][-1]["reason"] == "precheck_skipped"
        # what the pre-check model was offered and shown
        body = fake.chat_requests[1].body
        assert [t["function"]["name"] for t in body["tools"]] == ["precheck_result"]
        digest = body["messages"][-1]["content"]
        assert "Task file: unchanged." in digest and "Fix the flaky build" not in digest.split("The step now")[0]
        assert "the build server is down" in digest  # the retried step's last error

        r = ws.run("loop", "tell", "--task-id", "ai", "CI is green again, please retry")
        assert r.returncode == 0, r.stderr
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, ws.output(proc)
    assert _models(fake) == [FULL, CHEAP, FULL, FULL]  # the message passed the gate without asking
    assert "## Message from a person\nCI is green again" in json.dumps(fake.chat_requests[2].body["messages"])\
        .replace("\\n", "\n")
    passed = _named(ws, "precheck_passed")
    assert [(e["reason"], e["asked"]) for e in passed] == [
        ("no earlier run to compare with", False),
        ("a message is waiting", False),
        ("step 2 was not tried at the last check: new work", False),
    ]
    assert len(_named(ws, "precheck_skipped")) == 1
    state = ws.state("ai")
    assert state["usage"]["api_calls"] == 3  # two answered full-model calls and the pre-check call


def test_a_failing_or_unanswered_precheck_never_blocks_work(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task(TASK)
    _config(ws, fake)
    fake.error(500)  # step 1, attempt 1 (not gated)
    fake.error(503, "pre-check endpoint overloaded")  # the gate's call fails: fail open
    fake.error(500)  # step 1, attempt 2
    fake.reply("I think things changed, probably.")  # prose instead of precheck_result: fail open
    fake.reply(call("complete_step", {"summary": "step 1"}))  # step 1, attempt 3
    fake.reply(call("complete_step", {"summary": "step 2"}))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _models(fake) == [FULL, CHEAP, FULL, CHEAP, FULL, FULL]
    asked = [e for e in _named(ws, "precheck_passed") if e["asked"]]
    assert [e["failed"] for e in asked] == [True, True]
    assert "HTTP 503" in asked[0]["reason"] and "did not call precheck_result" in asked[1]["reason"]
    assert not _named(ws, "precheck_skipped")


def test_a_change_made_while_the_loop_slept_is_in_the_digest_and_runs(ws: Workspace, fake: FakeOpenAI) -> None:
    """Skipped, stopped, a person adds a file, resumed: the digest names the file, the model says
    it matters, the step runs. The baseline stays the one from the last turn that ran."""
    ws.task(TASK)
    _config(ws, fake)
    full: list[dict[str, Any]] = [{"status": 500, "message": "tests fail"},
                                  {"tool_calls": [{"name": "complete_step", "arguments": {"summary": "patched"}}]},
                                  {"tool_calls": [{"name": "complete_step", "arguments": {"summary": "notes"}}]}]

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        if body["model"] == CHEAP:
            seen = "+ incoming.patch" in body["messages"][-1]["content"]
            return {"tool_calls": [{"name": "precheck_result", "arguments": {
                "material_change": seen, "reason": "a patch arrived" if seen else "nothing new"}}]}
        return full.pop(0)

    fake.responder = responder
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    try:
        ws.wait_for(lambda: _named(ws, "precheck_skipped"), what="the skipped turn")
        (ws.root / "incoming.patch").write_text("+ the fix\n")  # a person, while the loop sleeps
        assert ws.run("loop", "stop", "--task-id", "ai").returncode == 0
        assert proc.wait(timeout=60) == 3, ws.output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _models(fake) == [FULL, CHEAP]
    r = ws.kiro("loop", "resume", "--task-id", "ai")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _models(fake) == [FULL, CHEAP, CHEAP, FULL, FULL]
    digest = fake.chat_requests[2].body["messages"][-1]["content"]
    assert "Project files: 1 added, 0 modified, 0 removed:\n+ incoming.patch (10 bytes)" in digest
    asked = [e for e in _named(ws, "precheck_passed") if e["asked"]]
    assert [(e["reason"], e["failed"]) for e in asked] == [("a patch arrived", False)]
    assert "1 added" in asked[0]["changes"]


def test_precheck_keys_are_checked(ws: Workspace) -> None:
    ws.task(TASK)
    ws.write("config/autonomous_loop.yaml", "llm:\n  precheck: sometimes\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    assert r.returncode == 1 and "precheck" in r.stderr and "Traceback" not in r.stderr
    assert not (ws.root / ".state" / "autonomous_loop_ai.json").exists()


def test_a_loop_without_schedule_is_told_the_gate_needs_every_iteration(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. One step\n")
    ws.write("config/autonomous_loop.yaml",
             f"executor: openai\nllm:\n  base_url: {fake.base_url}\n  precheck_model: {CHEAP}\n")
    fake.reply(call("complete_step", {"summary": "done"}))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "llm.precheck: every_iteration" in r.stdout + r.stderr
    assert _models(fake) == ["gpt-4o-mini"]


SCHEDULED = """\
---
title: Nightly inbox check
schedule: {every: 1s}
---
- [ ] 1. Read the inbox
- [ ] 2. Write the digest
"""


class ScheduledAgent:
    """The full model completes each step and writes run summaries; when run `done_after`'s summary
    is asked for it moves the task to Done/ (the schedule ends). The cheap model says "nothing
    changed" every time it is asked."""

    def __init__(self, ws: Workspace, done_after: int) -> None:
        self.ws, self.done_after, self.summaries = ws, done_after, 0
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if body["model"] == CHEAP:
                return {"tool_calls": [{"name": "precheck_result", "arguments": {
                    "material_change": False, "reason": "same inbox as last night"}}]}
            if "tools" not in body:  # kiro's forced run summary
                self.summaries += 1
                if self.summaries == self.done_after:
                    (self.ws.root / "Done").mkdir(exist_ok=True)
                    os.replace(self.ws.root / "Specs/nightly", self.ws.root / "Done/nightly")
                return {"content": f"run {self.summaries}: nothing new in the inbox"}
            return {"tool_calls": [{"name": "complete_step", "arguments": {"summary": "done"}}]}


def test_a_scheduled_run_is_skipped_when_nothing_changed_until_a_message_arrives(ws: Workspace,
                                                                                 fake: FakeOpenAI) -> None:
    ws.task(SCHEDULED, "Specs/nightly/tasks.md")
    openai_config(ws, fake, model=FULL, llm=f"  precheck_model: {CHEAP}\n")
    fake.responder = ScheduledAgent(ws, done_after=2)
    proc = ws.spawn("loop", "start", "--task", "Specs/nightly/tasks.md", "--task-id", "nightly")
    try:
        ws.wait_for(lambda: len([e for e in ws.events("nightly") if e["event"] == "precheck_skipped"]) >= 2,
                    timeout=60, what="two skipped fires")
        assert ws.state("nightly")["runs"] == 1
        r = ws.run("loop", "tell", "--task-id", "nightly", "Look again: the boss wrote at 03:00")
        assert r.returncode == 0, r.stderr
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, ws.output(proc)
    events = ws.events("nightly")
    skipped = [e for e in events if e["event"] == "precheck_skipped"]
    assert all(e["scope"] == "run" and e["reason"] == "same inbox as last night" for e in skipped)
    assert [e["run"] for e in events if e["event"] == "schedule_fired"] == [1, 2]
    # the server's log: run 1 (2 steps + summary), only pre-check calls while skipped, then run 2
    models = _models(fake)
    k = models.count(CHEAP)
    assert k == len(skipped) >= 2
    assert models == [FULL] * 3 + [CHEAP] * k + [FULL] * 3
    passed = [(e["reason"], e["asked"]) for e in events if e["event"] == "precheck_passed"]
    assert passed == [("no earlier run to compare with", False), ("a message is waiting", False)]
    # the digest is free of kiro's own bookkeeping: the run's report, summary memory and state
    digest = next(r for r in fake.chat_requests if r.body["model"] == CHEAP).body["messages"][-1]["content"]
    assert "Task file: unchanged." in digest and "Project files: none added, modified or removed." in digest
    assert "New memories: none." in digest
    # run 2's first prompt carries the message
    run2_first = fake.chat_requests[3 + k].body["messages"]
    assert "Look again: the boss wrote at 03:00" in json.dumps(run2_first)


def test_a_stop_hook_ends_the_wait_for_a_slow_precheck_answer(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task(TASK)
    _config(ws, fake)
    fake.error(500)  # step 1, attempt 1 (not gated)
    fake.reply(_verdict(False, "too late"), delay=120)  # the pre-check model takes two minutes
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    try:
        fake.wait_for_requests(2, timeout=60)
        assert fake.chat_requests[1].body["model"] == CHEAP
        assert ws.run("loop", "stop", "--task-id", "ai").returncode == 0
        code = proc.wait(timeout=60)  # well before the answer would come
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 3, ws.output(proc)
    assert ws.state("ai")["stop_reason"] == "stop_hook"
    assert not _named(ws, "precheck_skipped") and _models(fake) == [FULL, CHEAP]


def test_kiros_own_temp_files_are_not_a_change_in_the_project(tmp_path: Path) -> None:
    """Dashboard.md is written by a temp file and a rename; a walk that came between the two once put
    `.Dashboard.md.<pid>-<rand>.kiro.tmp` in the digest as a file a person added (CI, 1 run in 4)."""
    from kiro.core import precheck

    (tmp_path / "Specs/feature").mkdir(parents=True)
    (tmp_path / ".Dashboard.md.4987-03860711.kiro.tmp").write_text("x" * 405)
    (tmp_path / "Specs/feature/.tasks.md.12-ab.kiro.tmp").write_text("- [x] 1. a\n")
    (tmp_path / "incoming.patch").write_text("+ the fix\n")
    files, capped = precheck._walk(tmp_path, tmp_path)
    assert sorted(files) == ["incoming.patch"] and not capped
