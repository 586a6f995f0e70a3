"""search_files is bounded in time and never blocks the event loop (issue #7, item 2).

With Python's `re`, `(a+)+$` against "a"*34 + "!" backtracks for hours while holding the GIL: the
stop hook, SIGTERM and the step timeout could not run. kiro searches with the `regex` module in a
worker thread (the GIL is released while matching) and gives up on a match after 1 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from kiro.executors.tools import ToolResult
from tests.conftest import FAST_CONFIG, Workspace
from tests.fake_openai import FakeOpenAI, call, invoke, make_harness

EVIL = "a" * 34 + "!"


async def _search_while_ticking(root: Path, pattern: str, text: str) -> tuple[ToolResult, int]:
    """Run search_files while another task ticks every 10 ms; return the result and the ticks."""
    h = make_harness(root)
    (h.root / "evil.txt").write_text(text)
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.ensure_future(ticker())
    try:
        result = await invoke(h.tool_env(), "search_files", {"pattern": pattern})
    finally:
        done.set()
        await t
    return result, ticks


def test_issue_pattern_returns_promptly(tmp_path: Path) -> None:
    result, _ = asyncio.run(_search_while_ticking(tmp_path / "ws", "(a+)+$", EVIL))
    assert result.ok and "no matches" in result.text


def test_a_catastrophic_pattern_is_an_error_for_the_model_and_the_loop_keeps_running(tmp_path: Path) -> None:
    result, ticks = asyncio.run(_search_while_ticking(tmp_path / "ws", "(a|aa)+$", "a" * 40 + "!"))
    assert not result.ok
    assert "gave up" in result.text and "(a|aa)+$" in result.text
    assert ticks >= 20  # the event loop ran on while the regex was matching (>= 1 s of 10 ms ticks)


def test_stop_hook_and_sigterm_end_a_loop_whose_agent_searches_catastrophically(ws: Workspace) -> None:
    """End to end: the model writes the evil file and searches it over and over; a stop hook and
    then SIGTERM are honoured within a normal wait."""
    with FakeOpenAI() as fake:
        fake.reply(tool_calls=[call("write_file", {"path": "evil.txt", "content": "a" * 40 + "!"})])
        for _ in range(40):
            fake.reply(tool_calls=[call("search_files", {"pattern": "(a|aa)+$"})])
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"llm:\n  base_url: {json.dumps(fake.base_url)}\n"
                 "  max_turns_per_step: 50\n")
        ws.task("---\ntitle: ReDoS\nexecutor: openai\n---\n- [ ] 1. Search\n- [ ] 2. More\n")
        proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", env=ws.env(OPENAI_API_KEY="sk-test"))
        fake.wait_for_requests(3, timeout=30)  # a search has been answered: the model got the error
        tool_msgs = [m for r in fake.chat_requests for m in r.messages if m.get("role") == "tool"]
        assert any("gave up" in str(m.get("content")) for m in tool_msgs)
        tid = ws.only_task_id()
        (ws.root / ".hooks" / f"stop_autonomous_loop_{tid}.md").write_text("stop\n")
        assert proc.wait(timeout=20) == 3
        assert ws.state(tid)["stop_reason"] == "stop_hook"

        # And SIGTERM, mid-search, after a resume.
        for _ in range(40):
            fake.reply(tool_calls=[call("search_files", {"pattern": "(a|aa)+$"})])
        proc = ws.spawn("loop", "resume", "--task-id", tid, env=ws.env(OPENAI_API_KEY="sk-test"))
        before = len(fake.chat_requests)
        ws.wait_for(lambda: len(fake.chat_requests) >= before + 2, what="a search after resume")
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 3
        print(f"SIGTERM mid-search: kiro exited after {time.monotonic() - started:.2f} s")
