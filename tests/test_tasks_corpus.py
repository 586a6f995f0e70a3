"""kiro.store.tasks against real Kiro task files (the shared corpus, see its SOURCES.md): the counts
people expect, and edits that leave every byte kiro does not own exactly as committed."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from kiro.errors import TaskFileError
from kiro.store import tasks


def _corpus_dir() -> Path:
    """The corpus is vendored in tests/data/kiro-tasks (a copy of ../shared/corpus/kiro-tasks, so a
    clean clone tests it too); KIRO_CORPUS_DIR points the tests at another copy."""
    env = os.environ.get("KIRO_CORPUS_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "data" / "kiro-tasks"


CORPUS = _corpus_dir()
FILES = sorted(CORPUS.glob("*tasks.md")) if CORPUS.is_dir() else []
EXPECTED: dict[str, dict[str, object]] = (
    json.loads((CORPUS / "EXPECTED.json").read_text(encoding="utf-8"))
    if (CORPUS / "EXPECTED.json").is_file() else {}
)
MISSING = pytest.mark.skip(reason=f"task corpus not found at {CORPUS} (set KIRO_CORPUS_DIR to its folder)")


def _params(names: list[str]) -> Sequence[object]:
    if not names:
        return [pytest.param("<corpus missing>", marks=MISSING)]
    return names


ALL = _params([p.name for p in FILES])
WITH_STEPS = _params([p.name for p in FILES if tasks.parse(p.read_text(encoding="utf-8-sig")).steps])
WITH_EXPECTATIONS = _params(sorted(EXPECTED))


def corpus_file(prefix: str) -> Path:
    """The corpus file whose name starts with `prefix`: skipped without a corpus, failed when the
    corpus is there but incomplete."""
    if not CORPUS.is_dir():
        pytest.skip(f"task corpus not found at {CORPUS} (set KIRO_CORPUS_DIR to its folder)")
    matches = [p for p in FILES if p.name.startswith(prefix)]
    assert matches, f"corpus file {prefix}*tasks.md missing from {CORPUS}"
    return matches[0]


def copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / "tasks.md"
    shutil.copyfile(CORPUS / name, dest)
    return dest


def byte_offset(raw: bytes, tf: tasks.TaskFile, step: tasks.Step) -> int:
    bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    return bom + len(tf.text[: step.box_offset].encode("utf-8"))


def changed_bytes(before: bytes, after: bytes) -> list[int]:
    assert len(before) == len(after), "an edit changed the file's length"
    return [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]


@pytest.mark.parametrize("name", ALL)
def test_every_corpus_file_parses(name: str) -> None:
    tf = tasks.parse((CORPUS / name).read_text(encoding="utf-8-sig"), CORPUS / name)
    counts = tf.counts()
    assert counts.total == len(tf.steps)
    assert 0 <= counts.open <= counts.leaves <= counts.total
    for step in tf.steps:
        assert tf.text[step.box_offset] == step.marker
        assert "\r" not in step.text and all("\r" not in d for d in step.details)


@pytest.mark.parametrize("name", WITH_EXPECTATIONS)
def test_counts_match_expected_json(name: str) -> None:
    tf = tasks.load(CORPUS / name)
    counts = tf.counts()
    current = tf.current_step()
    assert {
        "steps_total": counts.total,
        "done": counts.done,
        "optional": counts.optional,
        "first_open_step_id": current.id if current else None,
    } == EXPECTED[name]


@pytest.mark.parametrize(
    ("prefix", "with_optional"),
    [("08_", "1.1"), ("13_", "3.2"), ("14_", "2.3"), ("15_", "13.4"), ("19_", "2.4")],
)
def test_first_open_step_with_optional_steps_included(prefix: str, with_optional: str) -> None:
    current = tasks.load(corpus_file(prefix)).current_step(include_optional=True)
    assert current is not None and current.id == with_optional


def test_bullet_less_checkboxes_are_refused_with_a_hint() -> None:
    path = corpus_file("17_")
    with pytest.raises(TaskFileError) as info:
        tasks.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: no steps found")
    assert "found 20 checkboxes that are not list items (line 6: '[x] **T1.1** ...')" in message
    assert "write them as '- [ ] ...'" in message and "\n" not in message


def test_colon_ids_are_numbers() -> None:
    tf = tasks.load(corpus_file("24_"))
    assert len(tf.steps) == 217
    assert tf.counts().done == 0 and tf.counts().optional == 0
    assert [s.id for s in tf.steps[:3]] == ["1.1.1", "1.1.2", "1.1.3"]
    assert tf.steps[0].title == "Create `backend/src/services/secrets-manager.ts` with AWS SDK integration"
    assert tf.duplicates() == []


@pytest.mark.parametrize("name", WITH_STEPS)
def test_marking_a_step_done_and_back_changes_only_its_marker_byte(name: str, tmp_path: Path) -> None:
    path = copy(name, tmp_path)
    original = path.read_bytes()
    tf = tasks.load(path)
    step = tf.current_step() or tf.current_step(include_optional=True) or tf.steps[0]
    target = " " if step.done else "x"

    after = tasks.set_marker(path, step.key, target, expected=tf)
    edited = path.read_bytes()
    assert changed_bytes(original, edited) == [byte_offset(original, tf, step)]
    assert edited[byte_offset(original, tf, step)] == ord(target)
    assert after.find(step.key) is not None and after.find(step.key).marker == target  # type: ignore[union-attr]

    tasks.set_marker(path, step.key, step.marker, expected=after)
    assert path.read_bytes() == original


@pytest.mark.parametrize("name", WITH_STEPS)
def test_mark_done_and_parent_checks_write_only_markers(name: str, tmp_path: Path) -> None:
    path = copy(name, tmp_path)
    original = path.read_bytes()
    tf = tasks.load(path)
    step = tf.current_step()
    if step is not None:
        _, checked = tasks.mark_done(path, step.key, expected=tf)
        assert checked[0] == step.id
    _, more = tasks.check_finished_parents(path)
    edited = path.read_bytes()
    offsets = {byte_offset(original, tf, s): s for s in tf.steps}
    diff = changed_bytes(original, edited)
    assert all(i in offsets and edited[i] == ord("x") for i in diff)
    assert len(diff) == len(checked if step is not None else []) + len(more)


@pytest.mark.parametrize("name", WITH_STEPS)
def test_setting_kiro_task_id_adds_one_line_and_nothing_else(name: str, tmp_path: Path) -> None:
    path = copy(name, tmp_path)
    original = path.read_bytes()
    before = tasks.load(path)
    after = tasks.set_frontmatter_key(path, "kiro_task_id", "task_20250101_120000")
    edited = path.read_bytes()
    nl = before.newline.encode()
    line = b"kiro_task_id: task_20250101_120000" + nl
    bom = original[:3] if original.startswith(b"\xef\xbb\xbf") else b""
    if not original[len(bom):].startswith(b"---"):
        assert edited == bom + b"---" + nl + line + b"---" + nl + original[len(bom):]
    else:
        at = edited.index(line)
        assert edited[:at] + edited[at + len(line):] == original
        assert edited[at + len(line):].startswith(b"---")
    assert after.frontmatter == {**before.frontmatter, "kiro_task_id": "task_20250101_120000"}
    assert [s.key for s in after.steps] == [s.key for s in before.steps]


# -- flat layouts: the numbering is the hierarchy ------------------------------------------------------------

FLAT = {"08_": 1, "14_": 38, "18_": 19}  # the files whose `x.y` sub-steps are not indented: how many such steps
NUMBERED = re.compile(r"(?P<ws>[ \t]*)[-*+][ \t]+\[[ xX~-]\](?:\\?\*)?[ \t]+(?P<id>[0-9]+(?:\.[0-9]+)*)")


def indented(text: str) -> str:
    """`text` laid out as Kiro writes it: each numbered step indented two spaces per earlier step whose
    number it continues (`2.1` under `2.`), the lines indented under it moved with it. Lines at column 0
    that are not steps (headings, `---`, prose) stay where they are: they end a step's details either way."""
    seen: set[str] = set()
    shift = ""
    out = []
    for line in text.split("\n"):
        m = NUMBERED.match(line)
        if m is not None and not m["ws"]:
            sid = m["id"]
            shift = "  " * sum(1 for known in seen if sid.startswith(known + "."))
            seen.add(sid)
            out.append(shift + line)
        elif line[:1] in (" ", "\t"):
            out.append(shift + line)
        else:
            out.append(line)
    return "\n".join(out)


