"""Running the REAL ACP agents `codex-acp` (npm @agentclientprotocol/codex-acp) and `opencode acp`
(npm opencode-ai) under kiro against the scripted API servers in tests/fakes: the harness that
tests/test_agent_acp_codex_opencode.py and tests/test_sandbox_escapes.py share. Same shape as
tests/agent_clis_acp.py (claude-acp, gemini-acp).

Each is its one-shot CLI's harness with the ACP program: codex-acp starts the Codex App Server,
which reads the same `$CODEX_HOME/config.toml` (the fake OpenAI Responses server as its model
provider) and makes the same tool calls (`exec_command` with `apply_patch`); `opencode acp` reads
the same opencode.json (the fake Chat Completions server) and makes the same `read` / `edit` calls.
The scripted model does what kiro's prompt asks and checks the step's box with them. A brain can be
held (`held`, tests/agent_clis_acp.py) to see what kiro does while a step still runs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agent_clis import Cli, Codex
from tests.agent_clis_acp import Held
from tests.agent_clis_aider_gemini_opencode import Opencode
from tests.fakes import FakeServer, HttpError, Recorded
from tests.fakes import chat as fc
from tests.fakes import responses as fr


class CodexAcp(Codex):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.name, self.program, self.package = "codex-acp", "codex-acp", "@agentclientprotocol/codex-acp"
        self.held: Held | None = None

    def brain(self, rec: Recorded) -> fr.Reply | HttpError:
        if self.held is not None:
            self.held.wait()
        return super().brain(rec)

    def read_call(self, path: str) -> tuple[str, dict[str, Any]]:
        return ("exec_command", {"cmd": f"cat {shlex.quote(path)}"})

    def with_api_key_only(self) -> None:
        """Codex's built-in OpenAI provider (its endpoint: `openai_base_url`), the key in OPENAI_API_KEY and
        no login: as a person with an API key has it."""
        assert self.server is not None
        config = f'model = "{fr.MODEL}"\nopenai_base_url = "{self.server.url}/v1"\n'
        (self.codex_home / "config.toml").write_text(config)

    def write_call(self, path: str, content: str) -> tuple[str, dict[str, Any]]:
        """Its shell tool running `apply_patch`, which the App Server turns into an edit it asks about."""
        lines = "".join(f"+{line}\n" for line in content.splitlines())
        return ("exec_command", {"cmd": f"apply_patch <<'PATCH'\n*** Begin Patch\n*** Add File: {path}\n{lines}"
                                        f"*** End Patch\nPATCH\n"})


class OpencodeAcp(Opencode):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.name = "opencode-acp"
        self.held: Held | None = None

    def brain(self, rec: Recorded) -> fc.Reply | HttpError:
        if self.held is not None and "edit" in fc.tool_names(rec.body):
            self.held.wait()
        return super().brain(rec)

    def read_call(self, path: str) -> tuple[str, dict[str, Any]]:
        return ("read", {"filePath": path})

    def write_call(self, path: str, content: str) -> tuple[str, dict[str, Any]]:
        return ("write", {"filePath": path, "content": content})

    def start(self) -> FakeServer:
        """The model with its context limit too, as models.dev gives a real one: `opencode acp` reports the
        session's cost (`usage_update`) only for a model whose limit it knows."""
        server = super().start()
        config = self.tmp / "opencode-home" / ".config" / "opencode" / "opencode.json"
        data = json.loads(config.read_text())
        data["provider"]["fake"]["models"][fc.MODEL]["limit"] = {"context": 128000, "output": 8192}
        config.write_text(json.dumps(data))
        return server


AcpMoreCli = CodexAcp | OpencodeAcp
ACP_MORE_CLIS: dict[str, Callable[[Path], AcpMoreCli]] = {"codex-acp": CodexAcp, "opencode-acp": OpencodeAcp}

__all__ = ["ACP_MORE_CLIS", "AcpMoreCli", "Cli", "CodexAcp", "Held", "OpencodeAcp"]
