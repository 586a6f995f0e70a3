"""The ACP presets codex-acp and opencode-acp (kiro.executors.agents.codex_acp, .opencode_acp) with the
REAL adapters from npm, against the scripted API servers on 127.0.0.1 (tests/fakes): `codex-acp` on the
OpenAI Responses fake, `opencode acp` on the Chat Completions fake. kiro runs them as a user would
(`kiro loop start --agent codex-acp`). An adapter that is not installed makes its tests SKIP, saying
how to install it (.ci/install-agent-clis).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_clis import made_early, serving, task_text
from tests.agent_clis_acp import (
    TASK,
    SharedRun,
    configure,
    dead_early,
    dead_run,
    followed_run,
    kinds,
    run,
    shows_a_tool_call_while_the_step_ran,
)
from tests.agent_clis_codex_opencode_acp import ACP_MORE_CLIS, AcpMoreCli, CodexAcp, Held
from tests.conftest import Workspace
from tests.fakes import chat as fc
from tests.fakes import responses as fr


@pytest.fixture(params=sorted(ACP_MORE_CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[AcpMoreCli]:
    yield from serving(ACP_MORE_CLIS[request.param](cli_home))




def two_steps_run(name: str, base: Path) -> SharedRun:
    """One real two-step run per agent that two tests here and one of tests/test_agent_acp_modes.py read
    (tests/agent_clis_acp.followed_run): each step reads the task file before it checks the box, the second
    model call held while `kiro loop logs --follow` looks for that read, then finished."""
    return followed_run(name, ACP_MORE_CLIS[name], base, 2, "the read in `kiro loop logs --follow`",
                        extra=lambda cli, ws: [cli.read_call(str(ws.root / TASK))])


@pytest.fixture(scope="module", params=sorted(ACP_MORE_CLIS))
def two_steps(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    name = request.param
    return two_steps_run(name, tmp_path_factory.mktemp(f"two-steps-{name}"))


def test_two_steps_complete(two_steps: SharedRun) -> None:
    """Each step a session of its own (its own adapter process): two show it as well as more would."""
    code, out, ws = two_steps.code, two_steps.out, two_steps.ws
    assert code == 0, out
    done = ws.root / "Done" / "feature" / "tasks.md"
    assert done.read_text().count("- [x]") == 2, done.read_text()
    tid = ws.only_task_id()
    state = ws.state(tid)
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2"]
    usage = state["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0, usage
    assert usage["cost_usd"] > 0, usage
    events = ws.events(tid)
    edits = [e for e in kinds(events, "tool_called") if e.get("kind") == "edit" and e.get("status") == "completed"]
    # each edit is of the attempt's own copy of the task file (.state/steps/<loop>-<step>_<hash>/tasks.md): named in
    # the title (opencode: "Write <path>", cut at 120 characters) or, where the title is generic (codex-acp 2.6:
    # "Editing files"), in the event's arguments (the call's locations, relative to the project)
    shown = [f"{e['tool']} {e.get('arguments', '')}" for e in edits]
    assert len(edits) == 2 and all(".state/steps/" in s for s in shown), shown
    answers = kinds(events, "permission_answered")
    print(f"{two_steps.name}: 2 steps, {two_steps.calls} model calls, usage {usage}, {len(edits)} edits, "
          f"{len(answers)} permission answers")


def test_a_refused_write_to_state_or_outside_leaves_no_file_and_the_attempt_goes_on(ws: Workspace,
                                                                                    cli: AcpMoreCli) -> None:
    """Without kiro's box (`sandbox: off`: nothing but kiro's answers stands in the way) the agent tries to
    write `.state/x` and `../outside` with its own edit tool, then checks the box: both asked, both
    refused, neither written, and the same attempt goes on to finish the step."""
    ws.task(task_text(1))
    state_file, outside = ws.root / ".state" / "x", ws.root.parent / "outside"
    cli.extra = [cli.write_call(str(state_file), "forged\n"), cli.write_call(str(outside), "escaped\n")]
    configure(ws, cli, "sandbox: off\n", loop="  failure_threshold: 1\n")
    code, out = run(ws, cli)
    assert code == 0, out
    assert not state_file.exists() and not outside.exists()
    tid = ws.only_task_id()
    assert [p.name for p in (ws.root / "Logs" / tid).glob("1-*.log")] == ["1-1.log"], out  # one attempt
    refused = [a for a in kinds(ws.events(tid), "permission_answered") if not a["allowed"]]
    for path in (".state/x", str(outside)):
        assert any(path in " ".join(a["paths"]) for a in refused), (path, refused)
    print(f"{cli.name}: refused {[(a['kind'], a['paths'], a['reason']) for a in refused]}")


def test_a_tool_call_shows_in_logs_follow_while_the_step_still_runs(two_steps: SharedRun) -> None:
    shows_a_tool_call_while_the_step_ran(two_steps)


def test_a_stop_hook_mid_step_cancels_the_turn_and_resume_starts_that_step_again(ws: Workspace,
                                                                                 cli: AcpMoreCli) -> None:
    ws.task(task_text(1))
    configure(ws, cli)
    cli.extra = [cli.read_call(str(ws.root / TASK))]  # a tool call, then the model is held: the box is not checked
    cli.held = held = Held(at=2)
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(**cli.env()))
    try:
        assert held.reached.wait(120), ws.output(proc)
        tid = ws.only_task_id()
        asked = time.monotonic()
        ws.write(f".hooks/stop_autonomous_loop_{tid}.md", "stop now\n")
        assert proc.wait(timeout=60) == 3, ws.output(proc)
        seconds = time.monotonic() - asked
    finally:
        held.released.set()
        if proc.poll() is None:
            proc.kill()
    state = ws.state(tid)
    assert state["completed_steps"] == [] and state["current_step"]["step_id"] == "1", state["current_step"]
    log = (ws.root / "Logs" / tid / "1-1.log").read_text()
    assert "# result: cancelled" in log and '"method": "session/cancel"' in log, log[-2000:]
    ended = "the agent ended its turn (stopReason cancelled)" if '"stopReason": "cancelled"' in log else \
        "kiro ended the agent's process after the grace second"
    cli.held = None
    r = ws.kiro("loop", "resume", "--task-id", tid, env=ws.env(**cli.env()), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["step_id"] for c in ws.state(tid)["completed_steps"]] == ["1"]
    started = [e["step_id"] for e in kinds(ws.events(tid), "step_started")]
    assert started == ["1", "1"], started  # the resumed loop began with the step the hook cut short
    print(f"{cli.name}: the stop hook ended the loop {seconds:.2f} s after it was written; {ended}")


# The silence kiro counts begins at the agent's spawn and ends with its first word: `opencode acp` answers
# `initialize` only once it has started, 15-50 s after its spawn at load 12 (its first request came 56 s after
# `kiro loop start`, the ACP messages before it ending each silence), so 5 s always ended its first attempt before
# it reached the endpoint and the test ran a second one with 60 s. codex-acp answers within a few seconds when
# the machine is quiet, but at load 12 it took longer than 5 s and the test ran the 60 s retry: 10 s leaves room.
IDLE = {"codex-acp": 10, "opencode-acp": 30}


@made_early("dead-codex-opencode-acp", dead_early("dead-codex-opencode-acp", ACP_MORE_CLIS, configure, IDLE))
@pytest.mark.parametrize("name", sorted(ACP_MORE_CLIS))
def test_a_dead_endpoint_ends_the_attempt_by_the_idle_timeout(name: str,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    dead_run(name, "dead-codex-opencode-acp", ACP_MORE_CLIS, configure, IDLE,
             tmp_path_factory.mktemp("dead")).assert_ended_by_the_idle_timeout()


def test_codex_acp_with_an_api_key_and_no_login_is_authenticated_by_kiro(ws: Workspace, cli_home: Path) -> None:
    """codex-acp answers `session/new` with "Authentication required" until its client picks its `api-key`
    method; kiro does, when the key is set, and says at the start that the key is billed."""
    cli = CodexAcp(cli_home)
    for _ in serving(cli):
        cli.with_api_key_only()
        ws.task(task_text(1))
        configure(ws, cli)
        code, out = run(ws, cli)
        assert code == 0, out
        assert "codex-acp bills the API key in OPENAI_API_KEY" in out, out
        log = (ws.root / "Logs" / ws.only_task_id() / "1-1.log").read_text()
        assert '"method": "authenticate", "params": {"methodId": "api-key"}' in log, log[:3000]
        assert '"Authentication required"' in log  # what it said before kiro authenticated
        assert cli.calls() >= 2


def test_a_refused_api_key_ends_the_run_with_exit_1_saying_what_to_fix(ws: Workspace, cli: AcpMoreCli) -> None:
    """opencode passes the API's words on; codex-acp answers the turn with "Authentication required" and
    nothing of the API's (its App Server's 401, as it reports it over ACP)."""
    ws.task(task_text(1))
    make, said = (fr.error, "session/prompt: Authentication required") if cli.name == "codex-acp" else \
        (fc.error, "Incorrect API key provided")
    cli.error = make(401, "Incorrect API key provided: sk-test-key")
    configure(ws, cli)
    code, out = run(ws, cli)
    assert code == 1, out
    lines = [x for x in out.splitlines() if x.startswith("kiro:")]
    assert len(lines) == 1 and "auth error" in lines[0] and said in lines[0], out
    assert "sk-test-key" not in out
    assert sorted(p.name for p in (ws.root / "Logs" / ws.only_task_id()).iterdir()) == ["1-1.log"]  # not retried
    print(f"{cli.name}: {lines[0]}")


def test_codex_acp_out_of_the_box_runs_only_the_commands_tools_shell_allows(ws: Workspace, cli_home: Path) -> None:
    """With `sandbox: off` codex-acp runs commands in Codex's own read-only sandbox without asking kiro; kiro's
    hook (kiro.processes.codex_hook) puts `tools.shell` on them: `cat` on the allow-list runs and shows
    as a tool call; a planted ~/.ssh key read through a second line, `$(...)` or a program off the list is
    refused with kiro's reason, which is what the model reads."""
    cli = CodexAcp(cli_home)
    for _ in serving(cli):
        ws.task(task_text(1))
        key = cli.codex_home.parent / ".ssh" / "id_ed25519"  # its HOME
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text("PLANTED-SSH-KEY\n")
        tries = [f"cat {TASK}", f"cat {TASK}\ncat {key}", f"cat $(echo {key})", f"head {key}"]
        cli.extra = [("exec_command", {"cmd": c}) for c in tries]
        configure(ws, cli, "sandbox: off\ntools:\n  shell:\n    enabled: true\n    allow: [cat]\n")
        code, out = run(ws, cli)
        assert code == 0, out
        assert cli.server is not None
        said = [str(o.get("output")) for o in fr.outputs(cli.server.requests[-1].body)]  # the whole history
        assert not any("PLANTED-SSH-KEY" in s for s in said), said
        assert any("Write part 1 of the greeting" in s for s in said), said  # the allowed cat of the task file
        refusals = [s for s in said if "kiro refused this command" in s]
        assert len(refusals) == 3 and any("'head' is not on the allow-list" in s for s in refusals), said
        calls = kinds(ws.events(ws.only_task_id()), "tool_called")  # Codex calls its `cat` a read
        assert any(TASK in f"{e['tool']} {e['arguments']}" for e in calls if e.get("kind") != "edit"), calls
        print(f"codex-acp out of the box: {len(refusals)} commands refused by kiro's hook, e.g. {refusals[-1][:160]}")
