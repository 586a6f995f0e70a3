"""The workspace watcher reads inotify on the event loop (kiro.inotify, issue #12): no watcher
thread, folders made after the watch started are watched too, kiro's own edits wake nobody, and
where inotify cannot start the watchfiles thread takes over."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import kiro.inotify
import kiro.watch
from kiro import tasks
from kiro.watch import acquire_hub, release_hub
from tests.conftest import Workspace

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux only")


async def _woken(ev: asyncio.Event, timeout: float = 10.0) -> bool:
    try:
        await asyncio.wait_for(ev.wait(), timeout)
    except TimeoutError:
        return False
    return True


def test_a_file_in_a_folder_made_after_the_watch_started_wakes_and_kiros_box_edits_do_not(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiro.watch, "SAFETY_POLL", 600.0)

    async def scenario() -> list[tuple[str, bool]]:
        hub = await acquire_hub(ws.root)
        woken = asyncio.Event()
        hub.subscribe_event(woken)
        seen: list[tuple[str, bool]] = []
        try:
            assert hub._inotify is not None and hub._task is None  # no watcher thread
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


def test_without_inotify_the_watchfiles_thread_wakes_waiters(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_inotify(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device (the inotify watch limit)")

    monkeypatch.setattr(kiro.inotify.Inotify, "__init__", no_inotify)

    async def scenario() -> bool:
        hub = await acquire_hub(ws.root)
        woken = asyncio.Event()
        hub.subscribe_event(woken)
        try:
            assert hub._inotify is None and hub._task is not None
            await asyncio.sleep(0.3)
            woken.clear()
            (ws.root / ".hooks/stop_autonomous_loop_x.md").write_text("stop\n")
            return await _woken(woken)
        finally:
            hub.unsubscribe(woken)
            await release_hub(hub)

    assert asyncio.run(scenario())


def _inotify_fds() -> int:
    import os

    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


def test_a_released_hub_closes_its_inotify_without_the_caller_waiting_on_it(ws: Workspace) -> None:
    """The kernel waits out a grace period when an inotify with watches is closed; kiro closes it on a
    thread of its own (a few ms less of every run), and the descriptor is gone all the same."""
    import time

    before = _inotify_fds()

    async def scenario() -> None:
        hub = await acquire_hub(ws.root)
        assert hub._inotify is not None
        assert _inotify_fds() == before + 1
        await release_hub(hub)

    asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while _inotify_fds() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _inotify_fds() == before, "the inotify descriptor was left open"
