"""The collector's pace while loops run (kiro.core.heap, issue #12): while loops start and run, the
objects that existed before are left out of collections and young collections come less often;
cycles are still collected; afterwards the process's collector is as it was."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from kiro.core import heap
from kiro.core.runner import StartBatch, prepare_start, run_loops
from kiro.executors.base import ExecutorBase, StepContext, StepResult
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace, shell_task


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    """Each test starts from CPython's own settings and leaves them so (a failing test too)."""
    before = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


class Looker(ExecutorBase):
    """Completes every step, noting how the collector is set while the step runs."""

    name = "looker"
    system_template = "agent_cli.md"

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    async def run_step(self, ctx: StepContext) -> StepResult:
        self.seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
        return StepResult("completed", summary="done")


def test_while_loops_run_the_older_objects_are_left_alone_and_afterwards_all_is_as_it_was(ws: Workspace) -> None:
    ws.task(shell_task(3))
    young = gc.get_threshold()
    looker = Looker()
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id="g", executor=looker)
    [outcome] = asyncio.run(run_loops([run]))
    assert outcome.exit_code == 0, outcome.message
    assert len(looker.seen) == 3
    for threshold, frozen in looker.seen:
        assert threshold == heap.YOUNG_THRESHOLD
        assert frozen > 1000  # the imported modules, the loop's models: not walked by any collection
    assert gc.get_threshold() == young and gc.get_freeze_count() == 0


def test_a_batch_start_prepares_its_loops_with_the_collector_slowed_and_puts_it_back(ws: Workspace) -> None:
    for name in ("a", "b"):
        ws.task(shell_task(1), rel=f"Specs/{name}/tasks.md")
    young = gc.get_threshold()
    seen: list[tuple[int, int]] = []
    runs = []
    with StartBatch() as batch:
        for name in ("a", "b"):
            runs.append(prepare_start(KiroWorkspace(ws.root), f"Specs/{name}/tasks.md", task_id=name, batch=batch))
            seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
    for run in runs:
        assert run.release is not None
        run.release()
    assert all(threshold == heap.YOUNG_THRESHOLD and frozen > 1000 for threshold, frozen in seen), seen
    assert gc.get_threshold() == young and gc.get_freeze_count() == 0


def test_a_start_makes_its_loop_ready_with_the_collector_slowed_and_freezes_what_it_made_before_the_run(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #41: `kiro loop start` (kiro.core.api.start) makes its loop ready inside `long_lived`: importing the
    runner, the engine and its features and building the validators is walked by no young collection every 700
    allocations; what it made is frozen before the loop runs (`settled`); afterwards all is as it was."""
    from kiro.core import api, runner

    ws.task(shell_task(1))
    young = gc.get_threshold()
    preparing: list[tuple[int, int]] = []
    frozen: list[tuple[int, int]] = []
    real_prepare, real_settled = runner.prepare_start, heap.settled

    def prepare(*args: Any, **kwargs: Any) -> Any:
        preparing.append((gc.get_threshold()[0], gc.get_freeze_count()))
        return real_prepare(*args, **kwargs)

    def settled() -> None:
        before = gc.get_freeze_count()
        real_settled()
        frozen.append((before, gc.get_freeze_count()))

    monkeypatch.setattr(runner, "prepare_start", prepare)
    monkeypatch.setattr(heap, "settled", settled)
    started = api.start(["Specs/feature/tasks.md"], workspace_path=ws.root)
    assert started.exit_code == 0
    assert preparing and all(threshold == heap.YOUNG_THRESHOLD and count > 1000 for threshold, count in preparing)
    [(before, after)] = frozen
    assert after > before  # the loop made ready (its state, its executor, its listeners): frozen too
    assert gc.get_threshold() == young and gc.get_freeze_count() == 0


def test_a_cycle_made_while_loops_run_is_still_collected() -> None:
    with heap.long_lived():
        cycle: Any = _Cycle()
        gone: list[bool] = []
        ref = weakref.ref(cycle, lambda _r: gone.append(True))
        del cycle
        gc.collect()
        assert ref() is None and gone == [True]


def test_nested_use_changes_the_collector_once_and_leaves_a_freeze_made_before_it() -> None:
    young = gc.get_threshold()
    gc.freeze()
    frozen = gc.get_freeze_count()
    with heap.long_lived():
        with heap.long_lived():
            pass
        assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD  # the outer one still holds
    assert gc.get_threshold() == young
    # the caller's freeze is the caller's to undo (an unfreeze would leave 0; objects frozen and freed
    # meanwhile by reference counting leave the count a little lower)
    assert gc.get_freeze_count() > frozen // 2


_START_UP = """
import gc, json, sys, typing
from kiro.core import heap
collections = 0
def count(phase, info):
    global collections
    collections += phase == "start"
gc.callbacks.append(count)
real_starting_up = heap.starting_up
import contextlib
@contextlib.contextmanager
def starting_up():  # counted from where kiro starts it up (compiling kiro.cli itself, before, may collect)
    global collections
    collections = 0
    with real_starting_up():
        yield
heap.starting_up = starting_up
seen = []
real = heap.started
def started():
    seen.append(collections)
    real()
heap.started = started
body = []
def store_of(*args, **kwargs):
    body.append(gc.isenabled())
    raise SystemExit(0)
import kiro.cli  # Typer's import
import kiro.cli.loop
kiro.cli.loop._store = store_of  # the command's body: how is the collector set there?
collections = 0
sys.argv = ["kiro", "loop", "status"]
try:
    kiro.cli.main()
except SystemExit:
    pass
print(json.dumps({"seen": seen, "body": body, "after": gc.isenabled()}))
"""


def test_a_command_starts_up_without_cyclic_collections_and_runs_its_body_with_the_collector_on(ws: Workspace) -> None:
    """Issue #41: Typer's import, and in `main` kiro's command modules and the parameters' validators (pydantic's
    import), made at every command's start, are walked by no cyclic collection (it would free nothing); the
    command's body runs with the collector on, and it is on afterwards."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _START_UP], cwd=ws.root, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["body"] == [True] and result["after"] is True, result
    typer_imported, body_began, _end = result["seen"]
    assert typer_imported == 0 and body_began == 0, result  # no collection in either


_AT_EXIT = """
import atexit, gc, json, os, sys
def walked() -> None:  # registered before kiro's: runs after it, as the interpreter's own collections are next
    os.write(1, json.dumps({"walked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}).encode() + b"\\n")
atexit.register(walked)
sys.argv = ["kiro", "loop", "status"]
from kiro.cli import main
main()
"""


def test_a_command_ends_without_walking_what_it_made(ws: Workspace) -> None:
    """Issue #41: as the interpreter ends, it collects every generation (four times over): the objects a command
    made (Typer's, pydantic's, the config's), frozen by then, are walked by none of those collections; the
    command's output is whole."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _AT_EXIT], cwd=ws.root, capture_output=True, text=True, check=True)
    table, probe = out.stdout.strip().splitlines()
    assert table.startswith("no loops in "), out.stdout
    seen = json.loads(probe)
    assert seen["frozen"] > 20_000, seen  # the modules, Typer's commands, the validators: left alone
    assert seen["walked"] < 100, seen  # what the interpreter's last collections would still walk
