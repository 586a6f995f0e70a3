"""Which loop a task file belongs to lives in kiro's own state (`.state/task_files.json`), not in the person's
file (issue #31 item 2): a task file in Specs/ (or anywhere) gets box characters and nothing else, and is still
found when a person moves and renames it between Specs/, Needs_Action/ and Done/. A `kiro_task_id` the person
wrote is honoured and kept current: a `kiro_task_id:` line is how a person asks for the id in the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
    r = ws.run("loop", "status", "--task", "Needs_Action/review/auth-plan.md", "--json")
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


BAD_MAPS = {
    "not JSON": b"{not json",
    "a list": b"[1, 2]",
    "odd entries": b'{"a": {"path": ["x"], "dev": 1, "ino": 2}, "b": {"path": "/x", "dev": "1", "ino": null}, "c": 3}',
    "binary": bytes(range(256)),
    "a FIFO": None,
}


@pytest.mark.parametrize("what", list(BAD_MAPS))
def test_a_bad_day_map_of_task_files_never_stops_a_start(ws: Workspace, what: str) -> None:
    """kiro's map of task files damaged (by hand, a crash of another tool, a FIFO in its place): a start still
    works, says nothing odd, and writes a good map; nothing hangs."""
    path = ws.root / ".state" / "task_files.json"
    data = BAD_MAPS[what]
    if data is None:
        os.mkfifo(path)
    else:
        path.write_bytes(data)
    ws.task(shell_task(1))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "t", timeout=60)
    print(f"{what}: exit {r.returncode}")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert path.is_file() and json.loads(path.read_text())["t"]["path"].endswith(TASK)


def test_a_new_task_file_on_a_deleted_ones_inode_is_not_taken_for_it(ws: Workspace) -> None:
    """A file system gives a deleted file's inode to the next new file. Here the map says so (as it would
    after a person deleted the first task file and wrote another): the new file, of another length, is a
    new task, not the unfinished loop's file moved."""
    ws.task(shell_task(2))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "old", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    (ws.root / TASK).unlink()
    other = ws.task(shell_task(1, title="Something else entirely"), "Specs/other/tasks.md")
    recorded = ws.root / ".state" / "task_files.json"
    entries = json.loads(recorded.read_text())
    st = other.stat()
    entries["old"].update(dev=st.st_dev, ino=st.st_ino)  # the old file's inode, now the new file's
    recorded.write_text(json.dumps(entries))
    r = ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "new")
    assert r.returncode == 0, r.stdout + r.stderr  # not "already has an unfinished loop 'old'"
    assert ws.state("old")["status"] == "max_iterations"  # the old loop is as it was
