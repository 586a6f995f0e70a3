"""The file tools inside the project: bounded reads, exact edits, listings, searches."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

from kiro.executors.tools import ToolResult, toolset
from kiro.executors.tools.files import READ_LIMIT
from tests.fake_openai import StepHarness, invoke, make_harness


def call(h: StepHarness, tool: str, args: dict[str, Any] | str) -> ToolResult:
    async def go() -> ToolResult:
        return await invoke(h.tool_env(), tool, args)

    return asyncio.run(go())


def test_every_tool_has_a_schema_from_its_argument_model(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws", tools={"shell": {"enabled": True}})
    schemas = {name: t.schema()["function"] for name, t in toolset(h.config).items()}
    assert list(schemas) == ["read_file", "write_file", "edit_file", "list_files", "search_files",
                             "run_command", "complete_step", "fail_step", "request_human", "add_steps",
                             "memory_save", "memory_recall", "sleep", "send_message", "read_messages"]
    write = schemas["write_file"]["parameters"]
    assert write["required"] == ["path", "content"] and write["additionalProperties"] is False
    assert "title" not in write and "title" not in write["properties"]["path"]
    assert schemas["add_steps"]["parameters"]["properties"]["steps"]["type"] == "array"


def test_read_file_is_bounded_and_can_be_read_on(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    lines = [f"line {i:06d} " + "x" * 80 + "\n" for i in range(3000)]  # ~270 KB
    (h.root / "big.txt").write_text("".join(lines))
    first = call(h, "read_file", {"path": "big.txt"}).text
    assert first.startswith("line 000000")
    assert len(first) < READ_LIMIT + 500
    assert "[truncated: showing lines 1-" in first
    next_line = int(first.rsplit("start_line=", 1)[1].split()[0].rstrip("]"))
    second = call(h, "read_file", {"path": "big.txt", "start_line": next_line}).text
    assert second.startswith(f"line {next_line - 1:06d}")


def test_read_file_errors(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    (h.root / "bin.dat").write_bytes(b"\x00\x01binary")
    (h.root / "empty.txt").write_text("")
    assert "does not exist" in call(h, "read_file", {"path": "nope.txt"}).text
    assert "looks binary" in call(h, "read_file", {"path": "bin.dat"}).text
    assert "is a folder" in call(h, "read_file", {"path": "Specs"}).text
    assert call(h, "read_file", {"path": "empty.txt"}).text == "(empty.txt is empty)"


def test_write_file_creates_folders_and_keeps_the_mode(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    assert call(h, "write_file", {"path": "a/b/c.sh", "content": "#!/bin/sh\n"}).text == \
        "created a/b/c.sh (10 characters)"
    script = h.root / "a/b/c.sh"
    script.chmod(0o755)
    assert call(h, "write_file", {"path": "a/b/c.sh", "content": "echo\n"}).text.startswith("replaced")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755 and script.read_text() == "echo\n"
    assert not [p for p in script.parent.iterdir() if p.name.endswith(".tmp")]


def test_edit_file_replaces_exactly_one_occurrence(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    (h.root / "m.py").write_text("a = 1\nb = 1\nb = 1\n")
    ok = call(h, "edit_file", {"path": "m.py", "old": "a = 1", "new": "a = 2"})
    assert ok.ok and (h.root / "m.py").read_text() == "a = 2\nb = 1\nb = 1\n"
    twice = call(h, "edit_file", {"path": "m.py", "old": "b = 1", "new": "b = 2"})
    assert "occurs 2 times" in twice.text
    missing = call(h, "edit_file", {"path": "m.py", "old": "c = 1", "new": "c = 2"})
    assert "was not found" in missing.text
    empty = call(h, "edit_file", {"path": "m.py", "old": "", "new": "x"})
    assert "old: String should have at least 1 character" in empty.text
    assert (h.root / "m.py").read_text() == "a = 2\nb = 1\nb = 1\n"


def test_list_files(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    for rel in ("src/a.py", "src/pkg/b.py", "src/pkg/c.txt", "README.md"):
        (h.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (h.root / rel).write_text("x")
    top = call(h, "list_files", {}).text.splitlines()
    assert "src/" in top and "README.md" in top and "Specs/" in top
    assert ".state/" not in top and "config/" not in top and ".hooks/" not in top
    py = call(h, "list_files", {"path": "src", "pattern": "*.py"}).text.splitlines()
    assert py == ["src/a.py", "src/pkg/b.py"]
    pkg = call(h, "list_files", {"pattern": "src/pkg/*"}).text.splitlines()
    assert pkg == ["src/pkg/b.py", "src/pkg/c.txt"]
    assert "is a file" in call(h, "list_files", {"path": "README.md"}).text


def test_search_files(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "ws")
    (h.root / "src").mkdir()
    (h.root / "src" / "a.py").write_text("def login(user):\n    return check(user)\n")
    (h.root / "node_modules").mkdir()
    (h.root / "node_modules" / "x.js").write_text("function login() {}\n")
    found = call(h, "search_files", {"pattern": r"def \w+\(", "path": "src"}).text
    assert found == "src/a.py:1: def login(user):"
    anywhere = call(h, "search_files", {"pattern": "login"}).text
    assert "src/a.py:1:" in anywhere and "node_modules" not in anywhere
    literal = call(h, "search_files", {"pattern": "check(", "path": "src"}).text
    assert "searched for the literal text" in literal and "src/a.py:2:" in literal
    assert call(h, "search_files", {"pattern": "nothing-like-this"}).text.startswith("no matches")
