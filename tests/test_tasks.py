"""Unit tests for kiro.store.tasks: what a person writing a tasks.md sees kiro make of it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kiro.errors import TaskFileError, TaskNotFound
from kiro.fs import atomic
from kiro.store import tasks

BOM = b"\xef\xbb\xbf"


def write(folder: Path, content: str | bytes, name: str = "tasks.md") -> Path:
    path = folder / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


def only_step(line: str) -> tasks.Step:
    tf = tasks.parse(line + "\n")
    assert len(tf.steps) == 1, tf.steps
    return tf.steps[0]


# -- step lines ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "sid", "title"),
    [
        ("- [ ] 1. Set up project structure", "1", "Set up project structure"),
        ("- [ ] 2.1 Create the User model", "2.1", "Create the User model"),
        ("- [ ] 10.3.2 Deep step", "10.3.2", "Deep step"),
        ("- [ ] 1.1.1: Create `secrets-manager.ts`", "1.1.1", "Create `secrets-manager.ts`"),
        ("- [ ] 4 Un-dotted id", "4", "Un-dotted id"),
        ("- [ ] 1.Setup without a space", "1", "Setup without a space"),
        ("- [x]   1. 共通型定義", "1", "共通型定義"),
        ("- [ ] Write the docs  ", "Write the docs", "Write the docs"),
        ("- [ ] T01: Tạo entity", "T01: Tạo entity", "T01: Tạo entity"),
        ("- [ ] 1.5x faster startup", "1.5x faster startup", "1.5x faster startup"),
        ("- [ ] 2024-01 cleanup", "2024-01 cleanup", "2024-01 cleanup"),
        ("- [ ] ❌ Create NotesSection.vue", "❌ Create NotesSection.vue", "❌ Create NotesSection.vue"),
    ],
)
def test_step_id_is_the_leading_number_else_the_text(line: str, sid: str, title: str) -> None:
    step = only_step(line)
    assert (step.id, step.title) == (sid, title)
    assert step.text == line.split("] ", 1)[1].strip()


@pytest.mark.parametrize(
    ("line", "marker", "done", "optional"),
    [
        ("- [ ] a", " ", False, False),
        ("- [x] a", "x", True, False),
        ("- [X] a", "X", True, False),
        ("- [-] a", "-", False, False),
        ("- [~] a", "~", False, False),
        ("- [ ]* a", " ", False, True),
        ("- [ ]\\* a", " ", False, True),
        ("- [x]* a", "x", True, True),
        ("- [x]\\* a", "x", True, True),
        ("* [ ] a", " ", False, False),
        ("+ [x] a", "x", True, False),
        ("\t- [ ] a", " ", False, False),
    ],
)
def test_markers_and_optional_stars(line: str, marker: str, done: bool, optional: bool) -> None:
    step = only_step(line)
    assert (step.marker, step.done, step.optional, step.text) == (marker, done, optional, "a")


@pytest.mark.parametrize(
    "text",
    [
        "- `[ ]` - Not started\n- `[x]` - Completed\n",  # a legend, in backticks
        "[x] **T1.1** bullet-less checkbox\n",
        "1. [ ] numbered, not a bullet\n",
        "1. Code review with team\n2. Security audit\n",
        "-[ ] no space after the bullet\n",
        "- [ ]\n",  # an empty box is nothing to do
        "- [y] unknown marker\n",
        "```\n- [ ] inside a fence\n```\n",
        "~~~md\n- [ ] inside a tilde fence\n~~~\n",
        "````\n```\n- [ ] still inside: a shorter fence does not close it\n```\n````\n",
        "<!--\n- [ ] commented out\n-->\n",
        "<!-- - [ ] commented out on one line -->\n",
        "> - [ ] in a quote\n",
        "---\nnote: |\n  - [ ] in the frontmatter\n---\n",
    ],
)
def test_lines_that_are_not_steps(text: str) -> None:
    assert tasks.parse(text).steps == []


def test_a_fence_closes_and_steps_after_it_count() -> None:
    tf = tasks.parse(
        "```json\n{\"a\": \"- [ ] x\"}\n```\n- [ ] 1. real\n  ```\n  - [x] fake\n  ```\n- [ ] 2. real\n"
    )
    assert [s.id for s in tf.steps] == ["1", "2"]


def test_positions_point_at_the_marker() -> None:
    text = "# Plan\n\n- [ ] 1. a\n\t- [x] 1.1 b\n"
    tf = tasks.parse(text)
    assert [(s.line, s.indent) for s in tf.steps] == [(2, 0), (3, 4)]
    assert [text[s.box_offset] for s in tf.steps] == [" ", "x"]


def test_hierarchy_comes_from_indentation_with_tabs_as_four_columns() -> None:
    tf = tasks.parse(
        "- [ ] 1. top\n"
        "\t- [ ] 1.1 tab child\n"
        "    - [ ] 1.2 four-space child\n"
        "        - [ ] 1.2.1 grandchild\n"
        "- [ ] 2. top\n"
        "  - [ ] 2.1 child\n"
        "      - [ ] 2.2 indented by accident\n"
    )
    parents = {s.id: (tf.steps[s.parent].id if s.parent is not None else None) for s in tf.steps}
    assert parents == {"1": None, "1.1": "1", "1.2": "1", "1.2.1": "1.2", "2": None, "2.1": "2", "2.2": "2.1"}
    assert [s.id for s in tf.steps if s.is_leaf] == ["1.1", "1.2.1", "2.2"]
    assert tf.steps[0].children == [1, 2]


def test_a_note_at_column_0_between_parent_and_child_does_not_orphan_the_child() -> None:
    tf = tasks.parse("- [ ] 2. Parent\n  - detail\n<!-- TODO: split this -->\n  - [ ] 2.1 Child\n")
    assert tf.steps[1].parent == 0
    assert tf.steps[0].details == ["- detail"]  # the comment line ended the parent's details
    assert tf.current_step() is tf.steps[1]


# -- current step ----------------------------------------------------------------------------------


def test_current_step_is_the_first_open_leaf_and_skips_optional() -> None:
    tf = tasks.parse(
        "- [x] 1. done parent\n"
        "  - [ ] 1.1 open child of a checked parent\n"
        "- [ ] 2. open parent\n"
        "  - [ ]* 2.1 optional\n"
        "  - [-] 2.2 in progress\n"
    )
    assert tf.current_step().id == "1.1"  # type: ignore[union-attr]
    tf = tasks.parse("- [ ] 1. parent\n  - [ ]* 1.1 optional\n  - [~] 1.2 queued\n")
    assert tf.current_step().id == "1.2"  # type: ignore[union-attr]
    assert tf.current_step(include_optional=True).id == "1.1"  # type: ignore[union-attr]


def test_children_of_an_optional_step_are_optional_too() -> None:
    tf = tasks.parse("- [ ]* 1. optional tests\n  - [ ] 1.1 unit\n- [ ] 2. required\n")
    assert tf.current_step().id == "2"  # type: ignore[union-attr]
    assert tf.steps[1].optional is False  # as written
    assert tf.counts() == tasks.TaskCounts(total=3, done=0, optional=1, open=1, leaves=2)


def test_complete_when_only_optional_steps_are_open() -> None:
    tf = tasks.parse("- [ ] 1. parent left open\n  - [x] 1.1 a\n  - [ ]* 1.2 optional\n")
    assert tf.current_step() is None
    assert tf.is_complete()
    assert not tf.is_complete(include_optional=True)


def test_counts() -> None:
    tf = tasks.parse("- [x] 1. a\n  - [X] 1.1 b\n  - [x]* 1.2 c\n- [-] 2. d\n- [ ]\\* 3. e\n")
    assert tf.counts() == tasks.TaskCounts(total=5, done=3, optional=2, open=1, leaves=4)


def test_duplicate_lines_are_separate_steps_with_their_own_keys() -> None:
    tf = tasks.parse("- [x] 3. Same\n- [-] 3. Same\n- [ ] 3. Other\n")
    assert [s.key for s in tf.steps] == [("3", "3. Same", 0), ("3", "3. Same", 1), ("3", "3. Other", 0)]
    assert tf.duplicates() == ["3"]
    assert tf.find(("3", "3. Same", 1)) is tf.steps[1]
    assert tf.find("3") is tf.steps[0]
    assert tf.find(tf.steps[2]) is tf.steps[2]
    assert tf.current_step() is tf.steps[1]


def test_find_follows_a_renumbered_step_but_not_a_reworded_one() -> None:
    before = tasks.parse("- [ ] 2. Implement login\n")
    renumbered = tasks.parse("- [ ] 2. New step\n- [ ] 3. Implement login\n")
    assert renumbered.find(before.steps[0].key) is renumbered.steps[1]
    reworded = tasks.parse("- [ ] 2. Implement login and logout\n")
    assert reworded.find(before.steps[0].key) is None


# -- details and commands --------------------------------------------------------------------------


def test_details_are_the_dedented_lines_under_the_step_without_child_steps() -> None:
    tf = tasks.parse(
        "- [ ] 1. Parent\n"
        "\n"
        "\n"
        "  - parent detail\n"
        "  - [ ] 1.1 Child\n"
        "    - child detail\n"
        "      nested\n"
        "    \n"
        "    - _Requirements: 1.1_\n"
        "  - _Requirements: 2.1_ (parent level, after the children)\n"
        "\n"
        "## Next section\n"
        "Prose that belongs to no step.\n"
    )
    parent, child = tf.steps
    assert parent.details == ["- parent detail", "- _Requirements: 2.1_ (parent level, after the children)"]
    assert child.details == ["- child detail", "  nested", "", "- _Requirements: 1.1_"]


def test_details_with_tabs_and_crlf() -> None:
    tf = tasks.parse("- [ ] 1. a\r\n\t- detail\r\n\t\t- deeper\r\n\t\r\n- [ ] 2. b\r\n")
    assert tf.steps[0].details == ["- detail", "    - deeper"]


def test_a_sh_block_under_a_step_is_its_command_and_a_childs_block_is_the_childs() -> None:
    tf = tasks.parse(
        "- [ ] 2. Implement authentication\n"
        "  ```bash\n"
        "  make setup\n"
        "    echo indented\n"
        "  ```\n"
        "  - [ ] 2.2 Implement login\n"
        "    ```sh\n"
        "    python -m app.login --selftest\n"
        "    ```\n"
        "    ```shell\n"
        "    second block is not the command\n"
        "    ```\n"
        "  - [ ] 2.3 Untagged and python blocks are not commands\n"
        "    ```\n"
        "    ls\n"
        "    ```\n"
        "    ```python\n"
        "    print(1)\n"
        "    ```\n"
    )
    parent, login, untagged = tf.steps
    assert parent.command == "make setup\n  echo indented"
    assert login.command == "python -m app.login --selftest"
    assert untagged.command is None
    assert "```sh" not in "\n".join(parent.details)


def test_a_sh_fence_shown_inside_another_block_is_not_the_command() -> None:
    tf = tasks.parse("- [ ] 1. a\n  ````markdown\n  ```sh\n  rm -rf /\n  ```\n  ````\n")
    assert tf.steps[0].command is None


def test_a_step_in_a_code_block_under_a_step_is_a_detail() -> None:
    tf = tasks.parse("- [ ] 1. a\n  ```md\n  - [ ] not a step\n   - [x] nor this\n  ```\n- [ ] 2. b\n")
    assert [s.id for s in tf.steps] == ["1", "2"]
    assert tf.steps[0].details == ["```md", "- [ ] not a step", " - [x] nor this", "```"]


def test_a_fence_left_open_under_a_step_ends_with_the_step() -> None:
    """A forgotten closing ``` must not turn the next steps into part of this step's command."""
    tf = tasks.parse("- [ ] 1. a\n  ```sh\n  make\n\n- [ ] 2. b\n  <!-- open comment\n- [ ] 3. c\n")
    assert [s.id for s in tf.steps] == ["1", "2", "3"]
    assert tf.steps[0].command == "make"


