"""Running the REAL aider, Gemini CLI and opencode under kiro against the scripted API servers in
tests/fakes (Chat Completions SSE for aider and opencode, the Gemini API for gemini): the harness
that tests/test_agent_clis_aider_gemini_opencode.py and bench/agent_clis.py share. Same shape as tests/agent_clis.py
(claude, codex).

Each `Cli` points its program at a fake with a HOME and config it owns in tmp (nothing from the
machine leaks in), and plays a model that does what kiro's prompt asks, through the CLI's own edit
protocol: aider gets a SEARCH/REPLACE block in the reply text (or the whole file, in its "whole"
format), Gemini CLI a `replace` function call, opencode `read` then `edit` tool calls.

aider lives in its own virtual environment: found on PATH, at $KIRO_AIDER, or in the venv that
.ci/install-agent-clis makes (/opt/aider-venv, ~/.cache/kiro/aider-venv); the tests put a link to it
on PATH, as a person who installed it with pipx has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agent_clis import INSTALL, Cli, filled, parse_prompt
from tests.conftest import cli_homes
from tests.fakes import FakeServer, HttpError, Recorded
from tests.fakes import chat as fc
from tests.fakes import gemini as fg

AIDER_VENVS = (Path("/opt/aider-venv"), Path.home() / ".cache" / "kiro" / "aider-venv")
# $ per 1M tokens the fakes' models cost (aider's model metadata, opencode's model config)
PRICE_IN, PRICE_OUT = 2.0, 10.0
GEMINI_PRICE = f"llm:\n  prices:\n    {fg.MODEL}: {{input_per_1m: {PRICE_IN}, output_per_1m: {PRICE_OUT}}}\n"


def find_aider() -> str | None:
    explicit = os.environ.get("KIRO_AIDER")
    if explicit and os.access(explicit, os.X_OK):
        return explicit
    found = shutil.which("aider")
    if found:
        return found
    for venv in AIDER_VENVS:
        if os.access(venv / "bin" / "aider", os.X_OK):
            return str(venv / "bin" / "aider")
    return None


# in HOME under the name aider reads there by default (in kiro's box HOME shows only aider's own files)
METADATA = ".aider.model.metadata.json"


class Aider(Cli):
    """aider with `--model openai/fake-coder` on the Chat Completions fake, edit format `diff`
    (SEARCH/REPLACE blocks), a model metadata file that gives the model a price."""

    def __init__(self, tmp: Path) -> None:
        super().__init__("aider", "aider", "aider-chat", tmp)
        self.path = find_aider()

    def where(self) -> str | None:
        return self.path

    def skip_reason(self) -> str:
        return (f"aider is not installed (PyPI aider-chat, in its own venv: not on PATH, not at $KIRO_AIDER, "
                f"not in {' or '.join(map(str, AIDER_VENVS))}); install it with {INSTALL} to run this test")

    def brain(self, rec: Recorded) -> fc.Reply | HttpError:
        if self.error is not None:
            return self.error
        usage = {"prompt_tokens": self.input_tokens, "completion_tokens": self.output_tokens}
        path, old, new = parse_prompt(fc.user_text(rec.body))
        name = self.relative(path)
        # `{task}`: the file the prompt says to check the box in (the agent's copy of the task file)
        blocks = [self.block(rec.body, name if file == "{task}" else file, o, n) for file, o, n in self.extra]
        blocks.append(self.block(rec.body, name, old, new))
        return fc.Reply(f"{self.said}\n\n" + "\n".join(blocks) + f"\n{self.said}\n", **usage) if self.said is not None \
            else fc.Reply("I will check the step's box.\n\n" + "\n".join(blocks), **usage)

    def relative(self, path: str) -> str:
        root = self.tmp / "vault"
        try:
            return str(Path(path).relative_to(root))
        except ValueError:
            return path

    def block(self, body: Any, name: str, old: str, new: str) -> str:
        """One edit in the format aider asked for in its system prompt."""
        if "SEARCH/REPLACE" in fc.system_text(body):
            return f"{name}\n```\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n```\n"
        target = Path(name) if Path(name).is_absolute() else self.tmp / "vault" / name
        text = target.read_text() if target.exists() else ""
        return f"{name}\n```\n{text.replace(old, new, 1) if old else new}\n```\n"

    def start(self) -> FakeServer:
        self.server = fc.FakeChat(self.brain).start()
        bindir = self.tmp / "aider-bin"
        bindir.mkdir(exist_ok=True)
        assert self.path is not None
        link = bindir / "aider"
        if not link.exists():
            link.symlink_to(self.path)
        home = self.tmp / "aider-home"
        home.mkdir(exist_ok=True)
        (home / METADATA).write_text(json.dumps({f"openai/{fc.MODEL}": {
            "max_input_tokens": 128000, "max_output_tokens": 8192, "litellm_provider": "openai", "mode": "chat",
            "input_cost_per_token": PRICE_IN / 1e6, "output_cost_per_token": PRICE_OUT / 1e6}}))
        return self.server

    def env(self) -> dict[str, str]:
        assert self.server is not None
        home = self.tmp / "aider-home"
        return {"HOME": str(home), "PATH": f"{self.tmp / 'aider-bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                "OPENAI_API_BASE": f"{self.server.url}/v1", "OPENAI_API_KEY": "sk-test-key",
                "AIDER_MODEL": f"openai/{fc.MODEL}", "AIDER_EDIT_FORMAT": "diff",
                "AIDER_MODEL_METADATA_FILE": str(home / METADATA)}

    def calls(self) -> int:
        assert isinstance(self.server, fc.FakeChat)
        return len(self.server.calls())


class Gemini(Cli):
    def __init__(self, tmp: Path) -> None:
        super().__init__("gemini", "gemini", "@google/gemini-cli", tmp)

    def brain(self, rec: Recorded) -> fg.Turn | HttpError:
        if self.error is not None:
            return self.error
        usage = {"prompt_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if ":streamGenerateContent" not in rec.path:  # a side call (routing, checks): not the agent's turn
            return fg.Turn([fg.text(fg.side_call_answer(rec.body))], **usage)
        self.saw_nodes(self.tmp / "gemini-home")
        done = len(fg.function_responses(rec.body))
        path, old, new = parse_prompt(fg.user_text(rec.body))
        plan = [*filled(self.extra, path), ("replace", {"file_path": path, "old_string": old, "new_string": new,
                                          "instruction": "check the step's box"})]
        if done < len(plan):
            name, args = plan[done]
            return fg.Turn([fg.function_call(name, args)], **usage)
        return fg.Turn([fg.text(self.reply(new))], **usage)

    def start(self) -> FakeServer:
        self.server = fg.FakeGemini(self.brain).start()
        settings = self.tmp / "gemini-home" / ".gemini" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        }))
        return self.server

    def env(self) -> dict[str, str]:
        assert self.server is not None
        return {"HOME": str(self.tmp / "gemini-home"), "GEMINI_API_KEY": "test-gemini-key",
                "GOOGLE_GEMINI_BASE_URL": self.server.url, "GEMINI_MODEL": fg.MODEL}

    def calls(self) -> int:
        assert isinstance(self.server, fg.FakeGemini)
        return len(self.server.agent_calls())


class ChatEditCli(Cli):
    """A CLI on a Chat Completions endpoint whose agent reads the task file and then edits the box with its
    `edit` tool; a request that offers no `edit` tool is a side call (a title, a summary)."""

    def edit_plan(self, path: str, old: str, new: str) -> list[tuple[str, dict[str, str]]]:
        """The CLI's own read and edit tool calls, with its argument names."""
        raise NotImplementedError

    def brain(self, rec: Recorded) -> fc.Reply | HttpError:
        if self.error is not None:
            return self.error
        usage = {"prompt_tokens": self.input_tokens, "completion_tokens": self.output_tokens}
        if "edit" not in fc.tool_names(rec.body):
            return fc.Reply("kiro step", **usage)
        done = len(fc.tool_results(rec.body))
        path, old, new = parse_prompt(fc.user_text(rec.body))
        plan = [*filled(self.extra, path), *self.edit_plan(path, old, new)]
        if done < len(plan):
            name, args = plan[done]
            return fc.Reply(None, [fc.tool_call(name, args)], **usage)
        return fc.Reply(self.reply(new), **usage)


