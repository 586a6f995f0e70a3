"""Which loop a task file belongs to lives in kiro's own state (`.state/task_files.json`), not in the person's
file (issue #31 item 2): a task file in Specs/ (or anywhere) gets box characters and nothing else, and is still
found when a person moves and renames it between Specs/, Needs_Action/ and Done/. A `kiro_task_id` the person
wrote is honoured and kept current: a `kiro_task_id:` line is how a person asks for the id in the file."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Workspace, shell_task

TASK = "Specs/feature/tasks.md"


def boxes_only(before: str, after: str) -> None:
    assert after.replace("[x]", "[ ]") == before, after


def test_a_plain_task_file_gets_boxes_only_and_is_followed_through_moves_and_renames(ws: Workspace) -> None:
    path = ws.task(shell_task(2, extra_frontmatter="owner: alice  # the person's key"))
    before = path.read_text()
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "t", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr  # one step done, one to go
    assert path.read_text() == before.replace("- [ ] 1.", "- [x] 1.")  # no kiro_task_id line

    moved = ws.root / "Needs_Action" / "review" / "auth-plan.md"  # a person moves and renames it
    moved.parent.mkdir(parents=True)
    path.rename(moved)
    r = ws.kiro("loop", "status", "--task", "Needs_Action/review/auth-plan.md", "--json")
    assert r.returncode == 0 and '"task_id": "t"' in r.stdout, r.stdout + r.stderr

    done = ws.root / "Done" / "finished.md"  # then calls it done: the loop is completed, nothing runs again
    moved.rename(done)
    r = ws.kiro("loop", "resume", "--task-id", "t", "--max-iterations", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("t")["status"] == "completed"
    assert (ws.root / "side_effects.log").read_text().split() == ["1"]
    boxes_only(before, done.read_text())
    print("moved and renamed twice, found each time by the id kiro keeps; the file holds boxes only")


def test_a_batch_start_records_every_task_file_and_writes_none_of_them(ws: Workspace) -> None:
    paths = [ws.task(shell_task(1, title=f"T{i}"), f"Specs/t{i}/tasks.md") for i in range(3)]
    before = [p.read_text() for p in paths]
    r = ws.kiro("loop", "start", *(a for i in range(3) for a in ("--task", f"Specs/t{i}/tasks.md")),
                "--max-iterations", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    for i, text in enumerate(before):
        boxes_only(text, (ws.root / f"Done/t{i}/tasks.md").read_text())
    import json

    recorded = json.loads((ws.root / ".state" / "task_files.json").read_text())
    assert sorted(Path(e["path"]).parent.name for e in recorded.values()) == ["t0", "t1", "t2"]


def test_a_kiro_task_id_line_the_person_wrote_is_kept_current(ws: Workspace) -> None:
    path = ws.task(shell_task(2, extra_frontmatter="kiro_task_id:"))  # asked for: the id in the file
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "mine", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "kiro_task_id: mine\n" in path.read_text()
    moved = ws.root / "Specs" / "elsewhere" / "copy.md"  # copied, not moved: a new file; its id still names it
    moved.parent.mkdir(parents=True)
    moved.write_text(path.read_text())
    path.unlink()
    r = ws.kiro("loop", "resume", "--task-id", "mine", "--max-iterations", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2"]
