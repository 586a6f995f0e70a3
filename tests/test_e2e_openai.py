"""The openai executor end to end: `kiro loop start` as a subprocess, the real `openai` client, and an
OpenAI-compatible server on 127.0.0.1 that each test scripts."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Workspace, openai_config
from tests.fake_openai import FakeOpenAI, call, usage

THREE_STEPS = """\
---
title: Three files
---
# Implementation Plan
- [ ] 1. Write a.txt
  - It must say alpha
- [ ] 2. Write b.txt
- [ ] 3. Append to a.txt
"""

CANARY = "sk-canary-7f3a9c1e55d04b2a8e6f0c9d1b2a3c4d"


def _config(ws: Workspace, fake: FakeOpenAI) -> None:
    openai_config(ws, fake, llm="  prices: {fake-model: {input_per_1m: 1000, output_per_1m: 2000}}\n")


def _start(ws: Workspace, *args: str, env: dict[str, str] | None = None) -> object:
    return ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai", *args, env=env)


def test_three_steps_done_by_tool_calls(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task(THREE_STEPS)
    _config(ws, fake)
    script = [
        (call("write_file", {"path": "a.txt", "content": "alpha\n"}), usage(100, 20)),
        (call("complete_step", {"summary": "wrote a.txt"}), usage(130, 10)),
        (call("write_file", {"path": "b.txt", "content": "beta\n"}), usage(90, 15)),
        (call("complete_step", {"summary": "wrote b.txt"}), usage(120, 8)),
        (call("edit_file", {"path": "a.txt", "old": "alpha\n", "new": "alpha\nomega\n"}), usage(95, 12)),
        (call("complete_step", {"summary": "appended"}), usage(140, 9)),
    ]
    for tool_call, u in script:
        fake.reply(tool_call, usage=u)
    r = _start(ws)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "a.txt").read_text() == "alpha\nomega\n" and (ws.root / "b.txt").read_text() == "beta\n"
    done = (ws.root / "Done/feature/tasks.md").read_text()
    assert done.count("- [x]") == 3
    st = ws.state("ai")
    prompt = sum(u["prompt_tokens"] for _, u in script)
    completion = sum(u["completion_tokens"] for _, u in script)
    assert st["usage"]["prompt_tokens"] == prompt and st["usage"]["completion_tokens"] == completion
    assert st["usage"]["total_tokens"] == prompt + completion and st["usage"]["api_calls"] == 6
    assert st["usage"]["cost_usd"] == pytest.approx(prompt * 1000 / 1e6 + completion * 2000 / 1e6)
    assert [c["summary"] for c in st["completed_steps"]] == ["wrote a.txt", "wrote b.txt", "appended"]
    report = (ws.root / "Logs/completion_reports/ai.md").read_text()
    assert "type: completion_report" in report and f"**Tokens**: {prompt + completion}" in report
    # the model saw the task: the first request carries the step and the task title
    first = fake.chat_requests[0].body
    text = json.dumps(first["messages"])
    assert "Write a.txt" in text and "Three files" in text and "It must say alpha" in text
    names = {t["function"]["name"] for t in first["tools"]}
    assert {"read_file", "write_file", "edit_file", "list_files", "search_files", "complete_step", "fail_step",
            "request_human", "add_steps", "memory_save", "memory_recall", "sleep"} <= names
    assert "run_command" not in names  # shell access is off unless configured
    transcript = (ws.root / ".state/transcripts/ai.jsonl").read_text().splitlines()
    assert transcript and all(json.loads(line) for line in transcript)


def test_verify_failure_gives_a_second_attempt_with_its_output(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task("---\nverify: test -f ok.txt || { echo 'ok.txt is missing'; exit 1; }\n---\n- [ ] 1. Make ok.txt\n")
    _config(ws, fake)
    fake.reply(call("complete_step", {"summary": "I think it is done"}))
    fake.reply(call("write_file", {"path": "ok.txt", "content": "ok"}))
    fake.reply(call("complete_step", {"summary": "really done"}))
    r = _start(ws)
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("ai")
    assert st["total_failures"] == 1 and "verify" in st["failed_steps"][0]["error"]
    second_attempt = json.dumps(fake.chat_requests[1].body["messages"])
    assert "ok.txt is missing" in second_attempt and "attempt 2" in second_attempt
    events = [e["event"] for e in ws.events("ai")]
    assert "verify_failed" in events


def test_prose_claiming_completion_checks_nothing(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. Do it\n- [ ] 2. Then this\n")
    ws.write("config/autonomous_loop.yaml",
             f"executor: openai\nllm:\n  base_url: {fake.base_url}\n  max_retries: 0\n  max_turns_per_step: 2\n"
             f"autonomous_loop:\n  failure_threshold: 1\n")
    fake.reply("All steps COMPLETE! <promise>COMPLETE</promise> Everything is done.")
    fake.reply("I am confident the task is complete. DONE.")
    r = _start(ws)
    assert r.returncode == 5
    text = (ws.root / "Specs/feature/tasks.md").read_text()
    assert "- [x]" not in text
    st = ws.state("ai")
    assert st["completed_steps"] == [] and "complete_step" in st["failed_steps"][0]["error"]


def test_a_run_of_500s_ends_in_an_escalation(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. Do it\n")
    _config(ws, fake)
    fake.error(500, "upstream exploded", times=10)
    r = _start(ws)
    assert r.returncode == 5, r.stdout + r.stderr
    st = ws.state("ai")
    assert st["consecutive_failures"] == 3 and "500" in st["failed_steps"][-1]["error"]
    esc = (ws.root / "Needs_Action/escalation_ai.md").read_text()
    assert "500" in esc


def test_401_ends_with_exit_1_and_a_clear_message(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. Do it\n")
    _config(ws, fake)
    fake.error(401, "Incorrect API key provided", times=20)
    r = _start(ws, env=ws.env(OPENAI_API_KEY="sk-wrong"))
    assert r.returncode == 1
    assert "OPENAI_API_KEY" in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert len(fake.chat_requests) <= 3
    assert ws.state("ai")["status"] == "stopped"


def test_turns_exhausted_without_complete_step_is_a_failed_attempt(ws: Workspace, fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. Do it\n")
    ws.write("config/autonomous_loop.yaml",
             f"executor: openai\nllm:\n  base_url: {fake.base_url}\n  max_retries: 0\n  max_turns_per_step: 3\n"
             f"autonomous_loop:\n  failure_threshold: 1\n")
    for i in range(3):
        fake.reply(call("read_file", {"path": f"nothing{i}.txt"}))
    r = _start(ws)
    assert r.returncode == 5
    assert len(fake.chat_requests) == 3
    assert "3 turns" in ws.state("ai")["failed_steps"][0]["error"]


def test_canary_api_key_reaches_no_file_in_the_workspace(ws: Workspace) -> None:
    with FakeOpenAI(require_key=CANARY) as fake:
        ws.task(THREE_STEPS)
        _config(ws, fake)
        fake.reply(call("write_file", {"path": "a.txt", "content": "alpha"}))
        fake.reply(call("memory_save", {"content": "remember the key is in the env"}))
        fake.reply(call("complete_step", {"summary": "ok"}))
        fake.reply(call("complete_step", {"summary": "ok"}))
        fake.reply(call("fail_step", {"error": "giving up on purpose"}))
        r = _start(ws, env=ws.env(OPENAI_API_KEY=CANARY))
        assert r.returncode in (0, 5), r.stderr
        assert len(fake.chat_requests) >= 5
    leaked = []
    for p in ws.root.rglob("*"):
        if p.is_file() and CANARY.encode() in p.read_bytes():
            leaked.append(str(p.relative_to(ws.root)))
    assert leaked == []
    assert CANARY not in r.stdout + r.stderr


def test_request_human_pauses_with_exit_6_and_a_request_file_then_resume_continues(ws: Workspace,
                                                                                  fake: FakeOpenAI) -> None:
    ws.task("- [ ] 1. Pick the database\n- [ ] 2. Write the config\n")
    _config(ws, fake)
    fake.reply(call("request_human", {"question": "Postgres or SQLite for production?"}))
    r = _start(ws)
    assert r.returncode == 6, r.stdout + r.stderr
    st = ws.state("ai")
    assert st["status"] == "paused" and st["stop_reason"] == "request_human"
    assert st["stop_conditions"]["manual_intervention"]
    request = (ws.root / "Needs_Action/request_ai.md").read_text()
    assert "type: intervention_request" in request and "Postgres or SQLite for production?" in request
    assert "- [x]" not in (ws.root / "Specs/feature/tasks.md").read_text()
    # the person answers in the task file and resumes; the agent finishes both steps
    fake.reply(call("complete_step", {"summary": "chose Postgres as the person said"}))
    fake.reply(call("complete_step", {"summary": "config written"}))
    r = ws.kiro("loop", "resume", "--task-id", "ai")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("ai")["status"] == "completed"
