"""Comparing a temporal run's workspace files with a local run's: what may differ (times, durations, process
ids, hosts, paths, commit hashes, task ids) is replaced by placeholders; everything else must be equal."""

from __future__ import annotations

import re
from typing import Any

VOLATILE = {"started_at", "updated_at", "completed_at", "failed_at", "finished_at", "created", "at", "ts",
            "duration_seconds", "total_duration_seconds", "average_step_duration", "pid", "host", "workspace",
            "checkpoint", "task_id", "sleep_until", "next_retry_at", "git", "history", "last_prompt", "runs",
            "journal_seq"}  # journal_seq: how many journal records the saves took (more with a local worktree)
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+\d\d:\d\d")
_SHA = re.compile(r"\b[0-9a-f]{40}\b|(?<=`)[0-9a-f]{12}(?=`)")
_SECONDS = re.compile(r"\b\d+(\.\d+)?(s| seconds)\b")


def normal(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: ("<v>" if k in VOLATILE and v not in (None, [], {}) else normal(v, ids)) for k, v in value.items()}
    if isinstance(value, list):
        return [normal(v, ids) for v in value]
    if isinstance(value, str):
        for old, new in ids.items():
            value = value.replace(old, new)
        return _SECONDS.sub("<t>", _SHA.sub("<sha>", _TIME.sub("<time>", value)))
    return value


def report_text(text: str, ids: dict[str, str]) -> str:
    return str(normal(text, ids))
