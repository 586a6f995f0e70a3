"""The agent's transcript: one JSONL file per loop, `.state/transcripts/<task_id>.jsonl`.

Every model request (only the messages that are new since the previous request), every response,
every tool call and its result, wrap-ups and restarts are appended as they happen, each tagged with
the iteration and attempt. It is the record a person reads to learn why the agent did what it did,
so it is written for completeness, not for the model: nothing in it is ever sent back.

Secrets never reach it: every line goes through a `Redactor` before it is written. The redactor
lives here because the transcript is the widest door to disk; memory, tool output and events use
the same one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kiro import timeutil

REDACTED = "[REDACTED]"
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "PRIVATE")
MIN_SECRET_LENGTH = 8  # shorter values ("", "1", "true") would mangle ordinary text if redacted


def looks_secret(name: str) -> bool:
    """True for an environment variable name that by convention holds a credential."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


class Redactor:
    """Replaces known secret values with `[REDACTED]` in any text kiro is about to write or send.

    It knows the API key itself plus the values of environment variables whose names look secret,
    so a token that turns up in a file the agent reads, or in an error a proxy echoes, is cut too.
    Values are matched literally and also in their JSON-escaped form.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        found = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}
        forms: set[str] = set()
        for s in found:
            forms.add(s)
            forms.add(json.dumps(s)[1:-1])
        # Longest first, so a secret that contains another is cut whole.
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None

    @classmethod
    def from_environment(cls, api_key: str | None, environ: Mapping[str, str] | None = None) -> Redactor:
        env = os.environ if environ is None else environ
        values = [v for k, v in env.items() if looks_secret(k)]
        if api_key:
            values.append(api_key)
        return cls(values)

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def contains_secret(self, text: str) -> bool:
        return bool(self._pattern and self._pattern.search(text))


class Transcript:
    """Appends records to one loop's transcript. The file is opened per write in append mode
    (`O_APPEND`, one `write` per line), so a crash leaves at most a torn last line and two
    writers never interleave inside a line."""

    def __init__(self, path: Path, task_id: str, redact: Redactor | None = None) -> None:
        self.path = path
        self.task_id = task_id
        self.redact = redact or Redactor()

    def write(self, kind: str, *, iteration: int, attempt: int, step_id: str | None = None,
              **fields: Any) -> None:
        record: dict[str, Any] = {
            "ts": timeutil.iso(), "task_id": self.task_id, "iteration": iteration, "attempt": attempt,
        }
        if step_id is not None:
            record["step_id"] = step_id
        record["kind"] = kind
        record.update(fields)
        line = self.redact(json.dumps(record, ensure_ascii=False, default=str)) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            data = line.encode("utf-8")
            while data:
                n = os.write(fd, data)
                data = data[n:]
        finally:
            os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a transcript; a torn last line is skipped."""
    records: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return records
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records
