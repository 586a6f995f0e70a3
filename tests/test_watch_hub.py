"""The workspace watcher (kiro.core.watch, watchfiles): folders made after the watch started are watched
too, kiro's own edits wake nobody, a very deep folder does not stop it, a loop whose watcher cannot
start says so and still sees a hook (it checks often instead), and a released watcher leaves no
inotify descriptor behind."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import kiro.core.watch
from kiro.core.runner import prepare_start, run_loops
from kiro.core.watch import acquire_hub, release_hub
from kiro.store import tasks
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace, deep_tree, shell_task


async def _woken(ev: asyncio.Event, timeout: float = 10.0) -> bool:
    try:
        await asyncio.wait_for(ev.wait(), timeout)
    except TimeoutError:
        return False
    return True


def test_a_file_in_a_folder_made_after_the_watch_started_wakes_and_kiros_box_edits_do_not(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiro.core.watch, "SAFETY_POLL", 600.0)

    async def scenario() -> list[tuple[str, bool]]:
        hub = acquire_hub(ws.root)
        woken = asyncio.Event()
        await hub.subscribe(woken)
        seen: list[tuple[str, bool]] = []
        try:
            assert hub.failed is None, hub.failed
            nested = ws.root / "Specs/feature/deep"
            nested.mkdir(parents=True)  # a new folder: a change, and watched from now on
            seen.append(("new folder", await _woken(woken)))
            await asyncio.sleep(0.2)
            woken.clear()
            task = ws.task("- [ ] 1. one\n- [ ] 2. two\n", "Specs/feature/deep/tasks.md")
            seen.append(("a person's file in it", await _woken(woken)))
            await asyncio.sleep(0.2)
            woken.clear()
            tf = tasks.load(task)
            tf = tasks.set_marker(task, tf.steps[0].key, "-", expected=tf)
            tasks.mark_done(task, tf.steps[0].key, expected=tf)
            seen.append(("kiro's own box edits", await _woken(woken, 1.0)))
            woken.clear()
            Path(task).write_text("- [x] 1. one\n- [ ] 2. two, reworded\n")
            seen.append(("a person's edit of it", await _woken(woken)))
        finally:
            hub.unsubscribe(woken)
            await release_hub(hub)
        return seen

    seen = asyncio.run(scenario())
    print(seen)
    assert seen == [("new folder", True), ("a person's file in it", True), ("kiro's own box edits", False),
                    ("a person's edit of it", True)]


def test_in_a_kiro_repository_the_watch_makes_no_folder_and_watches_needs_action_once_it_appears(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #38 item 15: the watcher made Specs/ Done/ Needs_Action/ .hooks/ at a Kiro repository's root. Now it
    makes none; Needs_Action/, made later (kiro's first note), is watched from then on: a person deleting
    the note wakes the loop at once, not at the next safety poll."""
    monkeypatch.setattr(kiro.core.watch, "SAFETY_POLL", 600.0)
    root = tmp_path / "project"
    (root / ".kiro/specs/auth").mkdir(parents=True)
    (root / ".kiro/specs/auth/tasks.md").write_text("- [ ] 1. one\n")

    async def scenario() -> list[tuple[str, bool]]:
        hub = acquire_hub(root)
        woken = asyncio.Event()
        await hub.subscribe(woken)
        seen: list[tuple[str, bool]] = []
        try:
            assert hub.failed is None, hub.failed
            made = sorted(p.name for p in root.iterdir())
            assert made == [".kiro", ".state"], made  # .state/inbox: kiro's own
            note = root / "Needs_Action" / "review_t.md"
            note.parent.mkdir()
            seen.append(("Needs_Action/ made", await _woken(woken)))
            await asyncio.sleep(0.3)  # the watcher restarts with the new folder
            note.write_text("a note\n")
            woken.clear()
            await asyncio.sleep(0.3)
            woken.clear()
            note.unlink()  # the person answers by deleting the note
            seen.append(("the note deleted", await _woken(woken)))
        finally:
            hub.unsubscribe(woken)
            await release_hub(hub)
        return seen

    seen = asyncio.run(scenario())
    print(seen)
    assert seen == [("Needs_Action/ made", True), ("the note deleted", True)]


def test_a_1500_deep_folder_in_specs_does_not_stop_the_watcher(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiro.core.watch, "SAFETY_POLL", 600.0)
    (ws.root / "Specs/deep").mkdir()
    deep_tree(ws.root / "Specs/deep", 1500)  # deeper than PATH_MAX allows a path to name

    async def scenario() -> bool:
        hub = acquire_hub(ws.root)
        woken = asyncio.Event()
        await hub.subscribe(woken)
        try:
            assert hub.failed is None, hub.failed
            await asyncio.sleep(0.2)
            woken.clear()
            (ws.root / ".hooks/stop_autonomous_loop_x.md").write_text("stop\n")
            return await _woken(woken)
        finally:
            hub.unsubscribe(woken)
            await release_hub(hub)

    try:
        assert asyncio.run(scenario())
    finally:
        subprocess.run(["rm", "-rf", str(ws.root / "Specs/deep")], check=True)


