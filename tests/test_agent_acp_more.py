"""The ACP presets codex-acp and opencode-acp (kiro.executors.agents.codex_acp, .opencode_acp) with the
REAL adapters from npm, against the scripted API servers on 127.0.0.1 (tests/fakes): `codex-acp` on the
OpenAI Responses fake, `opencode acp` on the Chat Completions fake. kiro runs them as a user would
(`kiro loop start --agent codex-acp`). An adapter that is not installed makes its tests SKIP, saying
how to install it (.ci/install-agent-clis).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import CODEX_PRICE, serving, task_text
from tests.agent_clis_acp_more import ACP_MORE_CLIS, AcpMoreCli
from tests.conftest import FAST_CONFIG, Workspace

TASK = "Specs/feature/tasks.md"


@pytest.fixture(params=sorted(ACP_MORE_CLIS))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[AcpMoreCli]:
    yield from serving(ACP_MORE_CLIS[request.param](cli_home))


def configure(ws: Workspace, cli: AcpMoreCli, extra: str = "", loop: str = "") -> None:
    price = CODEX_PRICE if cli.name == "codex-acp" else ""
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + loop + f"agent: {cli.name}\n" + price + extra)


def run(ws: Workspace, cli: AcpMoreCli, *args: str, timeout: float = 240) -> tuple[int, str]:
    r = ws.kiro("loop", "start", "--task", TASK, *args, env=ws.env(**cli.env()), timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def kinds(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def test_three_steps_complete(ws: Workspace, cli: AcpMoreCli) -> None:
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
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0, usage
    assert usage["cost_usd"] > 0, usage
    events = ws.events(tid)
    edits = [e for e in kinds(events, "tool_called") if e.get("kind") == "edit" and e.get("status") == "completed"]
    assert len(edits) == 3 and all("tasks.md" in f"{e['tool']} {e['arguments']}" for e in edits), edits
    answers = kinds(events, "permission_answered")
    print(f"{cli.name}: 3 steps, {cli.calls()} model calls, usage {usage}, {len(edits)} edits, "
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
