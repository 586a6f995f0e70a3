"""The look at the workspace's task files around every step (kiro.executors.control.TaskFiles, SPEC §15) made
cheap for many loops (issue #41): a task file is read again only when it changed, and a real path is asked
for only where a link may be. Neither may let a step's change of a task file go unseen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiro.executors import control
from kiro.fs import statcache
from kiro.processes import sandbox
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
        monkeypatch.setattr(statcache, "RACY_NS", -(10**18))
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


@pytest.fixture
def listings_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every folder's listing kept at once (kiro.store.workspace._listing, kiro.fs.statcache), as for folders last
    changed long ago: the next look lists a folder again only because its times moved."""
    from kiro.store import workspace

    monkeypatch.setattr(statcache, "RACY_NS", -(10**18))
    workspace._listed.clear()


@pytest.mark.usefixtures("listings_kept")
def test_a_task_file_planted_in_a_folder_listed_before_is_held_though_the_folders_mtime_was_put_back(
        ws: Workspace) -> None:
    """The folders' listings are kept between looks; an unboxed step that plants a task file in a folder the
    look listed before, and puts the folder's mtime back, is still seen (the folder's ctime moved) and held."""
    own = ws.task(OTHER.replace("other", "mine!"), "Specs/feature/tasks.md")
    (ws.root / "Specs/other").mkdir()
    kws = KiroWorkspace(ws.root)
    look = control.TaskFiles.take(kws, own)
    assert control.TaskFiles.take(kws, own).by_path == look.by_path  # from the kept listings: the same
    folder = ws.root / "Specs/other"
    before = os.stat(folder)
    (folder / "tasks.md").write_text(OTHER)
    os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(folder).st_mtime_ns == before.st_mtime_ns
    said = look.check(boxed=False, task_id="mine", step_id="1")
    print(said)
    assert any("Specs/other/tasks.md was created" in line for line in said), said


@pytest.mark.usefixtures("listings_kept")
def test_a_boxed_steps_look_still_holds_what_it_wrote_outside_specs(ws: Workspace) -> None:
    """Boxed, the look leaves Specs/'s own files alone (read-only to the step), but not what lies elsewhere: a
    Kiro spec the step planted, a file in the project a link in Specs/ names (made between the two looks, as
    a person may), each frontmatter changed, are held."""
    own = ws.task(OTHER.replace("other", "mine!"), "Specs/feature/tasks.md")
    ws.task(OTHER, ".kiro/specs/known/tasks.md")
    notes = ws.write("notes/plan.md", OTHER)
    kws = KiroWorkspace(ws.root)
    look = control.TaskFiles.take(kws, own, boxed=True)
    assert set(look.by_path) == {os.path.realpath(ws.root / ".kiro/specs/known/tasks.md")}  # Specs/ not read
    (ws.root / "Specs/linked.md").symlink_to(notes)  # a person's link: the folder listed before changed
    notes.write_text(SAME_SIZE)  # the step's edit of the file it names
    ws.task(OTHER, ".kiro/specs/planted/tasks.md")
    said = look.check(boxed=True, task_id="mine", step_id="1")
    print(said)
    assert any("notes/plan.md was created" in line for line in said), said  # by the file the link names
    assert any(".kiro/specs/planted/tasks.md was created" in line for line in said), said
    held = sorted(p.name for p in (ws.root / "Pending_Approval").glob("task_file_*.md"))
    assert len(held) == 2, held


@pytest.mark.usefixtures("listings_kept")
def test_the_task_files_found_from_kept_listings_are_those_a_fresh_walk_finds(ws: Workspace, tmp_path: Path) -> None:
    """Files added, removed, replaced by a link and moved between two looks: the look from the kept listings
    finds what a walk without them finds, in the same order."""
    from kiro.store import workspace

    for name in ("a", "b", "c/d", "c/e"):
        ws.task(OTHER, f"Specs/{name}/tasks.md")
    kws = KiroWorkspace(ws.root)
    list(task_files(kws))
    (ws.root / "Specs/a/tasks.md").unlink()
    ws.task(OTHER, "Specs/c/d/more.md")
    (ws.root / "Specs/b/tasks.md").unlink()
    outside = tmp_path / "outside.md"
    outside.write_text(OTHER)
    (ws.root / "Specs/b/tasks.md").symlink_to(outside)
    (ws.root / "Specs/c/e").rename(ws.root / "Specs/f")
    kept = list(task_files(kws))
    workspace._listed.clear()
    assert kept == list(task_files(kws))
    assert [real for _path, real in kept] == [
        os.path.realpath(outside), *(os.path.realpath(ws.root / f"Specs/{name}") for name in
                                     ("c/d/more.md", "c/d/tasks.md", "f/tasks.md"))]


