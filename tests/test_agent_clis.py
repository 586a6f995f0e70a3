"""The agent presets with the REAL Claude Code and Codex CLIs (installed from npm), pointed at scripted
API servers on 127.0.0.1 that speak their wire protocols (tests/fakes): Anthropic Messages with SSE
for claude, OpenAI Responses with SSE for codex. kiro runs them as a user would: `kiro loop start
--agent NAME`. A CLI that is not installed makes its tests SKIP with the reason (never pass).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiro.processes import sandbox
from tests.agent_clis import CLIS, CODEX_PRICE, Cli, task_text
from tests.conftest import FAST_CONFIG, Workspace
from tests.fakes import anthropic as fa
from tests.fakes import responses as fr

TASK = "Specs/feature/tasks.md"


@pytest.fixture(params=sorted(CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[Cli]:
    agent = CLIS[request.param](cli_home)
    if not agent.installed:
        pytest.skip(agent.skip_reason())
    agent.start()
    yield agent
    agent.close()


def configure(ws: Workspace, cli: Cli, extra: str = "", loop: str = "") -> None:
    """The workspace config: fast backoff, the agent, codex's price; `loop` adds autonomous_loop keys."""
    text = (FAST_CONFIG + loop + f"agent: {cli.name}\n" + (CODEX_PRICE if cli.name == "codex" else "")
            + extra)
    ws.write("config/autonomous_loop.yaml", text)


def run(ws: Workspace, cli: Cli, *args: str, timeout: float = 240) -> tuple[int, str]:
    env = ws.env(**cli.env(), KIRO_RAISE_ERRORS="1")
    r = ws.kiro("loop", "start", "--task", TASK, *args, env=env, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def test_three_steps_complete_with_tokens_and_cost_in_usage(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(3))
    configure(ws, cli)
    code, out = run(ws, cli, "--agent", cli.name)
    assert code == 0, out
    done = ws.root / "Done" / "feature" / "tasks.md"
    assert done.read_text().count("- [x]") == 3, done.read_text()
    tid = ws.only_task_id()
    state = ws.state(tid)
    usage = state["usage"]
    calls = cli.calls()
    per_call = cli.input_tokens + cli.output_tokens
    # every model call the CLI made is counted: the fake served `calls` agent calls of 120 tokens
    assert usage["total_tokens"] == calls * per_call, (usage, calls)
    assert usage["prompt_tokens"] == calls * cli.input_tokens
    assert usage["cost_usd"] > 0, usage
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2", "3"]
    for step in ("1", "2", "3"):  # each attempt's full output is kept
        log = (ws.root / "Logs" / tid / f"{step}-1.log").read_text()
        assert f"agent: {cli.name}" in log and "## stdout" in log
    print(f"{cli.name}: 3 steps, {calls} model calls, usage {usage}")


@pytest.mark.parametrize(("limit", "value"), [("max_total_tokens", "200"), ("max_cost_usd", "0.0005")])
def test_a_token_or_cost_budget_stops_the_loop_with_exit_4(ws: Workspace, cli: Cli, limit: str, value: str) -> None:
    ws.task(task_text(3))
    configure(ws, cli, f"guardrails:\n  {limit}: {value}\n")
    code, out = run(ws, cli)
    assert code == 4, out
    state = ws.state(ws.only_task_id())
    assert state["stop_reason"] == limit
    spent = state["usage"]["total_tokens" if limit == "max_total_tokens" else "cost_usd"]
    assert spent >= float(value), state["usage"]
    assert [c["step_id"] for c in state["completed_steps"]] == ["1"]  # the first step's usage spent it
    assert f"{limit} {value} reached" in out


def test_token_budget_per_hour_makes_the_loop_wait(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(3))
    configure(ws, cli, "guardrails:\n  token_budget_per_hour: 100\n")
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(**cli.env(), KIRO_RAISE_ERRORS="1"))
    try:
        tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop to start")
        ws.wait_for(lambda: ws.state(tid)["status"] == "sleeping", timeout=120, what="the loop to sleep")
        waits = [e for e in ws.events(tid) if e["event"] == "guardrail_triggered"]
        assert waits and waits[-1]["limit"] == "token_budget_per_hour" and waits[-1]["action"] == "wait", waits
        assert [c["step_id"] for c in ws.state(tid)["completed_steps"]] == ["1"]
        ws.write(f".hooks/stop_autonomous_loop_{tid}.md", "enough\n")
        assert proc.wait(timeout=60) == 3, ws.output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_dead_endpoint_ends_the_attempt_by_the_idle_timeout(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(1))
    assert cli.server is not None
    cli.server.hang = True  # accepts the connection, never answers
    configure(ws, cli, "step_idle_timeout_seconds: 10\n", loop="  failure_threshold: 1\n")
    code, out = run(ws, cli)
    assert code == 5, out
    state = ws.state(ws.only_task_id())
    error = state["steps"]["1"]["last_error"]
    assert "printed nothing for 10 s" in error and "step_idle_timeout_seconds" in error, error
    assert len(cli.server.requests) >= 1  # it did reach the endpoint


USAGE_ERRORS = {
    "claude": ("claude -p --output-format stream-json --no-such-flag", "error: unknown option '--no-such-flag'"),
    "codex": ("codex exec --full-auto --json -", "error: unexpected argument '--full-auto' found"),
}


