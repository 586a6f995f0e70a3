"""An agent CLI's usage limit is a wait, not a failure (issue #29 items 1-2), with the REAL CLIs
pointed at scripted servers that answer as the real service does when a usage window is used up:

- Claude Code on a subscription (CLAUDE_CODE_OAUTH_TOKEN): HTTP 429 `rate_limit_error` with the
  `anthropic-ratelimit-unified-*` headers; the CLI prints a `rate_limit_event` (status rejected,
  resetsAt) and "You've hit your session limit · resets 6:27am (UTC)".
- Codex: HTTP 429 `usage_limit_reached` with `resets_at` / `resets_in_seconds`; the CLI prints
  "You've hit your usage limit. ... try again at 6:27 AM." (local time, minute precision).
- Gemini CLI: 429 RESOURCE_EXHAUSTED with QuotaFailure and RetryInfo; opencode and aider: a 429
  that outlasts their own retries.

The loop sleeps until the reset (status `sleeping`, `usage_limit`), wakes, and finishes with no
failure counted and no step run twice; a stop hook ends the wait; `max_limit_wait_seconds` caps
it (exit 4); `fallback_agents` carries on with the next agent. Windows are a few seconds long; no
assertion is about elapsed time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from kiro.executors import agents
from kiro.executors.command import RESET_MARGIN_SECONDS
from tests.agent_clis import CLIS, CODEX_PRICE, Cli, early, made_early, once_early, task_text
from tests.agent_clis_aider_gemini_opencode import MORE_CLIS
from tests.conftest import FAST_CONFIG, Workspace, new_cli_home
from tests.fakes import HttpError, Recorded
from tests.fakes import anthropic as fa
from tests.fakes import chat as fc
from tests.fakes import gemini as fg
from tests.fakes import responses as fr

TASK = "Specs/feature/tasks.md"
OAUTH = "sk-ant-oat01-fake-subscription-token"


class Window:
    """A usage window on a fake: from the first request, for `seconds`, every request is answered
    with the service's limit answer for a reset at the window's end; then the model answers again.
    With `answers`, the window is that many requests instead (a provider whose reset the CLI learns from
    its Retry-After, not from the window: it lasts as long as the CLI's own retries, however slow they
    are on a loaded machine)."""

    def __init__(self, seconds: float, limit: Callable[[float], HttpError], answers: int | None = None) -> None:
        self.seconds = seconds
        self.limit = limit
        self.answers = answers
        self.ends: float | None = None
        self.limited = 0
        self.lock = threading.Lock()

    def wrap(self, brain: Callable[[Recorded], Any]) -> Callable[[Recorded], Any]:
        def answer(rec: Recorded) -> Any:
            with self.lock:
                if self.ends is None:
                    self.ends = time.time() + self.seconds
                limited = time.time() < self.ends if self.answers is None else self.limited < self.answers
                self.limited += limited
            return self.limit(self.ends) if limited else brain(rec)
        return answer


def start(name: str, home: Path) -> Cli:
    home.mkdir(parents=True, exist_ok=True)
    cli = CLIS[name](home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    cli.start()
    return cli


def env_of(cli: Cli) -> dict[str, str]:
    """The CLI's environment; Claude Code on a subscription (a login token, not an API key): usage
    windows are a subscription's, and only then does it read the unified rate-limit headers."""
    env = cli.env()
    if cli.name == "claude":
        del env["ANTHROPIC_API_KEY"]
        env["CLAUDE_CODE_OAUTH_TOKEN"] = OAUTH
    return env


LIMITS: dict[str, Callable[[float], HttpError]] = {"claude": fa.usage_limit, "codex": fr.usage_limit}


def limit_window(cli: Cli, seconds: float) -> Window:
    window = Window(seconds, LIMITS[cli.name])
    assert cli.server is not None
    cli.server.brain = window.wrap(cli.server.brain)  # type: ignore[attr-defined]
    return window


@pytest.fixture(params=["claude", "codex"])
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[Cli]:
    agent = start(request.param, cli_home)
    yield agent
    agent.close()


