"""A person edits the task file while the loop runs: kiro's checkbox edits must land on top of
the person's changes (compare-and-swap, re-read, retry) and never undo or reformat them."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiro.errors import TaskFileError
from kiro.fs.atomic import Staged
from kiro.store import tasks

BASE = (
    "# Plan\n"
    "\n"
    "- [ ] 1. First\n"
    "  - detail one\n"
    "- [ ] 2. Second\n"
    "  - [ ] 2.1 Child\n"
    "- [x] 3. Third\n"
)

PERSON_EDITS: dict[str, Callable[[str], str]] = {
    "checks a box": lambda t: t.replace("- [ ] 2.1 Child", "- [x] 2.1 Child"),
    "unchecks a box": lambda t: t.replace("- [x] 3. Third", "- [ ] 3. Third"),
    "adds a step above": lambda t: t.replace("- [ ] 1. First", "- [x] 0. Prepared by hand\n- [ ] 1. First"),
    "adds a step below": lambda t: t + "- [ ] 4. Added by hand\n",
    "edits a detail": lambda t: t.replace("  - detail one\n", "  - detail one, reworded \t\n  - a new one\n"),
    "adds an HTML comment": lambda t: "<!-- reviewed by Ana: looks good -->\n" + t,
    "switches to CRLF": lambda t: t.replace("\n", "\r\n"),
}


def write(folder: Path, text: str) -> Path:
    path = folder / "tasks.md"
    path.write_bytes(text.encode("utf-8"))
    return path


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "tasks.md")


@pytest.mark.parametrize("edit", sorted(PERSON_EDITS))
def test_a_persons_edit_after_kiros_read_survives_kiros_write(tmp_path: Path, edit: str) -> None:
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    step = seen.current_step()
    assert step is not None and step.id == "1"

    persons = PERSON_EDITS[edit](BASE)
    path.write_bytes(persons.encode())
    after = tasks.set_marker(path, step.key, "-", expected=seen)

    assert path.read_bytes() == persons.replace("- [ ] 1. First", "- [-] 1. First", 1).encode()
    assert after.find(step.key).marker == "-"  # type: ignore[union-attr]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("edit", sorted(PERSON_EDITS))
def test_a_persons_edit_between_a_batch_starts_read_and_its_write_survives(tmp_path: Path, edit: str) -> None:
    """A batch start (`kiro loop start --task a --task b ...`) makes the `kiro_task_id` edit of
    every task file while it prepares the loops and writes them all at its end: a person's edit in
    between is kept, and the key is set on top of it."""
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    staged = Staged()
    tasks.stage_frontmatter_key(path, "kiro_task_id", "t1", expected=seen, staged=staged)
    assert path.read_bytes() == BASE.encode()  # nothing in place yet

    persons = PERSON_EDITS[edit](BASE)
    path.write_bytes(persons.encode())
    staged.commit()

    after = tasks.load(path)
    assert after.frontmatter == {"kiro_task_id": "t1"}
    nl = "\r\n" if "\r\n" in persons else "\n"
    assert path.read_bytes() == f"---{nl}kiro_task_id: t1{nl}---{nl}{persons}".encode()
    assert leftovers(tmp_path) == []


def test_a_batch_starts_task_id_edit_of_an_unchanged_file_and_of_one_that_has_it(tmp_path: Path) -> None:
    path = write(tmp_path, "---\ntitle: Plan  # mine\n---\n" + BASE)
    path.chmod(0o600)
    staged = Staged()
    tasks.stage_frontmatter_key(path, "kiro_task_id", "t1", expected=tasks.load(path), staged=staged)
    staged.commit()
    assert path.read_text() == "---\ntitle: Plan  # mine\nkiro_task_id: t1\n---\n" + BASE
    assert path.stat().st_mode & 0o777 == 0o600  # the file's own permission bits kept
    before = path.stat().st_mtime_ns, path.stat().st_ino
    tasks.stage_frontmatter_key(path, "kiro_task_id", "t1", expected=tasks.load(path), staged=staged)
    assert len(staged) == 0  # the same value: nothing to write
    staged.commit()
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("edit", sorted(PERSON_EDITS))
def test_a_persons_edit_during_kiros_write_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str
) -> None:
    """The person saves after kiro computed its edit and wrote the temp file, right before the
    replace: kiro's last look sees it, drops its temp file and redoes the edit on the new text."""
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    persons = PERSON_EDITS[edit](BASE)
    real_last_look = tasks._last_look
    calls: list[Path] = []

    def person_saves_first(p: Path, *through: Any) -> bytes | None:
        if not calls:
            path.write_bytes(persons.encode())
        calls.append(p)
        return real_last_look(p, *through)

    monkeypatch.setattr(tasks, "_last_look", person_saves_first)
    _, checked = tasks.mark_done(path, "1", expected=seen)

    assert checked == ["1"]
    assert len(calls) == 2
    assert path.read_bytes() == persons.replace("- [ ] 1. First", "- [x] 1. First", 1).encode()
    assert leftovers(tmp_path) == []


