"""A long Retry-After (issue 7 item 10): the endpoint says "come back in an hour"; kiro sleeps like a
budget wait (status `sleeping`, `sleep_until` in the state, a stop hook ends it at once) instead of
failing the attempt three times in two seconds and ending the loop as failed. Error messages count
the retries that really happened."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.conftest import Workspace, openai_config
from tests.fake_openai import FakeOpenAI, call
from tests.test_openai_executor import harness, run


def test_an_hour_long_retry_after_is_a_wait_a_hook_ends_and_resume_just_works(ws: Workspace,
                                                                              fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. Write a\n- [ ] 2. Write b\n")
    openai_config(ws, fake, max_retries=2)
    fake.error(429, "come back in an hour", retry_after=3600)
    fake.reply(call("complete_step", {"summary": "a"}))
    fake.reply(call("complete_step", {"summary": "b"}))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ra")
    try:
        st = ws.wait_for(lambda: ws.state("ra")["status"] == "sleeping" and ws.state("ra"), what="sleeping")
        until = datetime.fromisoformat(st["sleep_until"])
        assert timedelta(minutes=59) < until - datetime.now(UTC) <= timedelta(hours=1)
        time.sleep(1.0)
        assert len(fake.chat_requests) == 1  # no retries burned
        assert ws.state("ra")["consecutive_failures"] == 0
        [t] = [e for e in ws.events("ra") if e["event"] == "guardrail_triggered"]
        assert t["limit"] == "retry_after" and t["action"] == "wait" and t["seconds"] == 3600
        (ws.root / ".hooks/stop_autonomous_loop_ra.md").write_text("stop\n")
        assert proc.wait(timeout=15) == 3, Workspace.output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    st = ws.state("ra")
    assert st["status"] == "paused" and st["consecutive_failures"] == 0 and not st["failed_steps"]
    assert st["sleep_until"] is None
    r = ws.kiro("loop", "resume", "--task-id", "ra")  # no --reset-failures needed
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(fake.chat_requests) == 3


def test_a_retry_after_the_client_honours_itself_is_still_retried_by_it(tmp_path: Path,
                                                                        fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.error(429, "slow down", retry_after=1)
    fake.reply(call("complete_step", {"summary": "ok"}))
    assert run(h).outcome == "completed"
    assert len(fake.chat_requests) == 2


def test_the_error_counts_the_retries_that_happened(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.error(429, "no", headers={"x-should-retry": "false"})  # the server forbids retrying
    result = run(h)
    assert result.error is not None and "HTTP 429 after 0 retries" in result.error
    assert len(fake.chat_requests) == 1
    fake.error(500, "boom", retry_after_ms=5, times=3)
    result = run(h)
    assert result.error is not None and "HTTP 500" in result.error and "after 2 retries" in result.error

