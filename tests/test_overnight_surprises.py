"""What a Kiro user found in the morning after a night of specs (issue #38), one test per item fixed here:

- item 4: `max_cost_usd` with an agent kiro cannot price (codex reports tokens, not money) is refused at
  start, saying how to give it a price, instead of a cap that never fires (REAL codex, scripted server).
- item 9: a spec whose last step is its "Final checkpoint" completes with `pause_at_checkpoints`; it does
  not end paused at 100% (exit 6).
- item 11: a resumed loop never overwrites an earlier attempt's log (the auth error's `1-1.log`).
- item 12: a global `fallback_agents: [codex]` yields to a shell task and to `--agent codex`.
- item 10: the numbers agree: a completed loop with optional steps left open does not say "all 4 steps done"
  beside a card "3/4"; a cost reads `$0.0018`, never `0.0018000000000000002`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiro.store.config import resolve_config
from tests.agent_clis import CLIS, CODEX_PRICE, Cli, serving, task_text
from tests.conftest import FAST_CONFIG, Workspace, shell_task
from tests.test_command_executor import agent_task, make_agent

TASK = "Specs/feature/tasks.md"


@pytest.fixture
def codex(cli_home: Path) -> Iterator[Cli]:
    yield from serving(CLIS["codex"](cli_home))


def test_a_cost_cap_kiro_cannot_check_for_the_agent_is_refused_at_start_saying_how_to_price_it(
        ws: Workspace, codex: Cli) -> None:
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: codex\nguardrails:\n  max_cost_usd: 0.01\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**codex.env()), timeout=300)
    print(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.stdout)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "max_cost_usd 0.01 cannot hold: codex reports tokens, not money, and llm.prices has no price for its " \
           "model 'gpt-5-codex'" in r.stderr, r.stderr
    assert "gpt-5-codex: {input_per_1m" in r.stderr and "Traceback" not in r.stderr
    assert codex.calls() == 0 and not (ws.root / "Logs").exists() or not any((ws.root / "Logs").rglob("*.log"))
    # with a price the cap can hold: the loop runs
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: codex\nguardrails:\n  max_cost_usd: 5\n"
             + CODEX_PRICE)
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**codex.env()), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state(ws.only_task_id())["usage"]["cost_usd"] > 0


def test_a_final_checkpoint_with_nothing_after_it_completes_the_task(ws: Workspace) -> None:
    ws.task(shell_task(3).replace("Step number 3", "Final checkpoint - Ensure all tests pass")
            .replace("executor: shell", "executor: shell\npause_at_checkpoints: true"))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "fc")
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("fc")
    assert (st["status"], st["stop_reason"]) == ("completed", None) or st["status"] == "completed", st
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3"]


def test_a_checkpoint_with_steps_after_it_still_pauses(ws: Workspace) -> None:
    ws.task(shell_task(3).replace("Step number 2", "Checkpoint - Ensure all tests pass")
            .replace("executor: shell", "executor: shell\npause_at_checkpoints: true"))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "cp")
    assert r.returncode == 6 and ws.state("cp")["stop_reason"] == "checkpoint", r.stdout + r.stderr
    r = ws.kiro("loop", "resume", "--task-id", "cp")
    assert r.returncode == 0 and ws.state("cp")["status"] == "completed", r.stdout + r.stderr


def test_a_resumed_loop_keeps_the_earlier_attempts_log(ws: Workspace) -> None:
    """The first run ends on a refused key (exit 1, its log `1-1.log`); after `resume` the step's attempt is
    numbered 1 again: its log takes the next free name, and the auth error's log is still there."""
    ws.task(agent_task(1))
    make_agent(ws, """\
        if not (OUT / "refused").exists():
            (OUT / "refused").write_text("x")
            sys.stderr.write("Error: 401 Unauthorized: the API key was refused\\n")
            sys.exit(1)
        check_box()
        """, extra_config="sandbox: off\n")
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "lg")
    assert r.returncode == 1 and "auth error" in r.stderr, r.stdout + r.stderr
    r = ws.kiro("loop", "resume", "--task-id", "lg")
    assert r.returncode == 0, r.stdout + r.stderr
    logs = sorted(p.name for p in (ws.root / "Logs" / "lg").glob("*.log"))
    print("attempt logs:", logs)
    assert logs == ["1-1.2.log", "1-1.log"], logs
    assert "401 Unauthorized" in (ws.root / "Logs/lg/1-1.log").read_text()  # the auth error's, kept
    assert "# result: exit 0" in (ws.root / "Logs/lg/1-1.2.log").read_text()


def test_a_global_fallback_agents_yields_to_a_shell_task_and_to_a_chosen_agent(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\nfallback_agents: [codex]\n")
    ws.task(shell_task(1))
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    # `--agent codex` (a flag, a later layer than the config file): codex first, no fallback to itself
    chosen = resolve_config(workspace_root=ws.root, env={}, overrides={"agent": "codex"})
    assert (chosen.agent, chosen.fallback_agents) == ("codex", [])
    # both written in one file is the person's own contradiction: still one clear line
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: codex\nfallback_agents: [codex]\n")
    ws.task(shell_task(1).replace("executor: shell\n", "executor: command\n"))
    r = ws.kiro("loop", "start", "--task", TASK, "--fresh")
    assert r.returncode == 1 and "'codex' is named twice" in r.stderr, r.stdout + r.stderr


def test_a_spec_with_an_optional_step_left_open_says_how_many_were_done(ws: Workspace) -> None:
    """Issue #38 item 10: "COMPLETED 51/55" on the card while the CLI said "all 55 steps done": Kiro's optional
    steps (`- [ ]*`) are left open, so the message says what the counts say."""
    ws.task("---\ntitle: T\nexecutor: shell\n---\n# Plan\n- [ ] 1. Parent\n  - [ ] 1.1 Child\n    ```sh\n"
            "    true\n    ```\n  - [ ]* 1.2 Optional tests\n    ```sh\n    true\n    ```\n- [ ] 2. Last\n  ```sh\n"
            "  true\n  ```\n")
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "opt")
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads(ws.run("loop", "status", "--task-id", "opt", "--json").stdout)
    row = row[0] if isinstance(row, list) else row
    said = [line for line in (r.stdout + r.stderr).splitlines() if "steps done" in line]
    print("the CLI said:", said, "| the card shows", f"{row['steps_done']}/{row['steps_total']}")
    assert (row["steps_done"], row["steps_total"]) == (3, 4)
    assert "all 4 steps done" not in r.stdout + r.stderr
    assert any("3 of 4 checked, 1 optional step left open" in line for line in said), said


def test_a_cost_reads_as_money_in_every_view(ws: Workspace) -> None:
    """Issue #38 item 10: `cost usd 0.0018000000000000002` in the event lines: one formatter for every cost."""
    from kiro.views import console

    line = console.event_plain({"ts": "2026-01-01T00:00:00+00:00", "task_id": "t", "iteration": 1,
                                "event": "agent_ran", "agent": "claude", "cost_usd": 0.0009 + 0.0009})
    print(line)
    assert "$0.0018" in line and "0.0018000000000000002" not in line
