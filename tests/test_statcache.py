"""Re-read a file only when it changed (kiro.fs.statcache), the one rule kiro's kept reads follow: a file's
identity, size and both times must be as they were, and a file changed within the rule's window is read again
at every look (git's "racily clean" files: a write in the same tick of the clock as the read leaves its times as
they were). The users a person notices: a prompt file, the workspace's rules, a loop's task-file map."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiro.executors import prompts
from kiro.fs import statcache
from kiro.fs.statcache import StatCache
from kiro.store import taskmap
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace

HOUR_AGO_NS = 3600 * 10**9


class Reads:
    """A reader that says how often it read the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        return self.path.read_text()


def rewrite_keeping_times(path: Path, text: str) -> None:
    """What a step or an editor may do: the same size, the mtime put back (only the ctime, which no process
    sets, moves)."""
    before = os.stat(path)
    assert len(text) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns


def test_a_file_rewritten_in_the_same_tick_with_its_mtime_put_back_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The racy case itself: the second look finds every time of the file as the first did (the stat taken
    before the rewrite, as in a coarse clock's same tick). The file changed within the window: read again."""
    monkeypatch.setattr(statcache, "RACY_NS", 10**18)  # within the window however long a loaded machine takes
    path = tmp_path / "prompt.md"
    path.write_text("one\n")
    cache: StatCache[str] = StatCache(most=8)
    same_tick = os.stat(path)
    reads = Reads(path)
    assert cache.read(str(path), same_tick, reads) == "one\n"
    rewrite_keeping_times(path, "two\n")
    assert cache.read(str(path), same_tick, reads) == "two\n"  # the key is the very same: the rule re-reads
    assert cache.read(str(path), os.stat(path), reads) == "two\n"
    assert reads.count == 3, "a file changed this recently is read at every look"


def test_a_settled_file_is_read_once_and_again_when_its_ctime_moved(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A file left alone longer than the window is read once; a same-size rewrite with its mtime put back is
    still seen (its ctime moved), and so is a new file renamed over it (another inode)."""
    monkeypatch.setattr(statcache, "RACY_NS", -(10**18))  # every file counts as settled: no wait in a test
    path = tmp_path / "rules.md"
    path.write_text("one\n")
    cache: StatCache[str] = StatCache(most=8)
    reads = Reads(path)
    assert [cache.read(str(path), os.stat(path), reads) for _ in range(3)] == ["one\n"] * 3
    assert reads.count == 1, "an unchanged, settled file is read once"
    rewrite_keeping_times(path, "two\n")
    assert cache.read(str(path), os.stat(path), reads) == "two\n"
    other = tmp_path / "new.md"
    other.write_text("six\n")
    os.utime(other, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns))
    other.replace(path)
    assert cache.read(str(path), os.stat(path), reads) == "six\n"
    assert reads.count == 3


def test_a_value_the_caller_will_not_keep_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statcache, "RACY_NS", -(10**18))
    path = tmp_path / "big.md"
    path.write_text("x" * 100)
    cache: StatCache[str] = StatCache(most=8)
    reads = Reads(path)
    for _ in range(2):
        cache.read(str(path), os.stat(path), reads, keep=lambda text: len(text) < 10)
    assert reads.count == 2


def test_a_prompt_file_a_person_rewrote_with_its_old_mtime_is_used(ws: Workspace) -> None:
    """A person's prompt override last changed an hour ago, rewritten to the same size with its mtime put
    back (a sync tool, `cp -p`, an editor that keeps times): the next prompt uses the new text."""
    override = ws.write("config/prompts/step.md", "Do step A now.\n")
    old = os.stat(override).st_mtime_ns - HOUR_AGO_NS
    os.utime(override, ns=(old, old))
    kws = KiroWorkspace(ws.root)
    assert prompts.template("step.md", kws).template == "Do step A now.\n"
    rewrite_keeping_times(override, "Do step B now.\n")
    assert prompts.template("step.md", kws).template == "Do step B now.\n"


def test_a_task_file_map_rewritten_with_its_old_mtime_is_read_again(ws: Workspace) -> None:
    """kiro's record of which loop owns which task file, replaced in place by the same length with its mtime
    put back (a restore from a backup): the loop it names now is the one found."""
    task = ws.task("---\ntitle: t\nexecutor: shell\n---\n- [ ] 1. Step\n", "Specs/t/tasks.md")
    state_dir = ws.root / ".state"
    taskmap.remember(state_dir, "loop_aaaa", task)
    record = state_dir / taskmap.FILE
    old = os.stat(record).st_mtime_ns - HOUR_AGO_NS
    os.utime(record, ns=(old, old))
    assert taskmap.task_id_for(state_dir, task) == "loop_aaaa"
    rewrite_keeping_times(record, record.read_text().replace("loop_aaaa", "loop_bbbb"))
    assert taskmap.task_id_for(state_dir, task) == "loop_bbbb"


def test_a_stop_hook_is_found_by_the_folders_kept_listing_as_by_a_stat_of_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`first_present` (a loop's look for its stop hooks at every safe point) answers what `os.path.exists` of
    each name does: a hook planted with the folder's mtime put back is found (the folder's ctime moved), a link
    to nothing is no hook, and the same link counts once its target appears, though the folder did not change."""
    monkeypatch.setattr(statcache, "RACY_NS", -(10**18))  # every folder counts as settled: its listing is kept
    hooks = tmp_path / ".hooks"
    hooks.mkdir()
    names = ("stop_autonomous_loop_t1.md", "stop_autonomous_loop.md")
    assert statcache.first_present(str(hooks), names) is None
    assert statcache.first_present(str(tmp_path / "none"), names) is None

    before = os.stat(hooks)
    (hooks / names[1]).write_text("stop\n")
    os.utime(hooks, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert statcache.first_present(str(hooks), names) == str(hooks / names[1])

    target = tmp_path / "later.md"
    (hooks / names[0]).symlink_to(target)
    assert statcache.first_present(str(hooks), names) == str(hooks / names[1])  # the link leads nowhere yet
    (hooks / names[1]).unlink()
    assert statcache.first_present(str(hooks), names) is None
    settled = os.stat(hooks)
    assert statcache.first_present(str(hooks), names) is None  # the listing is kept now
    target.write_text("stop\n")  # .hooks/ itself does not change
    assert os.stat(hooks).st_mtime_ns == settled.st_mtime_ns and os.stat(hooks).st_ctime_ns == settled.st_ctime_ns
    assert statcache.first_present(str(hooks), names) == str(hooks / names[0])


def test_a_prompts_build_looks_at_config_once_and_sees_a_file_a_person_adds(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """One build of a step's prompts (`prompts.Overrides`) asks what `config/` holds once: with no override there,
    two stats (`config/`, `AGENTS.md`) where each of the four files was stat'ed. A prompt or rules file a person
    adds later is used at the next build, also with `config/`'s mtime put back (its ctime moved)."""
    monkeypatch.setattr(statcache, "RACY_NS", -(10**18))  # every folder counts as settled: its listing is kept
    ws.write("config/autonomous_loop.yaml", "autonomous_loop: {}\n")
    kws = KiroWorkspace(ws.root)
    stats: list[str] = []
    real_stat = os.stat

    def counting(path: object, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(os.fspath(path))  # type: ignore[arg-type]
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting)
    overrides = prompts.Overrides(kws)
    assert overrides.template("step.md").template == prompts.template("step.md").template  # kiro's own
    assert overrides.template("system.md").template == prompts.template("system.md").template
    assert overrides.rules() == ""
    assert stats == [str(ws.root / "config"), str(ws.root / "AGENTS.md")]

    config = ws.root / "config"
    before = real_stat(config)
    ws.write("config/prompts/step.md", "Do it now.\n")
    ws.write("config/rules.md", "Be brief.\n")
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    overrides = prompts.Overrides(kws)
    assert overrides.template("step.md").template == "Do it now.\n"
    assert "Be brief." in overrides.rules()