def test_a_fence_left_open_at_the_top_level_hides_the_rest() -> None:
    assert tasks.parse("- [ ] 1. a\n```\n- [ ] 2. inside the block\n").counts().total == 1


# -- frontmatter, title, encodings -----------------------------------------------------------------


def test_frontmatter_is_read_and_kept_out_of_the_steps() -> None:
    tf = tasks.parse(
        "---\ntitle: Auth feature\nverify: pytest -q  # comment\ntags: [a, b]\n---\n- [ ] 1. a\n"
    )
    assert tf.frontmatter == {"title": "Auth feature", "verify": "pytest -q", "tags": ["a", "b"]}
    assert tf.title == "Auth feature"
    assert tf.steps[0].line == 5


def test_frontmatter_lines_say_where_each_key_is_written() -> None:
    tf = tasks.parse(
        "---\r\n# a comment\r\ntitle: x\r\n\"quoted key\": 1\r\nlist:\r\n  - nested: no\r\n"
        "max_iterations: lots\r\nmax_iterations: 5\r\n---\r\n- [ ] a\r\n"
    )
    assert tf.frontmatter_lines == {"title": 3, "quoted key": 4, "list": 5, "max_iterations": 8}
    assert tf.frontmatter["max_iterations"] == 5  # YAML keeps the last one, and so does the line
    assert tasks.parse("- [ ] a\n").frontmatter_lines == {}


