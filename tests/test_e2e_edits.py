"""A person edits the task file while a loop runs: every edit is honoured, and survives kiro's own
edits byte for byte (kiro changes only the checkbox characters it owns)."""

from __future__ import annotations

import pytest

from tests.conftest import Workspace

TASK = """\
---
title: Edits while running
owner: alice            # the person's own key, left alone
executor: shell
---
<!-- planning notes: keep -->
# Plan

- [ ] 1. First
  - a detail bullet
  ```sh
  echo 1 >> side_effects.log
  ```
- [ ] 2. Second, waits for the gate
  ```sh
  echo 2 >> side_effects.log
  while [ ! -f gate ]; do sleep 0.02; done
  ```
- [ ] 3. Third: the person checks it while 2 runs
  ```sh
  echo 3 >> side_effects.log
  ```
- [ ] 4. Fourth: the person rewrites its command while 2 runs
  ```sh
  echo 4-old >> side_effects.log
  ```
"""


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_person_edits_during_a_run_are_honoured_and_kept(ws: Workspace, newline: str) -> None:
    path = ws.root / "Specs/feature/tasks.md"
    path.parent.mkdir(parents=True)
    path.write_bytes(TASK.replace("\n", newline).encode())
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "edits")
    ws.wait_for(lambda: (ws.root / "side_effects.log").read_text().split() == ["1", "2"], what="step 2 running")

    text = path.read_bytes().decode()
    assert f"- [x] 1. First{newline}" in text and "- [-] 2. Second" in text  # kiro's marks so far
    assert "kiro_task_id" not in text  # which loop it belongs to lives in kiro's state (.state/task_files.json)
    edited = (
        text.replace("- [x] 1. First", "- [ ] 1. First")  # uncheck: done again
        .replace("- [ ] 3. Third", "- [x] 3. Third")  # check: skipped
        .replace("echo 4-old", "echo 4-new")  # edit a detail
        .replace("<!-- planning notes: keep -->", "<!-- planning notes: keep -->" + newline
                 + "<!-- a comment the person added mid-run -->")
        + f"- [ ] 5. Added by the person{newline}  ```sh{newline}  echo 5 >> side_effects.log{newline}  ```{newline}"
    )
    path.write_bytes(edited.encode())
    (ws.root / "gate").touch()
    assert proc.wait(timeout=60) == 0, ws.output(proc)

    ran = (ws.root / "side_effects.log").read_text().split()
    assert ran == ["1", "2", "1", "4-new", "5"]
    final = (ws.root / "Done/feature/tasks.md").read_bytes().decode()
    expected = edited.replace("- [ ] ", "- [x] ").replace("- [-] ", "- [x] ")
    assert final == expected  # byte for byte: only kiro's checkbox characters changed


def test_a_box_checked_by_hand_before_start_is_skipped_and_unchecked_parent_is_closed(ws: Workspace) -> None:
    ws.task("""\
        ---
        executor: shell
        ---
        - [ ] 1. Parent
          - [x] 1.1 Done by hand
            ```sh
            echo 1.1 >> side_effects.log
            ```
          - [ ] 1.2 Open
            ```sh
            echo 1.2 >> side_effects.log
            ```
          - [ ]* 1.3 Optional, skipped by default
            ```sh
            echo 1.3 >> side_effects.log
            ```
        """)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "hand")
    assert r.returncode == 0, r.stderr
    assert (ws.root / "side_effects.log").read_text().split() == ["1.2"]
    final = (ws.root / "Done/feature/tasks.md").read_text()
    assert "- [x] 1. Parent" in final and "- [ ]* 1.3 Optional" in final
