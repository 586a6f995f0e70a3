"""`kiro loop watch` is driven by file events (issue 7 item 5): a task file dropped into Specs/ and a
deleted stop hook are acted on when the file changes, not at the next rescan or safety poll.

The supervisor runs in-process with both timers (the 30 s rescan and the 5 s safety poll) pushed out
to 10 minutes, so only a file event can make it act within the generous bounds below. Figures for
the reaction time itself are in bench/watch_reaction.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kiro.core.supervisor
import kiro.core.watch
from kiro.core.supervisor import Supervisor
from kiro.store.events import Event, LoopFinished, LoopStarted, StepStarted
from kiro.store.workspace import Workspace as KiroWorkspace
from kiro.store.workspace import markdown_files
from tests.conftest import Workspace, shell_task

BOUND = 30.0  # seconds: far below the 600 s timers, far above the tens of ms it takes (a busy CI box)


@pytest.fixture(autouse=True)
def no_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiro.core.supervisor, "RESCAN_SECONDS", 600.0)
    monkeypatch.setattr(kiro.core.watch, "SAFETY_POLL", 600.0)


async def until(check: Callable[[], object], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        await asyncio.sleep(0.02)


def _state_status(ws: Workspace, tid: str) -> str | None:
    try:
        return ws.state(tid)["status"]  # type: ignore[no-any-return]
    except (AssertionError, ValueError, KeyError):
        return None


def test_a_task_file_dropped_into_specs_starts_on_its_file_event(ws: Workspace) -> None:
    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=2)
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: (ws.root / ".state/watch.pid").exists(), 10, "watch start")
            await asyncio.sleep(0.3)  # the first scan found nothing; now only an event can help
            ws.task(shell_task(2), "Specs/alpha/tasks.md")
            await until(lambda: (ws.root / "Done/alpha/tasks.md").exists(), BOUND, "loop for the new task file")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2"]


def test_a_task_file_made_in_a_new_folder_before_the_watcher_watches_it_still_starts(ws: Workspace) -> None:
    """`mkdir Specs/beta && cp tasks.md Specs/beta/`: inotify watches a new folder only after it is made, so the
    file can be made before the watch and no change of it ever comes. Here the file's change is dropped for
    sure (noted as kiro's own, which the watcher ignores): the scan that found the new folder looks again once
    the folder is still (SETTLE_SECONDS), not only at the rescan (600 s here)."""
    from kiro.fs import ownwrites

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=2)
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: (ws.root / ".state/watch.pid").exists(), 10, "watch start")
            await asyncio.sleep(2.5)  # the first scan found nothing, and the workspace's folders are still
            (ws.root / "Specs/beta").mkdir()  # its event wakes a scan, which finds no task file in it
            await asyncio.sleep(0.5)
            made = ws.root / "beta.md"
            made.write_text(shell_task(2))
            path = ws.root / "Specs/beta/tasks.md"
            os.rename(made, path)
            ownwrites.note_own_write(path)  # its change wakes nobody: as if the folder had no watch yet
            await until(lambda: (ws.root / "Done/beta/tasks.md").exists(), BOUND, "loop for the task file")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2"]


@pytest.mark.parametrize("kiro_there", [False, True], ids=["no .kiro", ".kiro with steering only"])
def test_a_kiro_spec_made_after_the_watch_started_starts_on_its_events(ws: Workspace, kiro_there: bool) -> None:
    """`.kiro/specs/` was not there when the watch started (a project Kiro had not planned in yet, or only its
    steering): the spec Kiro then makes (`.kiro/specs/x/`, then its tasks.md) starts on the changes, not at the
    rescan (600 s here; 30 s in kiro)."""
    if kiro_there:
        ws.write(".kiro/steering/product.md", "# Product\n")

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=2)
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: (ws.root / ".state/watch.pid").exists(), 10, "watch start")
            await asyncio.sleep(2.5)  # the first scan found nothing, and the workspace's folders are still
            (ws.root / ".kiro/specs/x").mkdir(parents=True)
            (ws.root / ".kiro/specs/x/tasks.md").write_text(shell_task(1))
            await until(lambda: "[x] 1." in (ws.root / ".kiro/specs/x/tasks.md").read_text(), BOUND,
                        "loop for the spec")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    assert (ws.root / "side_effects.log").read_text().split() == ["1"]


def test_a_person_approving_a_held_spec_starts_it_on_the_move_into_a_new_approved_folder(ws: Workspace) -> None:
    """A step makes a spec (SPEC §15: it waits for a person); kiro's note makes `Approved/`, which was not there
    when the watch started. The person's move of the note into it starts the spec on its change, not at the
    rescan (600 s here; 30 s in kiro)."""
    (ws.root / "plan.md").write_text(shell_task(1, cmd="echo planted >> side_effects.log"))
    ws.task(shell_task(1, cmd="mkdir -p .kiro/specs/x && cp plan.md .kiro/specs/x/tasks.md"))

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=2)
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: (ws.root / "Done/feature/tasks.md").exists(), BOUND, "the planting loop")
            notes = list((ws.root / "Pending_Approval").glob("task_file_*.md"))
            assert len(notes) == 1, notes
            await asyncio.sleep(2.5)  # every folder still: no scan is due but the rescan
            notes[0].rename(ws.root / "Approved" / notes[0].name)
            await until(lambda: "[x] 1." in (ws.root / ".kiro/specs/x/tasks.md").read_text(), BOUND,
                        "loop for the approved spec")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    assert (ws.root / "side_effects.log").read_text().split() == ["planted"]


def test_a_paused_loop_continues_on_the_deletion_of_its_hook(ws: Workspace) -> None:
    ws.task(shell_task(6, cmd='echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.2'), "Specs/alpha/tasks.md")

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=2)
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: any((ws.root / ".state").glob("autonomous_loop_*.json")), 10, "loop start")
            [state_file] = (ws.root / ".state").glob("autonomous_loop_*.json")
            tid = state_file.name[len("autonomous_loop_"):-5]
            hook = ws.root / ".hooks" / f"stop_autonomous_loop_{tid}.md"
            hook.write_text("---\ntype: stop_hook\n---\nstop\n")
            await until(lambda: _state_status(ws, tid) == "paused", 20, "pause on the hook")
            await asyncio.sleep(0.3)
            hook.unlink()
            await until(lambda: _state_status(ws, tid) in ("running", "completed"), BOUND,
                        "continue after the hook was deleted")
            await until(lambda: (ws.root / "Done/alpha/tasks.md").exists(), 30, "the rest of the steps")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    lines = (ws.root / "side_effects.log").read_text().split()
    assert sorted(lines) == [str(i) for i in range(1, 7)]  # every step once, none twice


def test_a_review_note_deleted_as_the_loop_pauses_is_acted_on(ws: Workspace) -> None:
    """The person deletes the review note the moment the loop pauses at it (here: as the loop says it paused,
    before its run has closed its executor): that deletion is the change the paused loop waits for, not one
    from before the pause. (The supervisor counted changes from when it got round to waiting: this one was
    lost and the loop went on only at the next rescan, 30 s later; 600 s here.)"""
    ws.task("---\nexecutor: shell\npause_at_checkpoints: true\n---\n"
            "- [ ] 1. Checkpoint - Ensure all tests pass\n  ```sh\n  echo 1 >> side_effects.log\n  ```\n"
            "- [ ] 2. Ship\n  ```sh\n  echo 2 >> side_effects.log\n  ```\n", "Specs/alpha/tasks.md")
    deleted: list[str] = []

    def listener(event: Event) -> None:
        if isinstance(event, LoopFinished) and event.reason == "checkpoint" and event.task_id:
            (ws.root / "Needs_Action" / f"review_{event.task_id}.md").unlink()
            deleted.append(event.task_id)

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=2, listeners=[listener])
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: (ws.root / "Done/alpha/tasks.md").exists(), BOUND, "going on after the review")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    assert len(deleted) == 1
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2"]


def test_a_slow_start_does_not_hold_the_loops_already_running(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new task file's first writes (state file, lock, the map of task files) are made off the event loop
    (issue #12 item 5): while its start waits on a slow disk, here until the loop already running has
    done two more steps, that loop goes on. When the start ran on the event loop it held every loop."""
    ws.task(shell_task(8, cmd='echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.1'), "Specs/alpha/tasks.md")
    log = ws.root / "side_effects.log"
    done = threading.Event()
    real = kiro.core.supervisor.prepare_start

    def slow_start(ws0: KiroWorkspace, task_arg: str, **kwargs: object) -> object:
        if "beta" in task_arg:
            before = len(log.read_text().split())
            deadline = time.monotonic() + BOUND
            while len(log.read_text().split()) < before + 2:
                assert time.monotonic() < deadline, "the running loop stood still while a start waited"
                time.sleep(0.02)
            done.set()
        return real(ws0, task_arg, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kiro.core.supervisor, "prepare_start", slow_start)

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=2)
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: log.exists(), 20, "the first loop's first step")
            ws.task(shell_task(1, cmd="true"), "Specs/beta/tasks.md")
            await until(lambda: (ws.root / "Done/beta/tasks.md").exists(), BOUND, "the slow start's loop")
            await until(lambda: (ws.root / "Done/alpha/tasks.md").exists(), BOUND, "the first loop's end")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    assert done.is_set()
    assert log.read_text().split() == [str(i) for i in range(1, 9)]