def test_empty_frontmatter_is_an_empty_mapping() -> None:
    assert tasks.parse("---\n---\n- [ ] a\n").frontmatter == {}


@pytest.mark.parametrize("text", ["- [ ] a\n", "---\n---\n- [ ] a\n", "---\n# only a comment\n---\n- [ ] a\n"])
def test_each_task_file_without_keys_has_a_mapping_of_its_own(text: str) -> None:
    """The frontmatter record is a NamedTuple (issue #41: cheaper to make at import than a frozen dataclass),
    which has no default_factory: no two reads may share one default dict that an edit of one would change."""
    first, second = tasks.parse(text), tasks.parse(text)
    assert first.frontmatter == second.frontmatter == {} and first.frontmatter_lines == {}
    assert first.frontmatter is not second.frontmatter and first.frontmatter_lines is not second.frontmatter_lines


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("---\ntitle: ok\nbad: [unclosed\n---\n- [ ] a\n", 4, "not valid YAML"),
        ("---\ntitle: a: b\n---\n- [ ] a\n", 2, "not valid YAML"),
        ("---\n- a\n- b\n---\n- [ ] a\n", 2, "must be YAML keys"),
        ("---\ntitle: ok\n- [ ] a\n", 1, "never closed"),
        ("---\nverify: x\ntitle: 42\n---\n- [ ] a\n", 3, "'title' must be text"),
        ("---\nkiro_task_id: [1]\n---\n- [ ] a\n", 2, "'kiro_task_id' must be text"),
    ],
)
def test_broken_frontmatter_is_one_line_naming_file_and_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TaskFileError) as info:
        tasks.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ")
    assert words in message
    assert "\n" not in message
    with pytest.raises(TaskFileError):
        tasks.parse(text)