def test_one_look_serves_every_loop_that_asks_in_the_same_turn_and_is_taken_after_the_last_asked(
        ws: Workspace) -> None:
    """Many loops in one process share a look (kiro.executors.control.shared_look, issue #41): those that ask in
    the same turn of the event loop get one look, taken after all of them asked. A loop whose step planted a
    task file just before asking finds the file in it and holds it, though another loop asked first."""
    import asyncio

    first = ws.task(OTHER.replace("other", "first"), "Specs/first/tasks.md")
    second = ws.task(OTHER.replace("other", "second"), "Specs/second/tasks.md")
    ws.task(OTHER, ".kiro/specs/known/tasks.md")
    kws = KiroWorkspace(ws.root)

    async def steps() -> tuple[control.Look, control.Look, control.Look, list[str], list[str]]:
        before = await control.shared_look(kws, boxed=True)
        files = [control.TaskFiles.take(kws, own, boxed=True, look=before) for own in (first, second)]

        async def first_ends() -> control.Look:
            return await control.shared_look(kws, boxed=True)

        async def second_ends() -> control.Look:  # its step planted a Kiro spec, then it asks, after the first
            ws.task(OTHER, ".kiro/specs/planted/tasks.md")
            return await control.shared_look(kws, boxed=True)

        after_first, after_second = await asyncio.gather(first_ends(), second_ends())
        said_second = files[1].check(boxed=True, task_id="second", step_id="1", look=after_second)
        said_first = files[0].check(boxed=True, task_id="first", step_id="1", look=after_first)
        return before, after_first, after_second, said_first, said_second

    before, after_first, after_second, said_first, said_second = asyncio.run(steps())
    planted = os.path.realpath(ws.root / ".kiro/specs/planted/tasks.md")
    assert after_first is after_second  # one look for both loops
    assert planted in {real for _path, real, _st, _fm in after_first.files}
    assert planted not in {real for _path, real, _st, _fm in before.files}
    print(said_second, said_first)
    assert any(".kiro/specs/planted/tasks.md was created" in line for line in said_second), said_second
    assert said_first == []  # held once, by the loop that found it first
    held = sorted(p.name for p in (ws.root / "Pending_Approval").glob("task_file_*.md"))
    assert len(held) == 1, held


@pytest.mark.skipif(sandbox.unusable() is not None, reason=f"no usable bwrap: {sandbox.unusable()}")
def test_loops_sharing_looks_in_one_process_hold_the_task_file_a_boxed_step_planted(ws: Workspace) -> None:
    """Three shell loops in one process, boxed (their looks shared): the Kiro spec one loop's step plants is held
    for a person's approval, once; every loop completes, and nothing else is held."""
    import asyncio

    from kiro.core.runner import LoopIndex, prepare_start, run_loops
    from kiro.store.statestore import StateStore
    from tests.conftest import FAST_CONFIG

    def shell_steps(*commands: str) -> str:
        return "---\ntitle: t\nexecutor: shell\n---\n# Plan\n\n" + "".join(
            f"- [ ] {i}. Step {i}\n  ```sh\n  {cmd}\n  ```\n" for i, cmd in enumerate(commands, 1))

    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: bwrap\n")
    for name in ("a", "b"):
        ws.task(shell_steps("true", "true"), f"Specs/{name}/tasks.md")
    ws.write("payload/planted.md", OTHER)
    ws.task(shell_steps("true", "mkdir -p .kiro/specs/x && cp payload/planted.md .kiro/specs/x/tasks.md"),
            "Specs/c/tasks.md")
    kws = KiroWorkspace(ws.root)
    index = LoopIndex(StateStore(kws))
    runs = [prepare_start(kws, f"Specs/{name}/tasks.md", task_id=name, index=index) for name in ("a", "b", "c")]
    outcomes = asyncio.run(run_loops(runs))
    assert [o.exit_code for o in outcomes] == [0, 0, 0], [o.message for o in outcomes]
    notes = sorted((ws.root / "Pending_Approval").glob("task_file_*.md"))
    named = [n.read_text().split("path: ", 1)[1].split("\n", 1)[0] for n in notes]
    assert named == [".kiro/specs/x/tasks.md"], named  # once (by whichever loop's step overlapped the planting)


