"""ACP agents (kiro.executors.acp) with the REAL adapters from npm, against the scripted API servers on
127.0.0.1 (tests/fakes): `claude-agent-acp` on the Anthropic Messages fake, `gemini --acp` on the Gemini
fake. kiro runs them as a user would (`kiro loop start --agent claude-acp`). An adapter that is not
installed makes its tests SKIP, saying how to install it (.ci/install-agent-clis).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import early, made_early, once_early, serving, task_text
from tests.agent_clis_acp import (
    ACP_CLIS,
    TASK,
    ClaudeAcp,
    GeminiAcp,
    Held,
    SharedRun,
    configure,
    dead_early,
    dead_run,
    descendants,
    followed_run,
    kinds,
    run,
    shared_run,
    shows_a_tool_call_while_the_step_ran,
)
from tests.agent_clis_aider_gemini_opencode import GEMINI_PRICE
from tests.conftest import FAST_CONFIG, Workspace, new_cli_home, new_workspace

AcpCli = ClaudeAcp | GeminiAcp

@pytest.fixture(params=sorted(ACP_CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[AcpCli]:
    yield from serving(ACP_CLIS[request.param](cli_home))




def gemini_nodes(proc: Any) -> list[str]:
    """Gemini CLI's node processes under the loop's process (`kiro loop start`) while its step runs."""
    return [" ".join(argv) for argv in descendants(proc.pid) if argv[0].rsplit("/", 1)[-1] == "node"
            and "--acp" in argv and any(a.rsplit("/", 1)[-1] == "gemini" for a in argv)]


def two_steps_run(name: str, base: Path) -> SharedRun:
    """One real two-step run per agent that two tests here and one of tests/test_agent_acp_modes.py read
    (tests/agent_clis_acp.followed_run): its second model call held while `kiro loop logs --follow` looks for
    the tool call, then finished."""
    return followed_run(name, ACP_CLIS[name], base, 2, "a tool call in `kiro loop logs --follow`",
                        while_held=gemini_nodes if name == "gemini-acp" else None)


@pytest.fixture(scope="module", params=sorted(ACP_CLIS))
def two_steps(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    name = request.param
    return two_steps_run(name, tmp_path_factory.mktemp(f"two-steps-{name}"))


def test_two_steps_complete_with_tool_calls_and_permissions_as_events(two_steps: SharedRun) -> None:
    """Each step a session of its own (its own adapter process): two show it as well as more would."""
    name, code, out, ws = two_steps.name, two_steps.code, two_steps.out, two_steps.ws
    assert code == 0, out
    done = ws.root / "Done" / "feature" / "tasks.md"
    assert done.read_text().count("- [x]") == 2, done.read_text()
    tid = ws.only_task_id()
    state = ws.state(tid)
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2"]
    usage = state["usage"]
    calls = two_steps.calls
    # each step's turn reports its model calls' tokens (claude-code 2.1.332 sometimes makes one more call of
    # its own, with the agent's tools, that its turn does not count: at most one a step)
    assert usage["prompt_tokens"] >= (calls - 2) * two_steps.input_tokens and usage["completion_tokens"] > 0, \
        (usage, calls)
    assert usage["cost_usd"] > 0, usage
    events = ws.events(tid)
    edits = [e for e in kinds(events, "tool_called") if e.get("kind") == "edit"]
    assert len([e for e in edits if e.get("status") == "completed"]) == 2, edits
    assert all("tasks.md" in f"{e['tool']} {e['arguments']}" for e in edits), edits
    answers = kinds(events, "permission_answered")
    assert answers and all(a["allowed"] for a in answers), answers
    log = (ws.root / "Logs" / tid / "1-1.log").read_text()
    assert f"agent: {name}" in log and '"method": "session/prompt"' in log and "Checked the box" in log
    print(f"{name}: 2 steps, {calls} model calls, usage {usage}, {len(edits)} edit events, "
          f"{len(answers)} permission answers")


def test_a_tool_call_shows_in_logs_follow_while_the_step_still_runs(two_steps: SharedRun) -> None:
    """...and Gemini CLI runs as one node process: left to itself it starts a second one of itself under
    the first (kiro sets GEMINI_CLI_NO_RELAUNCH: kiro.executors.agents.acp), a third longer a step."""
    if two_steps.name == "gemini-acp":
        nodes = two_steps.seen["while_held"]
        print(f"gemini-acp: its node processes while the step runs: {nodes}")
        assert nodes is not None and len(nodes) == 1, nodes
    shows_a_tool_call_while_the_step_ran(two_steps)


SHELL_RULES = "tools:\n  shell:\n    enabled: true\n    allow: [ls]\n"
COMMANDS = ["touch pwned.txt", "ls; touch pwned2.txt", "ls -la"]
TODOS = [{"content": "Read the task file", "status": "completed", "activeForm": "Reading the task file"},
         {"content": "Check the box of step 1", "status": "in_progress", "activeForm": "Checking the box"}]


def guarded_run(name: str, sandbox: str, base: Path) -> SharedRun:
    """A one-step run (`shared_run`) whose agent first tries to write `.state/x` and `../outside.txt` (out of
    the project); in kiro's box, with `tools.shell` allowing `ls`, it then runs COMMANDS too, and claude-acp
    first writes its todo list (TODOS): the run the shell rules' test and the plan's test read as well."""
    shells = sandbox == "bwrap"

    def extra(cli: AcpCli, ws: Workspace) -> list[Any]:
        writes = [cli.write_call(str(ws.root / ".state" / "x"), "forged\n"),
                  cli.write_call(str(ws.root.parent / "outside.txt"), "escaped\n")]
        todos = [("TodoWrite", {"todos": TODOS})] if shells and isinstance(cli, ClaudeAcp) else []
        return todos + writes + ([cli.shell_call(c) for c in COMMANDS] if shells else [])

    return shared_run(f"guarded-{name}-{sandbox}", ACP_CLIS[name], base, 1,
                      f"sandbox: {sandbox}\n" + (SHELL_RULES if shells else ""), extra)


@pytest.fixture(scope="module", params=sorted(ACP_CLIS))
def acp_name(request: pytest.FixtureRequest) -> str:
    """An ACP agent's name, for tests that read a `shared_run` of it."""
    return str(request.param)


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_writes_to_kiros_state_or_outside_the_project_are_refused_and_the_attempt_goes_on(
        acp_name: str, sandbox: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = guarded_run(acp_name, sandbox, tmp_path_factory.mktemp(f"guarded-{acp_name}-{sandbox}"))
    ws = run.ws
    forged, outside = ws.root / ".state" / "x", ws.root.parent / "outside.txt"  # ../outside from the project
    assert run.code == 0, run.out
    assert not forged.exists() and not outside.exists()
    tid = ws.only_task_id()
    assert [c["step_id"] for c in ws.state(tid)["completed_steps"]] == ["1"]  # the attempt went on
    refused = [a for a in kinds(ws.events(tid), "permission_answered")
               if not a["allowed"] and a.get("kind") != "execute"]  # (the commands: the shell rules' test)
    by_kiro = {p for a in refused for p in a["paths"]}
    assert any(".state/x" in p for p in by_kiro), refused  # kiro refused it; the agent did not ask for less
    assert all("off limits" in a["reason"] or "outside the project" in a["reason"] for a in refused), refused
    held = "outside.txt refused by kiro" if any("outside.txt" in p for p in by_kiro) else \
        "outside.txt refused by the agent itself (it never asked)"
    print(f"{acp_name} (sandbox {sandbox}): 2 writes tried, 2 held; .state/x refused by kiro; {held}")


def _stop_mid_step(ws: Workspace, cli: AcpCli, how: str, *command: str) -> dict[str, Any]:
    """`kiro COMMAND` with its step's second model call held (after a tool call: the box is not checked), then
    stopped `how` (a stop hook, or `kiro loop stop --force`): what was seen, for the test of that stop."""
    before = set((ws.root / "Logs").rglob("1-*.log")) if (ws.root / "Logs").exists() else set()
    cli.held = held = Held(at=2)
    proc = ws.spawn(*command, env=ws.env(**cli.env()))
    seen: dict[str, Any] = {"reached": False, "stopped": None, "code": None}
    try:
        if held.reached.wait(120):
            seen["reached"] = True
            tid = ws.only_task_id()
            asked = time.monotonic()
            if how == "stop hook":
                ws.write(f".hooks/stop_autonomous_loop_{tid}.md", "stop now\n")
            else:
                stopped = ws.kiro("loop", "stop", "--task-id", tid, "--force")
                seen["stopped"] = [stopped.returncode, stopped.stdout + stopped.stderr]
            with contextlib.suppress(subprocess.TimeoutExpired):  # not ended: `code` stays None, the test says so
                seen["code"] = proc.wait(timeout=60)
            seen["seconds"] = time.monotonic() - asked
    finally:
        held.released.set()
        cli.held = None
        if proc.poll() is None:
            proc.kill()
    seen["out"] = ws.output(proc)
    if seen["reached"]:
        state = ws.state(tid)
        seen["completed"] = [c["step_id"] for c in state["completed_steps"]]
        seen["current"] = state["current_step"]["step_id"]
        logs = sorted(set((ws.root / "Logs" / tid).glob("1-*.log")) - before)
        seen["logs"] = [p.name for p in logs]
        seen["log"] = logs[-1].read_text() if logs else ""
        seen["started"] = [e["step_id"] for e in kinds(ws.events(tid), "step_started")]
    return seen


def _stopped_twice(ws: Workspace, cli: AcpCli) -> dict[str, Any]:
    """`kiro loop start` stopped mid-step by a stop hook; `kiro loop resume` stopped mid-step by `kiro loop stop
    --force`; `kiro loop resume` again, to the end. Each stop's run begins with an agent start of its own, and
    the resume after one stop is the run the next stop ends: three agent starts for the two stops' tests. A stop
    hook that did not end the loop ends the run there."""
    seen: dict[str, Any] = {"stop hook": _stop_mid_step(ws, cli, "stop hook", "loop", "start", "--task", TASK)}
    if seen["stop hook"].get("code") != 3:
        return {**seen, "code": None, "out": seen["stop hook"]["out"]}
    tid = ws.only_task_id()
    seen["stop --force"] = _stop_mid_step(ws, cli, "stop --force", "loop", "resume", "--task-id", tid)
    # resumed again whatever `--force` did (a loop it did not end was killed): the stop hook's test reads this run
    r = ws.kiro("loop", "resume", "--task-id", tid, env=ws.env(**cli.env()), timeout=240)
    state = ws.state(tid)
    return {**seen, "code": r.returncode, "out": r.stdout + r.stderr,
            "completed": [c["step_id"] for c in state["completed_steps"]],
            "started": [e["step_id"] for e in kinds(ws.events(tid), "step_started")]}


@pytest.fixture(scope="module", params=sorted(ACP_CLIS))
def stopped_twice(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    """One real one-step run per agent that both stop tests read (`shared_run`, `_stopped_twice`): stopped by a
    stop hook, resumed, stopped by `kiro loop stop --force`, resumed to the end."""
    name = request.param
    return shared_run(f"stopped-twice-{name}", ACP_CLIS[name], tmp_path_factory.mktemp(f"stopped-{name}"), 1,
                      extra=lambda cli, ws: [cli.read_call(str(ws.root / TASK))], body=_stopped_twice)


@pytest.mark.parametrize("how", ["stop hook", "stop --force"])
def test_a_stop_mid_step_cancels_the_turn_and_resume_starts_that_step_again(stopped_twice: SharedRun,
                                                                           how: str) -> None:
    """The stop (`how`) ends the loop (exit 3) while the agent's turn is held mid-step: the turn is cancelled
    (`session/cancel`, the attempt's log says so), the step is not done, and the next `kiro loop resume`
    starts that step again and, unheld, finishes it. The stop hook cuts a `kiro loop start` short, `--force`
    the `kiro loop resume` after it (`stopped_twice`)."""
    seen = stopped_twice.seen.get(how)
    assert seen is not None, f"the run did not get to `{how}`: {stopped_twice.seen['stop hook']}"
    assert seen["reached"], seen["out"]  # the held model call came
    if how == "stop --force":
        assert seen["stopped"][0] == 0, seen["stopped"][1]
    assert seen["code"] == 3, seen["out"]
    assert seen["completed"] == [] and seen["current"] == "1", seen
    assert len(seen["logs"]) == 1, seen["logs"]  # the stopped attempt's log
    log = seen["log"]
    assert "# result: cancelled" in log and '"method": "session/cancel"' in log, log[-2000:]
    ended = "the agent ended its turn (stopReason cancelled)" if '"stopReason": "cancelled"' in log else \
        "kiro ended the agent's process after the grace second"
    # the run after this stop (a `kiro loop resume`) began with the step the stop cut short, and finished it
    assert stopped_twice.code == 0, stopped_twice.out  # (the last resume; None: the run ended before it)
    after = stopped_twice.seen["stop --force"] if how == "stop hook" else stopped_twice.seen
    assert after["started"][len(seen["started"]):][:1] == ["1"], (seen["started"], after["started"])
    assert stopped_twice.seen["completed"] == ["1"], stopped_twice.seen["completed"]
    assert stopped_twice.seen["started"] == ["1", "1", "1"], stopped_twice.seen["started"]
    print(f"{stopped_twice.name}: `{how}` ended the loop {seen['seconds']:.2f} s after it was given; {ended}")


DEAD_IDLE = {"claude-acp": 10, "gemini-acp": 10}


@made_early("dead-claude-gemini-acp", dead_early("dead-claude-gemini-acp", ACP_CLIS, configure, DEAD_IDLE))
@pytest.mark.parametrize("name", sorted(ACP_CLIS))
def test_a_dead_endpoint_ends_the_attempt_by_the_idle_timeout(name: str,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    dead_run(name, "dead-claude-gemini-acp", ACP_CLIS, configure, DEAD_IDLE,
             tmp_path_factory.mktemp("dead")).assert_ended_by_the_idle_timeout()


def turn_that_does_not_end(name: str) -> dict[str, Any]:
    """Agent `name`'s one-step run whose model never answers within the step's time: what the test reads of it.
    The step's time counts from the agent's start; a loaded machine may take longer than 15 s to start it and
    have it ask its model (Gemini CLI at load 11): then it is tried once more, afresh, with 60 s (what must
    hold is the step timeout ending a turn whose model never answers)."""
    home, base = new_cli_home(), Path(tempfile.mkdtemp(prefix="kiro-step-timeout-"))
    cli = ACP_CLIS[name](home)
    try:
        if not cli.installed:
            return {"skip": cli.skip_reason()}
        cli.start()
        ws = new_workspace(base / "vault")
        ws.task(task_text(1))
        for attempt, seconds in enumerate((15, 60)):
            configure(ws, cli, f"step_timeout_seconds: {seconds}\n", loop="  failure_threshold: 1\n")
            cli.held = held = Held(at=1)  # the model never answers within the step's time
            tid = f"slow{attempt}"
            try:
                code, out = run(ws, cli, "--task-id", tid, *(("--fresh",) if attempt else ()))
            finally:
                held.released.set()
            if held.reached.is_set():  # the turn had begun: the model was asked
                break
            print(f"{cli.name} did not ask its model within {seconds} s of its start (a slow start): again")
        return {"code": code, "out": out, "reached": held.reached.is_set(), "seconds": seconds,
                "error": ws.state(tid)["steps"]["1"]["last_error"],
                "log": (ws.root / "Logs" / tid / "1-1.log").read_text()}
    except BaseException:
        return {"failed": traceback.format_exc()}
    finally:
        cli.close()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def _turns_that_do_not_end() -> None:
    for name in sorted(ACP_CLIS):
        once_early(f"step-timeout-{name}", lambda name=name: turn_that_does_not_end(name))()


@made_early("step-timeout-acp", _turns_that_do_not_end)
@pytest.mark.parametrize("name", sorted(ACP_CLIS))
def test_the_step_timeout_ends_a_turn_that_does_not_end(name: str) -> None:
    """Its run mostly waits for the step's time to pass: it is made early (`turn_that_does_not_end`)."""
    run = early(f"step-timeout-{name}", lambda: turn_that_does_not_end(name))
    code, out, seconds, error, log = run["code"], run["out"], run["seconds"], run["error"], run["log"]
    assert code == 5, out
    assert run["reached"]
    assert f"timed out after {seconds} s" in error, error
    assert "# result: timed out" in log and '"method": "session/cancel"' in log, log[-1500:]


BAD_COMMANDS = {
    "not on PATH": ("agent: acp\nacp_command: [no-such-acp-agent, --acp]\n",
                    "agent program 'no-such-acp-agent' was not found on PATH"),
    "missing": ("agent: acp\n", "agent 'acp' needs acp_command"),
    "not a list": ("agent: acp\nacp_command: gemini --acp\n", "acp_command"),
    "not an ACP agent's": ("agent: claude\nacp_command: [claude-agent-acp]\n", "agent is 'claude'"),
    "no ACP on its stdio": ("agent: acp\nacp_command: [\"true\"]\n", "did not answer ACP's initialize"),
    # kiro's initialize meets a closed pipe: the acp library's own error record (with its traceback) stays in
    # the attempt's log, not on the person's terminal
    "its stdin closed at once": ("sandbox: off\nagent: acp\nacp_command: [sh, -c, \"exec 0<&-; sleep 0.5\"]\n",
                                 "did not answer ACP's initialize"),
    "acp as a fallback": ("agent: claude\nfallback_agents: [acp]\n", "'acp' has no command line of its own"),
    "executor_command instead": ("agent: gemini-acp\nexecutor_command: gemini --acp\n", "set its command line as "
                                                                                          "acp_command"),
}


@pytest.mark.parametrize("case", sorted(BAD_COMMANDS))
def test_a_bad_acp_command_is_one_clear_line_and_exit_1(ws: Workspace, case: str) -> None:
    ws.task(task_text(1))
    config, said = BAD_COMMANDS[case]
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + config)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("kiro:")]  # (after the start's `sandbox:` line)
    assert len(lines) == 1 and said in lines[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "- [ ] 1. Write part 1" in (ws.root / TASK).read_text()  # no box checked, none left `[-]`
    print(f"{case}: {lines[0]}")


def test_commands_are_answered_by_the_shell_tool_rules(acp_name: str,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """`tools.shell` allows `ls`: `touch` is not on the allow-list, and `ls; touch` needs a shell. Gemini CLI's
    permission request does not carry the command (only a title, which may be the model's own description
    of it): kiro refuses what it cannot read. Both run a read-only command such as `ls -la` without asking.
    (The run of the writes' test in kiro's box: COMMANDS come after its two writes.)"""
    run = guarded_run(acp_name, "bwrap", tmp_path_factory.mktemp(f"guarded-{acp_name}-bwrap"))
    ws = run.ws
    assert run.code == 0, run.out
    tid = ws.only_task_id()
    assert not (ws.root / "pwned.txt").exists() and not (ws.root / "pwned2.txt").exists()
    answers = kinds(ws.events(tid), "permission_answered")
    refused = [a for a in answers if a.get("kind") == "execute" and not a["allowed"]]
    allowed = [a for a in answers if a.get("kind") == "execute" and a["allowed"]]
    if acp_name == "claude-acp":
        reasons = " | ".join(a["reason"] for a in refused)
        assert len(refused) == 2 and "'touch' is not on the allow-list" in reasons and "without a shell" in reasons, \
            refused
    else:
        assert len(refused) == 2 and all("cannot tell which command" in a["reason"] for a in refused), refused
    # `ls -la` is run without asking by both (read-only commands are their own policy's): kiro never saw it
    assert all(a["tool"] == "ls -la" for a in allowed), allowed
    print(f"{acp_name}: 3 commands tried; refused {len(refused)}, allowed {len(allowed)} "
          f"({', '.join(a['tool'] for a in allowed) or 'none'}); no file made by a refused one")


@pytest.fixture
def gemini_acp(cli_home: Path) -> Iterator[GeminiAcp]:
    yield from serving(GeminiAcp(cli_home))


def test_a_write_through_kiro_adds_no_secret_and_keeps_the_files_own(ws: Workspace, gemini_acp: GeminiAcp) -> None:
    """Gemini CLI writes project files through kiro's `fs` (claude-agent-acp writes its own): a secret kiro knows
    that the agent writes into a file is cut; an edit of another line of a file that holds one keeps it."""
    secret = "db-word-7f3a9c2e41d8"
    notes = ws.write("notes.txt", f"database password: {secret}\nowner: nobody\n")
    ws.task(task_text(1))
    configure(ws, gemini_acp, "secret_env: [DB_WORD]\n")
    gemini_acp.extra = [
        gemini_acp.write_call(str(ws.root / "copy.txt"), f"copied: {secret}\n"),
        ("replace", {"file_path": str(notes), "old_string": "owner: nobody", "new_string": "owner: kiro",
                     "instruction": "change the owner"})]
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**gemini_acp.env(), DB_WORD=secret), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "copy.txt").read_text() == "copied: [REDACTED]\n"
    assert notes.read_text() == f"database password: {secret}\nowner: kiro\n"
    tid = ws.only_task_id()
    writes = [a for a in kinds(ws.events(tid), "permission_answered") if a["tool"] == "fs/write_text_file"]
    assert {p for a in writes for p in a["paths"]} >= {"copy.txt", "notes.txt"}, writes
    for path in [*(ws.root / "Logs").rglob("*"), *(ws.root / ".state").rglob("*")]:
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    print("gemini-acp: the secret it wrote reached the disk cut; the file's own secret survived an edit of "
          f"another line; no log or state of {tid} holds it")


def test_claude_acp_at_its_subscription_limit_sleeps_instead_of_failing(ws: Workspace, cli_home: Path) -> None:
    """Claude Code on a subscription (a login token) answered 429 with the unified rate-limit headers: the ACP
    adapter ends `session/prompt` with Claude Code's "You've hit your session limit"; kiro waits for the window
    (a usage limit, not a failed attempt) and a stop hook ends the wait."""
    from tests.fakes import anthropic as fa

    cli = ClaudeAcp(cli_home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    server = cli.start()
    server.brain = lambda rec: fa.usage_limit(time.time() + 3600)  # type: ignore[attr-defined]
    env = cli.env()
    del env["ANTHROPIC_API_KEY"]
    env["CLAUDE_CODE_OAUTH_TOKEN"] = "sk-ant-oat01-fake-subscription-token"
    ws.task(task_text(1))
    configure(ws, cli)
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(**env))
    try:
        tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop to start")
        ws.wait_for(lambda: ws.state(tid)["status"] == "sleeping", timeout=120, what="the loop to sleep")
        limits = kinds(ws.events(tid), "usage_limit")
        assert limits and re.search(r"hit your .*limit", limits[0]["message"]), limits  # 0.101: "5-hour limit"
        ws.write(f".hooks/stop_autonomous_loop_{tid}.md", "enough\n")
        assert proc.wait(timeout=60) == 3, ws.output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        cli.close()
    state = ws.state(tid)
    assert state["total_failures"] == 0, state
    print(f"claude-acp: {limits[0]['message']!r}: the loop slept, a stop hook ended it")


# -- kiro's answers, asked directly (no adapter needed): every way out of the project an agent could name --


def _world(tmp_path: Path) -> tuple[Any, Path]:
    from tests.fake_openai import make_harness

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside\n")
    h = make_harness(tmp_path / "ws")
    root = h.root
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('hi')\n")
    (root / ".git").mkdir()
    (root / "link_out").symlink_to(outside)
    (root / "leaf_link.txt").symlink_to(outside / "secret.txt")
    (root / "state_alias").symlink_to(root / ".state")
    os.link(outside / "secret.txt", root / "hard.txt")
    return h, outside


ESCAPES = ["../outside/x.txt", "{outside}/x.txt", "link_out/x.txt", "leaf_link.txt", "state_alias/x.json",
           ".state/x", ".hooks/stop_autonomous_loop_t1.md", "config/autonomous_loop.yaml", ".git/hooks/pre-commit",
           "src/.git/config", "Logs/t1.jsonl", "Done/x.md", "Specs/other/tasks.md", "Dashboard.md", "hard.txt",
           "~/.bashrc"]


def test_kiros_answers_refuse_every_way_out_and_allow_the_project_and_the_task_file(tmp_path: Path) -> None:
    import asyncio

    from acp import RequestError
    from acp.schema import PermissionOption, ToolCallLocation, ToolCallUpdate

    from kiro.executors.acp import KiroClient, Policy

    h, outside = _world(tmp_path)
    ctx = h.context()
    client = KiroClient(ctx, Policy(ctx))
    options = [PermissionOption(kind="allow_once", name="Allow", option_id="allow"),
               PermissionOption(kind="reject_once", name="Reject", option_id="reject")]

    async def ask(path: str) -> tuple[str, bool]:
        call = ToolCallUpdate(tool_call_id=path, kind="edit", title=f"Write {path}",
                              locations=[ToolCallLocation(path=path)], raw_input={"file_path": path})
        answer = await client.request_permission(options, "s1", call)
        try:
            await client.write_text_file("forged\n", path, "s1")
            wrote = True
        except RequestError:
            wrote = False
        return answer.outcome.option_id if answer.outcome.outcome == "selected" else "cancelled", wrote

    before = {p: p.read_bytes() for p in (outside / "secret.txt", h.root / "hard.txt")}
    held = 0
    for raw in ESCAPES:
        path = raw.format(outside=outside)
        option, wrote = asyncio.run(ask(path))
        assert option == "reject" and not wrote, (path, option, wrote)
        held += 1
    assert not (outside / "x.txt").exists() and not (h.root / ".state" / "x").exists()
    assert {p: p.read_bytes() for p in before} == before
    refusals = [e for e in h.events if e["event"] == "permission_answered" and not e["allowed"]]
    assert len(refusals) == 2 * len(ESCAPES), len(refusals)  # each request and each write, an event
    # inside the project, and the task file (by its absolute and its relative path): allowed
    task = h.task_path
    for path in ("src/app.py", str(h.root / "src" / "new.py"), str(task), str(task.relative_to(h.root))):
        option, wrote = asyncio.run(ask(path))
        assert option == "allow" and wrote, path
    assert (h.root / "src" / "new.py").read_text() == "forged\n" and task.read_text() == "forged\n"
    # an agent that offers only "allow always" would not ask kiro again: refused
    only_always = [PermissionOption(kind="allow_always", name="Always", option_id="always"), options[1]]
    call = ToolCallUpdate(tool_call_id="x", kind="edit", title="Write src/app.py",
                          raw_input={"file_path": "src/app.py"})
    answer = asyncio.run(client.request_permission(only_always, "s1", call))
    assert answer.outcome.outcome == "selected" and answer.outcome.option_id == "reject", answer
    print(f"{len(ESCAPES)} ways out tried as a permission request and an fs write: {held} held")


def test_any_acp_agent_by_acp_command_in_the_task_frontmatter(ws: Workspace, gemini_acp: GeminiAcp) -> None:
    """`agent: acp` with `acp_command` (here in the task's frontmatter): kiro knows nothing of the agent's own
    files, so its config folder is granted to the box with sandbox_paths, and its key passed by agent_env (a
    bare command gets no secret of kiro's environment otherwise)."""
    home = Path(gemini_acp.env()["HOME"])
    text = task_text(1).replace("title: Greeting\n", "title: Greeting\nagent: acp\nacp_command: [gemini, --acp]\n")
    ws.task(text)
    grant = f"sandbox_paths:\n  rw: [{home / '.gemini'}]\nagent_env:\n  pass: [GEMINI_API_KEY]\n"
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + GEMINI_PRICE + grant)
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**gemini_acp.env()), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    tid = ws.only_task_id()
    assert [c["step_id"] for c in ws.state(tid)["completed_steps"]] == ["1"]
    log = (ws.root / "Logs" / tid / "1-1.log").read_text()
    assert "# agent: acp\n" in log and "# command: gemini --acp\n" in log, log[:600]


