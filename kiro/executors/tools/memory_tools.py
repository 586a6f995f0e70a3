"""memory_save and memory_recall: the agent's long-term memory (see `kiro.store.memory`).

What the agent saves is tagged with the source `loop:<task_id>` (`schedule:<task_id>` in a stateful
scheduled task, so that its later runs see it); it cannot write under another
source, but it can recall everybody's (or one source's) notes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from kiro.executors.tools.base import Args, Tool, ToolEnv, ToolResult
from kiro.store.memory import MAX_CONTENT_CHARS

RECALL_SHOWN_CHARS = 2000


class MemorySaveArgs(Args):
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS, description="what to remember")
    type: str = Field("note", pattern=r"^[a-z][a-z0-9_-]{0,31}$",
                      description="kind of memory: note, fact, decision, finding, summary, ...")
    importance: float = Field(0.5, ge=0, le=1, description="0 (trivia) to 1 (must not be forgotten)")


async def memory_save(args: MemorySaveArgs, env: ToolEnv) -> ToolResult:
    content = env.redact(args.content)
    memory_id = await asyncio.to_thread(env.memory.save, content, args.type, args.importance,
                                        env.memory_source)
    env.memory_saved.append(content)
    return ToolResult(f"saved memory #{memory_id} ({args.type}, source {env.memory_source})")


class MemoryRecallArgs(Args):
    query: str = Field(description="keywords to look for; empty for the most recent memories")
    source: str | None = Field(None, description="only memories from this source, e.g. 'loop:<task_id>'")
    limit: int = Field(5, ge=1, le=20, description="how many memories at most")


async def memory_recall(args: MemoryRecallArgs, env: ToolEnv) -> ToolResult:
    found = await asyncio.to_thread(env.memory.recall, args.query, args.source, args.limit)
    if not found:
        where = f" from {args.source}" if args.source else ""
        return ToolResult(f"no memories{where} match {args.query!r}")
    lines = []
    for m in found:
        content = m.content
        if len(content) > RECALL_SHOWN_CHARS:
            content = content[:RECALL_SHOWN_CHARS] + " […]"
        head = f"#{m.id} [{m.type}, importance {m.importance:g}, {m.source}, {m.created_at}]"
        lines.append(f"{head}\n{content}")
    return ToolResult(env.redact("\n\n".join(lines)))


TOOLS: tuple[Tool[Any], ...] = (
    Tool("memory_save", "Save a note to long-term memory (kept across steps and runs).",
         MemorySaveArgs, memory_save),
    Tool("memory_recall", "Search long-term memory by keywords.", MemoryRecallArgs, memory_recall),
)