def test_a_shared_look_after_unboxed_steps_holds_the_frontmatter_one_of_them_changed(ws: Workspace) -> None:
    """Unboxed, the shared look reads Specs/ too: a step of one loop that rewrites a third task file's frontmatter
    gets it held, and each loop's own file gets its frontmatter put back by its own check."""
    import asyncio

    first = ws.task(OTHER.replace("other", "first"), "Specs/first/tasks.md")
    second = ws.task(OTHER.replace("other", "second"), "Specs/second/tasks.md")
    third = ws.task(OTHER, "Specs/third/tasks.md")
    kws = KiroWorkspace(ws.root)

    async def steps() -> list[str]:
        before = await control.shared_look(kws, boxed=False)
        files = [control.TaskFiles.take(kws, own, boxed=False, look=before) for own in (first, second)]
        third.write_text(SAME_SIZE)  # the first loop's step
        first.write_text(SAME_SIZE.replace("other", "first"))  # and its own settings
        after = await control.shared_look(kws, boxed=False)
        return [line for f, (tid, own) in zip(files, (("first", first), ("second", second)), strict=True)
                for line in f.check(boxed=False, task_id=tid, step_id="1", look=after)]

    said = asyncio.run(steps())
    print(said)
    assert any("Specs/third/tasks.md was changed (its frontmatter)" in line for line in said), said
    assert any("Specs/first/tasks.md: its frontmatter changed" in line for line in said), said
    assert "executor: shell" in first.read_text()  # put back
    held = sorted(p.name for p in (ws.root / "Pending_Approval").glob("task_file_*.md"))
    assert len(held) == 1, held


