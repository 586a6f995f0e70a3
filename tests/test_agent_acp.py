"""ACP agents (kiro.executors.acp) with the REAL adapters from npm, against the scripted API servers on
127.0.0.1 (tests/fakes): `claude-agent-acp` on the Anthropic Messages fake, `gemini --acp` on the Gemini
fake. kiro runs them as a user would (`kiro loop start --agent claude-acp`). An adapter that is not
installed makes its tests SKIP, saying how to install it (.ci/install-agent-clis).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import serving, task_text
from tests.agent_clis_acp import ACP_CLIS, ClaudeAcp, GeminiAcp, Held
from tests.agent_clis_more import GEMINI_PRICE
from tests.conftest import FAST_CONFIG, Workspace

TASK = "Specs/feature/tasks.md"
AcpCli = ClaudeAcp | GeminiAcp


@pytest.fixture(params=sorted(ACP_CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[AcpCli]:
    yield from serving(ACP_CLIS[request.param](cli_home))


def configure(ws: Workspace, cli: AcpCli, extra: str = "", loop: str = "") -> None:
    price = GEMINI_PRICE if cli.name == "gemini-acp" else ""
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + loop + f"agent: {cli.name}\n" + price + extra)


def run(ws: Workspace, cli: AcpCli, *args: str, timeout: float = 240) -> tuple[int, str]:
    r = ws.kiro("loop", "start", "--task", TASK, *args, env=ws.env(**cli.env()), timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def kinds(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def test_three_steps_complete_with_tool_calls_and_permissions_as_events(ws: Workspace, cli: AcpCli) -> None:
    ws.task(task_text(3))
    configure(ws, cli)
    code, out = run(ws, cli, "--agent", cli.name)
    assert code == 0, out
    done = ws.root / "Done" / "feature" / "tasks.md"
    assert done.read_text().count("- [x]") == 3, done.read_text()
    tid = ws.only_task_id()
    state = ws.state(tid)
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2", "3"]
    usage = state["usage"]
    calls = cli.calls()
    assert usage["prompt_tokens"] >= calls * cli.input_tokens and usage["completion_tokens"] > 0, (usage, calls)
    assert usage["cost_usd"] > 0, usage
    events = ws.events(tid)
    edits = [e for e in kinds(events, "tool_called") if e.get("kind") == "edit"]
    assert len([e for e in edits if e.get("status") == "completed"]) == 3, edits
    assert all("tasks.md" in e["arguments"] for e in edits), edits
    answers = kinds(events, "permission_answered")
    assert answers and all(a["allowed"] for a in answers), answers
    log = (ws.root / "Logs" / tid / "1-1.log").read_text()
    assert f"agent: {cli.name}" in log and '"method": "session/prompt"' in log and "Checked the box" in log
    print(f"{cli.name}: 3 steps, {calls} model calls, usage {usage}, {len(edits)} edit events, "
          f"{len(answers)} permission answers")


def test_a_tool_call_shows_in_logs_follow_while_the_step_still_runs(ws: Workspace, cli: AcpCli) -> None:
    ws.task(task_text(1))
    configure(ws, cli)
    cli.held = held = Held(at=2)  # the model call after the first tool call waits for the test
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(**cli.env()))
    follow = None
    try:
        assert held.reached.wait(120), ws.output(proc)
        tid = ws.only_task_id()
        follow = ws.spawn("loop", "logs", "--task-id", tid, "--follow")
        line = ws.wait_for(lambda: next((x for x in ws.output(follow).splitlines()
                                         if "tasks.md" in x and "(completed)" in x), None),
                           timeout=60, what="a tool call in `kiro loop logs --follow`")
        assert ws.state(tid)["current_step"]["status"] == "in_progress"  # the step is still running...
        assert proc.poll() is None and not held.released.is_set()  # ...its model call held by the test
        held.released.set()
        assert proc.wait(timeout=120) == 0, ws.output(proc)
        assert follow.wait(timeout=60) == 0, ws.output(follow)
        print(f"{cli.name}: while the step ran, `logs --follow` showed: {line.strip()}")
    finally:
        held.released.set()
        for p in (proc, follow):
            if p is not None and p.poll() is None:
                p.kill()


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_writes_to_kiros_state_or_outside_the_project_are_refused_and_the_attempt_goes_on(
        ws: Workspace, cli: AcpCli, sandbox: str) -> None:
    ws.task(task_text(1))
    configure(ws, cli, f"sandbox: {sandbox}\n")
    forged, outside = ws.root / ".state" / "x", ws.root.parent / "outside.txt"  # ../outside from the project
    cli.extra = [cli.write_call(str(forged), "forged\n"), cli.write_call(str(outside), "escaped\n")]
    code, out = run(ws, cli)
    assert code == 0, out
    assert not forged.exists() and not outside.exists()
    tid = ws.only_task_id()
    assert [c["step_id"] for c in ws.state(tid)["completed_steps"]] == ["1"]  # the attempt went on
    refused = [a for a in kinds(ws.events(tid), "permission_answered") if not a["allowed"]]
    by_kiro = {p for a in refused for p in a["paths"]}
    assert any(".state/x" in p for p in by_kiro), refused  # kiro refused it; the agent did not ask for less
    assert all("off limits" in a["reason"] or "outside the project" in a["reason"] for a in refused), refused
    held = "outside.txt refused by kiro" if any("outside.txt" in p for p in by_kiro) else \
        "outside.txt refused by the agent itself (it never asked)"
    print(f"{cli.name} (sandbox {sandbox}): 2 writes tried, 2 held; .state/x refused by kiro; {held}")


def test_a_stop_hook_mid_step_cancels_the_turn_and_resume_starts_that_step_again(ws: Workspace, cli: AcpCli) -> None:
    ws.task(task_text(2))
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
    r = ws.kiro("loop", "resume", "--task-id", tid, env=ws.env(**cli.env()), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    state = ws.state(tid)
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2"]
    started = [e["step_id"] for e in kinds(ws.events(tid), "step_started")]
    assert started == ["1", "1", "2"], started  # the resumed loop began with the step the hook cut short
    print(f"{cli.name}: the stop hook ended the loop {seconds:.2f} s after it was written; {ended}")


def test_a_dead_endpoint_ends_the_attempt_by_the_idle_timeout(ws: Workspace, cli: AcpCli) -> None:
    ws.task(task_text(1))
    assert cli.server is not None
    cli.server.hang = True  # accepts the connection, never answers
    configure(ws, cli, "step_idle_timeout_seconds: 5\n", loop="  failure_threshold: 1\n")
    code, out = run(ws, cli)
    assert code == 5, out
    error = ws.state(ws.only_task_id())["steps"]["1"]["last_error"]
    assert "printed nothing for 5 s" in error and "step_idle_timeout_seconds" in error, error
    assert len(cli.server.requests) >= 1  # it did reach the endpoint


BAD_COMMANDS = {
    "not on PATH": ("agent: acp\nacp_command: [no-such-acp-agent, --acp]\n",
                    "agent program 'no-such-acp-agent' was not found on PATH"),
    "missing": ("agent: acp\n", "agent 'acp' needs acp_command"),
    "not a list": ("agent: acp\nacp_command: gemini --acp\n", "acp_command"),
    "not an ACP agent's": ("agent: claude\nacp_command: [claude-agent-acp]\n", "agent is 'claude'"),
    "no ACP on its stdio": ("agent: acp\nacp_command: [\"true\"]\n", "did not answer ACP's initialize"),
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


def test_commands_are_answered_by_the_shell_tool_rules(ws: Workspace, cli: AcpCli) -> None:
    """`tools.shell` allows `ls`: `touch` is not on the allow-list, and `ls; touch` needs a shell. Gemini CLI's
    permission request does not carry the command (only a title, which may be the model's own description
    of it): kiro refuses what it cannot read. Both run a read-only command such as `ls -la` without asking."""
    ws.task(task_text(1))
    configure(ws, cli, "tools:\n  shell:\n    enabled: true\n    allow: [ls]\n")
    cli.extra = [cli.shell_call("touch pwned.txt"), cli.shell_call("ls; touch pwned2.txt"), cli.shell_call("ls -la")]
    code, out = run(ws, cli)
    assert code == 0, out
    tid = ws.only_task_id()
    assert not (ws.root / "pwned.txt").exists() and not (ws.root / "pwned2.txt").exists()
    answers = kinds(ws.events(tid), "permission_answered")
    refused = [a for a in answers if a.get("kind") == "execute" and not a["allowed"]]
    allowed = [a for a in answers if a.get("kind") == "execute" and a["allowed"]]
    if cli.name == "claude-acp":
        reasons = " | ".join(a["reason"] for a in refused)
        assert len(refused) == 2 and "'touch' is not on the allow-list" in reasons and "without a shell" in reasons, \
            refused
    else:
        assert len(refused) == 2 and all("cannot tell which command" in a["reason"] for a in refused), refused
    # `ls -la` is run without asking by both (read-only commands are their own policy's): kiro never saw it
    assert all(a["tool"] == "ls -la" for a in allowed), allowed
    print(f"{cli.name}: 3 commands tried; refused {len(refused)}, allowed {len(allowed)} "
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
