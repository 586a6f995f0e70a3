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

from tests.agent_clis import Cli, run_once
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


# Copilot CLI unpacks itself (~235 MB) into its cache on a HOME's first run, half its CPU a run: the tests'
# CLIs share one cache (COPILOT_CACHE_HOME; kiro's box shows it read-only, as a folder a COPILOT_ variable
# names), unpacked once a test run, as a person's ~/.cache/copilot is after their first run.
PACKAGES = cli_homes() / "copilot-cache"


def unpacked(cache: str) -> None:
    """Copilot's package unpacked in `cache` (its `--version` does it), once a test run."""

    def unpack() -> dict[str, str]:
        said = subprocess.run(["copilot", "--version"], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "COPILOT_CACHE_HOME": cache})
        return {"said": said.stdout + said.stderr}

    run_once(f"copilot-unpacked-{hashlib.sha256(cache.encode()).hexdigest()[:12]}", unpack)


class Copilot(ChatEditCli):
    def __init__(self, tmp: Path) -> None:
        super().__init__("copilot", "copilot", "@github/copilot", tmp)

    def edit_plan(self, path: str, old: str, new: str) -> list[tuple[str, dict[str, str]]]:
        return [("view", {"path": path}), ("edit", {"path": path, "old_str": old, "new_str": new})]

    def start(self) -> FakeServer:
        self.server = fc.FakeChat(self.brain).start()
        (self.tmp / "copilot-home").mkdir(exist_ok=True)
        unpacked(str(PACKAGES))
        return self.server

    def env(self) -> dict[str, str]:
        assert self.server is not None
        return {"HOME": str(self.tmp / "copilot-home"), "COPILOT_OFFLINE": "true",
                "COPILOT_PROVIDER_BASE_URL": f"{self.server.url}/v1", "COPILOT_PROVIDER_API_KEY": "sk-test-key",
                "COPILOT_MODEL": fc.MODEL, "COPILOT_CACHE_HOME": str(PACKAGES)}

    def calls(self) -> int:
        assert isinstance(self.server, fc.FakeChat)
        return len([r for r in self.server.calls() if "edit" in fc.tool_names(r.body)])


NEW_CLIS: dict[str, Callable[[Path], Cli]] = {"qwen": Qwen, "copilot": Copilot}
