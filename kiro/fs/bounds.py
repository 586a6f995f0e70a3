"""Caps on what kiro writes to its logs, so that one huge reply or output cannot fill the disk.

    transcript (.state/transcripts/<id>.jsonl)   each text field at most TRANSCRIPT_FIELD_CHARS
    event log (Logs/<id>.jsonl)                  each text field at most EVENT_FIELD_CHARS
    state (last_prompt, last_response, errors)   kiro.store.state.TEXT_KEPT characters
    a step's process output                      kiro.processes.spawn.OUTPUT_KEPT bytes (the tail)

A clipped text keeps its head and its tail and says how much was cut in between, so a person
still sees how it began and how it ended. The caps are documented in docs/guides/troubleshooting.md.
"""

from __future__ import annotations

from typing import Any

TRANSCRIPT_FIELD_CHARS = 64_000
EVENT_FIELD_CHARS = 8_000


def clip_text(text: str, limit: int) -> str:
    """`text`, or its head and tail with a marker saying how many characters were cut."""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return text[:half] + f"\n[... {len(text) - 2 * half:,} characters cut by kiro ...]\n" + text[-half:]


def clip_fields(value: Any, limit: int) -> Any:
    """A copy of a JSON-like record whose every string is at most `limit` characters (clipped as
    `clip_text` does); other values are kept. Only containers that hold a long string are copied."""
    if isinstance(value, str):
        return clip_text(value, limit)
    if isinstance(value, dict):
        return {key: clip_fields(sub, limit) for key, sub in value.items()}
    if isinstance(value, list | tuple):
        return [clip_fields(sub, limit) for sub in value]
    return value
