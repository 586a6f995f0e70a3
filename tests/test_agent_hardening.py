"""Hardening from other loops' bugs (issue #29 item 4), with the REAL Claude Code and Codex CLIs on the
scripted servers of tests/fakes:

- a person's global Claude Code hooks must not run inside an unattended step (a Stop hook in
  `~/.claude/settings.json` that blocks the stop hijacks the step, as ralph-wiggum's does);
- Codex's goal tools (`create_goal`, a standing objective kept in `$CODEX_HOME`) are off in a step.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import CODEX_PRICE, Claude, Codex, run_once, serving, task_text
from tests.conftest import FAST_CONFIG, Workspace, new_cli_home, new_workspace
from tests.fakes import responses as fr

TASK = "Specs/feature/tasks.md"


@pytest.fixture
def codex(cli_home: Path) -> Iterator[Codex]:
    yield from serving(Codex(cli_home))


@dataclass
class HookedRun:
    """One claude step with a person's global hooks and the project's own hook, both set to leave a mark."""

    root: Path  # the workspace
    code: int
    out: str
    global_mark: Path
    project_mark: Path


def hooked_run(root: Path) -> dict[str, Any]:
    """A global Stop hook that blocks the stop and a global UserPromptSubmit hook in ~/.claude/settings.json,
    and a UserPromptSubmit hook in the project's .claude/settings.json; each marks a file in the project (the
    one place a hook may write in kiro's box); one claude step."""
    home = new_cli_home()
    try:
        cli = Claude(home)
        if not cli.installed:
            pytest.skip(cli.skip_reason())
        cli.start()
        try:
            ws = new_workspace(root)
            env = cli.env()
            global_mark, project_mark = ws.root / "stop-hook-ran", ws.root / "project-hook-ran"
            blocks = json.dumps({"decision": "block", "reason": "keep going: rewrite it all"})
            hook = f"touch {global_mark}; echo '{blocks}'"
            settings = Path(env["HOME"]) / ".claude" / "settings.json"
            settings.parent.mkdir(parents=True, exist_ok=True)
            settings.write_text(json.dumps({"hooks": {
                "Stop": [{"hooks": [{"type": "command", "command": hook}]}],
                "UserPromptSubmit": [{"hooks": [{"type": "command", "command": f"touch {global_mark}"}]}],
            }}))
            ws.write(".claude/settings.json", json.dumps({"hooks": {
                "UserPromptSubmit": [{"hooks": [{"type": "command", "command": f"touch {project_mark}"}]}]}}))
            ws.task(task_text(1))
            ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\n")
            r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**env, KIRO_RAISE_ERRORS="1"), timeout=240)
            return {"root": str(ws.root), "code": r.returncode, "out": r.stdout + r.stderr,
                    "global_mark": str(global_mark), "project_mark": str(project_mark)}
        finally:
            cli.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory) -> HookedRun:
    """The two hook tests read one run (`run_once`: one in the test run, whichever workers they land on)."""
    made = run_once("claude-hooks", lambda: hooked_run(tmp_path_factory.mktemp("hooks") / "vault"))
    return HookedRun(Path(made["root"]), made["code"], made["out"], Path(made["global_mark"]),
                     Path(made["project_mark"]))


def test_the_users_global_claude_stop_hook_does_not_run_in_a_step(hooked: HookedRun) -> None:
    assert hooked.code == 0, hooked.out
    assert not hooked.global_mark.exists(), "the global Stop/UserPromptSubmit hook ran inside kiro's step"
    log = next((hooked.root / "Logs").glob("*/1-1.log")).read_text()
    assert "--setting-sources project,local" in log
    print("tried a global Stop hook that blocks the stop and a UserPromptSubmit hook: neither ran")


def test_a_projects_own_claude_hooks_still_run(hooked: HookedRun) -> None:
    """Only the person's global settings are left out: the project's .claude/settings.json applies."""
    assert hooked.code == 0, hooked.out
    assert hooked.project_mark.exists(), "the project's own hook did not run"


def test_codex_steps_offer_the_model_no_goal_tools(ws: Workspace, codex: Codex) -> None:
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: codex\n" + CODEX_PRICE)
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**codex.env(), KIRO_RAISE_ERRORS="1"), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert isinstance(codex.server, fr.FakeResponses)
    calls = codex.server.calls()
    tools = {t.get("name") for rec in calls for t in rec.body.get("tools", []) if isinstance(t, dict)}
    assert "exec_command" in tools, tools  # the tools were read: codex's own shell tool is there
    assert not tools & {"create_goal", "get_goal", "update_goal"}, tools
