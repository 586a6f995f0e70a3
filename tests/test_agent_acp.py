"""ACP agents (kiro.executors.acp) with the REAL adapters from npm, against the scripted API servers on
127.0.0.1 (tests/fakes): `claude-agent-acp` on the Anthropic Messages fake, `gemini --acp` on the Gemini
fake. kiro runs them as a user would (`kiro loop start --agent claude-acp`). An adapter that is not
installed makes its tests SKIP, saying how to install it (.ci/install-agent-clis).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import serving, task_text
from tests.agent_clis_acp import ACP_CLIS, ClaudeAcp, GeminiAcp
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
