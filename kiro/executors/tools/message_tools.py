"""send_message and read_messages: loops talking to each other (SPEC §11, seed 003's message bus).

`send_message {to, content}` queues a message in another loop's inbox (`to` is a task id, or `*` for
every other loop in the workspace); it reaches that loop's agent in its next prompt under
`## Message from loop <task_id>`. `read_messages` hands over anything queued for this loop and not
yet seen, then lists the latest messages it has received. See `kiro.store.messages`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from kiro.errors import KiroError
from kiro.executors.tools.base import Args, Tool, ToolEnv, ToolResult
from kiro.executors.tools.errors import ToolError
from kiro.store.events import MessageSent
from kiro.store.messages import MESSAGE_MAX_CHARS, Inbox, known_loops

READ_LAST = 10


class SendMessageArgs(Args):
    to: str = Field(min_length=1, max_length=128, description="the task id of the loop to tell, or '*' for every "
                                                               "other loop in the workspace")
    content: str = Field(min_length=1, max_length=MESSAGE_MAX_CHARS, description="the message")


async def send_message(args: SendMessageArgs, env: ToolEnv) -> ToolResult:
    ctx = env.ctx
    me = ctx.task_id
    content = env.redact(args.content)
    if not content.strip():
        raise ToolError("the message is empty")
    loops = known_loops(ctx.workspace)
    if args.to.strip() == "*":
        targets = [t for t in loops if t != me]
        if not targets:
            raise ToolError("there is no other loop in this workspace to send to")
    else:
        target = args.to.strip()
        try:
            Inbox(ctx.workspace, target)
        except KiroError as exc:
            raise ToolError(f"to: {exc}") from None
        if target == me:
            raise ToolError("to: that is this loop's own task id")
        if target not in loops:
            known = ", ".join(t for t in loops if t != me) or "none"
            raise ToolError(f"to: no loop {target!r} in this workspace (other loops: {known})")
        targets = [target]
    for target in targets:
        msg = await asyncio.to_thread(Inbox(ctx.workspace, target).queue, content, sender=f"loop:{me}",
                                      via="send_message")
        ctx.emit(MessageSent(message_id=msg.id, to=target, chars=len(content)))
    return ToolResult(f"queued for {', '.join(targets)}: it reaches their agent in its next prompt")


class ReadMessagesArgs(Args):
    pass


async def read_messages(args: ReadMessagesArgs, env: ToolEnv) -> ToolResult:
    ctx = env.ctx
    fresh = ctx.messages() if ctx.messages is not None else None
    received = await asyncio.to_thread(Inbox(ctx.workspace, ctx.task_id).all)
    if not received:
        return ToolResult("no messages for this loop")
    lines = [f"{m.ts} {m.heading[3:]}:\n{m.content.strip()}" for m in received[-READ_LAST:]]
    head = "including new ones; " if fresh else ""
    return ToolResult(env.redact(f"{head}the latest {len(lines)} message(s) received:\n\n" + "\n\n".join(lines)))


TOOLS: tuple[Tool[Any], ...] = (
    Tool("send_message", "Send a message to another loop (by task id, or '*' for all): it reaches that loop's "
                         "agent in its next prompt.", SendMessageArgs, send_message),
    Tool("read_messages", "Read the messages people and other loops sent to this loop.", ReadMessagesArgs,
         read_messages),
)