# what opencode installs from the npm registry into a fresh home on its first start (its plugin package in the
# config folder, the provider's package in its cache): kept from the first test's run, copied into each new home
OPENCODE_INSTALLS = (Path(".config") / "opencode", Path(".cache") / "opencode")


# What opencode starts beside a run that the tests never use, turned off as its documented variables allow (its
# own config skill lists them): its built-in plugins (the logins of providers other than the fake's), its watcher
# of the project's files, its scans of ~/.claude and ~/.agents for skills and prompts. With `"snapshot": false`,
# one 3-call `opencode run` starts ~50 fewer git processes and costs 0.2-1.6 s less CPU of 11-13 s (1.18.33,
# load 4-15; docs/guides/opencode-cost.md): the rest is opencode's own start, which no setting skips.
OPENCODE_FEATURES = {"OPENCODE_DISABLE_DEFAULT_PLUGINS": "true", "OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER": "true",
                     "OPENCODE_DISABLE_CLAUDE_CODE": "true", "OPENCODE_DISABLE_EXTERNAL_SKILLS": "true"}


def opencode_seed() -> Path:
    """Where a test run keeps opencode's first installs, beside the CLI homes (tests/conftest.py cli_homes)."""
    return cli_homes() / "opencode-installs"


def link_or_copy(source: str, target: str) -> None:
    """A seed's file in a new home: a hard link of what is inside node_modules (the seed's ~4,000 files, 64 MB:
    copied, 8 s of a test's start on a loaded machine, 2 s of CPU; linked, 0.2 s), a copy of the rest (the
    package.json and lock file opencode may write)."""
    if "node_modules" in Path(source).parts:
        try:
            os.link(source, target)
            return
        except OSError:  # another file system
            pass
    shutil.copy2(source, target)


