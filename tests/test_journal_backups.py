"""Backups of a running loop (backup_state_every_n_iterations, SPEC §4) with the journal (issue #12):
each due iteration gets its own backup, made as a hard link to the current snapshot plus the
journal records after it (no copy of a history-sized file), and each reads back as exactly the
state saved at that iteration, also after the loop has written newer snapshots."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from kiro.core.runner import prepare_start, run_loops
from kiro.store import journal
from kiro.store.statestore import BACKUPS_KEPT, StateStore
from kiro.store.workspace import Workspace


def _workspace(root: Path, steps: int) -> Workspace:
    for name in ("Specs/t", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "config/autonomous_loop.yaml").write_text(
        "autonomous_loop:\n  backup_state_every_n_iterations: 1\n  max_iterations: 1000\n")
    lines = ["---", "title: backups", "executor: shell", "---"]
    for i in range(1, steps + 1):
        lines += [f"- [ ] {i}. Step {i}", "  ```sh", "  true", "  ```"]
    (root / "Specs/t/tasks.md").write_text("\n".join(lines) + "\n")
    return Workspace(root)


def test_each_due_iteration_gets_a_backup_that_reads_back_as_that_iterations_state(tmp_path: Path,
                                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # no timer snapshot overtakes a queued backup (then the backup would be that newer state)
    monkeypatch.setattr(journal, "SNAPSHOT_SECONDS", 600.0)
    ws = _workspace(tmp_path / "ws", 12)
    store = StateStore(ws)
    seen: dict[str, tuple[int, bytes, bytes | None]] = {}  # backup name -> (iteration read, its bytes, journal)
    linked: list[str] = []
    order: list[str] = []
    real_link, real_copy = StateStore._link_backup, StateStore._write_backup

    def note(target: Path) -> Path:
        order.append(target.name)
        side = journal.journal_path(target)
        seen[target.name] = (store._read(target, "t").iteration, target.read_bytes(),
                             side.read_bytes() if side.exists() else None)
        return target

    def link(self: StateStore, task_id: str, iteration: int, snapshot: Path, records: bytes) -> Path:
        linked.append(task_id)
        return note(real_link(self, task_id, iteration, snapshot, records))

    def copy(self: StateStore, task_id: str, iteration: int, text: str) -> Path:
        return note(real_copy(self, task_id, iteration, text))

    monkeypatch.setattr(StateStore, "_link_backup", link)
    monkeypatch.setattr(StateStore, "_write_backup", copy)
    run = prepare_start(ws, "Specs/t/tasks.md", task_id="t")
    [outcome] = asyncio.run(run_loops([run]))
    assert outcome.exit_code == 0, outcome
    print(f"{len(seen)} backups made ({len(linked)} linked): "
          f"{sorted((n.rsplit('.i', 1)[1], v[0]) for n, v in seen.items())}")
    # in the order made (one per due iteration): the state saved at that iteration, or the next save when
    # a snapshot already held it (a backup never copies the history, so it can only link what is on disk)
    made = [seen[name][0] for name in order]
    assert len(made) == 12 and all(due <= it <= due + 1 for due, it in enumerate(made, 1)), made
    assert sum(due == it for due, it in enumerate(made, 1)) >= 10, made
    assert len(linked) >= 10  # a copy only where no snapshot was on disk yet
    backups = store._backups("t")
    assert len(backups) == BACKUPS_KEPT
    due_of = {name: due for due, name in enumerate(order, 1)}
    for path in backups:
        iteration, data, side = seen[path.name]
        assert int(path.name.rsplit(".i", 1)[1].split(".")[0]) == iteration
        assert path.read_bytes() == data, "a backup changed after it was made"
        side_path = journal.journal_path(path)
        assert (side_path.read_bytes() if side_path.exists() else None) == side
        assert store._read(path, "t").iteration == iteration
        # the steps done by the due iteration, all of them: its own save, or the next one (the next
        # iteration's start, which has not completed its step yet; CI once met that case here)
        done = [c.step_id for c in store._read(path, "t").completed_steps]
        assert done == [str(i) for i in range(1, due_of[path.name] + 1)], (path.name, done)
    leftovers = [p.name for p in ws.backups_dir().iterdir()
                 if p not in backups and journal.journal_path(p) not in [journal.journal_path(b) for b in backups]]
    assert leftovers == []
    # no copy of the state: each backup is the first snapshot's file (a hard link: the loop's own
    # state file has been replaced by newer snapshots since) plus its journal of later saves
    assert len({os.stat(p).st_ino for p in backups}) <= 2
    assert sum(journal.journal_path(p).exists() for p in backups) >= BACKUPS_KEPT - 1
    # the loop ends with a state file of its own: tearing it in place leaves every backup whole
    main = ws.archived_state_file("t")  # completed: archived
    assert os.stat(main).st_nlink == 1
    main.write_text('{"task_id": "t", "status": "run')
    assert [store._read(p, "t").iteration for p in backups] == sorted((seen[p.name][0] for p in backups), reverse=True)


def test_a_step_is_never_recorded_completed_on_disk_before_its_checked_box_is_synced(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The `[x]` byte is written on the event loop and fdatasync'd on the loop's writer thread
    (kiro.store.statestore LiveJournal.sync_first), before any journal append or snapshot that records the step."""
    ws = _workspace(tmp_path / "ws", 8)
    state_file = StateStore(ws).path("t")
    real_sync = os.fdatasync
    synced_boxes = [0]
    checks: list[tuple[int, int]] = []  # (steps recorded completed on disk, boxes synced) at each state sync

    def sync(fd: int) -> None:
        real_sync(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith("/tasks.md"):  # Specs/t/tasks.md, or Done/t/tasks.md once the loop moved it
            synced_boxes[0] = os.pread(fd, 1 << 20, 0).decode().count("- [x]")
        elif target.endswith(".journal") and "backups" not in target:
            recorded = len(journal.read_state_dict(state_file).get("completed_steps") or [])
            checks.append((recorded, synced_boxes[0]))

    monkeypatch.setattr(os, "fdatasync", sync)
    run = prepare_start(ws, "Specs/t/tasks.md", task_id="t")
    [outcome] = asyncio.run(run_loops([run]))
    assert outcome.exit_code == 0, outcome
    print(f"{len(checks)} journal syncs checked: {checks}")
    assert len(checks) >= 8
    assert all(recorded <= boxes for recorded, boxes in checks)
    assert checks[-1][0] >= 7


def test_pruning_one_loops_backups_leaves_another_loops_whose_id_starts_with_its_own(tmp_path: Path) -> None:
    """Loops `a` and `a.b`: `a`'s backups were found by the prefix `autonomous_loop_a.`, which `a.b`'s
    files share too, so pruning `a` to its newest BACKUPS_KEPT deleted `a.b`'s (and a corrupt `a` fell
    back on `a.b`'s backup). Each loop's backups are its own, matched by the whole id."""
    from kiro.store.state import LoopState

    ws = _workspace(tmp_path / "ws", 1)
    store = StateStore(ws)
    for iteration in range(1, BACKUPS_KEPT + 1):
        store.backup(LoopState(task_id="a.b", task_path="Specs/t/tasks.md", iteration=iteration))
    for iteration in range(1, BACKUPS_KEPT + 3):
        store.backup(LoopState(task_id="a", task_path="Specs/t/tasks.md", iteration=iteration))
    ab = [store._read(p).task_id for p in store._backups("a.b")]
    a = [store._read(p).task_id for p in store._backups("a")]
    print(f"backups of a.b: {len(ab)} of {BACKUPS_KEPT} kept; backups listed as a's: {a}")
    assert ab == ["a.b"] * BACKUPS_KEPT
    assert a == ["a"] * BACKUPS_KEPT
    # the newest of `a`'s, not of `a.b`'s, is what a corrupt `a` falls back on
    store.save(LoopState(task_id="a", task_path="Specs/t/tasks.md", iteration=9))
    store.path("a").write_text('{"task_id": "a", "stat')
    assert store.load("a").state.iteration == BACKUPS_KEPT + 2


def test_a_backups_journal_left_without_its_backup_goes_at_the_loops_next_backup(tmp_path: Path) -> None:
    """A kill between a backup's journal and its link leaves the journal alone in `.state/backups/`: the loop's
    next backup removes it (another loop's stays), keeps the newest BACKUPS_KEPT backups each with its journal,
    and each still reads back as the iteration in its name."""
    from kiro.store.state import LoopState

    ws = _workspace(tmp_path / "ws", 1)
    store = StateStore(ws)
    folder = ws.backups_dir()
    folder.mkdir(parents=True, exist_ok=True)
    orphan = folder / "autonomous_loop_t.20200101T000000000000.i000001.journal"
    other = folder / "autonomous_loop_t.b.20200101T000000000000.i000001.journal"
    for path in (orphan, other):
        path.write_bytes(b'{"seq":1,"set":{}}\n')
    state = LoopState(task_id="t", task_path="Specs/t/tasks.md")
    store.open_journal(state)
    try:
        store.save(state)  # the first save: a snapshot; each later one a journal record after it
        for iteration in range(1, BACKUPS_KEPT + 3):
            state.iteration = iteration
            store.save(state)
            assert store.backup(state) is None  # linked to the snapshot, with the records after it
    finally:
        store.close_journal("t")
    names = sorted(p.name for p in folder.iterdir())
    print(f"left in backups/: {names}")
    assert not orphan.exists() and other.exists()
    backups = store._backups("t")
    assert [store._read(p, "t").iteration for p in backups] == list(range(BACKUPS_KEPT + 2, 2, -1))
    assert sorted(store._backups("t", journal.JOURNAL_SUFFIX)) == sorted(journal.journal_path(p) for p in backups)