def test_many_new_loops_start_a_few_at_a_time(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Task files taken on at once under a high `max_parallel_loops` start at most STARTING_AT_ONCE (here
    3) at a time (from `loop_started` to their first `step_started`), so that their starts do not all run in one
    turn of the event loop the running loops share; every one of them still runs."""
    monkeypatch.setattr(kiro.core.supervisor, "STARTING_AT_MOST", 60.0)  # only a step's start gives the turn back
    monkeypatch.setattr(kiro.core.supervisor, "STARTING_AT_ONCE", 3)  # without the turns, all ten were starting at once
    for i in range(10):
        ws.task(shell_task(1, cmd="true"), f"Specs/t{i}/tasks.md")
    starting: set[str] = set()
    most = 0

    def listener(event: Event) -> None:
        nonlocal most
        if isinstance(event, LoopStarted):
            starting.add(event.task_id or "")
            most = max(most, len(starting))
        elif isinstance(event, StepStarted):
            starting.discard(event.task_id or "")

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=10, listeners=[listener])
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: len(list((ws.root / "Done").glob("t*/tasks.md"))) == 10, BOUND, "ten loops")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())
    assert 1 <= most <= 3, most


def test_a_loop_waiting_before_its_first_step_does_not_hold_up_the_others(ws: Workspace,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduled task waits for its first fire inside its run, before any step: its turn among the
    loops starting goes back after STARTING_AT_MOST, and the next task starts."""
    monkeypatch.setattr(kiro.core.supervisor, "STARTING_AT_ONCE", 1)
    ws.task(shell_task(1, cmd="true", extra_frontmatter='schedule: "0 3 * * *"'), "Specs/a_nightly/tasks.md")
    ws.task(shell_task(1, cmd="true"), "Specs/b_plain/tasks.md")

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=4)
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: (ws.root / "Done/b_plain/tasks.md").exists(), BOUND, "the plain task's loop")
        finally:
            sup.stop()
            await runner

    asyncio.run(scenario())


