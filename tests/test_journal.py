"""The state journal (issue #12, kiro.store.journal): every save of a running loop is one fdatasync'd
append; the state read back (snapshot + journal replayed) is exactly the last save, whatever
changed; a torn last append reads as the save before it; the bare JSON file follows within
SNAPSHOT_SECONDS, and at once on a status change."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from kiro import timeutil
from kiro.status import Status
from kiro.store import journal
from kiro.store.state import FAILED_KEPT, HISTORY_KEPT, CompletedStep, CurrentStep, FailedStep, LoopState, to_jsonable
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace


def _store(tmp_path: Path) -> StateStore:
    (tmp_path / ".state").mkdir()
    return StateStore(Workspace(tmp_path))


def _running(tmp_path: Path, task_id: str) -> tuple[StateStore, LoopState]:
    """A running loop's store and state, its journal open and its first save (the snapshot) made."""
    store = _store(tmp_path)
    state = LoopState(task_id=task_id, task_path=f"Specs/{task_id}/tasks.md", status=Status.RUNNING)
    store.open_journal(state)
    store.save(state)
    return store, state


def _same(store: StateStore, state: LoopState) -> None:
    assert to_jsonable(store.load(state.task_id).state) == to_jsonable(state)


def _mutate(state: LoopState, rng: random.Random, i: int) -> str:
    """One random change of the kinds the engine and `kiro loop rollback` make."""
    kind = rng.choice(["complete", "fail", "transition", "current", "rollback", "usage", "steps"])
    now = timeutil.iso()
    if kind == "complete":
        state.completed_steps.append(CompletedStep(step_id=f"s{i}", description=f"step {i} é", completed_at=now,
                                                   duration_seconds=rng.random(), iteration=i, summary="ok"))
        state.total_successes += 1
    elif kind == "fail":
        for _ in range(rng.randint(1, 30)):
            state.failed_steps.append(FailedStep(step_id=f"s{i}", description="d", failed_at=now, error="boom\n",
                                                 retry_count=1))
        state.step_record(f"s{i}").attempts += 1
        state.step_record(f"s{i}").last_error = "boom"
    elif kind == "transition":
        for _ in range(rng.randint(1, 80)):
            state.transition(rng.choice([Status.RUNNING, Status.SLEEPING]), f"r{rng.random()}")
    elif kind == "current":
        state.current_step = CurrentStep(step_id=f"s{i}", description="x", status="in_progress", started_at=now)
        state.iteration += 1
    elif kind == "rollback" and state.completed_steps:
        state.completed_steps = state.completed_steps[: rng.randint(0, len(state.completed_steps))]
    elif kind == "usage":
        state.usage.api_calls += 1
        state.context.last_prompt = "p" * rng.randint(0, 5000)
    elif kind == "steps":
        state.steps.clear()
    return kind


def test_every_save_reads_back_exactly_through_the_journal(tmp_path: Path) -> None:
    store, state = _running(tmp_path, "j")
    rng = random.Random(12)
    kinds: dict[str, int] = {}
    for i in range(400):
        kind = _mutate(state, rng, i)
        kinds[kind] = kinds.get(kind, 0) + 1
        store.save(state)
        _same(store, state)
    print(f"400 random saves read back exactly: {kinds}")
    assert len(state.failed_steps) <= FAILED_KEPT and len(state.history) <= HISTORY_KEPT
    assert len(state.steps) <= 200
    store.close_journal("j")
    assert not journal.journal_path(store.path("j")).exists()
    assert json.loads(store.path("j").read_text()) == to_jsonable(state)  # the file alone is whole again


def test_a_torn_last_append_reads_as_the_save_before(tmp_path: Path) -> None:
    store = _store(tmp_path)
    state = LoopState(task_id="t", task_path="Specs/t/tasks.md", status=Status.RUNNING)
    store.open_journal(state)
    store.save(state)
    state.iteration = 1
    store.save(state)
    before = to_jsonable(state)
    state.iteration = 2
    state.completed_steps.append(CompletedStep(step_id="1", description="a", completed_at=timeutil.iso(),
                                               duration_seconds=1.0))
    store.save(state)
    path = journal.journal_path(store.path("t"))
    data = path.read_bytes()
    assert data.count(b"\n") >= 2
    path.write_bytes(data[:-7])  # a kill in the middle of the last append
    assert to_jsonable(store.load("t").state) == before | {"journal_seq": before["journal_seq"]}
    store.close_journal("t")