def test_a_kiro_key_left_empty_is_not_an_error() -> None:
    assert tasks.parse("---\ntitle:\n---\n- [ ] a\n").frontmatter == {"title": None}


@pytest.mark.parametrize(
    ("text", "name", "title"),
    [
        ("# Auth feature\n- [ ] a\n", "tasks.md", "Auth feature"),
        ("# Implementation Plan\n- [ ] a\n", "tasks.md", "auth_feature"),
        ("- [ ] a\n", "tasks.md", "auth_feature"),
        ("- [ ] a\n", "login.md", "login"),
        ("```\n# not a heading\n```\n- [ ] a\n", "login.md", "login"),
    ],
)
def test_title(tmp_path: Path, text: str, name: str, title: str) -> None:
    folder = tmp_path / "Specs" / "auth_feature"
    folder.mkdir(parents=True)
    assert tasks.load(write(folder, text, name)).title == title


def test_a_kiro_specs_title_is_its_feature_name_not_its_heading(tmp_path: Path) -> None:
    """Issue #38 item 16: the dashboard's cards were titled "Plan" (the first heading of Kiro's tasks.md)."""
    folder = tmp_path / ".kiro" / "specs" / "admin-orders"
    folder.mkdir(parents=True)
    assert tasks.load(write(folder, "# Plan\n- [ ] 1. a\n", "tasks.md")).title == "admin-orders"
    assert tasks.load(write(folder, "# Orders page\n- [ ] 1. a\n", "tasks.md")).title == "admin-orders"
    assert tasks.load(write(folder, "---\ntitle: Orders\n---\n# Plan\n- [ ] 1. a\n", "tasks.md")).title == "Orders"
    plain = tmp_path / "Specs" / "billing"
    plain.mkdir(parents=True)
    assert tasks.load(write(plain, "# Plan\n- [ ] 1. a\n", "tasks.md")).title == "billing"