def configure(ws: Workspace, cli: Cli, extra: str = "") -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"agent: {cli.name}\n" + CODEX_PRICE + extra)


def kiro_json(ws: Workspace, env: dict[str, str], *args: str) -> Any:
    r = ws.kiro(*args, "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_the_loop_sleeps_through_a_usage_limit_wakes_and_finishes_with_no_failure(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(2))
    configure(ws, cli)
    window = limit_window(cli, 2)
    env = ws.env(**env_of(cli))
    proc = ws.spawn("loop", "start", "--task", TASK, env=env)
    try:
        tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop to start")
        ws.wait_for(lambda: ws.state(tid)["status"] == "sleeping", timeout=120, what="the loop to sleep")
        progress = kiro_json(ws, env, "loop", "progress", "--task-id", tid)
        status = kiro_json(ws, env, "loop", "status", "--task-id", tid)
        print("progress --json while limited:", {k: progress[k] for k in ("status", "sleeping_because",
                                                                         "sleep_until", "sleep_note")})
        assert code_of(proc, 180) == 0, ws.output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert progress["status"] == "sleeping" and progress["sleeping_because"] == "usage_limit", progress
    assert progress["sleep_note"].startswith(f"{cli.name} limit, resumes "), progress
    assert progress["sleep_until"], progress
    row = status[0] if isinstance(status, list) else status
    assert row["status"] == "sleeping" and row["sleep_note"] == progress["sleep_note"], row
    state = ws.state(tid)
    assert state["status"] == "completed"
    assert state["total_failures"] == 0 and state["failed_steps"] == [], state["failed_steps"]
    assert [(c["step_id"], c["attempts"], c["agent"]) for c in state["completed_steps"]] == \
        [("1", 1, cli.name), ("2", 1, cli.name)]  # each step once, on its first attempt
    events = ws.events(tid)
    limits = [e for e in events if e["event"] == "usage_limit"]
    assert limits and all(e["agent"] == cli.name and e["step_id"] == "1" for e in limits), limits
    assert window.ends is not None
    if cli.name == "claude":  # the exact reset it gave (resetsAt); codex prints the minute only
        assert limits[0]["resets_at"].startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(window.ends)))
    else:
        assert limits[0]["resets_at"] is not None
    assert [e["step_id"] for e in events if e["event"] == "step_started"] == ["1", "2"]  # no step started twice
    waits = [e for e in events if e["event"] == "guardrail_triggered"]
    assert waits and all(w["limit"] == "usage_limit" and w["figure"] == cli.name for w in waits), waits
    ran = [(e["step_id"], e["outcome"]) for e in events if e["event"] == "agent_ran"]
    assert ran[-2:] == [("1", "completed"), ("2", "completed")] and ("1", "usage_limit") in ran, ran
    # issue #38 item 10: what was slept is said (wait_ended) and counted by stats; step 1's duration leaves it out
    slept = [e["seconds"] for e in events if e["event"] == "wait_ended" and e["limit"] == "usage_limit"]
    assert slept and all(not e.get("stopped_by") for e in events if e["event"] == "wait_ended"), events
    began = next(e["ts"] for e in events if e["event"] == "step_started" and e["step_id"] == "1")
    done = next(e for e in events if e["event"] == "step_completed" and e["step_id"] == "1")
    wall = (datetime.fromisoformat(done["ts"]) - datetime.fromisoformat(began)).total_seconds()
    print(f"step 1: {wall:.3f} s from start to done, {sum(slept):.3f} s of it asleep, duration "
          f"{done['duration_seconds']} s")
    assert abs(done["duration_seconds"] - (wall - sum(slept))) < sum(slept) / 2, (done, wall, slept)  # on main: ~wall
    assert state["completed_steps"][0]["duration_seconds"] == done["duration_seconds"]
    stats = kiro_json(ws, env, "loop", "stats")
    assert abs(stats["waiting_seconds"]["usage_limits"] - sum(slept)) < 0.01, stats["waiting_seconds"]
    assert stats["steps"]["failed"] == 0 and stats["steps"]["success_rate"] == 1.0, stats["steps"]
    log = (ws.root / "Logs" / tid / "1-1.log").read_text()  # the limited run's own output is kept
    assert "# failure: usage_limit" in log, log[:2000]
    print(f"{cli.name}: {window.limited} limited answers, then done; limit said: {limits[0]['message']!r}")


