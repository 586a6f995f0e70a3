"""A loop resumes with what it started with (issue "What a new user hit", item 3): the executor,
agent and model `start` was given on its command line are kept in the loop's state and used again
by `resume`, unless it names its own. A workspace without a config file (the Kiro layout) has
nothing else to remember them by."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.conftest import Workspace

TASK = "Specs/feature/tasks.md"

# A stand-in `codex` on PATH: checks its step's box (kiro marks the step in progress `[~]`), notes the
# step, and drops this loop's stop hook after step 1.
FAKE_CODEX = f"""#!{sys.executable}
import os, pathlib, re, sys
sys.stdin.read()
task = pathlib.Path(os.environ["KIRO_TASK_FILE"])
step = os.environ["KIRO_STEP_ID"]
task.write_text(re.sub(r"^- \\[[ ~-]\\] " + re.escape(step) + r"\\.", "- [x] " + step + ".", task.read_text(),
                       count=1, flags=re.M))
root = pathlib.Path.cwd()  # the project (the task file given is the step's copy under .state/steps/)
with open(root.parent / "codex_runs.log", "a") as fh:
    fh.write(step + "\\n")
if step == "1":
    (root / ".hooks" / "stop_autonomous_loop_night.md").write_text("stop\\n")
"""


def _codex_on_path(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    codex = bin_dir / "codex"
    codex.write_text(FAKE_CODEX)
    codex.chmod(0o755)
    # KIRO_SANDBOX=off: the stand-in drops the loop's stop hook and notes its runs beside the workspace,
    # which the step's box refuses (and an environment variable is no flag for resume to keep)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "KIRO_SANDBOX": "off"}


def test_resume_without_flags_keeps_the_executor_and_agent_start_was_given(ws: Workspace, tmp_path: Path) -> None:
    (ws.root / "config" / "autonomous_loop.yaml").unlink()  # no config file: only the flags say it
    ws.task("---\ntitle: Night\n---\n- [ ] 1. Write part one\n- [ ] 2. Write part two\n")
    env = ws.env(**_codex_on_path(tmp_path))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "night", "--executor", "command", "--agent", "codex",
                env=env)
    assert r.returncode == 3, r.stdout + r.stderr  # the stop hook after step 1
    assert ws.state("night")["executor"] == "command"

    r = ws.kiro("loop", "resume", "--task-id", "night", "--reset-failures", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root.parent / "codex_runs.log").read_text().split() == ["1", "2"]
    st = ws.state("night")
    assert st["status"] == "completed" and st["overrides"] == {"executor": "command", "agent": "codex"}


def test_a_flag_given_to_resume_wins_and_is_kept(ws: Workspace, tmp_path: Path) -> None:
    ws.task("---\ntitle: Night\n---\n- [ ] 1. Write part one\n- [ ] 2. Write part two\n")
    env = ws.env(**_codex_on_path(tmp_path))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "night", "--agent", "codex", "--model", "m1", env=env)
    assert r.returncode == 3, r.stdout + r.stderr
    r = ws.kiro("loop", "resume", "--task-id", "night", "--model", "m2", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("night")["overrides"] == {"agent": "codex", "llm.model": "m2"}
