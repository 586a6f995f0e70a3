"""Usage limits of the REAL Qwen Code and GitHub Copilot CLIs are a wait, not a failure (issue #29), and
a step's qwen does not run the person's own hooks: both CLIs pointed at the scripted Chat Completions
server (tests/fakes/chat.py), which answers as an OpenAI-compatible provider does when a plan's
window is used up.

- The provider's message states the reset ("It will reset at 2026-08-29 23:59:59 +0800 CST.", as a
  coding plan's 429 does). qwen (0.24) does not retry a 429 whose message says the quota is exceeded and
  when it resets (its `isQuotaExhaustedError`: "Quota exhausted, fast-failing"): it ends at once with
  "Quota exhausted: <message>", so the window here is 1 s, its first request's (kiro sleeps to the reset
  and RESET_MARGIN_SECONDS more: the time the test has to see the loop asleep). (A 429 without the reset,
  qwen retries for ~77 s.)
- copilot retries a 429 five times itself, each after the server's Retry-After (up to ~3 min), then
  ends with `session.error` "Failed to get response from the AI model; retried 5 times ...". Here the
  provider's Retry-After is 1 s, the shortest it states, and its window lasts as many answers as
  copilot's one run asks (six): copilot gives up, and kiro takes the reset from copilot's log (the last
  failure's time plus its Retry-After).

The loop sleeps (status `sleeping`, `usage_limit`), wakes and finishes with no failure counted and no
step started twice. No assertion is about elapsed time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import Cli, serving, task_text
from tests.agent_clis_qwen_copilot import NEW_CLIS, QWEN_PRICE
from tests.conftest import FAST_CONFIG, Workspace
from tests.fakes import HttpError
from tests.fakes import chat as fc
from tests.test_usage_limits import Window, code_of

TASK = "Specs/feature/tasks.md"


def qwen_limit(ends: float) -> HttpError:
    """A coding plan's used-up window: 429, insufficient_quota, the reset in the provider's own zone."""
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ends + 8 * 3600))
    return fc.error(429, f"You have exceeded the 5-hour usage quota. It will reset at {local} +0800 CST. We "
                         f"recommend upgrading your plan for more quota, or waiting for the reset.",
                    "insufficient_quota")


def copilot_limit(ends: float) -> HttpError:
    """A provider whose Retry-After (1 s) is shorter than its window: copilot's own retries run out."""
    error = fc.error(429, "You exceeded your current quota, please check your plan and billing details.",
                     "insufficient_quota")
    error.headers["retry-after"] = "1"
    return error


# the limit answer, how long the window lasts from the first request, and how many answers it lasts (None:
# until then); copilot's: its first run's (a request and its 5 retries)
LIMITS: dict[str, tuple[Callable[[float], HttpError], float, int | None]] = {
    "qwen": (qwen_limit, 1, None), "copilot": (copilot_limit, 1, 6)}


@pytest.fixture(params=sorted(NEW_CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[Cli]:
    yield from serving(NEW_CLIS[request.param](cli_home))


def test_the_loop_sleeps_through_a_usage_limit_wakes_and_finishes_with_no_failure(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(2))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"agent: {cli.name}\n" + QWEN_PRICE)
    limit, seconds, answers = LIMITS[cli.name]
    window = Window(seconds, limit, answers)
    assert cli.server is not None
    cli.server.brain = window.wrap(cli.server.brain)  # type: ignore[attr-defined]
    env = ws.env(**cli.env())
    proc = ws.spawn("loop", "start", "--task", TASK, env=env)
    try:
        tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop to start")
        ws.wait_for(lambda: ws.state(tid)["status"] == "sleeping", timeout=240, what="the loop to sleep")
        shown = ws.run("loop", "progress", "--task-id", tid, "--json", env=env)  # in-process: while it sleeps
        assert shown.returncode == 0, shown.stdout + shown.stderr
        progress = json.loads(shown.stdout)
        print("progress --json while limited:", {k: progress[k] for k in ("status", "sleeping_because",
                                                                         "sleep_until", "sleep_note")})
        assert code_of(proc, 300) == 0, ws.output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert progress["status"] == "sleeping" and progress["sleeping_because"] == "usage_limit", progress
    assert progress["sleep_note"].startswith(f"{cli.name} limit, resumes "), progress
    state = ws.state(tid)
    assert state["status"] == "completed"
    assert state["total_failures"] == 0 and state["failed_steps"] == [], state["failed_steps"]
    assert [(c["step_id"], c["attempts"], c["agent"]) for c in state["completed_steps"]] == \
        [("1", 1, cli.name), ("2", 1, cli.name)]  # each step once, on its first attempt
    events = ws.events(tid)
    limits = [e for e in events if e["event"] == "usage_limit"]
    assert limits and all(e["agent"] == cli.name and e["step_id"] == "1" for e in limits), limits
    assert window.ends is not None and limits[0]["resets_at"] is not None, limits
    if cli.name == "qwen":  # the reset its message stated, to the second
        assert limits[0]["resets_at"].startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(window.ends))), \
            (limits[0], window.ends)
        # qwen 0.24 ends the run at once with its own "Quota exhausted: <the provider's message>"
        assert "Quota exhausted: You have exceeded the 5-hour usage quota" in limits[0]["message"], limits
    else:  # the last failure it logged plus the provider's Retry-After: inside the window
        assert "retried 5 times" in limits[0]["message"] and "You exceeded your current quota" in limits[0]["message"]
    assert [e["step_id"] for e in events if e["event"] == "step_started"] == ["1", "2"]  # no step started twice
    waits = [e for e in events if e["event"] == "guardrail_triggered"]
    assert waits and all(w["limit"] == "usage_limit" and w["figure"] == cli.name for w in waits), waits
    ran = [(e["step_id"], e["outcome"]) for e in events if e["event"] == "agent_ran"]
    assert ran[-2:] == [("1", "completed"), ("2", "completed")] and ("1", "usage_limit") in ran, ran
    print(f"{cli.name}: {window.limited} limited answers, then done; limit said: {limits[0]['message']!r}, "
          f"resets {limits[0]['resets_at']}")