def code_of(proc: Any, timeout: float) -> int:
    return int(proc.wait(timeout=timeout))


def test_a_stop_hook_ends_the_wait_for_a_usage_limit(ws: Workspace, cli_home: Path) -> None:
    cli = start("claude", cli_home)
    try:
        ws.task(task_text(1))
        configure(ws, cli)
        limit_window(cli, 3600)
        proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(**env_of(cli)))
        try:
            tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop to start")
            ws.wait_for(lambda: ws.state(tid)["status"] == "sleeping", timeout=120, what="the loop to sleep")
            board = ws.root / "Dashboard.md"  # the dashboard says whose limit and when it resumes
            ws.wait_for(lambda: board.exists() and "(claude limit, resumes " in board.read_text(), timeout=30,
                        what="Dashboard.md to show the limit")
            shown = ws.kiro("loop", "status", "--task-id", tid, env=ws.env(**env_of(cli)))
            assert "usage_limit" in shown.stdout and "claude limit, resumes" in shown.stdout, shown.stdout
            began = time.monotonic()
            ws.write(f".hooks/stop_autonomous_loop_{tid}.md", "enough\n")
            code = code_of(proc, 60)
            print(f"the loop ended {time.monotonic() - began:.2f} s after the stop hook was written")
        finally:
            if proc.poll() is None:
                proc.kill()
        assert code == 3, ws.output(proc)
        state = ws.state(tid)
        assert state["status"] == "paused" and state["total_failures"] == 0, state  # a stop hook pauses
        assert "- [ ] 1." in (ws.root / TASK).read_text()
        # issue #38 item 10: a planned wait a stop ended early counts only what was slept
        ended = [e for e in ws.events(tid) if e["event"] == "wait_ended"]
        print("wait_ended:", ended)
        assert [e["limit"] for e in ended] == ["usage_limit"] and ended[0]["stopped_by"] == "stop_hook", ended
        assert ended[0]["seconds"] < ended[0]["planned"], ended
        stats = kiro_json(ws, ws.env(**env_of(cli)), "loop", "stats")
        assert abs(stats["waiting_seconds"]["usage_limits"] - ended[0]["seconds"]) < 0.01, stats["waiting_seconds"]
    finally:
        cli.close()


def test_a_reset_beyond_max_limit_wait_seconds_ends_the_loop_with_exit_4(ws: Workspace, cli_home: Path) -> None:
    cli = start("claude", cli_home)
    try:
        ws.task(task_text(1))
        configure(ws, cli, "max_limit_wait_seconds: 600\n")
        limit_window(cli, 3 * 3600)
        r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**env_of(cli)), timeout=180)
        assert r.returncode == 4, r.stdout + r.stderr
        state = ws.state(ws.only_task_id())
        assert state["stop_reason"] == "max_limit_wait_seconds" and state["total_failures"] == 0, state
        stops = [e for e in ws.events(state["task_id"]) if e["event"] == "guardrail_triggered"]
        assert stops and stops[-1]["limit"] == "max_limit_wait_seconds" and stops[-1]["action"] == "stop", stops
        assert "max_limit_wait_seconds 600" in r.stdout + r.stderr
    finally:
        cli.close()


