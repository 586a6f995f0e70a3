"""kiro.fs.atomic.atomic_write, the one crash-safe write behind state files, task files, reports, hooks
and the agent's file tools; and storage that loads without the executors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiro.fs.atomic import TEMP_SUFFIX, atomic_write
from kiro.fs.diskfull import DiskFull


def _temps(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX)]


def test_writes_creates_folders_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state.json"
    assert atomic_write(target, "one")
    assert atomic_write(target, b"two")
    assert target.read_text() == "two"
    assert _temps(target.parent) == []


def test_a_failure_before_the_rename_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "tasks.md"
    target.write_text("old")

    def crash() -> bool:
        raise OSError(28, "No space left on device")

    with pytest.raises(DiskFull, match="No space"):
        atomic_write(target, "new", unchanged=crash)
    assert target.read_text() == "old"
    assert _temps(tmp_path) == []


def test_compare_and_swap_writes_nothing_when_the_file_changed(tmp_path: Path) -> None:
    target = tmp_path / "tasks.md"
    target.write_text("old")
    assert atomic_write(target, "new", unchanged=lambda: False) is False
    assert target.read_text() == "old"
    assert _temps(tmp_path) == []


def test_modes_new_kept_and_exact(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh"
        atomic_write(fresh, "x")
        assert fresh.stat().st_mode & 0o777 == 0o644
        private = tmp_path / "private"
        private.write_text("x")
        private.chmod(0o600)
        atomic_write(private, "y", keep_mode=True)
        assert private.stat().st_mode & 0o777 == 0o600  # a person's task file keeps its bits
        atomic_write(private, "z")
        assert private.stat().st_mode & 0o777 == 0o644  # state files: kiro's own mode
        token = tmp_path / "token"
        atomic_write(token, "secret", mode=0o600)
        assert token.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(umask)


def test_through_an_open_folder(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        atomic_write("notes.md", "hello", dir_fd=fd, fsync=False)
    finally:
        os.close(fd)
    assert (tmp_path / "notes.md").read_text() == "hello"


def test_storage_loads_without_the_executors() -> None:
    """Storage (state, tasks, events) and the reports load no executor (STYLE: the house this round); the
    views may know executors by name only (kiro.executors.kinds, written for readers of a loop's state)."""
    names_only = ("kiro.executors", "kiro.executors.kinds")
    code = ("import sys, kiro.store.state, kiro.store.statestore, kiro.store.tasks, kiro.store.events\n"
            "import kiro.views.reports\n"
            f"print(sorted(m for m in sys.modules if m.startswith(('kiro.executors', 'kiro.core.engine', 'openai'))"
            f" and m not in {names_only!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == "[]"


def test_yamls_own_reader_refuses_the_same_characters_as_pyyamls_spelling() -> None:
    """kiro imports PyYAML with its reader's character class compiled from a cheaper spelling
    (kiro.fs.safeio.yaml_module): the pure-Python reader (where libyaml is missing, and the wording of a
    syntax error) refuses exactly the characters PyYAML's own pattern refuses, and accepts the rest."""
    import re

    from kiro.fs import safeio

    yaml = safeio.yaml_module()
    every = "".join(map(chr, range(0x110000)))
    theirs = re.compile(safeio._YAML_NON_PRINTABLE, re.UNICODE)  # (another key than the cached one: compiled)
    assert re.compile(safeio._YAML_NON_PRINTABLE_SAME).findall(every) == theirs.findall(every)
    assert yaml.reader.Reader.NON_PRINTABLE.findall(every) == theirs.findall(every)
    with pytest.raises(yaml.reader.ReaderError, match="#x0007"):
        yaml.compose("key: a\x07b\n", Loader=yaml.SafeLoader)
    assert yaml.compose("key: \u00e9\U0001f600\n", Loader=yaml.SafeLoader) is not None