def test_crlf_bom_tabs_trailing_spaces_and_no_final_newline(tmp_path: Path) -> None:
    raw = BOM + b"# Plan  \r\n\r\n- [x] 1. a  \r\n\t- [ ] 1.1 b\t\r\n\t\t- detail  \r\n \r\n- [ ]* 2. c"
    tf = tasks.load(write(tmp_path, raw))
    assert tf.newline == "\r\n"
    assert not tf.text.startswith("\ufeff")
    assert [(s.id, s.text) for s in tf.steps] == [("1", "1. a"), ("1.1", "1.1 b"), ("2", "2. c")]
    assert tf.steps[1].details == ["- detail  "]  # trailing spaces are kept: a shell "\\ " means something
    assert tf.current_step().id == "1.1"  # type: ignore[union-attr]


def test_missing_file_is_task_not_found(tmp_path: Path) -> None:
    with pytest.raises(TaskNotFound, match="no such task file"):
        tasks.load(tmp_path / "nope.md")


def test_non_utf8_names_the_line_and_byte(tmp_path: Path) -> None:
    path = write(tmp_path, b"# Plan\n- [ ] 1. caf\xe9\n")
    with pytest.raises(TaskFileError) as info:
        tasks.load(path)
    assert str(info.value).startswith(f"{path}:2: not UTF-8")
    assert "0xe9" in str(info.value) and "byte offset 19" in str(info.value)


def test_no_steps_says_what_a_step_looks_like(tmp_path: Path) -> None:
    path = write(tmp_path, "# Plan\n\n1. do this\n2. then that\n")
    with pytest.raises(TaskFileError) as info:
        tasks.load(path)
    assert str(info.value) == (
        f"{path}: no steps found; a step is a list item with a checkbox, like '- [ ] 1. Set up the project'"
    )
    assert tasks.parse("# Plan\n").steps == []  # parse itself does not raise


def test_no_steps_points_at_bullet_less_checkboxes(tmp_path: Path) -> None:
    path = write(tmp_path, "# Plan\n\n[x] **T1.1** first thing to do\n[ ] **T1.2** second\n")
    tf = tasks.parse(path.read_text())
    assert tf.stray_checkboxes() == [2, 3]
    with pytest.raises(TaskFileError) as info:
        tasks.load(path)
    assert str(info.value).endswith(
        "found 2 checkboxes that are not list items (line 3: '[x] **T1.1** ...'); write them as '- [ ] ...'"
    )


# -- edits -----------------------------------------------------------------------------------------


def test_set_marker_changes_one_byte_and_keeps_the_star(tmp_path: Path) -> None:
    original = "- [ ]\\* 1. optional\n- [ ] 2. b\n"
    path = write(tmp_path, original)
    tf = tasks.set_marker(path, ("1", "1. optional", 0), "x")
    assert path.read_text() == "- [x]\\* 1. optional\n- [ ] 2. b\n"
    assert tf.steps[0].done and tf.steps[0].optional
    tasks.set_marker(path, tf.steps[0].key, " ")
    assert path.read_text() == original


def test_set_marker_leaves_a_persons_uppercase_x_alone(tmp_path: Path) -> None:
    path = write(tmp_path, "- [X] 1. a\n")
    tasks.set_marker(path, "1", "x")
    assert path.read_text() == "- [X] 1. a\n"


