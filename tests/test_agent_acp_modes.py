"""kiro chooses and holds an ACP agent's permission mode (kiro.executors.acp.hold_mode): each session is set
to the agent's most asking mode with `session/set_mode`, a switch to another mode during the turn ends the
attempt (failed closed), and an agent that offers no asking mode is not run. claude-agent-acp 0.101 with its
default model opens its session in `auto`, where edits inside the project (.state/ included) are never asked:
the REAL adapters against the scripted servers show what kiro set; a scripted ACP agent
(tests/agent_clis_acp_switching.py) plays the switches no real adapter makes on its own.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import Cli, serving, task_text
from tests.agent_clis_acp import ACP_CLIS, TASK, SharedRun, configure, kinds, run
from tests.agent_clis_codex_opencode_acp import ACP_MORE_CLIS
from tests.conftest import FAST_CONFIG, Workspace
from tests.test_agent_acp import guarded_run
from tests.test_agent_acp import two_steps_run as acp_two_steps
from tests.test_agent_acp_codex_opencode import two_steps_run as more_two_steps

ALL = {**ACP_CLIS, **ACP_MORE_CLIS}
# the mode kiro must hold each in (codex-acp in kiro's box: `agent-full-access`, the box confines it)
ASKING = {"claude-acp": "default", "gemini-acp": "default", "codex-acp": "read-only", "opencode-acp": "build"}
SWITCHING = Path(__file__).with_name("agent_clis_acp_switching.py")


# The agents whose most asking mode is the same in kiro's box and out of it (kiro.executors.acp.hold_mode: only
# codex-acp's differs): the session kiro opened and held is read from step 1 of the two-step run their own test
# modules share (`run_once`: one in the test run), not from a run of its own (an opencode start costs ~9 s of
# CPU). codex-acp runs here, out of the box, where its most asking mode is `read-only`.
SHARED: dict[str, Callable[[str, Path], SharedRun]] = {
    "claude-acp": acp_two_steps, "gemini-acp": acp_two_steps, "opencode-acp": more_two_steps}


def _conversation(log: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.splitlines() if x.startswith('{"from"')]


def _own_run(ws: Workspace, cli: Cli) -> tuple[int, str]:
    ws.task(task_text(1))
    configure(ws, cli, "sandbox: off\n")
    return run(ws, cli)


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_adapter_runs_in_its_most_asking_mode_which_kiro_sets(name: str, ws: Workspace, cli_home: Path,
                                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    if name in SHARED:
        shared = SHARED[name](name, tmp_path_factory.mktemp(f"two-steps-{name}"))
        ws, code, out = shared.ws, shared.code, shared.out
    else:
        cli = ALL[name](cli_home)
        for _ in serving(cli):
            code, out = _own_run(ws, cli)
    assert code == 0, out
    tid = ws.only_task_id()
    said = _conversation((ws.root / "Logs" / tid / "1-1.log").read_text())
    new_id = next(m["id"] for m in said if m.get("method") == "session/new")
    opened = next(m["result"] for m in said if m.get("from") == "agent" and m.get("id") == new_id and "result" in m)
    modes = opened.get("modes") or {}
    options = {o.get("id"): o for o in opened.get("configOptions") or []}
    was = modes.get("currentModeId") or options.get("mode", {}).get("currentValue")
    wanted = ASKING[name]
    notes = [m["mode"] for m in said if m.get("from") == "kiro" and "mode" in m]
    assert notes and notes[0].startswith(f"mode {wanted}"), notes
    set_to = [m["params"]["modeId"] for m in said if m.get("method") == "session/set_mode"]
    assert set_to == ([] if was == wanted else [wanted]), (was, set_to)
    refused = [a for a in kinds(ws.events(tid), "permission_answered") if not a["allowed"]]
    assert not refused, refused
    if name == "claude-acp":
        assert was == "auto", opened  # what kiro fixes: edits would not be asked
    print(f"{name}: the session opened in {was!r}; kiro " +
          (f"set {wanted!r} (session/set_mode)" if set_to else f"kept {wanted!r}") + "; the step completed")


def test_claude_acp_opened_in_auto_asks_kiro_before_writing_state(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The case of the issue: `sandbox: off`, claude-agent-acp's default model (its session opens in `auto`). The
    write to `.state/` is asked, refused by kiro, and never lands; the step completes. Read from the one-step
    run of tests/test_agent_acp.py that tries it (`guarded_run`, out of the box: a claude-acp start a test less),
    whose agent then tries `../outside.txt` too."""
    shared = guarded_run("claude-acp", "off", tmp_path_factory.mktemp("guarded-claude-acp-off"))
    ws, forged = shared.ws, shared.ws.root / ".state" / "x"
    assert shared.code == 0, shared.out
    assert not forged.exists()
    tid = ws.only_task_id()
    asked = [a for a in kinds(ws.events(tid), "permission_answered") if any(".state/x" in p for p in a["paths"])]
    assert asked and not asked[0]["allowed"] and "off limits" in asked[0]["reason"], asked
    print(f"claude-acp: the write to .state/ was asked and refused: {asked[0]['reason']}")


def _scripted(ws: Workspace, how: str) -> tuple[int, str]:
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: off\nagent: acp\n"
             f"acp_command: [{json.dumps(sys.executable)}, {json.dumps(str(SWITCHING))}, {how}]\n")
    r = ws.kiro("loop", "start", "--task", TASK, timeout=240)
    return r.returncode, r.stdout + r.stderr


def test_an_agent_that_switches_to_auto_during_its_turn_is_caught_and_the_attempt_fails_closed(
        ws: Workspace) -> None:
    code, out = _scripted(ws, "switch")
    assert not (ws.root / "pwned.txt").exists(), "the write the agent asked for after its switch was allowed"
    assert code == 1, out
    lines = [x for x in out.splitlines() if x.startswith("kiro:")]
    assert len(lines) == 1 and "switched its session to mode 'auto'" in lines[0], out
    assert "Traceback" not in out
    tid = ws.only_task_id()
    asked = [a for a in kinds(ws.events(tid), "permission_answered") if any("pwned" in p for p in a["paths"])]
    assert all(not a["allowed"] for a in asked), asked
    print(f"switch to auto mid-turn: caught; {len(asked)} request after it refused; {lines[0]}")


def test_an_agent_that_offers_no_asking_mode_is_not_run(ws: Workspace) -> None:
    code, out = _scripted(ws, "auto-only")
    assert code == 1, out
    lines = [x for x in out.splitlines() if x.startswith("kiro:")]
    assert len(lines) == 1 and "none of which asks kiro" in lines[0], out
    assert not (ws.root / "pwned.txt").exists()
    assert "- [ ] 1. Write part 1" in (ws.root / TASK).read_text()
    log = next((ws.root / "Logs").rglob("1-1.log")).read_text()
    assert '"method": "session/prompt"' not in log  # never prompted
    print(f"only auto / bypassPermissions offered: {lines[0]}")