def structure(tf: tasks.TaskFile) -> list[tuple[object, ...]]:
    def parent(s: tasks.Step) -> str | None:
        return tf.steps[s.parent].id if s.parent is not None else None

    return [(s.id, s.text, s.marker, s.optional, parent(s), [tf.steps[c].id for c in s.children], s.details,
             s.command) for s in tf.steps]


@pytest.mark.parametrize("prefix", sorted(FLAT))
def test_a_flat_file_has_the_steps_of_its_indented_layout(prefix: str) -> None:
    path = corpus_file(prefix)
    flat_text = path.read_text(encoding="utf-8-sig")
    flat, nested = tasks.parse(flat_text, path), tasks.parse(indented(flat_text), path)
    moved = sum(1 for a, b in zip(flat.steps, nested.steps, strict=True) if a.indent != b.indent)
    print(f"{path.name}: {len(flat.steps)} steps, {moved} written flat")
    assert moved == FLAT[prefix]  # the layouts differ...
    assert structure(flat) == structure(nested)  # ...and kiro reads the same plan from both
    assert flat.counts() == nested.counts()
    for include in (False, True):
        a, b = flat.current_step(include), nested.current_step(include)
        assert (a and a.id) == (b and b.id)


def test_a_flat_parent_is_not_a_step_of_its_own() -> None:
    tf = tasks.load(corpus_file("14_"))
    two = next(s for s in tf.steps if s.id == "2")
    assert [tf.steps[c].id for c in two.children] == ["2.1", "2.2", "2.3", "2.4", "2.5", "2.5", "2.6", "2.7", "2.8",
                                                      "2.9", "2.10"]  # 2.10 is not under 2.1
    assert not two.is_leaf and all(tf.steps[c].parent == two.index for c in two.children)


def test_numbers_do_not_override_an_indentation_that_says_otherwise() -> None:
    tf = tasks.parse("- [ ] 1. A\n  - [ ] 1.1 B\n- [ ] 2. C\n  - [ ] 1.2 D, filed under C on purpose\n"
                     "- [ ] 3. E\n- [ ] 4. F\n- [ ] 4 G, not 4.x\n")
    by_id = {s.id: s for s in tf.steps}
    assert tf.steps[by_id["1.2"].parent].id == "2"  # type: ignore[index]
    assert by_id["4"].children == [] and by_id["3"].children == []
