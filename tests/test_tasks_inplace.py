"""Box edits in place and the parse cache (issue #12): kiro's own edits overwrite the marker
byte(s) in the same file (no temp file, no rename), and a task file is parsed again only when its
bytes changed, however fast a person's edit follows kiro's read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kiro.store import tasks

BASE = "---\ntitle: t\n---\n- [ ] 1. Parent é\n  - [ ] 1.1 a\n  - [ ] 1.2 b\n- [ ] 2. Next 漢字\n"


def write(tmp: Path, text: str) -> Path:
    p = tmp / "tasks.md"
    p.write_text(text, encoding="utf-8")
    return p


def test_a_box_edit_keeps_the_file_its_inode_and_every_other_byte(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    inode = path.stat().st_ino
    seen = tasks.load(path)
    assert seen.counts().open == 3 and seen.current_step().id == "1.1"  # type: ignore[union-attr]
    after = tasks.set_marker(path, "1.1", "-", expected=seen)
    after, checked = tasks.mark_done(path, "1.1", expected=after)
    after, checked2 = tasks.mark_done(path, "1.2", expected=after)
    assert (checked, checked2) == (["1.1"], ["1.2", "1"])
    assert path.stat().st_ino == inode  # written in place, not replaced
    assert path.read_text(encoding="utf-8") == BASE.replace("[ ] 1.", "[x] 1.").replace("[ ] 1.", "[x] 1.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.md"]
    # what the edit returns is what a fresh parse of the disk says
    fresh = tasks.parse(path.read_text(encoding="utf-8"), path)
    assert [(s.id, s.marker) for s in after.steps] == [(s.id, s.marker) for s in fresh.steps]
    assert after.done_count == fresh.done_count == 3
    assert after.counts() == fresh.counts()
    assert after.current_step() is not None and after.current_step().id == "2"  # type: ignore[union-attr]


def test_a_utf8_file_with_bom_and_crlf_gets_the_right_byte(tmp_path: Path) -> None:
    path = tmp_path / "tasks.md"
    raw = b"\xef\xbb\xbf# \xc3\xa9t\xc3\xa9\r\n- [ ] 1. caf\xc3\xa9\r\n- [ ] 2. \xe6\xbc\xa2\r\n"
    path.write_bytes(raw)
    tasks.mark_done(path, "2")
    assert path.read_bytes() == raw.replace(b"[ ] 2.", b"[x] 2.")


def test_an_editor_that_saves_by_rename_during_kiros_edit_keeps_its_save_and_gets_the_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most editors save by writing a new file and renaming it over the old one. If that lands
    between kiro's read and its byte write, kiro's byte went into the old file: kiro sees the
    file's inode changed and makes the edit again in the new file."""
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    persons = BASE.replace("- [ ] 2. Next", "- [ ] 2. Next, reworded by hand\n- [ ] 3. Added")
    real_last_look = tasks._last_look
    calls: list[int] = []

    def editor_saves_by_rename(p: Path, *through: Any) -> bytes | None:
        look = real_last_look(p, *through)
        if not calls:
            tmp = tmp_path / ".tasks.md.swp"
            tmp.write_text(persons, encoding="utf-8")
            os.replace(tmp, path)
        calls.append(1)
        return look  # the look saw the old bytes: the swap lands right after it

    monkeypatch.setattr(tasks, "_last_look", editor_saves_by_rename)
    _, checked = tasks.mark_done(path, "1.1", expected=seen)
    assert checked == ["1.1"]
    assert len(calls) == 2
    assert path.read_text(encoding="utf-8") == persons.replace("- [ ] 1.1 a", "- [x] 1.1 a")


def test_an_unchanged_file_is_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, BASE)
    first = tasks.load(path)
    parses: list[int] = []
    real_parse = tasks._parse_bytes

    def counting(raw: bytes, p: Path | None) -> tasks.TaskFile:
        parses.append(1)
        return real_parse(raw, p)

    monkeypatch.setattr(tasks, "_parse_bytes", counting)
    assert tasks.load(path) is first
    edited = tasks.mark_done(path, "1.1", expected=first)[0]
    assert tasks.load(path) is edited  # kiro's own edit: no parse either
    assert parses == []


