"""The docs' sample task file (docs/guides/kiro-specs.md, under "Task files") runs as printed: it completes with the
shell executor in a workspace `kiro init` made, and a step with no ```sh block ends the loop at once
(exit 1) saying how to fix it, instead of failing three times with backoff (exit 5)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import Workspace

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "kiro-specs.md"


def _sample_task() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index("## Task files"):]
    found = re.search(r"^````markdown\n(.*?)^````$", section, re.S | re.M)
    assert found, "the guide's sample task file"
    return found.group(1)


def test_the_guide_sample_task_runs_to_completion_as_printed(ws: Workspace) -> None:
    r = ws.kiro("init", ".")
    assert r.returncode == 0, r.stdout + r.stderr
    ws.task(_sample_task(), "Specs/auth/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/auth/tasks.md", "--task-id", "auth")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "app/services/login.py").is_file()
    state = ws.state("auth")
    assert state["status"] == "completed" and state["total_failures"] == 0


def test_a_step_without_a_sh_block_ends_the_loop_at_once_with_the_fix(ws: Workspace) -> None:
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Set up project structure\n  - Create directories\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bare")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "has no ```sh block" in out and "--agent" in out
    state = ws.state("bare")
    assert state["stop_reason"] == "executor_error" and state["iteration"] == 1  # not retried