def test_claude_acp_at_its_limit_hands_the_step_to_a_fallback_acp_agent(ws: Workspace, cli_home: Path,
                                                                        gemini_acp: GeminiAcp) -> None:
    from tests.fakes import anthropic as fa

    claude = ClaudeAcp(cli_home / "claude")
    if not claude.installed:
        pytest.skip(claude.skip_reason())
    (cli_home / "claude").mkdir()
    server = claude.start()
    server.brain = lambda rec: fa.usage_limit(time.time() + 3600)  # type: ignore[attr-defined]
    env = {**gemini_acp.env(), **claude.env(), "HOME": gemini_acp.env()["HOME"]}
    del env["ANTHROPIC_API_KEY"]
    env["CLAUDE_CODE_OAUTH_TOKEN"] = "sk-ant-oat01-fake-subscription-token"
    try:
        ws.task(task_text(1))
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + GEMINI_PRICE + "agent: claude-acp\n"
                 "fallback_agents: [gemini-acp]\n")
        r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**env), timeout=240)
    finally:
        claude.close()
    assert r.returncode == 0, r.stdout + r.stderr
    tid = ws.only_task_id()
    state = ws.state(tid)
    assert [c["step_id"] for c in state["completed_steps"]] == ["1"] and state["total_failures"] == 0, state
    ran = [(e["agent"], e["outcome"]) for e in kinds(ws.events(tid), "agent_ran")]
    assert ran == [("claude-acp", "usage_limit"), ("gemini-acp", "completed")], ran