class Opencode(ChatEditCli):
    """opencode, with its config in its own HOME. A person's opencode installs its packages once, on its first
    start; each test's fresh home would install them again from the npm registry (10-40 s a start), so a home
    starts with what the first run installed (`opencode_seed`), and opencode itself checks them as it does a
    person's."""

    def __init__(self, tmp: Path) -> None:
        super().__init__("opencode", "opencode", "opencode-ai", tmp)

    def close(self) -> None:
        super().close()
        seed, home = opencode_seed(), self.tmp / "opencode-home"
        if seed.exists() or not all((home / part / "node_modules").is_dir() for part in OPENCODE_INSTALLS[:1]):
            return
        staging = Path(tempfile.mkdtemp(dir=seed.parent))
        for part in OPENCODE_INSTALLS:
            if (home / part).is_dir():
                shutil.copytree(home / part, staging / part, symlinks=True,
                                ignore=shutil.ignore_patterns("opencode.json"))
        try:
            staging.rename(seed)  # whole or not at all: another worker's may have landed first
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)

    def edit_plan(self, path: str, old: str, new: str) -> list[tuple[str, dict[str, str]]]:
        return [("read", {"filePath": path}), ("edit", {"filePath": path, "oldString": old, "newString": new})]

    def start(self) -> FakeServer:
        self.server = fc.FakeChat(self.brain).start()
        home, seed = self.tmp / "opencode-home", opencode_seed()
        for part in OPENCODE_INSTALLS:
            if (seed / part).is_dir():
                shutil.copytree(seed / part, home / part, symlinks=True, dirs_exist_ok=True,
                                copy_function=link_or_copy)
        config = home / ".config" / "opencode" / "opencode.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "fake",
                                  "options": {"baseURL": f"{self.server.url}/v1", "apiKey": "{env:FAKE_API_KEY}"},
                                  "models": {fc.MODEL: {"name": fc.MODEL,
                                                        "cost": {"input": PRICE_IN, "output": PRICE_OUT}}}}},
            "model": f"fake/{fc.MODEL}", "autoupdate": False, "share": "disabled",
            # its undo history: a git repository of the project beside its data, `git add -A` before and after
            # each model call (~50 git processes and 1.5 s of CPU in a 3-call run); kiro checkpoints with git
            "snapshot": False,
        }))
        return self.server

    def env(self) -> dict[str, str]:
        home = self.tmp / "opencode-home"
        # its config where a person has it (in kiro's box HOME shows only opencode's own XDG folders); off, as a
        # person may turn them off, what the tests never use and each start pays for (OPENCODE_FEATURES)
        return {"HOME": str(home), "FAKE_API_KEY": "sk-test-key", **OPENCODE_FEATURES,
                "OPENCODE_DISABLE_MODELS_FETCH": "true", "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_CACHE_HOME": str(home / ".cache"),
                "XDG_STATE_HOME": str(home / ".local" / "state")}

    def calls(self) -> int:
        assert isinstance(self.server, fc.FakeChat)
        return len([r for r in self.server.calls() if "edit" in fc.tool_names(r.body)])


MORE_CLIS: dict[str, Callable[[Path], Cli]] = {"aider": Aider, "gemini": Gemini, "opencode": Opencode}

_AIDER_TOKENS = re.compile(r"^Tokens: .*", re.M)


def aider_token_lines(log: str) -> list[str]:
    return _AIDER_TOKENS.findall(log)
