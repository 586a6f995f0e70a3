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
from typing import Any

import pytest

from kiro.processes import sandbox
from tests.agent_clis import CLIS, CODEX_PRICE, Cli, listed_agents, made_early, serving, task_text
from tests.agent_clis_acp import dead_early, dead_run
from tests.conftest import FAST_CONFIG, Workspace
from tests.fakes import anthropic as fa
from tests.fakes import responses as fr

TASK = "Specs/feature/tasks.md"


@pytest.fixture(params=sorted(CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[Cli]:
    yield from serving(CLIS[request.param](cli_home))


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
    # the cost so far, where a person watches: each step's line, the status table, the dashboard's rows
    spent = [line for line in out.splitlines() if "✓" in line and " so far" in line]
    assert len(spent) == 3, out
    assert spent[-1].endswith(f"${usage['cost_usd']:.4f} so far"), (spent, usage)
    table = ws.kiro("loop", "status").stdout.splitlines()
    assert "COST" in table[0].split() and f"${usage['cost_usd']:.4f}" in table[1].split(), table
    assert json.loads(ws.kiro("loop", "status", "--json").stdout)[0]["cost"] == f"${usage['cost_usd']:.4f}"
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


DEAD_IDLE = {"claude": 10, "codex": 10}


@made_early("dead-claude-codex", dead_early("dead-claude-codex", CLIS, configure, DEAD_IDLE))
@pytest.mark.parametrize("name", sorted(CLIS))
def test_dead_endpoint_ends_the_attempt_by_the_idle_timeout(name: str,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    run = dead_run(name, "dead-claude-codex", CLIS, configure, DEAD_IDLE, tmp_path_factory.mktemp("dead"))
    run.assert_ended_by_the_idle_timeout()
    # issue #38 item 17: a dead endpoint printed nothing for 170 s; now the silence is said while it lasts
    print("said while silent:", [line for line in run.out.splitlines() if "has printed nothing" in line])
    assert run.silent and all(e["agent"] == name and e["seconds"] >= run.seconds / 4 for e in run.silent), run.silent
    assert f"{name} has printed nothing for" in run.out, run.out


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
    tid = ws.only_task_id()  # the cause where people look, not only in `logs`: status and the dashboard
    status = ws.kiro("loop", "status", "--task-id", tid).stdout
    cause = next((ln for ln in status.splitlines() if ln.strip().startswith("Cause:")), "")
    assert "auth error" in cause and f"Logs/{tid}/1-1.log" in cause, status
    assert "auth error" in (ws.root / "Dashboard.md").read_text()


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
                     ("Read", {"file_path": "{task}"}),
                     ("Edit", {"file_path": "{task}", "old_string": "- [ ] 3. Write part 3",
                               "new_string": "- [x] 3. Write part 3"})]
    else:
        cli.extra = [("exec_command", {"cmd": f"echo 'rm -rf /' > {hooks}/evil.sh && echo '{{}}' > "
                                              f"{state_dir}/injected.json && sed -i 's/- \\[ \\] 3\\./- [x] 3./' "
                                              "{task}"})]
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
    # step 3's box, checked in the task file the agent was given (its copy), never reaches the task file
    assert "the task file: lines other than the step's box (line 8 of its copy; not taken" in error, error
    print(f"{cli.name}: tried .hooks/evil.sh, .state/injected.json, step 3's box: 3 of 3 undone and reported")


def test_kiro_agents_lists_installed_cli_version_and_command(ws: Workspace, cli: Cli) -> None:
    configure(ws, cli)
    row = listed_agents(ws, ws.env(**cli.env()), cli.name)[0][cli.name]
    assert row["installed"] is True and row["selected"] is True
    assert row["version"] and any(ch.isdigit() for ch in row["version"])
    assert row["command"].startswith(f"{cli.program} ")
    assert os.path.basename(row["path"]) == cli.program


def test_verbose_shows_each_tool_call_of_the_agent_as_it_happens(ws: Workspace, cli: Cli) -> None:
    """`-v` prints the agent's tool calls while its step runs (claude's stream-json `tool_use` blocks,
    codex's `item.started`), and they are `tool_called` events in the log (`logs --follow`, the
    dashboard), one short line each, the API key a call carries cut. The model's next answer after the
    watched call is held back until its line is seen, so the line cannot have come from the step's end."""
    import threading

    ws.task(task_text(1))
    configure(ws, cli)
    assert cli.server is not None
    key = cli.env()["ANTHROPIC_API_KEY" if cli.name == "claude" else "OPENAI_API_KEY"]
    # a tool call that carries the API key: its line and event show it cut
    cli.extra = [("Grep", {"pattern": key})] if cli.name == "claude" else [("exec_command", {"cmd": f"echo {key}"})]
    gate = threading.Event()
    brain = cli.server.brain  # type: ignore[attr-defined]

    def held(rec: Any) -> Any:
        answered = (len(fa.tool_results(rec.body)) if cli.name == "claude" and fa.is_agent_call(rec.body)
                    else len(fr.outputs(rec.body)) if cli.name == "codex" else 0)
        if answered > len(cli.extra):  # after the keyed call and the tool call the test watches for
            gate.wait(90)
        return brain(rec)

    cli.server.brain = held  # type: ignore[attr-defined]
    tool, shown = {"claude": ("Read", "Specs/feature/tasks.md"), "codex": ("edit", "Specs/feature/tasks.md")}[cli.name]
    proc = ws.spawn("loop", "start", "--task", TASK, "-v", env=ws.env(**cli.env(), KIRO_RAISE_ERRORS="1"))
    try:
        line = ws.wait_for(lambda: next((ln for ln in ws.output(proc).splitlines() if f"   {tool} " in ln), None),
                           timeout=120, what=f"the {tool} call's line")
        assert shown in line, line
        tid = ws.only_task_id()
        called = [e for e in ws.events(tid) if e["event"] == "tool_called"]
        assert any(e["tool"] == tool and shown in e["arguments"] for e in called), called
        assert "✓" not in ws.output(proc)  # the step still runs: the model has not answered yet
        gate.set()
        assert proc.wait(timeout=120) == 0, ws.output(proc)
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
    logs = ws.kiro("loop", "logs", "--task-id", tid)
    assert f"   {tool} " in logs.stdout, logs.stdout
    keyed = [e for e in ws.events(tid) if e["event"] == "tool_called" and "[REDACTED]" in e["arguments"]]
    assert keyed, ws.events(tid)
    for text in (ws.output(proc), logs.stdout, (ws.root / "Logs" / f"{tid}.jsonl").read_text()):
        assert key not in text
    print(f"{cli.name}: `-v` showed {line.strip()!r} while the step ran")


def test_a_failed_run_shows_its_cause_and_the_whole_log_path_where_people_look(ws: Workspace, cli: Cli) -> None:
    """The agent tries a file that is not there, then says it is done without checking its box. The
    failure names what the CLI reported (claude's failed tool result, codex's failed command), and
    `status --task-id` (80 columns), the status rows and Dashboard.md show the cause with the attempt
    log's path whole, also for a task id long enough to push it past column 80."""
    ws.task(task_text(1))
    configure(ws, cli, loop="  failure_threshold: 1\n")
    assert cli.server is not None
    missing = "/nonexistent/kiro-missing-file.md"

    def claude(rec: Any) -> Any:
        if not fa.is_agent_call(rec.body):
            return fa.Turn([fa.text("ok")])
        if not fa.tool_results(rec.body):
            return fa.Turn([fa.tool_use("Read", {"file_path": missing})])
        return fa.Turn([fa.text("All done.")])

    def codex(rec: Any) -> Any:
        if not fr.outputs(rec.body):
            return fr.Reply([fr.function_call("exec_command", {"cmd": f"cat {missing}"})])
        return fr.Reply([fr.message("All done.")])

    cli.server.brain = claude if cli.name == "claude" else codex  # type: ignore[attr-defined]
    tid = "overnight_run_of_the_greeting_feature_with_a_long_descriptive_task_id_" + cli.name
    code, out = run(ws, cli, "--task-id", tid)
    assert code == 5, out
    log = f"Logs/{tid}/1-1.log"
    error = ws.state(tid)["steps"]["1"]["last_error"]
    assert f"{cli.program} reported: " in error and "kiro-missing-file.md" in error.split("reported: ")[1], error
    assert log in error, error
    assert f"full output: {log}" in out  # the step's line gives the log a line of its own, whole
    r = ws.kiro("loop", "status", "--task-id", tid, env=ws.env(COLUMNS="80"))
    cause = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("Cause:"))
    assert "reported: " in cause and log in cause, r.stdout
    row = json.loads(ws.kiro("loop", "status", "--json").stdout)[0]
    assert row["task_id"] == tid and log in row["cause"] and "kiro-missing-file.md" in row["cause"], row
    dashboard = (ws.root / "Dashboard.md").read_text()
    assert log in dashboard, dashboard
    print(f"{cli.name}: {cause.strip()[:200]}")