def test_a_refused_api_key_ends_the_run_with_exit_1_saying_what_to_fix(ws: Workspace, cli: AcpCli) -> None:
    from tests.fakes import anthropic as fa
    from tests.fakes import gemini as fg

    ws.task(task_text(1))
    if cli.name == "claude-acp":
        # claude-agent-acp 0.101 passes on none of the API's words: "Authentication required"
        cli.error, said = fa.error(401, "invalid x-api-key"), "Authentication required"
    else:
        cli.error, said = fg.error(400, "API key not valid. Please pass a valid API key.", "API_KEY_INVALID"), \
            "session/prompt: API key not valid. Please pass a valid API key. —"
    configure(ws, cli)
    code, out = run(ws, cli)
    assert code == 1, out
    lines = [x for x in out.splitlines() if x.startswith("kiro:")]
    assert len(lines) == 1 and "auth error" in lines[0] and said in lines[0], out
    tid = ws.only_task_id()
    assert sorted(p.name for p in (ws.root / "Logs" / tid).iterdir()) == ["1-1.log"]  # not retried
    print(f"{cli.name}: {lines[0]}")


def test_the_agents_plan_is_an_event(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Claude Code's todo list (its TodoWrite tool) reaches kiro as ACP's `plan` update: a `plan_updated` event,
    shown by `kiro loop logs`. (The run of the writes test in kiro's box: TODOS is its agent's first call.)"""
    run = guarded_run("claude-acp", "bwrap", tmp_path_factory.mktemp("guarded-claude-acp-bwrap"))
    ws = run.ws
    assert run.code == 0, run.out
    tid = ws.only_task_id()
    plans = kinds(ws.events(tid), "plan_updated")
    # claude-agent-acp 0.101 names an entry in progress by its activeForm
    assert plans and plans[0]["entries"] == ["[completed] Read the task file",
                                             "[in_progress] Checking the box"], plans
    shown = ws.kiro("loop", "logs", "--task-id", tid).stdout
    assert "plan: [completed] Read the task file; [in_progress] Checking the box" in shown, shown


SHELL_ESCAPES = ["ls\ncat ~/.ssh/id_ed25519", "ls $(cat ~/.ssh/id_ed25519)", "ls `cat ~/.aws/credentials`",
                 "ls $HOME/.ssh", "ls \\\n; cat ~/.ssh/id_ed25519", "ls; cat ~/.ssh/id_ed25519",
                 "ls && cat ~/.ssh/id_ed25519", "ls | sh", "ls > .state/x"]


def test_an_allowed_program_does_not_carry_a_second_one_through_the_agents_shell(tmp_path: Path) -> None:
    """An ACP agent runs an allowed command through a shell of its own: `tools.shell.allow: [ls]` must not let a
    second line, `$(...)`, backquotes, `$VAR` or an operator run anything besides `ls`."""
    import asyncio

    from acp.schema import PermissionOption, ToolCallUpdate

    from kiro.executors.acp import KiroClient, Policy
    from kiro.store.config import ShellToolSettings

    h, _ = _world(tmp_path)
    ctx = h.context()
    ctx.config.tools.shell = ShellToolSettings(enabled=True, allow=["ls"])
    client = KiroClient(ctx, Policy(ctx))
    options = [PermissionOption(kind="allow_once", name="Allow", option_id="allow"),
               PermissionOption(kind="reject_once", name="Reject", option_id="reject")]

    def answer(command: str) -> str:
        call = ToolCallUpdate(tool_call_id=command, kind="execute", title=command, raw_input={"command": command})
        outcome = asyncio.run(client.request_permission(options, "s1", call)).outcome
        return outcome.option_id if outcome.outcome == "selected" else "cancelled"

    assert answer("ls -la src") == "allow"
    held = sum(answer(command) == "reject" for command in SHELL_ESCAPES)
    print(f"{len(SHELL_ESCAPES)} second commands behind an allowed `ls`: {held} held")
    assert held == len(SHELL_ESCAPES)


def test_the_task_file_is_read_and_written_through_its_folder_not_a_path_swapped_after_the_check(
        tmp_path: Path) -> None:
    """kiro checks an fs/read_text_file or fs/write_text_file of the task file by its path, then reads or writes
    it. An agent that swaps the task file's folder, or the file, for a symlink between the two must not lead
    the write outside the project, nor the read to a file outside: the file is reached through descriptors
    opened without following a symlink (kiro.fs.safeio.folder_fd)."""
    import asyncio
    import shutil

    from acp import RequestError

    from kiro.executors.acp import KiroClient, Policy

    h, outside = _world(tmp_path)
    task = h.task_path.resolve()
    folder = task.parent
    (outside / "tasks.md").write_text("outside tasks.md: secret\n")
    original = task.read_text()

    def swap_folder() -> None:
        folder.rename(folder.with_name("moved"))
        folder.symlink_to(outside)

    def swap_file() -> None:
        task.unlink()
        task.symlink_to(outside / "secret.txt")

    def restore() -> None:
        if folder.is_symlink():
            folder.unlink()
            folder.with_name("moved").rename(folder)
        if task.is_symlink():
            task.unlink()
        task.write_text(original)

    class SwapAfterTheCheck(Policy):
        swap: Any = None

        def path(self, raw: str, *, write: bool) -> Path:
            real = super().path(raw, write=write)
            if self.swap is not None:
                self.swap()
            return real

    ctx = h.context()
    policy = SwapAfterTheCheck(ctx)
    client = KiroClient(ctx, policy)
    before = {p: p.read_bytes() for p in outside.iterdir()}
    tried = held = 0
    for name, swap in (("its folder", swap_folder), ("the file", swap_file)):
        for op in ("write", "read"):
            policy.swap = swap
            tried += 1
            try:
                if op == "write":
                    asyncio.run(client.write_text_file("- [x] forged\n", str(task), "s1"))
                    got = None
                else:
                    got = asyncio.run(client.read_text_file(str(task), "s1")).content
            except RequestError as exc:
                got, why = None, str(exc)
            else:
                why = "served" if got is not None else "written"
            policy.swap = None
            restore()
            ok = {p: p.read_bytes() for p in outside.iterdir()} == before and (got is None or "secret" not in got) \
                and "outside" not in (got or "")
            held += ok
            print(f"{op} of the task file, {name} swapped for a symlink after the check: "
                  f"{'held' if ok else 'ESCAPED'} ({why[:100]})")
    shutil.rmtree(folder.with_name("moved"), ignore_errors=True)
    print(f"{tried} swaps between the check and the {{read, write}}: {held} held")
    assert held == tried
    # unswapped, the task file is read and written as before
    asyncio.run(client.write_text_file("- [x] done\n", str(task), "s1"))
    assert task.read_text() == "- [x] done\n"
    assert asyncio.run(client.read_text_file(str(task), "s1")).content == "- [x] done\n"