def test_fallback_agents_finish_the_task_while_the_first_is_limited(ws: Workspace, cli_home: Path) -> None:
    claude = start("claude", cli_home / "claude")
    codex = start("codex", cli_home / "codex")
    try:
        ws.task(task_text(2))
        configure(ws, claude, "fallback_agents: [codex]\n")
        limit_window(claude, 3600)
        env = ws.env(**{**codex.env(), **env_of(claude)})  # HOME: claude's; codex reads CODEX_HOME
        r = ws.kiro("loop", "start", "--task", TASK, env=env, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        tid = ws.only_task_id()
        state = ws.state(tid)
        assert state["total_failures"] == 0
        assert [(c["step_id"], c["attempts"], c["agent"]) for c in state["completed_steps"]] == \
            [("1", 1, "codex"), ("2", 1, "codex")]
        events = ws.events(tid)
        ran = [(e["step_id"], e["agent"], e["outcome"]) for e in events if e["event"] == "agent_ran"]
        assert ran == [("1", "claude", "usage_limit"), ("1", "codex", "completed"), ("2", "codex", "completed")], ran
        limits = [e for e in events if e["event"] == "usage_limit"]
        assert [(e["agent"], e["fallback"]) for e in limits] == [("claude", "codex")], limits
        assert not [e for e in events if e["event"] == "guardrail_triggered"]  # no sleep: codex was there
        stats = kiro_json(ws, env, "loop", "stats")
        by_agent = stats["by_agent"]
        assert by_agent["claude"]["usage_limits"] == 1 and by_agent["claude"]["completed"] == 0, by_agent
        assert by_agent["codex"]["completed"] == 2 and by_agent["codex"]["prompt_tokens"] > 0, by_agent
        print("stats by agent:", by_agent)
    finally:
        claude.close()
        codex.close()


def test_the_step_goes_back_to_the_first_agent_when_its_window_resets(ws: Workspace, cli_home: Path) -> None:
    """Claude limited for 2 s: step 1 goes to codex; its verify command waits until claude's window and
    kiro's margin after the reset (RESET_MARGIN_SECONDS) have passed, by a file the test writes half a second
    after them (outside the box's HOME and /tmp: the box shows it read-only), so step 2 is claude's again.
    Step 2's verify finds the file there at once. The reset is the one kiro read (its `usage_limit` event),
    or the moment kiro noted the limit when the CLI took longer than the window to say it."""
    claude = start("claude", cli_home / "claude")
    codex = start("codex", cli_home / "codex")
    passed = cli_home / "window-and-margin-passed"
    try:
        ws.task(task_text(2))
        configure(ws, claude, f"fallback_agents: [codex]\nverify: \"until [ -e {passed} ]; do sleep 0.2; done\"\n")
        window = limit_window(claude, 2)
        assert claude.server is not None
        server = claude.server

        def limit_noted() -> dict[str, Any] | None:
            return next((e for e in ws.events(ws.only_task_id()) if e["event"] == "usage_limit"), None)

        def mark() -> None:
            try:
                server.wait_until(lambda: window.ends, timeout=240, what="claude's first request")
                noted = ws.wait_for(limit_noted, timeout=240, what="kiro to note claude's limit")
                # kiro's `until`: the later of the reset and its clock when it noted the limit (before the event)
                until = max(datetime.fromisoformat(noted["resets_at"] or noted["ts"]),
                            datetime.fromisoformat(noted["ts"])).timestamp()
                time.sleep(max(0.0, until + RESET_MARGIN_SECONDS + 0.5 - time.time()))  # a time to come, not a race
            finally:
                passed.touch()  # (on a failure here too: step 2 then is codex's, and the test says so)

        threading.Thread(target=mark, daemon=True).start()
        env = ws.env(**{**codex.env(), **env_of(claude)})
        r = ws.kiro("loop", "start", "--task", TASK, env=env, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        state = ws.state(ws.only_task_id())
        assert [(c["step_id"], c["agent"]) for c in state["completed_steps"]] == [("1", "codex"), ("2", "claude")]
        assert state["total_failures"] == 0
    finally:
        claude.close()
        codex.close()


# -- recognition from the real output of gemini, opencode and aider ------------------------------


def run_cli(name: str, home: Path, error: HttpError) -> tuple[agents.Failure | None, str, float]:
    """Run the real CLI by its preset's command line against its fake answering `error`; what the
    preset reads from its output, the output, and when it ran."""

    cli = {**MORE_CLIS, **CLIS}[name](home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    cli.error = error
    cli.start()
    vault = home / "vault"
    vault.mkdir(exist_ok=True)
    subprocess.run(["git", "init", "-q", str(vault)], check=True)  # aider works in a git repository
    try:
        preset = agents.get(name)
        inv = agents.Invocation(vault / "prompt.md", vault / "tasks.md", "1", vault)
        (vault / "prompt.md").write_text("Say hello.\n")
        env = {**os.environ, **env_of(cli), **preset.env(inv)}
        began = time.time()
        done = subprocess.run(preset.argv(inv), input="Say hello.\n", capture_output=True, text=True, env=env,
                              cwd=vault, timeout=240)
    finally:
        cli.close()
    failure = preset.classify_failure(done.returncode, done.stdout, done.stderr)
    assert failure is not None, done.stdout[-2000:]
    limit = failure if failure.kind == "usage_limit" else preset.usage_limit(done.stdout, done.stderr)
    return limit, done.stdout + done.stderr, began


def test_gemini_quota_with_a_retry_delay_is_a_usage_limit_with_its_reset(cli_home: Path) -> None:
    limit, out, began = run_cli("gemini", cli_home, fg.quota(3600))
    assert limit is not None and limit.kind == "usage_limit", out[-2000:]
    assert "exceeded your current quota" in limit.line
    assert limit.resets_at is not None and 3590 < limit.resets_at.timestamp() - began < 3700, limit
    print("gemini:", limit)


def test_gemini_daily_quota_is_a_usage_limit_without_a_reset_time(cli_home: Path) -> None:
    limit, out, _ = run_cli("gemini", cli_home, fg.quota(20, per="Day"))
    assert limit is not None and limit.kind == "usage_limit", out[-2000:]
    assert "exhausted your daily quota" in limit.line and limit.resets_at is None, limit


def test_opencode_429_that_outlasts_its_retries_is_a_usage_limit_at_its_retry_after(cli_home: Path) -> None:
    """opencode retries a 429 five times itself, each after the server's retry-after (`retry-after-ms`, 100
    here, before `retry-after`, 1), then prints the error with the response headers."""
    error = fc.error(429, "Rate limit reached for requests", "rate_limit_exceeded", retry_after_ms=100)
    limit, out, began = run_cli("opencode", cli_home, error)
    assert limit is not None and limit.kind == "usage_limit", out[-2000:]
    assert "Rate limit reached" in limit.line and limit.resets_at is not None, limit
    assert began < limit.resets_at.timestamp() < time.time() + 5, limit
    print("opencode:", limit)


def test_opencode_waiting_hours_inside_its_own_retry_is_a_usage_limit_wait_at_once(ws: Workspace,
                                                                                   cli_home: Path) -> None:
    """A 429 with a retry-after of 2 hours: opencode would sleep through it inside its own retry, silent,
    until kiro's idle timeout failed the attempt. kiro's plugin prints opencode's retry status as it
    starts; kiro ends the attempt then and sleeps until the time opencode would have tried again."""
    cli = MORE_CLIS["opencode"](cli_home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    error = fc.error(429, "Rate limit reached for requests", "rate_limit_exceeded")
    error.headers["retry-after"] = "7200"
    cli.error = error
    cli.start()
    try:
        ws.task(task_text(1))
        configure(ws, cli, "step_idle_timeout_seconds: 60\n")
        env = ws.env(**cli.env())
        began = time.time()
        proc = ws.spawn("loop", "start", "--task", TASK, env=env)
        try:
            tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop to start")
            ws.wait_for(lambda: ws.state(tid)["status"] in ("sleeping", "failed"), timeout=150,
                        what="the loop to sleep")
            progress = kiro_json(ws, env, "loop", "progress", "--task-id", tid)
            print("progress --json:", {k: progress.get(k) for k in ("status", "sleeping_because", "sleep_note")})
            ws.write(f".hooks/stop_autonomous_loop_{tid}.md", "enough\n")
            code = code_of(proc, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        cli.close()
    assert progress["status"] == "sleeping" and progress["sleeping_because"] == "usage_limit", progress
    assert progress["sleep_note"].startswith("opencode limit, resumes "), progress
    assert code == 3, ws.output(proc)
    state = ws.state(tid)
    assert state["total_failures"] == 0, state["steps"]
    limits = [e for e in ws.events(tid) if e["event"] == "usage_limit"]
    assert len(limits) == 1 and limits[0]["agent"] == "opencode", limits
    resets = datetime.fromisoformat(limits[0]["resets_at"]).timestamp()
    assert began + 7100 < resets < time.time() + 7300, limits  # when opencode would have tried again
    assert "Rate limit reached" in limits[0]["message"], limits
    assert cli.calls() == 1  # kiro ended it at its first retry
    log = (ws.root / "Logs" / tid / "1-1.log").read_text()
    assert '"session.status"' in log and "# failure: usage_limit" in log, log[-2000:]
    print("opencode said, and kiro slept on:", limits[0]["message"])


def aider_rate_limit() -> dict[str, Any]:
    """aider's run on a provider that answers every request with a rate limit (made early: see the test)."""
    home = new_cli_home()
    try:
        error = fc.error(429, "Rate limit reached for requests", "rate_limit_exceeded", retry_after_ms=100)
        limit, out, _ = run_cli("aider", home, error)
    except pytest.skip.Exception as skipped:
        return {"skip": str(skipped)}
    except BaseException:
        return {"failed": traceback.format_exc()}
    finally:
        shutil.rmtree(home, ignore_errors=True)
    resets_at = limit and limit.resets_at and limit.resets_at.isoformat()
    return {"limit": None if limit is None else [limit.kind, limit.line, resets_at], "out": out[-2000:]}


@made_early("aider-rate-limit", once_early("aider-rate-limit", aider_rate_limit))
def test_aider_rate_limit_after_its_own_retries_is_a_usage_limit() -> None:
    """aider retries a RateLimitError itself, then prints it (no reset time). (A used-up balance, "check
    your plan and billing", is left a failed attempt: it does not reset.)

    aider 0.86's schedule is its own and fixed: 8 retries 0.25 s to 32 s apart (coders/base_coder.py
    `retry_delay`, doubling until it passes models.RETRY_TIMEOUT, 60 s; no option or variable sets it, and
    it ignores the server's Retry-After): ~64 s of its sleeps this test cannot shorten, so its run begins in
    the background as soon as a worker has collected the tests (`made_early`) and sleeps while the workers
    run others. Inside each of its 9 tries, litellm's OpenAI client retries twice more after the server's
    retry hint, or after its own backoff (~0.5 s, ~1 s) without one: the provider's shortest hint (100 ms)
    keeps that to 0.2 s."""
    answer = early("aider-rate-limit", aider_rate_limit)
    limit, out = answer["limit"], answer["out"]
    assert limit is not None, out
    kind, line, resets_at = limit
    assert kind == "usage_limit" and resets_at is None, out
    assert line.startswith("litellm.RateLimitError"), limit
    print("aider:", limit)


def test_claude_on_an_api_key_429_stays_a_rate_limit(cli_home: Path) -> None:
    """An API key's 429 is a rate limit the CLI and the loop retry, not a subscription's window."""
    cli = CLIS["claude"](cli_home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    preset = agents.get("claude")
    cli.error = fa.usage_limit(time.time() + 3600)
    cli.start()
    try:
        env = {**os.environ, **cli.env()}
        done = subprocess.run(["claude", "-p", "--output-format", "stream-json", "--verbose"], input="hi",
                              capture_output=True, text=True, env=env, cwd=cli_home, timeout=120)
    finally:
        cli.close()
    assert preset.usage_limit(done.stdout, done.stderr) is None, done.stdout[-1500:]
    failure = preset.classify_failure(done.returncode, done.stdout, done.stderr)
    assert failure is not None and failure.kind == "rate_limit", failure


@pytest.mark.parametrize(("text", "expect"), [
    ("6:27 AM", (6, 27)), ("11:05 PM", (23, 5)), ("12:00 AM", (0, 0)), ("Nov 30th, 2026 6:27 AM", (6, 27)),
])
def test_codex_reset_times_read_in_local_time(text: str, expect: tuple[int, int]) -> None:
    when = agents.local_clock(text)
    assert when is not None and (when.hour, when.minute) == expect
    if "Nov" in text:
        assert (when.year, when.month, when.day) == (2026, 11, 30)
    assert agents.local_clock("later") is None


@pytest.mark.parametrize(("frontmatter", "expect"), [
    ({"agent": "claude", "fallback_agents": ["codex", "gemini"]}, None),
    ({"agent": "claude", "fallback_agents": ["claude"]}, "'claude' is named twice"),
    ({"fallback_agents": "codex"}, "Input should be a valid list"),
    ({"fallback_agents": ["cursor"]}, "fallback_agents.0: Input should be"),
    ({"executor": "openai", "fallback_agents": ["codex"]}, "run by the command executor"),
])
def test_fallback_agents_in_a_task_frontmatter(tmp_path: Path, frontmatter: dict[str, Any], expect: str | None) -> None:
    from kiro.errors import ConfigError
    from kiro.store.config import resolve_config

    def resolve() -> Any:
        return resolve_config(workspace_root=tmp_path, frontmatter=frontmatter, task_path=tmp_path / "tasks.md",
                              env={})

    if expect is None:
        assert resolve().fallback_agents == ["codex", "gemini"]
        return
    with pytest.raises(ConfigError) as caught:
        resolve()
    assert expect in str(caught.value), caught.value


def test_the_run_time_limit_ends_a_usage_limit_wait_as_timed_out_not_failed(ws: Workspace, cli_home: Path) -> None:
    cli = start("claude", cli_home)
    try:
        ws.task(task_text(1))
        configure(ws, cli)
        limit_window(cli, 3600)
        # the run-time limit counts from the loop's start: 5 s leaves the CLI's start (~1 s) a margin before the
        # wait; a loaded machine may take longer to start it and have it meet the limit: then the time ran out
        # before the limit's wait, and it is tried once more, afresh, with 30 s
        for attempt, seconds in enumerate((5, 30)):
            tid = f"limited{attempt}"
            asked = len(cli.server.requests)
            r = ws.kiro("loop", "start", "--task", TASK, "--task-id", tid, "--timeout", str(seconds),
                        *(("--fresh",) if attempt else ()), env=ws.env(**env_of(cli)), timeout=180)
            if [e for e in ws.events(tid) if e["event"] == "usage_limit"]:
                break
            print(f"claude did not meet its limit within {seconds} s of the loop's start (a slow start): again")
        state = ws.state(tid)
        assert state["status"] == "timed_out" and state["total_failures"] == 0, (r.returncode, state["status"])
        assert [e for e in ws.events(tid) if e["event"] == "usage_limit"], "the time ran out before the limit's wait"
        asked = len(cli.server.requests) - asked
        assert asked <= 3, asked  # no calls spun while the time ran out
    finally:
        cli.close()


@pytest.mark.parametrize(("given", "kept"), [
    (None, {}),
    ('{"share": "disabled", "plugin": ["my-plugin"]}', {"share": "disabled", "plugin": ["my-plugin"]}),
    ('{"model": "fake/x"}', {"model": "fake/x"}),
])
def test_opencode_gets_kiros_retry_plugin_beside_the_persons_own_config_content(
        monkeypatch: pytest.MonkeyPatch, given: str | None, kept: dict[str, Any]) -> None:
    from kiro.executors.agents.opencode import PLUGIN

    if given is None:
        monkeypatch.delenv("OPENCODE_CONFIG_CONTENT", raising=False)
    else:
        monkeypatch.setenv("OPENCODE_CONFIG_CONTENT", given)
    preset = agents.get("opencode")
    env = preset.env(agents.Invocation(Path("p.md"), Path("t.md"), "1", Path(".")))
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert config["plugin"] == [*kept.get("plugin", []), PLUGIN.as_uri()] and PLUGIN.is_file()
    assert {k: v for k, v in config.items() if k != "plugin"} == {k: v for k, v in kept.items() if k != "plugin"}
    assert PLUGIN in preset.read_paths({})  # readable in the box wherever kiro is installed