def test_a_box_the_person_checked_meanwhile_is_left_as_they_wrote_it(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    path.write_text(BASE.replace("- [ ] 1. First", "- [X] 1. First"))
    _, checked = tasks.mark_done(path, "1", expected=seen)
    assert checked == []
    assert path.read_text() == BASE.replace("- [ ] 1. First", "- [X] 1. First")


def test_the_parent_check_uses_the_persons_latest_boxes(tmp_path: Path) -> None:
    path = write(tmp_path, "- [ ] 1. Parent\n  - [ ] 1.1 a\n  - [ ] 1.2 b\n")
    seen = tasks.load(path)
    path.write_text("- [ ] 1. Parent\n  - [ ] 1.1 a\n  - [x] 1.2 b\n")  # the person did 1.2
    _, checked = tasks.mark_done(path, seen.steps[1].key, expected=seen)
    assert checked == ["1.1", "1"]
    assert path.read_text() == "- [x] 1. Parent\n  - [x] 1.1 a\n  - [x] 1.2 b\n"


def test_a_renumbered_step_is_still_found(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    renumbered = BASE.replace("- [ ] 1. First", "- [ ] 1. New first\n- [ ] 2. First")
    path.write_text(renumbered)
    tasks.mark_done(path, seen.steps[0].key, expected=seen)
    assert path.read_text() == renumbered.replace("- [ ] 2. First", "- [x] 2. First")


def test_a_step_the_person_deleted_is_an_error_and_nothing_is_written(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    persons = BASE.replace("- [ ] 1. First\n  - detail one\n", "")
    path.write_text(persons)
    with pytest.raises(TaskFileError, match=r"step '1' is no longer in the task file"):
        tasks.set_marker(path, seen.steps[0].key, "x", expected=seen)
    assert path.read_text() == persons
    assert leftovers(tmp_path) == []


def test_a_file_that_never_stops_changing_is_an_error_not_a_lost_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, BASE)
    real_last_look = tasks._last_look
    saves = []

    def person_saves_again(p: Path, *through: Any) -> bytes | None:
        saves.append(1)
        path.write_text(BASE + f"<!-- save {len(saves)} -->\n")
        return real_last_look(p, *through)

    monkeypatch.setattr(tasks, "_last_look", person_saves_again)
    with pytest.raises(TaskFileError, match="kept changing"):
        tasks.mark_done(path, "1")
    assert path.read_text() == BASE + f"<!-- save {len(saves)} -->\n"
    assert leftovers(tmp_path) == []


def test_two_edits_in_a_row_with_a_stale_expected_file(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    seen = tasks.load(path)
    tasks.set_marker(path, seen.steps[0].key, "-", expected=seen)
    tasks.mark_done(path, seen.steps[0].key, expected=seen)  # `seen` is now stale: kiro re-reads
    assert path.read_text() == BASE.replace("- [ ] 1. First", "- [x] 1. First")


# -- property: generated task files ----------------------------------------------------------------

WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzÉé漢字`_", min_size=1, max_size=8).filter(
    lambda w: w[0].isalpha()
)
INDENT = st.sampled_from(["", "  ", "    ", "\t", "\t\t", "  \t", "      "])
TRAILING = st.sampled_from(["", "", " ", "  ", "\t"])


@st.composite
def task_files(draw: st.DrawFn) -> tuple[str, list[tuple[str, bool]]]:
    """A random task file and, for each step in it, (marker, optional)."""
    steps: list[tuple[str, bool]] = []
    lines: list[str] = []
    if draw(st.booleans()):
        lines += ["---", "title: Generated", "notes: '- [ ] not a step'", "# a comment", "---"]
    lines.append(draw(st.sampled_from(["# Implementation Plan", "Intro text", ""])))
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["step", "step", "step", "step", "detail", "blank", "code", "legend"]))
        indent = draw(INDENT)
        if kind == "step":
            marker = draw(st.sampled_from(list(tasks.MARKERS)))
            star = draw(st.sampled_from(["", "", "*", "\\*"]))
            number = draw(st.sampled_from(["", "1. ", "2.1 ", "3.1.2: ", "10. "]))
            words = " ".join(draw(st.lists(WORD, min_size=1, max_size=4)))
            bullet = draw(st.sampled_from("-*+"))
            space = draw(st.sampled_from([" ", "  ", "   "]))
            lines.append(f"{indent}{bullet} [{marker}]{star}{space}{number}{words}{draw(TRAILING)}")
            steps.append((marker, bool(star)))
        elif kind == "detail":
            lines.append(f"{indent}  - {draw(WORD)} _Requirements: 1.1_{draw(TRAILING)}")
        elif kind == "blank":
            lines.append(draw(st.sampled_from(["", " ", "\t", "  \t"])))
        elif kind == "code":
            fence = draw(st.sampled_from(["```", "~~~", "````"]))
            tag = draw(st.sampled_from(["", "sh", "bash", "json"]))
            inner = "```" if fence == "````" else "- [-] fake"  # a shorter fence does not close it
            fake = draw(st.sampled_from(["- [ ] 9. fake step", "- [x] fake", "[x] stray", inner]))
            lines += [f"{indent}  {fence}{tag}", f"{indent}  {fake}", f"{indent}    - [ ]* fake",
                      f"{indent}  {fence}"]
        else:
            lines.append(f"{indent}- `[ ]` - Not started")
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join(lines) + (newline if draw(st.booleans()) else "")
    return text, steps


@settings(max_examples=150, deadline=None)
@given(generated=task_files(), bom=st.booleans(), data=st.data())
def test_generated_files_parse_consistently_and_edit_one_byte(
    generated: tuple[str, list[tuple[str, bool]]], bom: bool, data: st.DataObject
) -> None:
    text, written = generated
    tf = tasks.parse(text)
    assert [(s.marker, s.optional) for s in tf.steps] == written
    counts = tf.counts()
    assert counts.total == len(written)
    assert counts.done == sum(1 for m, _ in written if m in "xX")
    assert counts.optional == sum(1 for _, opt in written if opt)
    assert counts.leaves == sum(1 for s in tf.steps if s.is_leaf)
    assert (counts.open == 0) == (tf.current_step() is None)
    for s in tf.steps:
        assert tf.text[s.box_offset] == s.marker
        assert all(tf.steps[c].parent == s.index and tf.steps[c].indent > s.indent for c in s.children)
    if not tf.steps:
        return

    step = data.draw(st.sampled_from(tf.steps))
    targets = [m for m in " -~x" if m != step.marker and not (step.done and m == "x")]
    target = data.draw(st.sampled_from(targets))
    original = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tasks.md"
        path.write_bytes(original)
        loaded = tasks.load(path)
        after = tasks.set_marker(path, step.key, target, expected=loaded)
        edited = path.read_bytes()
        at = (3 if bom else 0) + len(text[: step.box_offset].encode("utf-8"))
        assert len(edited) == len(original)
        assert [i for i in range(len(original)) if original[i] != edited[i]] == [at]
        assert edited[at] == ord(target)
        delta = (target in "xX") - step.done
        assert after.counts().done == counts.done + delta
        assert after.counts().total == counts.total

        tasks.set_marker(path, step.key, step.marker, expected=after)
        assert path.read_bytes() == original
        assert sorted(p.name for p in Path(folder).iterdir()) == ["tasks.md"]
