"""The look at the workspace's task files around every step (kiro.executors.control.TaskFiles, SPEC §15) made
cheap for many loops (issue #41): a task file is read again only when it changed, and a real path is asked
for only where a link may be. Neither may let a step's change of a task file go unseen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiro.executors import control
from kiro.store.workspace import Workspace as KiroWorkspace
from kiro.store.workspace import task_files
from tests.conftest import Workspace

OTHER = "---\ntitle: other\nexecutor: shell\n---\n# Plan\n\n- [ ] 1. Step\n"
SAME_SIZE = OTHER.replace("executor: shell", "executor: codex")  # as long, another executor


def test_each_task_file_is_named_by_its_real_path(ws: Workspace, tmp_path: Path) -> None:
    """A file in Specs/, a link in Specs/ to a file elsewhere, and a Kiro spec: each found once, by its real
    path, so that the look after a boxed step still sees the linked file (it is not under Specs/)."""
    plain = ws.task(OTHER, "Specs/plain/tasks.md")
    outside = tmp_path / "elsewhere.md"
    outside.write_text(OTHER)
    (ws.root / "Specs/linked.md").symlink_to(outside)
    spec = ws.task(OTHER, ".kiro/specs/zz/tasks.md")
    (ws.root / "Specs/twice.md").symlink_to(plain)  # the same file twice: once
    found = {real for _path, real in task_files(KiroWorkspace(ws.root))}
    assert found == {os.path.realpath(plain), os.path.realpath(outside), os.path.realpath(spec)}


def test_each_task_file_is_named_by_its_real_path_when_specs_is_a_link(ws: Workspace) -> None:
    target = ws.task(OTHER, ".kiro/specs/zz/tasks.md")
    (ws.root / "Specs").rmdir()
    (ws.root / "Specs").symlink_to(ws.root / ".kiro/specs")  # `ln -s .kiro/specs Specs`
    found = [real for _path, real in task_files(KiroWorkspace(ws.root))]
    assert found == [os.path.realpath(target)]


@pytest.mark.parametrize("kept", [True, False], ids=["read-kept", "read-again"])
def test_a_frontmatter_changed_during_a_step_with_its_times_put_back_is_held(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, kept: bool) -> None:
    """A step that rewrites another loop's frontmatter, keeps the file's size and puts its mtime back: the
    file is still read again (its ctime moved, which no process sets) and held for a person's approval."""
    if kept:  # the first read is remembered at once, as for a file last changed long ago
        monkeypatch.setattr(control, "RACY_NS", -(10**18))
    own = ws.task(OTHER.replace("other", "mine!"), "Specs/feature/tasks.md")
    other = ws.task(OTHER, "Specs/other/tasks.md")
    kws = KiroWorkspace(ws.root)
    look = control.TaskFiles.take(kws, own)
    assert control.TaskFiles.take(kws, own).by_path == look.by_path  # a second look finds the same
    before = os.stat(other)
    other.write_text(SAME_SIZE)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))  # the mtime put back
    after = os.stat(other)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    said = look.check(boxed=False, task_id="mine", step_id="1")
    assert any("Specs/other/tasks.md was changed (its frontmatter)" in line for line in said), said
    assert sorted(p.name for p in (ws.root / "Pending_Approval").glob("task_file_*.md")), "no hold written"