def test_a_persons_edit_right_after_kiros_read_is_seen_even_with_the_same_size_and_mtime(
    tmp_path: Path,
) -> None:
    """ext4 stamps mtimes with a coarse clock: an edit within the same tick and of the same size
    leaves (inode, size, mtime) unchanged. kiro compares the bytes of a file that recent."""
    path = write(tmp_path, BASE)
    before = os.stat(path)
    assert tasks.load(path).find("2").marker == " "  # type: ignore[union-attr]
    path.write_text(BASE.replace("- [ ] 2.", "- [x] 2."), encoding="utf-8")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same stamp, as in one tick
    assert tasks.load(path).find("2").marker == "x"  # type: ignore[union-attr]


def test_a_long_chain_of_edits_returns_what_the_disk_holds(tmp_path: Path) -> None:
    """A box edit's copy builds its text and bytes only when asked (issue #12). Over a chain of
    edits longer than the edits a copy keeps waiting, each returned file, read at any point of the
    chain, is what a fresh parse of the disk says: text, bytes, boxes."""
    lines = ["# Plan — ünïcode"] + [f"- [ ] {i}. Step {i} {'é' * (i % 3)}\n  détails {i}" for i in range(1, 151)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    tf = tasks.load(path)
    for i in range(1, 151):
        tf = tasks.set_marker(path, str(i), "-", expected=tf, durable=False)
        tf, checked = tasks.mark_done(path, str(i), expected=tf)
        assert checked == [str(i)]
        if i == 3 or i > 140:  # in between, more edits wait than a copy keeps: built on the way
            disk = path.read_bytes()
            assert tf._raw == disk, i
            assert tf.text == disk.decode("utf-8"), i
            assert [s.marker for s in tf.steps] == [s.marker for s in tasks.parse(tf.text, path).steps]
    assert path.read_text(encoding="utf-8") == "\n".join(lines).replace("- [ ]", "- [x]") + "\n"


def test_an_edit_on_a_stale_expected_file_is_worked_out_again_on_the_disk(tmp_path: Path) -> None:
    """The edit is first worked out on the caller's parse, unread; the last look before the write
    must find its bytes. A person's edit since that parse is kept, and the box is set where the
    step now is."""
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    persons = BASE.replace("- [ ] 1. Parent é\n", "- [ ] 0. Added above ✓\n- [ ] 1. Parent é\n")
    path.write_text(persons, encoding="utf-8")
    after = tasks.set_marker(path, "1.1", "-", expected=seen)
    assert path.read_text(encoding="utf-8") == persons.replace("- [ ] 1.1", "- [-] 1.1")
    assert [s.id for s in after.steps] == ["0", "1", "1.1", "1.2", "2"]
    # a box the stale parse already shows as set is still set on the disk
    path.write_text(BASE, encoding="utf-8")
    stale = tasks.parse(BASE.replace("- [ ] 2.", "- [x] 2."), path)
    _, checked = tasks.mark_done(path, "2", expected=stale)
    assert checked == ["2"]
    assert path.read_text(encoding="utf-8") == BASE.replace("- [ ] 2.", "- [x] 2.")


@pytest.mark.parametrize("persons", [BASE + "- [ ] 3. Added in place\n", BASE.replace(" é\n", "\n"),
                                     BASE.replace("1.2 b", "1.2 c")], ids=["longer", "shorter", "same size"])
def test_a_persons_edit_in_place_after_kiro_opened_the_file_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persons: str
) -> None:
    """The last look before the box write reads through the descriptor the edit opened, first with the size
    the file had then: a person's edit written into the same file meanwhile (same inode), longer, shorter or
    of the same size, is seen there, and kiro's box goes into the person's text."""
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    real_with_boxes = tasks._with_boxes
    edits: list[int] = []

    def person_writes_in_place(tf: tasks.TaskFile, marks: dict[int, str]) -> tasks.TaskFile:
        if not edits:
            with open(path, "r+b") as fh:  # the same file: an editor that writes in place
                fh.write(persons.encode("utf-8"))
                fh.truncate()
        edits.append(1)
        return real_with_boxes(tf, marks)

    monkeypatch.setattr(tasks, "_with_boxes", person_writes_in_place)
    inode = path.stat().st_ino
    after, checked = tasks.mark_done(path, "1.1", expected=seen)
    assert checked == ["1.1"] and len(edits) == 2  # the edit was worked out again on the person's bytes
    assert path.stat().st_ino == inode
    assert path.read_text(encoding="utf-8") == persons.replace("- [ ] 1.1 a", "- [x] 1.1 a")
    assert after.text == path.read_text(encoding="utf-8")