def test_loops_that_took_the_same_looks_compare_each_task_file_once(ws: Workspace,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Loops whose steps began and ended in the same turns (one look before, one after, shared) compare the
    workspace's task files with the look before once between them, not once each (issue #41: a thousand loops
    compared a thousand files each, every step); each still holds what changed, and its own file is its own."""
    import asyncio

    owns = [ws.task(OTHER.replace("other", f"own{i}"), f"Specs/own{i}/tasks.md") for i in range(3)]
    third = ws.task(OTHER, "Specs/third/tasks.md")
    kws = KiroWorkspace(ws.root)
    compared: list[str] = []
    unchanged = control.TaskFiles._unchanged

    def counted(self: control.TaskFiles, real: str, st: os.stat_result, now: bytes | None) -> bool:
        compared.append(real)
        return unchanged(self, real, st, now)

    monkeypatch.setattr(control.TaskFiles, "_unchanged", counted)

    async def steps() -> list[list[str]]:
        before = await control.shared_look(kws, boxed=False)
        files = [control.TaskFiles.take(kws, own, boxed=False, look=before) for own in owns]
        third.write_text(SAME_SIZE)  # one loop's step
        after = await control.shared_look(kws, boxed=False)
        return [f.check(boxed=False, task_id=f"own{i}", step_id="1", look=after) for i, f in enumerate(files)]

    said = asyncio.run(steps())
    print(said)
    assert any("Specs/third/tasks.md was changed (its frontmatter)" in line for line in said[0]), said
    assert said[1:] == [[], []]  # held once, by the first loop that found it
    changed = os.path.realpath(third)  # compared once, then read again by each loop (a look shared is older)
    assert sorted(compared) == sorted([*map(os.path.realpath, owns), changed, changed, changed, changed]), compared
    held = sorted(p.name for p in (ws.root / "Pending_Approval").glob("task_file_*.md"))
    assert len(held) == 1, held


def test_the_loops_that_share_a_look_share_its_frontmatters_rather_than_each_keeping_a_copy(ws: Workspace) -> None:
    """Every loop of a process holds its look before the step (`TaskFiles`) while the step runs: with the look
    shared (issue #41), a copy of its every task file's frontmatter in each loop grew as the loops times the
    task files (1,000 loops: ~20 MB). What 200 loops keep of one look of 200 task files, measured with
    tracemalloc (bytes, not a time): one copy a loop is ~1.4 MB; one for all, under 100 KB."""
    import gc
    import tracemalloc

    owns = [ws.task(OTHER.replace("other", f"t{i}"), f"Specs/t{i:03d}/tasks.md") for i in range(200)]
    kws = KiroWorkspace(ws.root)
    look = control.Look.now(kws, boxed=False)
    gc.collect()
    tracemalloc.start()
    try:
        files = [control.TaskFiles.take(kws, own, look=look) for own in owns]
        gc.collect()
        kept, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(files[0].by_path) == 200 and files[0].by_path == files[-1].by_path
    assert kept < 100_000, kept


OPENS = """
import os, sys
task = os.path.realpath(sys.argv[1])
opened = [0]
def count(event, args):
    if event == "open" and isinstance(args[0], (str, os.PathLike)) and os.fspath(args[0]).endswith("tasks.md"):
        opened[0] += os.path.realpath(args[0]) == task and not args[2] & os.O_PATH  # O_PATH: no watcher hears it
sys.addaudithook(count)
import kiro.cli
sys.argv = ["kiro", "loop", "start", "--task", sys.argv[1]]
try:
    kiro.cli.main()
finally:
    print(f"opened {opened[0]}", file=sys.stderr)
"""


def test_a_step_opens_its_task_file_at_most_five_times(ws: Workspace) -> None:
    """Every open of the task file wakes the change hub's thread, which watches Specs/ (docs/guides/step-cost.md).
    A step of a shell loop opens it five times, counted by an audit hook: the re-read before the step, the
    frontmatter in the looks before and after it (SPEC §15: the look after serves the put-back of the loop's own
    frontmatter too), and once for each box edit ([-] and [x]: its last look before the write reads through the
    descriptor it writes through, while the path still names that file). An `O_PATH` open (`real_path`: the file's
    real path, asked of the kernel) reads nothing and no watcher hears it: not counted
    (`test_an_o_path_open_wakes_no_watcher`)."""
    steps = 10
    ws.write("config/autonomous_loop.yaml", "sandbox: off\n")
    body = "".join(f"- [ ] {i}. Step {i}\n  ```sh\n  true\n  ```\n" for i in range(1, steps + 1))
    ws.task("---\ntitle: opens\nexecutor: shell\n---\n" + body, "Specs/opens/tasks.md")
    r = subprocess.run([sys.executable, "-c", OPENS, "Specs/opens/tasks.md"], cwd=ws.root, env=ws.env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (ws.root / "Done/opens/tasks.md").read_text().count("- [x]") == steps
    opened = int(r.stderr.rsplit("opened ", 1)[1].split()[0])
    assert steps <= opened <= 5 * steps + 2, opened  # + the first read at the start and the last look at the end


def test_a_fifo_named_like_a_task_file_in_done_does_not_hold_up_the_loop(ws: Workspace) -> None:
    """The look around each step reads the frontmatter of every `*.md` in Done/ and Needs_Action/ (a file moved
    back from there is not a new one). A FIFO named `pipe.md` there (a person's, or an unboxed step's `mkfifo`)
    is no task file: the look passes it by, where opening it to read blocked the loop, before its first step,
    until something wrote into it (and a SIGTERM could not end it)."""
    os.mkfifo(ws.root / "Done/pipe.md")
    os.mkfifo(ws.root / "Needs_Action/pipe.md")
    ws.write("config/autonomous_loop.yaml", "sandbox: off\n")
    ws.task("---\ntitle: fifo\nexecutor: shell\n---\n- [ ] 1. Step\n  ```sh\n  true\n  ```\n", "Specs/fifo/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/fifo/tasks.md", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "- [x] 1. Step" in (ws.root / "Done/fifo/tasks.md").read_text()


def test_a_folders_real_path_is_realpaths(tmp_path: Path) -> None:
    """`real_path` (the look's real path of Specs/ and of the loop's own task file, the workspace's `relative`
    and `area_of`, asked of the kernel) names what `os.path.realpath` names: through links, relative links, `..`
    after a link, a folder moved and a link left in its place, a file, a link to a file, a FIFO (not waited on),
    and for what is nothing to open (missing, a dangling link, a loop of links, a file named as a folder)
    realpath's own answer."""
    from kiro.store.workspace import real_path

    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "l").symlink_to(tmp_path / "a")
    (tmp_path / "rel").symlink_to("a/b")
    (tmp_path / "f").write_text("")
    (tmp_path / "a/b/tasks.md").write_text("")
    (tmp_path / "a/b/linked.md").symlink_to("../../f")
    (tmp_path / "a/b/dangling.md").symlink_to("nowhere.md")
    (tmp_path / "a/b/loop.md").symlink_to("loop.md")
    os.mkfifo(tmp_path / "a/b/pipe.md")
    paths = ["/", str(tmp_path), f"{tmp_path}/a/b", f"{tmp_path}/l", f"{tmp_path}/l/b", f"{tmp_path}/rel",
             f"{tmp_path}/l/../a", f"{tmp_path}/missing", f"{tmp_path}/f", f"{tmp_path}/l/missing",
             f"{tmp_path}/l/b/tasks.md", f"{tmp_path}/rel/tasks.md", f"{tmp_path}/rel/linked.md",
             f"{tmp_path}/l/b/dangling.md", f"{tmp_path}/a/b/loop.md", f"{tmp_path}/l/b/pipe.md", f"{tmp_path}/f/",
             f"{tmp_path}/f/x.md"]
    for path in paths:
        assert real_path(path) == os.path.realpath(path), path
    (tmp_path / "a").rename(tmp_path / "moved")
    (tmp_path / "a").symlink_to(tmp_path / "moved")
    for path in paths:
        assert real_path(path) == os.path.realpath(path), path
    assert real_path(f"{tmp_path}/a/b") == f"{tmp_path.resolve()}/moved/b"
    assert real_path(f"{tmp_path}/a/b/tasks.md") == f"{tmp_path.resolve()}/moved/b/tasks.md"
    (tmp_path / "f").rename(tmp_path / "g")  # the link's target moved: dangling now, then linked again
    assert real_path(f"{tmp_path}/rel/linked.md") == os.path.realpath(f"{tmp_path}/rel/linked.md")
    (tmp_path / "f").symlink_to("moved/b/tasks.md")
    assert real_path(f"{tmp_path}/rel/linked.md") == f"{tmp_path.resolve()}/moved/b/tasks.md"


def test_an_o_path_open_wakes_no_watcher(tmp_path: Path) -> None:
    """`real_path` opens the file it is asked about with O_PATH: inotify (the change hub's watchfiles) hears no
    open and no close of it, where a read's open is heard twice (`test_a_step_opens_its_task_file_at_most_five_times`
    counts only the opens heard)."""
    import ctypes
    import struct

    from kiro.store.workspace import real_path

    libc = ctypes.CDLL(None, use_errno=True)
    task = tmp_path / "tasks.md"
    task.write_text("- [ ] 1. Step\n")
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0
    try:
        assert libc.inotify_add_watch(fd, os.fsencode(tmp_path), 0xFFF) >= 0  # IN_ALL_EVENTS

        def heard() -> list[int]:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return []
            masks, at = [], 0
            while at < len(data):
                _wd, mask, _cookie, size = struct.unpack_from("iIII", data, at)
                masks.append(mask)
                at += 16 + size
            return masks

        assert real_path(os.fspath(task)) == os.path.realpath(task)
        assert heard() == []
        os.close(os.open(task, os.O_RDONLY))
        assert heard() == [0x20, 0x10]  # IN_OPEN, IN_CLOSE_NOWRITE: a read is heard
    finally:
        os.close(fd)
