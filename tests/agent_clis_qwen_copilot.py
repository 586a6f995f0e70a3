"""Running the REAL Qwen Code CLI (npm @qwen-code/qwen-code) under kiro against the scripted Chat
Completions server of tests/fakes (it speaks to any OpenAI-compatible endpoint, named by
OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL): the harness of tests/test_agent_clis_qwen_copilot.py. Same
shape as tests/agent_clis.py: a HOME it owns in the test-homes folder, and a model that checks the
step's box with the CLI's own tools (`read_file`, then `edit`).

GitHub Copilot CLI (npm @github/copilot) the same way: its "bring your own key" provider
(COPILOT_PROVIDER_BASE_URL, COPILOT_OFFLINE=true: no GitHub login or traffic) on the same fake,
its tools `view` and `edit`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.agent_clis import Cli, processes, run_once
from tests.agent_clis_aider_gemini_opencode import ChatEditCli
from tests.conftest import cli_homes
from tests.fakes import FakeServer, HttpError, Recorded
from tests.fakes import chat as fc

# $ per 1M tokens kiro prices the fake's model at (qwen reports tokens only)
PRICE_IN, PRICE_OUT = 2.0, 10.0
QWEN_PRICE = f"llm:\n  prices:\n    {fc.MODEL}: {{input_per_1m: {PRICE_IN}, output_per_1m: {PRICE_OUT}}}\n"


class Qwen(ChatEditCli):
    def __init__(self, tmp: Path) -> None:
        super().__init__("qwen", "qwen", "@qwen-code/qwen-code", tmp)

    def edit_plan(self, path: str, old: str, new: str) -> list[tuple[str, dict[str, str]]]:
        return [("read_file", {"file_path": path}),
                ("edit", {"file_path": path, "old_string": old, "new_string": new})]

    def brain(self, rec: Recorded) -> fc.Reply | HttpError:
        if "edit" in fc.tool_names(rec.body):  # the agent's turn, not a side call
            self.saw_nodes(self.tmp / "qwen-home")
        return super().brain(rec)

    def start(self) -> FakeServer:
        self.server = fc.FakeChat(self.brain).start()
        settings = self.tmp / "qwen-home" / ".qwen" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"privacy": {"usageStatisticsEnabled": False},
                                        "general": {"enableAutoUpdate": False}}))
        return self.server

    def env(self) -> dict[str, str]:
        assert self.server is not None
        return {"HOME": str(self.tmp / "qwen-home"), "OPENAI_BASE_URL": f"{self.server.url}/v1",
                "OPENAI_API_KEY": "sk-test-key", "OPENAI_MODEL": fc.MODEL}

    def calls(self) -> int:
        assert isinstance(self.server, fc.FakeChat)
        return len([r for r in self.server.calls() if "edit" in fc.tool_names(r.body)])


# Copilot CLI unpacks itself (~235 MB) into ~/.cache/copilot/pkg on a HOME's first run, a third of its CPU a
# run: the tests' CLIs share one cache folder (each test HOME's .cache links to it), unpacked once a test run,
# as a person's ~/.cache is after their first run of it (kiro's box shows that package read-only, where the
# rest of HOME is empty: CopilotPreset.read_paths).
CACHE = cli_homes() / "copilot-cache"
PACKAGE = CACHE / "copilot" / "pkg"


def unpacked() -> None:
    """Copilot's package unpacked in CACHE (its `--version` does it), once a test run."""

    def unpack() -> dict[str, str]:
        said = subprocess.run(["copilot", "--version"], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "XDG_CACHE_HOME": str(CACHE)})
        return {"said": said.stdout + said.stderr}

    run_once(f"copilot-unpacked-{hashlib.sha256(bytes(CACHE)).hexdigest()[:12]}", unpack)


def sees_as_is(pid: int, path: Path, folder: Path) -> bool:
    """Whether process `pid` sees at `path` this machine's `folder` (not a copy of it made in its box)."""
    try:
        inside, outside = (Path(f"/proc/{pid}/root") / path.relative_to("/")).stat(), folder.stat()
    except OSError:
        return False
    return (inside.st_dev, inside.st_ino) == (outside.st_dev, outside.st_ino)


class Copilot(ChatEditCli):
    def __init__(self, tmp: Path) -> None:
        super().__init__("copilot", "copilot", "@github/copilot", tmp)
        self.package_seen: list[list[bool]] = []  # at each agent call, per copilot process: sees PACKAGE as is

    def edit_plan(self, path: str, old: str, new: str) -> list[tuple[str, dict[str, str]]]:
        return [("view", {"path": path}), ("edit", {"path": path, "old_str": old, "new_str": new})]

    def brain(self, rec: Recorded) -> fc.Reply | HttpError:
        if "edit" in fc.tool_names(rec.body):  # the agent's turn: whether it runs from the unpacked package
            home = self.tmp / "copilot-home"
            self.package_seen.append([sees_as_is(pid, home / ".cache" / "copilot" / "pkg", PACKAGE)
                                      for pid, argv in processes(home)
                                      if argv and argv[0].rsplit("/", 1)[-1] == "copilot"])
        return super().brain(rec)

    def start(self) -> FakeServer:
        self.server = fc.FakeChat(self.brain).start()
        home = self.tmp / "copilot-home"
        home.mkdir(exist_ok=True)
        unpacked()
        if not (home / ".cache").exists():
            (home / ".cache").symlink_to(CACHE)
        return self.server

    def env(self) -> dict[str, str]:
        assert self.server is not None
        return {"HOME": str(self.tmp / "copilot-home"), "COPILOT_OFFLINE": "true",
                "COPILOT_PROVIDER_BASE_URL": f"{self.server.url}/v1", "COPILOT_PROVIDER_API_KEY": "sk-test-key",
                "COPILOT_MODEL": fc.MODEL}

    def calls(self) -> int:
        assert isinstance(self.server, fc.FakeChat)
        return len([r for r in self.server.calls() if "edit" in fc.tool_names(r.body)])


NEW_CLIS: dict[str, Callable[[Path], Cli]] = {"qwen": Qwen, "copilot": Copilot}