def test_a_loop_whose_watcher_cannot_start_says_so_and_still_sees_a_hook(ws: Workspace,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import watchfiles.main

    def no_watch(*_a: object, **_k: object) -> None:
        raise OSError("OS file watch limit reached.")  # what watchfiles raises at the inotify watch limit

    monkeypatch.setattr(watchfiles.main, "RustNotify", no_watch)
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  backoff_base_seconds: 36000\n"
                                             "  backoff_max_seconds: 36000\n  failure_threshold: 100\n")
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Fails\n  ```sh\n  exit 1\n  ```\n")
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id="w")
    events: list[dict[str, Any]] = []
    waiting = threading.Event()

    def listener(e: dict[str, Any]) -> None:
        events.append(e)
        if e["event"] == "backoff":
            waiting.set()

    def person() -> None:
        assert waiting.wait(60)
        (ws.root / ".hooks/stop_autonomous_loop_w.md").write_text("---\ntype: stop_hook\n---\nstop\n")

    helper = threading.Thread(target=person)
    helper.start()
    [outcome] = asyncio.run(asyncio.wait_for(run_loops([run], [listener]), 60))
    helper.join()
    assert outcome.reason == "stop_hook", outcome
    warnings = [e["message"] for e in events if e["event"] == "warning"]
    assert any("file watcher unavailable (OSError: OS file watch limit reached.); checking every 0.25s" in w
               for w in warnings), warnings


def _inotify_fds() -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts inotify descriptors")
@pytest.mark.parametrize("all_there", [True, False], ids=["every folder there", "Approved/ and .kiro/specs/ not"])
def test_a_released_hub_leaves_no_inotify_descriptor_open(ws: Workspace, all_there: bool) -> None:
    """One descriptor for the folders; one more for the top level's watch while a folder is missing."""
    if all_there:
        for name in kiro.core.watch.WATCHED_IF_THERE:
            (ws.root / name).mkdir(parents=True)
    before = _inotify_fds()

    async def scenario() -> None:
        hub = acquire_hub(ws.root)
        assert _inotify_fds() == before  # nothing is watched before somebody waits
        woken = asyncio.Event()
        await hub.subscribe(woken)
        assert hub.failed is None, hub.failed
        assert _inotify_fds() == before + (1 if all_there else 2)
        hub.unsubscribe(woken)
        await release_hub(hub)

    asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while _inotify_fds() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _inotify_fds() == before, "the inotify descriptor was left open"


def _switches(threads: list[threading.Thread]) -> int:
    """How many times these threads of this process gave up their core by themselves (a sleep, a wait)."""
    count = 0
    for thread in threads:
        with open(f"/proc/self/task/{thread.native_id}/status") as f:
            count += int(next(line for line in f if line.startswith("voluntary_ctxt_switches")).split()[1])
    return count


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_the_watch_steps_only_while_somebody_waits(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #41: watchfiles' thread wakes every STEP_MS and takes the GIL from the loop's own thread. While
    nobody waits on the hub (a loop running its steps, which looks for itself before each call), the thread
    holds still; a waiter that comes back finds it stepping again, and a person's change wakes it."""
    monkeypatch.setattr(kiro.core.watch, "SAFETY_POLL", 600.0)

    async def scenario() -> tuple[int, int, bool]:
        hub = acquire_hub(ws.root)
        woken = asyncio.Event()
        await hub.subscribe(woken)
        try:
            assert hub.failed is None, hub.failed
            threads = [t for t in threading.enumerate() if t.name == "kiro-watch"]  # the folders', the top level's
            assert threads
            hub.unsubscribe(woken)
            await asyncio.sleep(0.1)
            before = _switches(threads)
            await asyncio.sleep(0.5)
            held = _switches(threads) - before
            await hub.subscribe(woken)
            before = _switches(threads)
            await asyncio.sleep(0.5)
            stepping = _switches(threads) - before
            woken.clear()
            (ws.root / ".hooks/stop_autonomous_loop_x.md").write_text("stop\n")  # a person
            return held, stepping, await _woken(woken)
        finally:
            hub.unsubscribe(woken)
            await release_hub(hub)

    held, stepping, seen = asyncio.run(scenario())
    print(f"the watch thread's wake-ups in 0.5 s: {held} with nobody waiting, {stepping} with a waiter; "
          f"a person's hook seen: {seen}")
    assert held <= 4 and stepping >= 20 and seen


def test_a_loop_busy_with_its_steps_watches_nothing(ws: Workspace) -> None:
    """Issue #41: a loop whose steps run one after the other never waits, so it sets up no watch: no
    watchfiles import, no inotify thread woken by each of its own box edits. Each step looks at the threads
    of kiro's process (its parent: the steps run unboxed here)."""
    ws.write("config/autonomous_loop.yaml", "sandbox: off\n")
    ws.task(shell_task(3, cmd="cat /proc/$PPID/task/*/comm | tr '\\n' ' ' >> threads.log; echo >> threads.log"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 0, r.stdout + r.stderr
    seen = (ws.root / "threads.log").read_text().splitlines()
    print("kiro's threads at each step:", seen)
    assert len(seen) == 3 and not any("notify-rs" in line for line in seen)
