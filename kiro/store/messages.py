"""Messages to a loop (SPEC §11): from a person (`kiro loop tell`, `kiro serve`) or from another loop
(the `send_message` tool). Durable, delivered into the agent's next prompt exactly once.

Each loop has an inbox `.state/inbox/<task_id>.jsonl`: one JSON object a line (id, ts, from, via,
content), appended with a single O_APPEND write and fsync'd before `tell` returns, so a queued
message survives any crash. Delivery is recorded in `.state/inbox/<task_id>.delivered`, one message
id a line, appended and fsync'd just before the prompt that carries the message is sent; a message
whose id is there is never handed to the agent again (a reinjected prompt never repeats it).
A loop killed between queueing and delivery finds the message still pending when it resumes.

The watch hub watches `.state/inbox/`, so a waiting loop (the `sleep` tool, a retry backoff, the
delay between iterations) wakes as soon as a message is queued.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from kiro import jsonl, timeutil
from kiro.fs.atomic import fsync_dir
from kiro.store.workspace import Workspace, check_task_id

MESSAGE_MAX_CHARS = 20_000
PERSON = "person"


def _new_id() -> str:
    """A message id: uuid4's hex (uuid imported only when a message is sent, not by every run)."""
    import uuid

    return uuid.uuid4().hex


class Message(NamedTuple):  # (a NamedTuple, as kiro.store.tasks' TaskCounts)
    id: str
    ts: str
    sender: str  # "person" or "loop:<task_id>"
    via: str
    content: str

    @property
    def heading(self) -> str:
        if self.sender == PERSON:
            return "## Message from a person"
        if self.sender.startswith("loop:"):
            return f"## Message from loop {self.sender[len('loop:'):]}"
        return f"## Message from {self.sender!r}"

    def block(self) -> str:
        text = self.content.strip()
        if self.sender != PERSON:
            # Another loop's words (an agent's), quoted line by line: no line of them can pass for a
            # heading of kiro's, such as `## Message from a person`, whatever the sending agent wrote.
            text = "\n".join(f"> {line}" for line in text.splitlines())
        return f"{self.heading}\n{text}\n"

    def fields(self) -> dict[str, Any]:
        return {"message_id": self.id, "from": self.sender, "via": self.via, "queued_at": self.ts,
                "chars": len(self.content)}


def _append(path: Path, line: str) -> None:
    """One line, one write, fsync'd: concurrent writers (several processes) never interleave."""
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


class Inbox:
    def __init__(self, ws: Workspace, task_id: str) -> None:
        self.task_id = check_task_id(task_id)
        self.folder = ws.state_dir / "inbox"
        self.path = self.folder / f"{task_id}.jsonl"
        self.delivered_path = self.folder / f"{task_id}.delivered"

    def queue(self, content: str, *, sender: str = PERSON, via: str = "kiro loop tell",
              msg_id: str | None = None) -> Message:
        """Append a message (already redacted by the caller) and make it durable. A given `msg_id`
        makes it idempotent: a message with that id already queued is not queued again."""
        if msg_id is not None:
            for old in self.all():
                if old.id == msg_id:
                    return old
        if not content.strip():
            raise ValueError("the message is empty")
        if len(content) > MESSAGE_MAX_CHARS:
            raise ValueError(f"the message is longer than {MESSAGE_MAX_CHARS} characters")
        self.folder.mkdir(parents=True, exist_ok=True)
        msg = Message(msg_id or _new_id(), timeutil.iso(), sender, via, content)
        record = {"id": msg.id, "ts": msg.ts, "from": msg.sender, "via": msg.via, "content": msg.content}
        _append(self.path, json.dumps(record, ensure_ascii=False) + "\n")
        return msg

    def all(self) -> list[Message]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out = []
        for r in jsonl.records(text.splitlines()):
            try:
                out.append(Message(str(r["id"]), str(r.get("ts", "")), str(r.get("from", PERSON)),
                                   str(r.get("via", "")), str(r["content"])))
            except KeyError:
                continue  # not a message of kiro's
        return out

    def delivered(self) -> set[str]:
        try:
            return {x.strip() for x in self.delivered_path.read_text(encoding="utf-8").splitlines() if x.strip()}
        except FileNotFoundError:
            return set()

    def pending(self) -> list[Message]:
        if not self.path.exists():
            return []
        done = self.delivered()
        return [m for m in self.all() if m.id not in done]

    def has_pending(self) -> bool:
        try:
            if self.path.stat().st_size == 0:
                return False
        except FileNotFoundError:
            return False
        return bool(self.pending())

    def mark_delivered(self, messages: list[Message]) -> None:
        if messages:
            self.folder.mkdir(parents=True, exist_ok=True)
            _append(self.delivered_path, "".join(f"{m.id}\n" for m in messages))


def render(messages: list[Message]) -> str:
    return "\n".join(m.block() for m in messages)


def known_loops(ws: Workspace) -> list[str]:
    """Task ids with a state file in the workspace (running or not, archived excluded)."""
    prefix = "autonomous_loop_"
    return sorted(p.name[len(prefix):-len(".json")] for p in ws.state_dir.glob(f"{prefix}*.json"))