def test_a_task_folder_that_goes_away_during_the_look_is_passed_over(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor looks at Specs/ on a worker thread while its loops move their finished tasks to
    Done/ (folder and all). `Path.rglob` lists each folder twice (for its subfolders, then for its
    files); a folder gone between the two raised FileNotFoundError, which ended `kiro loop watch` (seen
    under load in the suite: test_git_worktrees.py's three loops under watch)."""
    specs = tmp_path / "Specs"
    for name in ("a", "b", "c"):
        (specs / name).mkdir(parents=True)
        (specs / name / "tasks.md").write_text("- [ ] 1. Step\n")
    real = os.scandir

    class Listed:  # what os.scandir had listed, as the iterator it returns
        def __init__(self, entries: Any) -> None:
            self.entries = iter(list(entries))

        def __iter__(self) -> Listed:
            return self

        def __next__(self) -> Any:
            return next(self.entries)

        def __enter__(self) -> Listed:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def close(self) -> None:
            pass

    def scandir(path: Any = ".") -> Any:
        it = real(path)
        if isinstance(path, (str, os.PathLike)) and Path(path) == specs / "b":
            with it:
                entries = Listed(it)
            shutil.rmtree(specs / "b")  # looked at once, then gone: b's loop moved its task away meanwhile
            return entries
        return it

    monkeypatch.setattr(os, "scandir", scandir)
    found = markdown_files(specs)  # rglob: FileNotFoundError (it lists a folder twice)
    assert {specs / "a" / "tasks.md", specs / "c" / "tasks.md"} <= set(found), found
    assert all(p.parent.parent == specs for p in found), found


def test_a_loop_waiting_for_its_turn_to_start_starts_nothing_once_the_watch_stops(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopping `kiro loop watch` while a new loop waits for its turn to start: it does not start after
    all when the turn comes (the loop holding the turn, a scheduled one waiting for its first fire, gives
    it back as the watch stops)."""
    monkeypatch.setattr(kiro.core.supervisor, "STARTING_AT_ONCE", 1)
    monkeypatch.setattr(kiro.core.supervisor, "STARTING_AT_MOST", 600.0)  # the scheduled loop keeps its turn
    ws.task(shell_task(1, cmd="true", extra_frontmatter='schedule: "0 3 * * *"'), "Specs/a_nightly/tasks.md")
    waiting: list[str] = []

    def listener(event: Event) -> None:
        if isinstance(event, LoopStarted) and "a_nightly" in event.task_path:
            ws.task(shell_task(1, cmd='echo ran >> side_effects.log'), "Specs/b_plain/tasks.md")
            waiting.append("b")

    async def scenario() -> None:
        sup = Supervisor(KiroWorkspace(ws.root), max_parallel=4, listeners=[listener])
        runner = asyncio.create_task(sup.run())
        try:
            await until(lambda: waiting and len(list((ws.root / ".state").glob("autonomous_loop_*.json"))) == 2,
                        BOUND, "the second task's loop, waiting for its turn")
            await asyncio.sleep(0.3)
        finally:
            sup.stop()
            await asyncio.wait_for(runner, BOUND)

    asyncio.run(scenario())
    assert not (ws.root / "side_effects.log").exists(), "a loop started after the watch was stopped"