def test_set_marker_rejects_an_unknown_marker(tmp_path: Path) -> None:
    path = write(tmp_path, "- [ ] 1. a\n")
    with pytest.raises(ValueError):
        tasks.set_marker(path, "1", "v")


def test_a_folder_kiro_cannot_write_to_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite (frontmatter) needs a temp file in the folder; a folder kiro may not write is one line."""
    path = write(tmp_path, "- [ ] 1. a\n")

    def read_only_folder(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(atomic, "_open_temp", read_only_folder)  # root would ignore a chmod 500 folder
    with pytest.raises(TaskFileError) as info:
        tasks.set_frontmatter_key(path, "kiro_task_id", "t1")
    assert str(info.value) == f"{path}: cannot write the task file: Permission denied"
    assert path.read_text() == "- [ ] 1. a\n"


def test_a_task_file_kiro_cannot_write_to_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A box edit is made in place: a file kiro may not open for writing is one line, nothing changes."""
    path = write(tmp_path, "- [ ] 1. a\n")

    def read_only_file(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tasks, "_open_rw", read_only_file)  # root would ignore a chmod 400 file
    with pytest.raises(TaskFileError) as info:
        tasks.mark_done(path, "1")
    assert str(info.value) == f"{path}: cannot write the task file: Permission denied"
    assert path.read_text() == "- [ ] 1. a\n"


def test_editing_a_file_that_is_gone_is_task_not_found(tmp_path: Path) -> None:
    with pytest.raises(TaskNotFound):
        tasks.set_marker(tmp_path / "tasks.md", "1", "x")


def test_edits_keep_permissions_symlinks_and_leave_no_temp_files(tmp_path: Path) -> None:
    real = write(tmp_path, "- [ ] 1. a\n", "real.md")
    os.chmod(real, 0o640)
    link = tmp_path / "tasks.md"
    link.symlink_to(real)
    tasks.mark_done(link, "1")
    assert link.is_symlink()
    assert real.read_text() == "- [x] 1. a\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real.md", "tasks.md"]


def test_mark_done_checks_ancestors_whose_children_are_all_done(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "- [ ] 1. a\n"
        "  - [x] 1.1 b\n"
        "  - [-] 1.2 c\n"
        "    - [ ] 1.2.1 d\n"
        "  - [ ]* 1.3 optional\n"
        "- [ ] 2. e\n",
    )
    tf, checked = tasks.mark_done(path, "1.2.1")
    assert checked == ["1.2.1", "1.2", "1"]
    assert path.read_text().splitlines()[:4] == [
        "- [x] 1. a", "  - [x] 1.1 b", "  - [x] 1.2 c", "    - [x] 1.2.1 d"
    ]
    assert tf.current_step().id == "2"  # type: ignore[union-attr]


def test_mark_done_counts_optional_children_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path, "- [ ] 1. a\n  - [ ] 1.1 b\n  - [ ]* 1.2 optional\n")
    _, checked = tasks.mark_done(path, "1.1", include_optional=True)
    assert checked == ["1.1"]
    _, checked = tasks.mark_done(path, "1.2", include_optional=True)
    assert checked == ["1.2", "1"]
    assert path.read_text() == "- [x] 1. a\n  - [x] 1.1 b\n  - [x]* 1.2 optional\n"


def test_mark_done_on_a_done_step_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, "- [x] 1. a\n- [ ] 2. b\n")
    before = path.stat().st_mtime_ns
    _, checked = tasks.mark_done(path, "1")
    assert checked == [] and path.stat().st_mtime_ns == before


def test_check_finished_parents(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "- [ ] 1. a\n  - [x] 1.1 b\n    - [x] 1.1.1 c\n"
        "- [-] 2. d\n  - [X] 2.1 e\n  - [ ]* 2.2 optional\n"
        "- [ ] 3. only optional children\n  - [ ]* 3.1 f\n"
        "- [ ] 4. open child\n  - [ ] 4.1 g\n",
    )
    _, checked = tasks.check_finished_parents(path)
    assert checked == ["1", "2"]
    assert [line[:5] for line in path.read_text().splitlines()] == [
        "- [x]", "  - [", "    -", "- [x]", "  - [", "  - [", "- [ ]", "  - [", "- [ ]", "  - ["
    ]