def test_a_usage_error_ends_the_run_with_exit_1_and_the_clis_own_line(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(2))
    command, line = USAGE_ERRORS[cli.name]
    configure(ws, cli, f"executor_command: {json.dumps(command)}\n")
    code, out = run(ws, cli)
    assert code == 1, out
    assert line in out, out
    assert "usage error" in out and "--help" in out
    tid = ws.only_task_id()
    logs = sorted(p.name for p in (ws.root / "Logs" / tid).iterdir())
    assert logs == ["1-1.log"], logs  # one attempt: no backoff retries of a command line that cannot work
    assert "- [-] 1." in (ws.root / TASK).read_text() or "- [ ] 1." in (ws.root / TASK).read_text()


def test_a_refused_api_key_ends_the_run_with_exit_1_saying_what_to_fix(ws: Workspace, cli: Cli) -> None:
    """Out of the box both CLIs retry a 401 with backoff for minutes; kiro ends the attempt at the
    first retry event and the run with exit 1."""
    ws.task(task_text(1))
    cli.default_retries()
    cli.error = (fa.error(401, "invalid x-api-key") if cli.name == "claude"
                 else fr.error(401, "Incorrect API key provided: sk-test-key."))
    configure(ws, cli)
    code, out = run(ws, cli)
    assert code == 1, out
    assert "auth error" in out and "API key" in out, out
    assert "401" in out
    assert len(cli.server.requests) <= 3, len(cli.server.requests)  # not the CLI's 5-10 retries


def test_a_rate_limit_is_a_failed_attempt_that_the_loop_retries(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(1))
    cli.error, cli.error_times = ((fa.error(429, "Number of request tokens has exceeded your per-minute rate limit"), 1)
                                 if cli.name == "claude" else (fr.error(429, "Rate limit reached for gpt-5-codex"), 1))
    configure(ws, cli)
    code, out = run(ws, cli)
    assert code == 0, out
    state = ws.state(ws.only_task_id())
    first = state["failed_steps"][0]["error"].splitlines()[0]
    assert first.startswith("agent rate limited"), first
    assert "429" in first or "Rate limit" in first, first
    assert state["completed_steps"][0]["attempts"] == 2


def test_executor_command_running_the_cli_keeps_the_presets_parser(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(1))
    command = {"claude": "claude -p --output-format json --permission-mode acceptEdits --allowedTools Read,Edit",
               "codex": "codex exec --json --sandbox workspace-write --skip-git-repo-check -"}[cli.name]
    configure(ws, cli, f"executor_command: {json.dumps(command)}\n")
    code, out = run(ws, cli)
    assert code == 0, out
    tid = ws.only_task_id()
    if cli.name == "codex" and sandbox.unusable() is None:  # in kiro's box, codex's own gives way (CodexPreset)
        command = command.replace("workspace-write", "danger-full-access")
    assert f"# command: {command}" in (ws.root / "Logs" / tid / "1-1.log").read_text()
    assert ws.state(tid)["usage"]["total_tokens"] == cli.calls() * (cli.input_tokens + cli.output_tokens)


def test_an_agent_that_writes_kiros_control_files_is_undone_and_fails(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(3))
    hooks, state_dir, task = ws.root / ".hooks", ws.root / ".state", ws.root / TASK
    if cli.name == "claude":
        cli.extra = [("Write", {"file_path": str(hooks / "evil.sh"), "content": "rm -rf /\n"}),
                     ("Write", {"file_path": str(state_dir / "injected.json"), "content": "{}\n"}),
                     ("Read", {"file_path": str(task)}),
                     ("Edit", {"file_path": str(task), "old_string": "- [ ] 3. Write part 3",
                               "new_string": "- [x] 3. Write part 3"})]
    else:
        cli.extra = [("exec_command", {"cmd": f"echo 'rm -rf /' > {hooks}/evil.sh && echo '{{}}' > "
                                              f"{state_dir}/injected.json && sed -i 's/- \\[ \\] 3\\./- [x] 3./' "
                                              f"{task}"})]
    # sandbox: off: this is the put-back kiro does where no box refuses the writes (with the box they fail
    # at once: tests/test_sandbox.py)
    configure(ws, cli, "sandbox: off\n", loop="  failure_threshold: 1\n")
    code, out = run(ws, cli)
    assert code == 5, out
    assert not (hooks / "evil.sh").exists()
    assert not (state_dir / "injected.json").exists()
    text = task.read_text()
    assert "- [ ] 3. Write part 3" in text and "- [x]" not in text, text
    error = ws.state(ws.only_task_id())["steps"]["1"]["last_error"]
    assert ".hooks/evil.sh (created; removed)" in error, error
    assert ".state/injected.json (created; removed)" in error, error
    assert "Specs/feature/tasks.md lines other than the step's box" in error, error
    print(f"{cli.name}: tried .hooks/evil.sh, .state/injected.json, step 3's box: 3 of 3 undone and reported")


def test_kiro_agents_lists_installed_cli_version_and_command(ws: Workspace, cli: Cli) -> None:
    configure(ws, cli)
    r = ws.kiro("agents", "--json", env=ws.env(**cli.env()))
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    row = rows[cli.name]
    assert row["installed"] is True and row["selected"] is True
    assert row["version"] and any(ch.isdigit() for ch in row["version"])
    assert row["command"].startswith(f"{cli.program} ")
    assert os.path.basename(row["path"]) == cli.program
