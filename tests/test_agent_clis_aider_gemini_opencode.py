"""The agent presets with the REAL aider (PyPI aider-chat, its own venv), Gemini CLI and opencode
(npm), pointed at scripted API servers on 127.0.0.1 that speak their wire protocols (tests/fakes):
Chat Completions with SSE for aider and opencode, the Gemini API (`streamGenerateContent?alt=sse`)
for gemini. kiro runs them as a user would: `kiro loop start --agent NAME`. A CLI that is not
installed makes its tests SKIP with the reason (never pass). Tests that only read a successful run share
one per CLI and test run (`three_steps`): a start of aider or opencode costs ~9 s of CPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import PROMPT_RE, Cli, listed_agents, made_early, run_once, serving, task_text
from tests.agent_clis_acp import dead_early, dead_run
from tests.agent_clis_aider_gemini_opencode import GEMINI_PRICE, MORE_CLIS, PRICE_IN, PRICE_OUT, aider_token_lines
from tests.conftest import FAST_CONFIG, Workspace, new_cli_home, new_workspace
from tests.fakes import chat as fc
from tests.fakes import gemini as fg

TASK = "Specs/feature/tasks.md"


@pytest.fixture(params=sorted(MORE_CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[Cli]:
    yield from serving(MORE_CLIS[request.param](cli_home))


def configure(ws: Workspace, cli: Cli, extra: str = "", loop: str = "") -> None:
    """The workspace config: fast backoff, the agent, gemini's price; `loop` adds autonomous_loop keys.
    For aider the workspace becomes a git repository (aider's requirement; see the test below)."""
    text = FAST_CONFIG + loop + f"agent: {cli.name}\n" + (GEMINI_PRICE if cli.name == "gemini" else "") + extra
    ws.write("config/autonomous_loop.yaml", text)
    if cli.name == "aider" and not (ws.root / ".git").exists():
        git_init(ws.root)


def run(ws: Workspace, cli: Cli, *args: str, timeout: float = 400) -> tuple[int, str]:
    env = ws.env(**cli.env(), KIRO_RAISE_ERRORS="1")
    r = ws.kiro("loop", "start", "--task", TASK, *args, env=env, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def git_init(root: Path) -> None:
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


GREETING = "src/greeting.txt"


def writes_greeting(cli: Cli, target: Path) -> list[Any]:
    """The CLI's own edit tool writing a new file, `target` (GREETING in the project), with "Hello from the agent"."""
    if cli.name == "aider":  # a SEARCH/REPLACE block with an empty SEARCH makes a new file
        return [(GREETING, "", "Hello from the agent")]
    if cli.name == "gemini":
        return [("write_file", {"file_path": str(target), "content": "Hello from the agent\n"})]
    return [("write", {"filePath": str(target), "content": "Hello from the agent\n"})]


def in_step_1(cli: Cli, extra: list[Any]) -> None:
    """`extra` tool calls in step 1's model calls only (the CLI's later steps are new conversations that would
    repeat them): the model sees which step it is from the line kiro's prompt says to change."""
    assert cli.server is not None
    brain = cli.server.brain  # type: ignore[attr-defined]
    text = fg.user_text if cli.name == "gemini" else fc.user_text

    def step_1_only(rec: Any) -> Any:
        said = list(PROMPT_RE.finditer(text(rec.body)))
        cli.extra = extra if said and said[-1]["old"].startswith("- [-] 1. ") else []
        return brain(rec)

    cli.server.brain = step_1_only  # type: ignore[attr-defined]


@dataclass
class ThreeSteps:
    """One run of the CLI through a 3-step task whose first step also writes a new file (GREETING): what
    the two tests that read it need (`three_steps`)."""

    name: str
    ws: Workspace
    code: int
    out: str
    calls: int
    nodes: list[list[list[str]]]
    input_tokens: int
    output_tokens: int


def three_steps_run(name: str, base: Path) -> dict[str, Any]:
    home = new_cli_home()
    try:
        cli = MORE_CLIS[name](home)
        if not cli.installed:
            pytest.skip(cli.skip_reason())
        cli.start()
        try:
            ws = new_workspace(base / "vault")
            ws.task(task_text(3))
            in_step_1(cli, writes_greeting(cli, ws.root / GREETING))
            configure(ws, cli, loop="  failure_threshold: 1\n")
            code, out = run(ws, cli, "--agent", cli.name)
            return {"root": str(ws.root), "code": code, "out": out, "calls": cli.calls(), "nodes": cli.nodes,
                    "input_tokens": cli.input_tokens, "output_tokens": cli.output_tokens}
        finally:
            cli.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module", params=sorted(MORE_CLIS))
def three_steps(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ThreeSteps:
    """The two tests that only read a successful run share one per CLI (`run_once`: one in the test run,
    whichever workers they land on; a start of aider or opencode costs ~9 s of CPU)."""
    name = request.param
    made = run_once(f"three-steps-{name}", lambda: three_steps_run(name, tmp_path_factory.mktemp(f"three-{name}")))
    return ThreeSteps(name, Workspace(Path(made["root"])), made["code"], made["out"], made["calls"], made["nodes"],
                      made["input_tokens"], made["output_tokens"])


def test_three_steps_complete_with_tokens_and_cost_in_usage(three_steps: ThreeSteps) -> None:
    ws, cli, code, out, calls = three_steps.ws, three_steps, three_steps.code, three_steps.out, three_steps.calls
    assert code == 0, out
    done = ws.root / "Done" / "feature" / "tasks.md"
    assert done.read_text().count("- [x]") == 3, done.read_text()
    tid = ws.only_task_id()
    state = ws.state(tid)
    usage = state["usage"]
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2", "3"]
    logs = [(ws.root / "Logs" / tid / f"{step}-1.log").read_text() for step in ("1", "2", "3")]
    for log in logs:  # each attempt's full output is kept
        assert f"agent: {cli.name}" in log and "## stdout" in log
    if cli.name == "aider":
        # aider counts tokens itself (the stream carries no usage) and prints one line per model call:
        # what kiro recorded is what aider said, summed
        lines = [line for log in logs for line in aider_token_lines(log)]
        assert len(lines) == calls == 3, (lines, calls)
        assert all("Cost: $" in line for line in lines), lines
        session = sum(float(line.split("Cost: $")[1].split(" ")[0]) for line in lines)
        assert usage["cost_usd"] == pytest.approx(session, abs=1e-9), (usage, lines)
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert (ws.root / ".git").is_dir() and not list(ws.root.glob(".aider.chat*"))
    else:
        per_call = cli.input_tokens + cli.output_tokens
        assert usage["total_tokens"] == calls * per_call, (usage, calls)
        assert usage["prompt_tokens"] == calls * cli.input_tokens
        price = (calls * cli.input_tokens * PRICE_IN + calls * cli.output_tokens * PRICE_OUT) / 1e6
        assert usage["cost_usd"] == pytest.approx(price, rel=1e-6), usage
    if cli.name == "gemini":  # one node process at each model call: kiro tells it not to start a second copy of itself
        nodes = three_steps.nodes
        assert len(nodes) == calls and all(len(n) == 1 for n in nodes), nodes
    if cli.name in ("gemini", "opencode"):  # their JSON streams name each tool call: one event each
        called = [e for e in ws.events(tid) if e["event"] == "tool_called"]
        wrote = [e for e in called if GREETING in e["arguments"]]  # step 1's new file (the test below)
        checked = [e for e in called if e not in wrote]
        assert len(wrote) == 1, called
        assert len(checked) >= 3 and all("Specs/feature/tasks.md" in e["arguments"] for e in checked), called
    print(f"{cli.name}: 3 steps, {calls} model calls, usage {usage}")


def test_max_total_tokens_stops_the_loop_with_exit_4(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(3))
    configure(ws, cli, "guardrails:\n  max_total_tokens: 100\n")
    code, out = run(ws, cli)
    assert code == 4, out
    state = ws.state(ws.only_task_id())
    assert state["stop_reason"] == "max_total_tokens"
    assert state["usage"]["total_tokens"] >= 100
    assert [c["step_id"] for c in state["completed_steps"]] == ["1"]  # the first step's tokens spent it
    assert "max_total_tokens 100 reached" in out


# Long enough for each CLI's silent start-up on a busy machine (opencode prints nothing before its first
# model call finishes); the step timeout is far away. kiro counts the silence from the spawn (SPEC: "printed
# nothing for that long"), so the test lasts at least this long and cannot be shorter than the start-up.
# Measured from spawn to the CLI's first request (load 7-13 on 2 cores, 2026-11-29): opencode 15-54 s, silent
# all along; aider 24-32 s, its banner at ~6 s; gemini 12-21 s, its first line just before the request. A start
# slower than that is tried once more with 60 s (tests/agent_clis_acp.dead_run).
IDLE = {"aider": 30, "gemini": 30, "opencode": 60}


@made_early("dead-aider-gemini-opencode", dead_early("dead-aider-gemini-opencode", MORE_CLIS, configure, IDLE))
@pytest.mark.parametrize("name", sorted(MORE_CLIS))
def test_dead_endpoint_ends_the_attempt_by_the_idle_timeout(name: str,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    dead_run(name, "dead-aider-gemini-opencode", MORE_CLIS, configure, IDLE,
             tmp_path_factory.mktemp("dead")).assert_ended_by_the_idle_timeout()


# a flag the CLI does not have, and the line the CLI itself prints about it
USAGE_ERRORS = {
    "aider": ("--bogus-flag", "aider: error: unrecognized arguments: --bogus-flag"),
    "gemini": ("--bogus-flag", "Unknown arguments: bogus-flag"),
    "opencode": ("--bogus-flag", "opencode printed its usage text (opencode run [message..])"),
}


def test_a_usage_error_ends_the_run_with_exit_1_and_the_clis_own_line(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(2))
    flag, line = USAGE_ERRORS[cli.name]
    configure(ws, cli, f"agent_args: [{json.dumps(flag)}]\n")
    code, out = run(ws, cli)
    assert code == 1, out
    assert line in out, out
    assert "usage error" in out
    tid = ws.only_task_id()
    logs = sorted(p.name for p in (ws.root / "Logs" / tid).iterdir())
    first = (ws.root / "Logs" / tid / "1-1.log").read_text()[-3000:]
    assert logs == ["1-1.log"], (logs, first)  # one attempt: no retries of a command line that cannot work
    assert "- [x]" not in (ws.root / TASK).read_text()


REFUSED_KEY = {
    "aider": (lambda: fc.error(401, "Incorrect API key provided: sk-test-***-key."), "AuthenticationError"),
    "gemini": (lambda: fg.error(400, "API key not valid. Please pass a valid API key.", "API_KEY_INVALID"),
               "API key not valid"),
    "opencode": (lambda: fc.error(401, "Incorrect API key provided: sk-test-***-key."), "Incorrect API key"),
}


def test_a_refused_api_key_ends_the_run_with_exit_1_saying_what_to_fix(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(1))
    make, said = REFUSED_KEY[cli.name]
    cli.error = make()
    configure(ws, cli)
    code, out = run(ws, cli)
    assert code == 1, out
    assert "auth error" in out and said in out, out
    tid = ws.only_task_id()
    assert sorted(p.name for p in (ws.root / "Logs" / tid).iterdir()) == ["1-1.log"]  # not retried


def test_an_agent_that_writes_kiros_control_files_is_undone_and_fails(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(3))
    hooks, state_dir, task = ws.root / ".hooks", ws.root / ".state", ws.root / TASK
    if cli.name == "aider":  # new files by SEARCH/REPLACE blocks with an empty SEARCH, step 3 by another
        cli.extra = [(".hooks/evil.sh", "", "rm -rf /"), (".state/injected.json", "", "{}"),
                     ("{task}", "- [ ] 3. Write part 3 of the greeting", "- [x] 3. Write part 3 of the greeting")]
    elif cli.name == "gemini":
        cli.extra = [("write_file", {"file_path": str(hooks / "evil.sh"), "content": "rm -rf /\n"}),
                     ("write_file", {"file_path": str(state_dir / "injected.json"), "content": "{}\n"}),
                     ("replace", {"file_path": "{task}", "old_string": "- [ ] 3. Write part 3",
                                  "new_string": "- [x] 3. Write part 3", "instruction": "check 3"})]
    else:
        cli.extra = [("write", {"filePath": str(hooks / "evil.sh"), "content": "rm -rf /\n"}),
                     ("write", {"filePath": str(state_dir / "injected.json"), "content": "{}\n"}),
                     ("read", {"filePath": "{task}"}),
                     ("edit", {"filePath": "{task}", "oldString": "- [ ] 3. Write part 3",
                               "newString": "- [x] 3. Write part 3"})]
    # sandbox: off: this is the put-back kiro does where no box refuses the writes (with the box they fail
    # at once: tests/test_sandbox.py)
    configure(ws, cli, "sandbox: off\n", loop="  failure_threshold: 1\n")
    code, out = run(ws, cli)
    assert code == 5, out
    assert not (hooks / "evil.sh").exists()
    assert not (state_dir / "injected.json").exists()
    text = task.read_text()
    assert "- [ ] 3. Write part 3" in text and "- [x]" not in text, text
    tid = ws.only_task_id()
    error = ws.state(tid)["steps"]["1"]["last_error"]
    if cli.name == "aider":  # kiro's first loop put its folders in .git/info/exclude: aider keeps out of them itself
        log = (ws.root / "Logs" / tid / "1-1.log").read_text()
        assert "Skipping edits to .hooks/evil.sh that matches gitignore spec" in log, log
        assert "Skipping edits to .state/injected.json that matches gitignore spec" in log, log
    else:
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
    assert Path(row["path"]).name == cli.program


def test_aider_outside_a_git_repository_is_refused_saying_how_to_fix_it(ws: Workspace, cli_home: Path) -> None:
    """Without a repository aider roots itself at the task file's folder (Specs/feature/), so the
    agent's files would land there; kiro does not start it and says what to do."""
    cli = MORE_CLIS["aider"](cli_home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    cli.start()
    try:
        ws.task(task_text(1))
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: aider\n")
        code, out = run(ws, cli)
    finally:
        cli.close()
    assert code == 1, out
    assert "aider needs the project in a git repository" in out and "git init" in out, out
    assert cli.calls() == 0
    assert not (ws.root / ".git").exists()  # nobody ran `git init` behind the person's back
    assert "- [x]" not in (ws.root / TASK).read_text()


def test_aider_retries_a_server_error_itself_and_the_step_still_counts(ws: Workspace, cli_home: Path) -> None:
    """aider prints an API error and retries it; when a later call answers, the attempt is not a failure
    (aider exits 0 either way, so kiro reads which came last)."""
    cli = MORE_CLIS["aider"](cli_home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    server = cli.start()
    answer = cli.brain  # type: ignore[attr-defined]
    seen = []

    def flaky(rec: Any) -> Any:
        seen.append(rec)
        # the first three 500s: the openai client inside litellm retries twice on its own, then aider
        # prints the error and retries the call itself
        return fc.error(500, "The server had an error while processing your request.") if len(seen) <= 3 \
            else answer(rec)

    assert isinstance(server, fc.FakeChat)
    server.brain = flaky
    try:
        ws.task(task_text(1))
        configure(ws, cli)
        code, out = run(ws, cli)
    finally:
        cli.close()
    assert code == 0, out
    log = next((ws.root / "Logs").glob("*/1-1.log")).read_text()
    assert "litellm.InternalServerError" in log and "Retrying in" in log, log[-2000:]
    assert len(seen) == 4
    tid = ws.only_task_id()
    assert sorted(p.name for p in (ws.root / "Logs" / tid).iterdir()) == ["1-1.log"]  # one attempt, not failed


def test_a_new_file_the_agent_writes_lands_in_the_project(three_steps: ThreeSteps) -> None:
    """The step's work is a new file in the project (the common case), written by the CLI's own edit
    tool, and the box checked: the step completes with the file in place (step 1 of the shared run, which
    stops at the first failed attempt)."""
    ws = three_steps.ws
    assert three_steps.code == 0, three_steps.out
    assert (ws.root / GREETING).read_text().strip() == "Hello from the agent"
    assert ws.state(ws.only_task_id())["completed_steps"][0]["step_id"] == "1"