def test_add_steps_at_the_end_of_the_last_checklist(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# Plan\n\n- [ ] 1. a\n  - [ ] 1.1 b\n    - detail\n\n```json\n{}\n```\n",
    )
    tf, added = tasks.add_steps(path, ["2. New step", "3. Another"])
    assert path.read_text() == (
        "# Plan\n\n- [ ] 1. a\n  - [ ] 1.1 b\n    - detail\n"
        "- [ ] 2. New step\n- [ ] 3. Another\n"
        "\n```json\n{}\n```\n"
    )
    assert [s.id for s in added] == ["2", "3"]
    assert added[0] is tf.steps[2]


def test_add_steps_after_a_step_as_its_sibling_keeping_tabs_and_crlf(tmp_path: Path) -> None:
    path = write(tmp_path, "* [ ] 1. a\r\n\t* [x] 1.1 b\r\n\t\t* detail\r\n\t* [ ] 1.3 c\r\n")
    tf, added = tasks.add_steps(path, ["1.2 inserted"], after=("1.1", "1.1 b", 0))
    assert path.read_bytes() == (
        b"* [ ] 1. a\r\n\t* [x] 1.1 b\r\n\t\t* detail\r\n\t* [ ] 1.2 inserted\r\n\t* [ ] 1.3 c\r\n"
    )
    assert added[0].parent == 0 and added[0].marker == " "
    assert tf.current_step() is added[0]


def test_add_steps_keeps_a_missing_final_newline_missing(tmp_path: Path) -> None:
    path = write(tmp_path, "- [x] 1. a")
    tasks.add_steps(path, ["2. b"])
    assert path.read_text() == "- [x] 1. a\n- [ ] 2. b"


def test_add_steps_to_a_file_without_steps(tmp_path: Path) -> None:
    path = write(tmp_path, "# Plan\n")
    tf, added = tasks.add_steps(path, ["First"])
    assert path.read_text() == "# Plan\n- [ ] First\n"
    assert tf.steps == added


@pytest.mark.parametrize("title", ["two\nlines", "carriage\rreturn", "   "])
def test_add_steps_rejects_multi_line_and_empty_titles(tmp_path: Path, title: str) -> None:
    path = write(tmp_path, "- [ ] 1. a\n")
    with pytest.raises(TaskFileError):
        tasks.add_steps(path, [title])
    assert path.read_text() == "- [ ] 1. a\n"


def test_add_steps_after_a_step_that_is_gone(tmp_path: Path) -> None:
    path = write(tmp_path, "- [ ] 1. a\n")
    with pytest.raises(TaskFileError, match="no longer in the task file"):
        tasks.add_steps(path, ["x"], after=("9", "9. gone", 0))


def test_set_frontmatter_key_replaces_its_line_only(tmp_path: Path) -> None:
    path = write(tmp_path, "---\n# mine\nkiro_task_id: old   \nz: 1\n---\n- [ ] a\n")
    tf = tasks.set_frontmatter_key(path, "kiro_task_id", "task_20250101_120000")
    assert path.read_text() == "---\n# mine\nkiro_task_id: task_20250101_120000\nz: 1\n---\n- [ ] a\n"
    assert tf.frontmatter == {"kiro_task_id": "task_20250101_120000", "z": 1}


def test_set_frontmatter_key_adds_before_the_closing_line_with_crlf(tmp_path: Path) -> None:
    path = write(tmp_path, b"---\r\ntitle: x  # keep me\r\n---\r\n- [ ] a")
    tasks.set_frontmatter_key(path, "kiro_task_id", "t1")
    assert path.read_bytes() == b"---\r\ntitle: x  # keep me\r\nkiro_task_id: t1\r\n---\r\n- [ ] a"


def test_set_frontmatter_key_without_frontmatter_prepends_one_after_the_bom(tmp_path: Path) -> None:
    path = write(tmp_path, BOM + b"# Plan\r\n- [ ] a\r\n")
    tf = tasks.set_frontmatter_key(path, "kiro_task_id", "t1")
    assert path.read_bytes() == BOM + b"---\r\nkiro_task_id: t1\r\n---\r\n# Plan\r\n- [ ] a\r\n"
    assert tf.steps[0].line == 4


