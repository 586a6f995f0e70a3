"""The openai agent's tools (SPEC §5), each a pydantic argument model plus an async function.

    files.py         read_file, write_file, edit_file, list_files, search_files (confined: paths.py)
    shell.py         run_command (off unless tools.shell.enabled; allow-list; no shell; clean env)
    steps.py         complete_step, fail_step, request_human, add_steps, sleep
    memory_tools.py  memory_save, memory_recall
    message_tools.py send_message, read_messages (SPEC §11)

`toolset(config)` gives the tools offered for one attempt, by name, in a stable order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiro.executors.tools.base import Ending, Tool, ToolEnv, ToolResult
from kiro.executors.tools.errors import ToolError

if TYPE_CHECKING:
    from kiro.store.config import Config

__all__ = ["Ending", "Tool", "ToolEnv", "ToolError", "ToolResult", "TOOL_NAMES", "toolset"]

TOOL_NAMES = (
    "read_file", "write_file", "edit_file", "list_files", "search_files", "run_command",
    "complete_step", "fail_step", "request_human", "add_steps", "memory_save", "memory_recall", "sleep",
    "send_message", "read_messages",
)


def toolset(config: Config) -> dict[str, Tool[Any]]:
    """Every tool, in SPEC order; `run_command` only when `tools.shell.enabled`."""
    from kiro.executors.tools import files, memory_tools, message_tools, shell, steps

    every = {t.name: t for t in (*files.TOOLS, *shell.TOOLS, *steps.TOOLS, *memory_tools.TOOLS,
                                 *message_tools.TOOLS)}
    names = [n for n in TOOL_NAMES if n != "run_command" or config.tools.shell.enabled]
    return {n: every[n] for n in names}
