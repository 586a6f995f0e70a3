"""The qwen and copilot presets with the REAL Qwen Code (npm @qwen-code/qwen-code) and GitHub Copilot
CLI (npm @github/copilot), pointed at the scripted Chat Completions server on 127.0.0.1
(tests/fakes/chat.py) by OPENAI_BASE_URL and COPILOT_PROVIDER_BASE_URL, as
tests/test_agent_clis_aider_gemini_opencode.py
does for aider, gemini and opencode: three steps with usage, a dead endpoint, a bad flag, a refused
key, a server error, and `kiro agents`. A CLI that is not installed makes its tests SKIP saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_clis import Cli, listed_agents, made_early, serving, task_text
from tests.agent_clis_acp import configure as acp_configure
from tests.agent_clis_acp import dead_early, dead_run
from tests.agent_clis_qwen_copilot import NEW_CLIS, PRICE_IN, PRICE_OUT, QWEN_PRICE, Copilot
from tests.conftest import FAST_CONFIG, Workspace
from tests.fakes import chat as fc

TASK = "Specs/feature/tasks.md"
KEY = {"qwen": "OPENAI_API_KEY", "copilot": "COPILOT_PROVIDER_API_KEY"}
# a flag the CLI does not have, the line the CLI prints about it
BAD_FLAG = {"qwen": "Unknown arguments: bogus-flag", "copilot": "error: unexpected argument '--bogus-flag' found"}
REFUSED = {"qwen": "Incorrect API key", "copilot": "Authentication failed with provider"}


@pytest.fixture(params=sorted(NEW_CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[Cli]:
    yield from serving(NEW_CLIS[request.param](cli_home))


def configure(ws: Workspace, cli: Cli, extra: str = "", loop: str = "") -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + loop + f"agent: {cli.name}\n" + QWEN_PRICE + extra)


def run(ws: Workspace, cli: Cli, *args: str, timeout: float = 300) -> tuple[int, str]:
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
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2", "3"]
    calls = cli.calls()
    assert isinstance(cli.server, fc.FakeChat)
    # copilot's stdout has no tokens: kiro reads its session's usage records, side calls (a title) included
    counted = len(cli.server.calls()) if cli.name == "copilot" else calls
    assert usage["api_calls"] == counted >= calls >= 3, (usage, calls)
    assert usage["total_tokens"] == counted * (cli.input_tokens + cli.output_tokens), (usage, counted)
    assert usage["prompt_tokens"] == counted * cli.input_tokens
    price = (counted * cli.input_tokens * PRICE_IN + counted * cli.output_tokens * PRICE_OUT) / 1e6
    assert usage["cost_usd"] == pytest.approx(price, rel=1e-6), usage
    assert f"agent {cli.name} bills the API key in {KEY[cli.name]}" in out, out
    if cli.name == "qwen":  # its entry's node process and the CLI's at each call: kiro tells it not to start a third
        assert len(cli.nodes) == calls and all(len(nodes) == 2 for nodes in cli.nodes), cli.nodes
    if isinstance(cli, Copilot):  # in kiro's box it runs from the package it unpacked before, not a new copy
        seen = cli.package_seen
        assert len(seen) == calls and all(each and all(each) for each in seen), seen
    print(f"{cli.name}: 3 steps, {calls} model calls, usage {usage}")


# Long enough for each CLI's silent start-up on a lightly loaded machine (kiro counts the silence from the spawn,
# so the test lasts at least this long); a start slower than that is tried once more with 60 s
# (tests/agent_clis_acp.dead_run).
IDLE = {"qwen": 15, "copilot": 10}


@made_early("dead-qwen-copilot", dead_early("dead-qwen-copilot", NEW_CLIS, acp_configure, IDLE))
@pytest.mark.parametrize("name", sorted(NEW_CLIS))
def test_dead_endpoint_ends_the_attempt_by_the_idle_timeout(name: str,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    dead_run(name, "dead-qwen-copilot", NEW_CLIS, acp_configure, IDLE,
             tmp_path_factory.mktemp("dead")).assert_ended_by_the_idle_timeout()


def test_a_usage_error_ends_the_run_with_exit_1_and_the_clis_own_line(ws: Workspace, cli: Cli) -> None:
    ws.task(task_text(2))
    configure(ws, cli, 'agent_args: ["--bogus-flag"]\n')
    code, out = run(ws, cli)
    assert code == 1, out
    assert BAD_FLAG[cli.name] in out and "usage error" in out, out
    tid = ws.only_task_id()
    assert sorted(p.name for p in (ws.root / "Logs" / tid).iterdir()) == ["1-1.log"]  # not retried
    assert "- [x]" not in (ws.root / TASK).read_text()


def test_a_refused_api_key_ends_the_run_with_exit_1_saying_what_to_fix(ws: Workspace, cli: Cli) -> None:
    """qwen 0.24 ends the run with its own error record (is_error, "[API Error: 401 ...]", exit 1): an auth error."""
    ws.task(task_text(1))
    cli.error = fc.error(401, "Incorrect API key provided: sk-test-***-key.", "invalid_api_key")
    configure(ws, cli)
    code, out = run(ws, cli)
    assert code == 1, out
    assert "auth error" in out and REFUSED[cli.name] in out and "401" in out, out
    tid = ws.only_task_id()
    assert sorted(p.name for p in (ws.root / "Logs" / tid).iterdir()) == ["1-1.log"]  # not retried


def test_a_server_error_is_a_failed_attempt_not_a_success(ws: Workspace, cli: Cli) -> None:
    """qwen 0.24 ends the run with its own error record ("[API Error: 400 ...]", exit 1): no completed step."""
    ws.task(task_text(1))
    cli.error = fc.error(400, "This model's maximum context length is 8192 tokens.", "context_length_exceeded")
    configure(ws, cli, loop="  failure_threshold: 1\n")
    code, out = run(ws, cli)
    assert code == 5, out
    error = ws.state(ws.only_task_id())["steps"]["1"]["last_error"]
    if cli.name == "qwen":
        assert error.startswith("agent failed (exit 1): [API Error: 400") and "maximum context length" in error, error
    else:
        assert error.startswith("agent failed (exit 1): ") and "400" in error, error


def test_kiro_agents_lists_installed_cli_version_and_command(ws: Workspace, cli: Cli) -> None:
    configure(ws, cli)
    row = listed_agents(ws, ws.env(**cli.env()), cli.name)[0][cli.name]
    assert row["installed"] is True and row["selected"] is True
    assert row["version"] and any(ch.isdigit() for ch in row["version"])
    assert row["command"].startswith(f"{cli.program} ") and Path(row["path"]).name == cli.program
    assert row["credential"] == "api_key" and row["credential_source"].startswith(KEY[cli.name]), row