@pytest.mark.parametrize("value", ["123", "true", "a b: c", "#x", "null", "ünï"])
def test_set_frontmatter_key_quotes_values_that_yaml_would_change(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, "- [ ] a\n")
    assert tasks.set_frontmatter_key(path, "kiro_task_id", value).frontmatter == {"kiro_task_id": value}
    assert tasks.load(path).frontmatter == {"kiro_task_id": value}


def test_a_frontmatter_value_kiro_writes_reads_back_as_the_same_string(tmp_path: Path) -> None:
    """Whatever the value (YAML 1.1's yes/no/null spellings, numbers, times, colons), the line kiro
    writes reads back as the same string."""
    import random

    rng = random.Random(7)
    words = ("yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF null Null NULL y n "
             "~ t0000 task_20250101_120000 a.b a-b _x x/y 1e3 0x1f 1_000 .inf .nan 2026-11-26 1:20 a:b").split()
    words += ["".join(rng.choice("aeyonNTfulL_.-/019xX:E ") for _ in range(rng.randint(1, 6))) for _ in range(500)]
    tf = tasks.parse("---\ntitle: x\n---\n- [ ] a\n")
    wrong = [w for w in words if tasks._parse_bytes(
        (tasks._frontmatter_change("kiro_task_id", w)(tf) or "").encode(), None).frontmatter.get("kiro_task_id") != w]
    assert wrong == []


def test_a_key_kiro_adds_reads_back_as_the_old_keys_and_the_new_one() -> None:
    """Generated frontmatters, simple or not (quotes over lines, block scalars, nested maps, flow
    collections): every edit kiro makes reads back as the old keys plus the new one, or is refused."""
    import random

    rng = random.Random(11)
    simple = ["title: Build it", "executor: shell", "max_iterations: 5", "# a comment", "", "tags: a, b",
              "note: it's fine", "x: 1 # trailing", "url: http://x.y/z?a=1", "flag: yes", "when: 2026-11-26"]
    tricky = ['quote: "over', 'still quoted"', "block: |", "  text", "nested:", "  k: v", "flow: [a,", "  b]",
              "folded: >", "  more", "alias: &a v", "ref: *a", "- item", "plain: a", "  continued", "key:",
              "? complex", ": value", "tab:	 v", "emptyq: ''", "kiro_task_id: >", "  old"]
    made = refused = 0
    for _ in range(1500):
        pool = simple if rng.random() < 0.5 else simple + tricky
        lines = [rng.choice(pool) for _ in range(rng.randint(1, 6))]
        text = "---\n" + "\n".join(lines) + "\n---\n- [ ] 1. a\n"
        try:
            tf = tasks._parse_bytes(text.encode(), None)
        except TaskFileError:
            continue  # kiro refuses the file as it is
        try:
            new = tasks._frontmatter_change("kiro_task_id", "t0001")(tf)
        except TaskFileError:
            refused += 1
            continue  # refused, the person's to do by hand
        assert new is not None
        made += 1
        after = tasks._parse_bytes(new.encode(), None)
        assert after.frontmatter == {**tf.frontmatter, "kiro_task_id": "t0001"}, text
        assert new.replace("kiro_task_id: t0001\n", "", 1) == text or "kiro_task_id" in tf.frontmatter, text
    assert made > 500


def test_set_frontmatter_key_with_the_same_value_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, "---\nkiro_task_id: t1\n---\n- [ ] a\n")
    before = path.stat().st_mtime_ns
    tasks.set_frontmatter_key(path, "kiro_task_id", "t1")
    assert path.stat().st_mtime_ns == before


def test_set_frontmatter_key_refuses_to_break_a_multi_line_value(tmp_path: Path) -> None:
    original = "---\nkiro_task_id: >\n  folded\n  value\n---\n- [ ] a\n"
    path = write(tmp_path, original)
    with pytest.raises(TaskFileError, match="by hand"):
        tasks.set_frontmatter_key(path, "kiro_task_id", "t1")
    assert path.read_text() == original
