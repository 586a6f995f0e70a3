"""A scripted ACP agent (run as a program: `python tests/agent_clis_acp_switching.py <how>`) that does what
no real adapter does on its own, for kiro's hold on the session's mode (kiro.executors.acp.hold_mode):
claude-agent-acp, codex-acp and opencode change mode only when the client says so (`session/set_mode`,
or an "always" permission option kiro never picks), so these cases are played here, in claude-agent-acp
0.101's own words (its mode ids, its `current_mode_update`).

- `switch`: opens in `auto` (modes default, acceptEdits, plan, auto), takes kiro's `default`, then, in its
  turn, says `current_mode_update: auto` and asks to write `pwned.txt`; it writes the file when allowed.
- `auto-only`: offers only `auto` and `bypassPermissions` (modes in which nothing is asked).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import acp
from acp.schema import (
    AgentCapabilities,
    CurrentModeUpdate,
    InitializeResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    SessionMode,
    SessionModeState,
    SetSessionModeResponse,
    ToolCallLocation,
    ToolCallUpdate,
)

MODES = {"switch": ["default", "acceptEdits", "plan", "auto"], "auto-only": ["auto", "bypassPermissions"]}


class Switching:
    def __init__(self, how: str) -> None:
        self.how = how
        self.client: Any = None
        self.cwd = Path(".")

    def on_connect(self, conn: Any) -> None:
        self.client = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=protocol_version, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        self.cwd = Path(cwd)
        modes = [SessionMode(id=m, name=m) for m in MODES[self.how]]
        return NewSessionResponse(session_id="s1", modes=SessionModeState(available_modes=modes,
                                                                          current_mode_id="auto"))

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> SetSessionModeResponse:
        return SetSessionModeResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        await self.client.session_update(session_id, CurrentModeUpdate(session_update="current_mode_update",
                                                                       current_mode_id="auto"))
        target = str(self.cwd / "pwned.txt")
        call = ToolCallUpdate(tool_call_id="t1", kind="edit", title=f"Write {target}",
                              locations=[ToolCallLocation(path=target)], raw_input={"file_path": target})
        options = [PermissionOption(kind="allow_once", name="Allow", option_id="allow"),
                   PermissionOption(kind="reject_once", name="Reject", option_id="reject")]
        answer = await self.client.request_permission(options=options, session_id=session_id, tool_call=call)
        if answer.outcome.outcome == "selected" and answer.outcome.option_id == "allow":
            Path(target).write_text("written in auto mode\n")
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(acp.run_agent(Switching(sys.argv[1])))  # type: ignore[arg-type]