def test_the_bare_state_file_follows_within_the_snapshot_interval_and_at_once_on_a_status_change(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    state = LoopState(task_id="b", task_path="Specs/b/tasks.md", status=Status.RUNNING)

    def bare() -> dict[str, object]:
        return json.loads(store.path("b").read_text())  # type: ignore[no-any-return]

    async def run() -> tuple[int, int, float, str]:
        store.open_journal(state)
        store.save(state)
        state.iteration = 7
        await asyncio.to_thread(store.save_job(state))
        at_once = bare()["iteration"]
        started = time.monotonic()
        while bare()["iteration"] != 7 and time.monotonic() - started < 10:  # no more saves: a long step
            await asyncio.sleep(0.02)
        later = bare()["iteration"]
        waited = time.monotonic() - started
        state.transition(Status.PAUSED, "stop_hook")
        await asyncio.to_thread(store.save_job(state))
        return at_once, later, waited, str(bare()["status"])

    at_once, later, waited, status = asyncio.run(run())
    print(f"bare JSON: iteration {at_once} right after the save, {later} after {waited:.2f} s; "
          f"status {status} right after a transition")
    assert (at_once, later, status) == (0, 7, "paused")
    store.close_journal("b")


def test_the_summary_says_what_status_shows_and_a_torn_one_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    state = LoopState(task_id="s", task_path="Specs/s/tasks.md", status=Status.RUNNING, title="T")
    store.open_journal(state)
    store.save(state)
    state.current_step = CurrentStep(step_id="2.1", description="Do it", status="in_progress")
    state.iteration = 3
    store.save(state)
    found = journal.read_summary(store.path("s"))
    assert found is not None
    assert (found["status"], found["iteration"], found["title"], found["current_step"]["step_id"]) == (
        "running", 3, "T", "2.1")
    path = journal.summary_path(store.path("s"))
    data = path.read_bytes()
    torn = data[:40] + data[40:60].replace(b"3", b"4") + data[60:]
    assert journal.decode_summary(torn.replace(b'"iteration":3', b'"iteration":4')) is None
    store.close_journal("s")


def _steps_in_order(state: LoopState) -> list[tuple[str, dict[str, object]]]:
    return [(k, r.model_dump(mode="json", by_alias=True)) for k, r in state.steps.items()]


def test_steps_records_are_journaled_entry_by_entry_and_read_back_in_order(tmp_path: Path) -> None:
    """steps{} (a record per step with attempts, up to STEPS_KEPT) is journaled by the entries that
    changed, not whole at every save (~20 KB a save at 200 steps, issue #12). Read back, it holds the
    same records in the same order (the oldest are the first dropped), whatever the engine, a rollback
    or a scheduled run's reset did to it: records added, changed in place, removed, removed and added
    again, replaced by new objects, the dict rebuilt in another order, extra keys of a newer kiro."""
    from kiro.store.state import StepRecord

    store, state = _running(tmp_path, "p")
    rng = random.Random(7)
    kinds: dict[str, int] = {}
    for i in range(600):
        kind = rng.choice(["add", "add", "attempt", "error", "retry", "pop", "readd", "replace", "reorder",
                           "clear", "extra", "none"])
        keys = list(state.steps)
        if kind == "add":
            state.step_record(f"s{i}").attempts = 1
        elif kind == "attempt" and keys:
            state.steps[rng.choice(keys)].attempts += 1
        elif kind == "error" and keys:
            state.steps[rng.choice(keys)].last_error = rng.choice([None, "boom", f"e{i}"])
        elif kind == "retry" and keys:
            state.steps[rng.choice(keys)].next_retry_at = rng.choice([None, timeutil.iso()])
        elif kind == "pop" and keys:
            state.steps.pop(rng.choice(keys))
        elif kind == "readd" and keys:
            k = rng.choice(keys)
            rec = state.steps.pop(k)
            state.steps[k] = rec  # the same record, now last
        elif kind == "replace" and keys:
            state.steps[rng.choice(keys)] = StepRecord(attempts=rng.randint(1, 3))
        elif kind == "reorder" and len(keys) > 1:
            state.steps = dict(reversed(list(state.steps.items())))
        elif kind == "clear" and rng.random() < 0.2:
            state.steps = {}
        elif kind == "extra" and keys:
            rec = state.steps[rng.choice(keys)]
            rec.newer = [i]  # a newer kiro's key (extra="allow": kept in model_extra)
        kinds[kind] = kinds.get(kind, 0) + 1
        store.save(state)
        assert _steps_in_order(store.load(state.task_id).state) == _steps_in_order(state), (i, kind)
    print(f"600 random changes of steps{{}} read back in order: {kinds}")


def test_a_save_that_changes_one_steps_record_journals_that_record_only(tmp_path: Path) -> None:
    store = _store(tmp_path)
    state = LoopState(task_id="q", task_path="Specs/q/tasks.md", status=Status.RUNNING)
    for i in range(200):
        state.step_record(str(i)).attempts = 1
    store.open_journal(state)
    store.save(state)
    path = journal.journal_path(store.path("q"))
    before = path.stat().st_size
    state.step_record("7").last_error = "boom"
    state.iteration += 1
    store.save(state)
    line = path.read_bytes()[before:]
    record = json.loads(line)
    assert record["put"] == {"steps": {"7": {"attempts": 1, "last_error": "boom", "next_retry_at": None,
                                             "last_verify_output": None}}}, record
    assert "steps" not in record["set"] and len(line) < 400, line
    assert store.load("q").state.steps["7"].last_error == "boom"


def _done(i: int) -> CompletedStep:
    return CompletedStep(step_id=f"d{i}", description=f"Step {i}, déjà vu ✓", completed_at=timeutil.iso(),
                         duration_seconds=i / 7, iteration=i, summary="did the thing " * 3)


def test_a_long_history_s_snapshot_alone_is_the_last_save(tmp_path: Path) -> None:
    """A snapshot of a state with a long history is written from its cached items' JSON a batch at a
    time (kiro.store.statestore LiveJournal._snapshot_data, issue #41): the bare state file, read alone
    with no journal, is exactly the save it holds, across every batch's seam, the lists' items in order."""
    store = _store(tmp_path)
    state = LoopState(task_id="h", task_path="Specs/h/tasks.md", status=Status.RUNNING)
    state.completed_steps = [_done(i) for i in range(1000)]  # a few batches and a part of one
    for i in range(40):
        state.failed_steps.append(FailedStep(step_id=f"f{i}", description="d", failed_at=timeutil.iso(),
                                             error="boom\n", retry_count=1))
        state.transition(Status.SLEEPING if i % 2 else Status.RUNNING, f"r{i}")
    store.open_journal(state)
    store.save(state)
    bare = json.loads(store.path("h").read_bytes())
    assert bare == to_jsonable(state)
    for i in range(1000, 1300):  # appended: the cached items grow by the journal's records
        state.completed_steps.append(_done(i))
        state.iteration = i
        store.save(state)
    state.transition(Status.PAUSED, "stop_hook")  # a status change: a snapshot at once
    store.save(state)
    assert journal.journal_path(store.path("h")).stat().st_size == 0  # every record is in the snapshot
    bare = json.loads(store.path("h").read_bytes())
    assert [c["step_id"] for c in bare["completed_steps"]] == [f"d{i}" for i in range(1300)]
    assert bare == to_jsonable(state)
    store.close_journal("h")


def test_a_snapshot_writes_each_field_on_its_line_as_json_dumps_spells_it(tmp_path: Path) -> None:
    """Each field of a snapshot but the long lists is one line, `"name": value`, the value as
    `json.dumps(value, ensure_ascii=False)` spells it (a space after `,` and `:`, non-ASCII as it is): the bare
    file a person reads is as it was before the snapshot kept one encoder for all its fields (session 36)."""
    store, state = _running(tmp_path, "f")
    state.title = "tâche ✓ \"q\""
    state.usage.api_calls = 3
    state.iteration = 2
    state.runs, state.timeout_seconds, state.timeout_reached = 1, 1.0, True  # equal keys, three spellings (kept apart)
    store.save(state)
    state.transition(Status.PAUSED, "stop_hook")  # a status change: a snapshot at once
    store.save(state)
    text = store.path("f").read_text("utf-8")
    bare = json.loads(text)
    assert bare == to_jsonable(state)
    saved = to_jsonable(state)
    lines = text.split("\n")
    small = [k for k, v in bare.items() if not (k in journal.BIG_LISTS and v)]
    assert len(small) > 30
    for key in small:
        lead = f"  {json.dumps(key)}: "
        found = [line.removesuffix(",") for line in lines if line.startswith(lead)]
        assert found == [lead + json.dumps(bare[key], ensure_ascii=False)], key
        assert found == [lead + json.dumps(saved[key], ensure_ascii=False)], key  # 1.0 is not true (1.0 == True)
    store.close_journal("f")


def test_a_resume_replays_at_most_a_snapshot_s_worth_of_journal(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With no timer (no event loop: a long run of saves in a row), the journal is folded into a new
    snapshot once it is larger than the snapshot and JOURNAL_MIN_BYTES, so what a resume after a kill
    reads and replays stays bounded by the state's own size, however many steps the loop has done."""
    monkeypatch.setattr(journal, "JOURNAL_MIN_BYTES", 16 * 1024)
    store = _store(tmp_path)
    state = LoopState(task_id="r", task_path="Specs/r/tasks.md", status=Status.RUNNING)
    state.completed_steps = [_done(i) for i in range(100)]
    store.open_journal(state)
    store.save(state)
    path = journal.journal_path(store.path("r"))
    most, folds, last = 0, 0, 0
    for i in range(100, 700):
        state.completed_steps.append(_done(i))
        state.iteration = i
        store.save(state)
        size = path.stat().st_size
        folds += size < last
        bound = max(journal.JOURNAL_MIN_BYTES, store.path("r").stat().st_size)
        assert size <= bound + 1024, (i, size, bound)  # the bound, and the one record that crossed it
        most, last = max(most, size), size
    print(f"600 saves: the journal at most {most:,} B, folded {folds} times")
    assert folds >= 2
    assert to_jsonable(store.load("r").state) == to_jsonable(state)
    store.close_journal("r")


def test_a_loops_first_snapshot_makes_its_journal_durable_with_one_fsync_of_the_folder(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The first save of a loop writes a snapshot and starts the journal: the journal is made before the
    snapshot's rename, so the one fsync of `.state/` after it makes both names durable (two before). A journal
    an earlier run left (a kill) is emptied only once the snapshot that holds its records is in place."""
    import os
    import stat

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    store = _store(tmp_path)
    state = LoopState(task_id="f", task_path="Specs/f/tasks.md", status=Status.RUNNING)
    path = journal.journal_path(store.path("f"))
    monkeypatch.setattr(os, "fsync", fsync)
    store.open_journal(state)
    store.save(state)
    assert synced == ["file", "folder"], synced  # the snapshot's temp file, then .state/ once
    assert path.exists() and path.stat().st_size == 0
    state.iteration = 3
    store.save(state)
    assert path.stat().st_size > 0
    seq = state.journal_seq
    os.close(store.journals["f"].fd)  # a kill: the journal stays, with its record after the snapshot
    store.journals.pop("f").closed = True

    resumed = StateStore(Workspace(tmp_path))
    again = resumed.load("f").state
    assert (again.iteration, again.journal_seq) == (3, seq)
    synced.clear()
    resumed.open_journal(again)
    resumed.save(again)
    assert synced == ["file", "folder"], synced
    assert path.stat().st_size == 0  # its record is in the new snapshot
    assert json.loads(resumed.path("f").read_text())["iteration"] == 3
    again.iteration = 4
    resumed.save(again)
    assert resumed.load("f").state.iteration == 4
    resumed.close_journal("f")


def test_an_archive_in_place_of_a_save_syncs_a_checked_box_first_and_is_not_written_when_that_fails(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The archive may take the place of the loop's last save (queued with its key, kiro.core.listeners.Archiver):
    a checked box that save would have synced before writing the state (`sync_before_next_save`) is synced by the
    archive first, and a failed sync fails the archive, as it fails a save: no state recording the box is written."""
    import errno
    import os

    import pytest

    store, state = _running(tmp_path, "a")
    box = tmp_path / "tasks.md"
    box.write_text("- [x] 1. one\n")
    store.sync_before_next_save("a", os.open(box, os.O_WRONLY))
    state.total_successes = 1
    state.transition(Status.COMPLETED, "task_done")

    def fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(OSError, match="could not sync the task file"):
        store.archive(state)
    assert not store.ws.archived_state_file("a").exists()
    assert store.load("a").state.total_successes == 0
