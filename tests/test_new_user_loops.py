"""What a new user hit on the first night, run as they ran it (issue #32): a flat Kiro task list (items 9), a
typo in a task's frontmatter (item 5), one chosen step (`--step`, item 10b) and a clean restart (`--fresh`,
item 10c). Each test runs `kiro loop start` as a subprocess on a shell task and reads what a person reads:
the exit code, the output, the task file's boxes, the state files."""

from __future__ import annotations

from tests.conftest import Workspace

TASK = "Specs/feature/tasks.md"


def sh(step: str) -> str:
    return f'  ```sh\n  echo {step} >> ran.log\n  ```\n'


FLAT = ("---\nexecutor: shell\n---\n# Implementation Plan\n\n"
        "- [ ] 1. Set up\n" + sh("1")
        + "- [ ] 2. Implement the feature\n"  # a parent: no command of its own, its sub-steps are not indented
        + "- [ ] 2.1 The model\n" + sh("2.1")
        + "- [ ] 2.2 The view\n" + sh("2.2")
        + "- [ ] 3. Document it\n" + sh("3"))


def ran(ws: Workspace) -> list[str]:
    log = ws.root / "ran.log"
    return log.read_text().split() if log.exists() else []


def test_a_flat_kiro_list_runs_its_sub_steps_and_checks_their_parent(ws: Workspace) -> None:
    ws.task(FLAT)
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "flat")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ran(ws) == ["1", "2.1", "2.2", "3"]  # no attempt at "2" on its own (it has no command: exit 1 before)
    done = (ws.root / "Done" / "feature" / "tasks.md").read_text()
    assert "- [x] 2. Implement the feature" in done and "- [ ]" not in done
    assert ws.state("flat")["steps_total"] == 5