def hooks(project: Path, name: str) -> dict[str, Any]:
    """qwen hooks that leave `<name>-<event>` in the project when they run (the box lets a step write there)."""
    return {event: [{"hooks": [{"type": "command", "command": f"touch {project}/{name}-{event}"}]}]
            for event in ("UserPromptSubmit", "Stop")}


@pytest.fixture
def qwen(cli_home: Path) -> Iterator[Cli]:
    yield from serving(NEW_CLIS["qwen"](cli_home))


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_a_step_runs_the_projects_qwen_hooks_not_the_persons_global_ones(ws: Workspace, qwen: Cli,
                                                                         sandbox: str) -> None:
    """The person's ~/.qwen/settings.json (with comments, as qwen allows) has hooks, as a ralph-style Stop
    hook would be: a step's qwen does not run them, in kiro's box or not; the project's
    .qwen/settings.json hooks run. The person's other settings still apply (their temperature reaches
    the model), and their file is not changed."""
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: qwen\n")
    project = ws.root
    user = qwen.tmp / "qwen-home" / ".qwen" / "settings.json"
    settings = {**json.loads(user.read_text()), "hooks": hooks(project, "global"),
                "model": {"generationConfig": {"samplingParams": {"temperature": 0.123}}}}
    user.write_text("// the person's own settings\n" + json.dumps(settings, indent=2))
    before = user.read_text()
    ws.write(".qwen/settings.json", json.dumps({"hooks": hooks(project, "project")}))
    r = ws.kiro("loop", "start", "--task", TASK, "--sandbox", sandbox, env=ws.env(**qwen.env()), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = sorted(p.name for p in project.iterdir() if p.name.startswith(("global-", "project-")))
    assert isinstance(qwen.server, fc.FakeChat)
    temperatures = {c.body.get("temperature") for c in qwen.server.calls()}
    print(f"sandbox {sandbox}: hook markers {ran}, temperatures sent {temperatures}")
    assert ran == ["project-Stop", "project-UserPromptSubmit"], ran
    assert temperatures == {0.123}, temperatures
    assert user.read_text() == before  # the person's file is theirs


@pytest.mark.parametrize(("text", "expect"), [
    ("It will reset at 2026-08-29 23:59:59 +0800 CST. We recommend", "2026-08-29T15:59:59+00:00"),
    ("limit resets at 2026-11-27T10:00:00Z", "2026-11-27T10:00:00+00:00"),
    ("resets on 2026-11-27T10:00:00.250-05:00", "2026-11-27T15:00:00+00:00"),
    ("Please wait and try again later.", None),
    ("reset at 2026-13-40 10:00:00Z", None),
])
def test_a_reset_time_stated_in_a_providers_message(text: str, expect: str | None) -> None:
    from kiro.executors.agents import reset_said

    when = reset_said(text)
    assert (when.isoformat() if when else None) == expect


@pytest.mark.parametrize(("message", "limited"), [
    ("You've hit your rate limit. Please wait for your limit to reset", True),
    ("You've reached your weekly rate limit. Learn More (https://docs.github.com/copilot/concepts/rate-limits).", True),
    ("You've run out of your included AI credits for the month. Manage budget: https://github.com/settings/copilot/"
     "features", True),
    ("You've reached your additional usage limit for your plan. Go to https://github.com/settings/copilot/features "
     "for more details.", True),
    ("You've reached the spending limit for this session. Start a new session to continue.", False),
    ("Authentication failed with provider", False),
])
def test_copilot_reads_githubs_own_limit_messages(message: str, limited: bool) -> None:
    """GitHub Copilot's limits (not the custom provider's) cannot be pointed at 127.0.0.1: these are the
    messages its runtime holds (strings of its runtime.node), in the `session.error` its JSON output
    prints; the spending limit of one session is not a window (the next attempt is a new session)."""
    from kiro.executors import agents

    error = {"type": "session.error", "data": {"errorType": "rate_limit", "message": message}}
    stdout = json.dumps(error) + "\n" + json.dumps({"type": "result", "exitCode": 1}) + "\n"
    found = agents.get("copilot").usage_limit(stdout, "")
    assert (found is not None and found.kind == "usage_limit" and found.line == message.splitlines()[0]) == limited
