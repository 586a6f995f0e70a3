"""The file tools stay inside the project directory and out of kiro's control folders, whatever
path the model tries; every refusal is a tool error and nothing is written anywhere."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from kiro.executors.tools import ToolResult
from tests.fake_openai import StepHarness, invoke, make_harness

SECRET = "top secret outside the project"


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under root: file bytes, or the link target, or 'dir'."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_bytes()
    return out


@pytest.fixture
def world(tmp_path: Path) -> tuple[StepHarness, Path]:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text(SECRET)
    (outside / "dir" / "inner.txt").write_text(SECRET)
    h = make_harness(tmp_path / "ws")
    root = h.root
    for folder, name in ((".state", "autonomous_loop_t1.json"), (".hooks", "note.md"),
                         ("config", "autonomous_loop.yaml"), (".git", "config")):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / name).write_text(f"{SECRET} in {folder}")
    (root / ".git" / "hooks").mkdir()
    (root / "src" / ".git").mkdir(parents=True)  # a nested repository
    (root / "src" / "app.py").write_text("print('hi')\n")
    (root / "link_out").symlink_to(outside)  # symlinked folder pointing out
    (root / "leaf_link.txt").symlink_to(outside / "secret.txt")  # symlinked file pointing out
    (root / "dangling.txt").symlink_to(outside / "not_yet.txt")  # dangling, pointing out
    (root / "state_alias").symlink_to(root / ".state")  # a way into a control folder
    (root / "inside_link.txt").symlink_to(root / "src" / "app.py")  # harmless: stays inside
    os.link(outside / "secret.txt", root / "hard.txt")  # a hard link to a file outside
    return h, outside


def call(h: StepHarness, tool: str, args: dict[str, Any]) -> ToolResult:
    async def go() -> ToolResult:
        return await invoke(h.tool_env(), tool, args)

    return asyncio.run(go())


def write(path: str) -> tuple[str, dict[str, Any]]:
    return ("write_file", {"path": path, "content": "pwned"})


def edit(path: str) -> tuple[str, dict[str, Any]]:
    return ("edit_file", {"path": path, "old": "top secret", "new": "pwned"})


ESCAPES: list[tuple[str, dict[str, Any]]] = [
    # `..` and absolute paths
    ("read_file", {"path": "../outside/secret.txt"}),
    write("../outside/new.txt"),
    write("src/../../outside/new.txt"),
    edit("../outside/secret.txt"),
    ("list_files", {"path": ".."}),
    ("search_files", {"pattern": "secret", "path": "../outside"}),
    ("read_file", {"path": "{outside}/secret.txt"}),
    write("{outside}/new.txt"),
    write("/tmp/kiro-escape-test.txt"),
    # a symlinked file pointing out
    ("read_file", {"path": "leaf_link.txt"}),
    write("leaf_link.txt"),
    edit("leaf_link.txt"),
    write("dangling.txt"),
    # a symlinked folder pointing out, and new files under it
    ("read_file", {"path": "link_out/secret.txt"}),
    write("link_out/secret.txt"),
    write("link_out/brand_new.txt"),
    write("link_out/deeper/new.txt"),
    ("list_files", {"path": "link_out"}),
    ("search_files", {"pattern": "secret", "path": "link_out"}),
    # a hard link to a file outside
    write("hard.txt"),
    edit("hard.txt"),
    # the control folders, for every file tool
    *[t for folder in (".state", ".hooks", "config", ".git") for t in (
        ("read_file", {"path": f"{folder}/" + {".state": "autonomous_loop_t1.json", ".hooks": "note.md",
                                                "config": "autonomous_loop.yaml", ".git": "config"}[folder]}),
        write(f"{folder}/new_file"),
        edit(f"{folder}/" + {".state": "autonomous_loop_t1.json", ".hooks": "note.md",
                             "config": "autonomous_loop.yaml", ".git": "config"}[folder]),
        ("list_files", {"path": folder}),
        ("search_files", {"pattern": "secret", "path": folder}),
    )],
    write(".hooks/stop_autonomous_loop_t1.md"),
    write(".git/hooks/pre-commit"),
    write("./.state/../.state/x.json"),
    write("src/.git/hooks/post-checkout"),  # any .git, not only the top one
    write("state_alias/autonomous_loop_t1.json"),  # a symlink into a control folder
    ("read_file", {"path": "state_alias/autonomous_loop_t1.json"}),
    # the task file: readable, but changed only through add_steps
    write("Specs/demo/tasks.md"),
    edit("Specs/demo/tasks.md"),
    # the workspace's task areas and records: a copy in Done/ must not read as "finished"
    write("Done/demo/tasks.md"),
    write("Needs_Action/demo/tasks.md"),
    write("Specs/other/tasks.md"),
    write("Logs/t1.jsonl"),
    write("Dashboard.md"),
    # odd spellings
    write("~/.bashrc"),
    write("a\x00b"),
    write(""),
    write("."),
]


@pytest.mark.parametrize(("tool", "args"), ESCAPES, ids=[f"{t}:{a.get('path', '')}" for t, a in ESCAPES])
def test_escape_is_refused_and_nothing_is_written(world: tuple[StepHarness, Path], tool: str,
                                                   args: dict[str, Any]) -> None:
    h, outside = world
    args = {k: v.replace("{outside}", str(outside)) if isinstance(v, str) else v for k, v in args.items()}
    before_out, before_ws = snapshot(outside), snapshot(h.root)

    result = call(h, tool, args)

    assert not result.ok
    assert result.text.startswith("error: ")
    assert SECRET not in result.text
    assert snapshot(outside) == before_out
    assert snapshot(h.root) == before_ws
    assert not Path("/tmp/kiro-escape-test.txt").exists()


def test_there_are_at_least_twenty_escapes() -> None:
    assert len(ESCAPES) >= 20


def test_refusals_say_why(world: tuple[StepHarness, Path]) -> None:
    h, _ = world
    assert "outside the project directory" in call(h, "read_file", {"path": "../outside/secret.txt"}).text
    assert "control folder .state/" in call(h, "read_file", {"path": ".state/autonomous_loop_t1.json"}).text
    assert "hard links" in call(h, "write_file", {"path": "hard.txt", "content": "x"}).text
    task_write = call(h, "write_file", {"path": "Specs/demo/tasks.md", "content": "x"})
    assert "only with add_steps" in task_write.text
    assert "may read but not change" in call(h, "write_file", {"path": "Done/x.md", "content": "x"}).text


def test_listing_and_search_do_not_wander_out(world: tuple[StepHarness, Path]) -> None:
    h, _ = world
    listing = call(h, "list_files", {"path": "."}).text.splitlines()
    assert "src/" in listing and "link_out@" in listing
    assert not any(e.startswith((".state", ".hooks", "config", ".git")) for e in listing)
    everything = call(h, "list_files", {"pattern": "*"}).text
    assert "inner.txt" not in everything and "autonomous_loop" not in everything
    assert "src/app.py" in everything
    found = call(h, "search_files", {"pattern": "secret"}).text.splitlines()
    # hard.txt is a real file inside (a hard link is only refused for writes); nothing else matches.
    assert [line.split(":")[0] for line in found] == ["hard.txt"]


def test_allowed_paths_still_work(world: tuple[StepHarness, Path]) -> None:
    h, _ = world
    assert call(h, "read_file", {"path": "inside_link.txt"}).text == "print('hi')\n"
    assert call(h, "read_file", {"path": "Specs/demo/tasks.md"}).text.startswith("---")
    assert call(h, "read_file", {"path": str(h.root / "src" / "app.py")}).ok  # absolute, but inside
    assert call(h, "write_file", {"path": "src/new/deep/file.txt", "content": "ok"}).ok
    assert (h.root / "src/new/deep/file.txt").read_text() == "ok"
    # a config/ folder deeper down is the project's own, not kiro's
    assert call(h, "write_file", {"path": "src/config/settings.py", "content": "x = 1"}).ok


def test_project_dir_below_the_workspace(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws", project_dir="project")
    (h.root / "project").mkdir()
    (h.root / "project" / "config").mkdir()
    before = snapshot(h.root / ".state")
    for tool, args in (write("../.state/x.json"), ("read_file", {"path": "../Specs/demo/tasks.md"}),
                       write("config/x.yaml"), write(str(h.root / ".hooks" / "stop_autonomous_loop.md"))):
        result = call(h, tool, args)
        assert not result.ok, (tool, args)
    assert snapshot(h.root / ".state") == before
    assert not (h.root / ".hooks" / "stop_autonomous_loop.md").exists()
    assert call(h, "write_file", {"path": "main.py", "content": "ok"}).ok
    assert (h.root / "project" / "main.py").read_text() == "ok"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    os.mkfifo(h.root / "pipe")
    assert "not a regular file" in call(h, "read_file", {"path": "pipe"}).text
    assert "not a regular file" in call(h, "write_file", {"path": "pipe", "content": "x"}).text


def test_a_symlink_swapped_in_after_the_check_is_not_followed(world: tuple[StepHarness, Path]) -> None:
    """The race: the path was checked as a plain folder, then became a symlink pointing out."""
    h, outside = world
    env = h.tool_env()
    real = env.confinement.resolve("swap/file.txt", write=True)
    (h.root / "swap").symlink_to(outside)  # swapped in after the check
    with pytest.raises(Exception, match="not a plain folder"):
        env.confinement.write_bytes(real, b"pwned")
    assert not (outside / "file.txt").exists()


def test_control_folders_and_records_behind_symlinks_are_refused_by_their_real_names(tmp_path: Path) -> None:
    """A workspace whose `config/`, `.hooks/` and `Logs/` are symbolic links to plain folders of the project:
    the agent cannot reach them by the folders' own names either (each name is looked at for a link)."""
    h = make_harness(tmp_path / "ws")
    root = h.root
    for name, kept in (("config", "kept_config"), (".hooks", "kept_hooks"), ("Logs", "kept_logs")):
        if (root / name).is_dir():
            (root / name).rename(root / kept)
        else:
            (root / kept).mkdir()
        (root / name).symlink_to(root / kept)
        (root / kept / "note.md").write_text(SECRET)
    before = snapshot(root)
    refused = call(h, "write_file", {"path": "kept_config/autonomous_loop.yaml", "content": "x"})
    assert not refused.ok and "control folder config/" in refused.text
    assert "control folder .hooks/" in call(h, "read_file", {"path": "kept_hooks/note.md"}).text
    logs = call(h, "write_file", {"path": "kept_logs/note.md", "content": "pwned"})
    assert not logs.ok and "may read but not change" in logs.text
    assert snapshot(root) == before
    assert call(h, "write_file", {"path": "src/new.txt", "content": "fine"}).ok  # the rest stays writable
