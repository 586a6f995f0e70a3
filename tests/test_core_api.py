"""The core API every front end calls (kiro.core.api, issue #40 item 1), and the issue #38 items that live in
it: warnings said before a loop goes to the background (item 5), `resume --all` and review points (item 8),
`--spec` on every command that names a loop (item 13), `history` of an interrupted step (item 17).

In process (the API, or the CLI through CliRunner) wherever no signal or background process is the point.
"""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from kiro.cli import app
from kiro.core import api
from kiro.core.engine import Outcome
from kiro.errors import Conflict, LockHeld, TaskNotFound
from tests.conftest import FAST_CONFIG, Workspace, shell_task


class Heard(api.Front):
    """A front end that keeps what it was told."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.lines: list[str] = []
        self.outcomes: list[Outcome] = []

    def warning(self, text: str) -> None:
        self.warnings.append(text)

    def line(self, text: str) -> None:
        self.lines.append(text)

    def outcome(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def kiro(ws: Workspace, *args: str) -> Any:
    """`kiro ARGS -w <workspace>` in this process, as a person types it."""
    return CliRunner().invoke(app, [*args, "-w", str(ws.root)], catch_exceptions=False)


# -- the API itself ---------------------------------------------------------------------------------


def test_start_resume_stop_and_tell_through_the_api(ws: Workspace) -> None:
    ws.task(shell_task(3))
    heard = Heard()
    started = api.start(["Specs/feature/tasks.md"], workspace_path=ws.root, options=api.Options(max_iterations=1),
                        front=heard)
    tid = started.task_ids[0]
    assert started.exit_code == 4 and not started.detached
    assert [(o.task_id, o.exit_code) for o in heard.outcomes] == [(tid, 4)]
    told = api.tell(tid, "mind the tabs", workspace_path=ws.root)
    assert told.task_id == tid and not told.running and told.inbox.startswith(".state/")
    assert api.stop(tid, workspace_path=ws.root, reason="lunch", front=heard) == []  # not running: a hook only
    assert "is not running" in heard.lines[-1] and (ws.root / ".hooks" / f"stop_autonomous_loop_{tid}.md").exists()
    again = api.resume(tid, workspace_path=ws.root, options=api.Options(max_iterations=10), front=heard)
    assert again.exit_code == 0 and ws.state(tid)["status"] == "completed"
    assert any("removed the stop hook" in w for w in heard.warnings), heard.warnings


def test_what_the_api_refuses_is_a_typed_error_with_one_line(ws: Workspace) -> None:
    """`kiro serve` answers these with 409 (Conflict) and 404 (TaskNotFound), from the type, not the text."""
    ws.task(shell_task(2))
    first = api.start(["Specs/feature/tasks.md"], workspace_path=ws.root, options=api.Options(max_iterations=1))
    with pytest.raises(Conflict, match="already has an unfinished loop"):
        api.start(["Specs/feature/tasks.md"], workspace_path=ws.root)
    with pytest.raises(Conflict, match="already has an unfinished loop"):  # said before a process is spent
        api.start(["Specs/feature/tasks.md"], workspace_path=ws.root, detach=True)
    with pytest.raises(TaskNotFound):
        api.start(["Specs/nope/tasks.md"], workspace_path=ws.root, detach=True)
    api.resume(first.task_ids[0], workspace_path=ws.root, options=api.Options(max_iterations=10))
    with pytest.raises(Conflict, match="already completed"):
        api.resume(first.task_ids[0], workspace_path=ws.root, detach=True)
    assert issubclass(LockHeld, Conflict)
    assert not list((ws.root / "Logs").glob("*.out")), "no refused start left an output file"


def test_a_loop_started_in_the_background_from_inside_a_process_runs_what_was_asked(ws: Workspace) -> None:
    """The background starter builds the loop's command line from the request, not from this process's argv
    (`kiro serve` and an in-process CLI have no `kiro loop start ...` argv to copy)."""
    ws.task(shell_task(2))
    heard = Heard()
    started = api.start(["Specs/feature/tasks.md"], workspace_path=ws.root, options=api.Options(max_iterations=7),
                        task_id="bg_loop", detach=True, front=heard)
    assert started.detached and started.task_ids == ["bg_loop"]
    state = ws.wait_for(lambda: (s := ws.state("bg_loop"))["status"] == "completed" and s, timeout=120,
                        what="the background loop to complete")
    assert state["max_iterations"] == 7
    assert "--quiet" not in (ws.root / "Logs" / "bg_loop.out").read_text()


# -- issue #38 item 5: start-time warnings with --detach --------------------------------------------


def test_a_detached_start_says_its_warnings_before_it_detaches(ws: Workspace) -> None:
    """A typo'd `max_iteration` would run with the default cap: the warning reaches the person's terminal,
    not only Logs/<id>.out."""
    ws.task(shell_task(1, extra_frontmatter="max_iteration: 3"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--detach")
    assert r.returncode == 0, r.stderr
    assert "frontmatter key 'max_iteration' is not one kiro reads (did you mean 'max_iterations'?)" in r.stderr, \
        (r.stdout, r.stderr)
    tid = r.stdout.strip().splitlines()[-1]
    ws.wait_for(lambda: ws.state(tid)["status"] == "completed", timeout=120, what="the loop to complete")


# -- issue #38 item 8: resume --all and review points ---------------------------------------------


def test_resume_all_continues_loops_paused_at_a_checkpoint(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "pause_at_checkpoints: true\n")
    ws.task(shell_task(1).replace("- [ ] 1. Step number 1",
                                  "- [ ] 1. Checkpoint - ensure all tests pass") + "- [ ] 2. Then this\n  ```sh\n"
            "  echo two >> side_effects.log\n  ```\n")
    r = kiro(ws, "loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.exit_code == 6, r.output
    tid = ws.only_task_id()
    assert ws.state(tid)["stop_reason"] == "checkpoint"
    r = kiro(ws, "loop", "resume", "--all")
    assert "no paused loop" not in r.output, r.output
    assert r.exit_code == 0, r.output
    assert ws.state(tid)["status"] == "completed"


# -- issue #38 item 13: --spec names a loop on every command ----------------------------------------


def test_spec_names_the_loop_on_every_command(ws: Workspace) -> None:
    ws.write(".kiro/specs/greeting/tasks.md", shell_task(2))
    r = kiro(ws, "loop", "start", "--spec", "greeting", "--max-iterations", "1")
    assert r.exit_code == 4, r.output
    tid = ws.only_task_id()
    for command in (["status"], ["progress"], ["state"], ["logs"], ["tell", "use tabs"]):
        r = kiro(ws, "loop", *command, "--spec", "greeting")
        assert r.exit_code == 0, (command, r.output)
        assert tid in r.output or "greeting" in r.output or "queued message" in r.output, (command, r.output)
    r = kiro(ws, "loop", "stop", "--spec", "greeting", "--reason", "lunch")
    assert r.exit_code == 0 and f"stop_autonomous_loop_{tid}.md" in r.output, r.output
    r = kiro(ws, "loop", "resume", "--spec", "greeting", "--max-iterations", "10")
    assert r.exit_code == 0, r.output
    assert ws.state(tid)["status"] == "completed"
    r = kiro(ws, "loop", "rollback", "--spec", "greeting", "--to-step", "1")
    assert "no such option" not in r.output.lower(), r.output
    r = kiro(ws, "loop", "progress", "--spec", "nope")
    assert r.exit_code == 1 and "no Kiro spec 'nope'" in r.output and "greeting" in r.output, r.output
    r = kiro(ws, "loop", "progress", "--spec", "greeting", "--task-id", tid)
    assert r.exit_code == 1 and "leave out --task-id" in r.output, r.output


# -- issue #38 item 17: history of an interrupted step --------------------------------------------


def test_history_says_an_interrupted_step_without_an_attempt_none(ws: Workspace) -> None:
    ws.task(shell_task(1))
    (ws.root / "Logs" / "t1.jsonl").write_text(
        '{"ts": "2026-11-28T09:00:00Z", "task_id": "t1", "event": "step_interrupted", "step_id": "1", '
        '"reason": "stop"}\n')
    r = kiro(ws, "loop", "history")
    assert r.exit_code == 0, r.output
    assert "step 1 interrupted" in r.output and "None" not in r.output, r.output
