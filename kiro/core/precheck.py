"""The pre-check gate (SPEC §11, seed 000): before a costly full-model turn, a cheap model decides
whether anything material changed since the last run; if not, the run (or iteration) is skipped.

- **What it sees.** A digest of what changed since the baseline kiro saved when the last run (or,
  with `llm.precheck: every_iteration`, the last iteration that ran) ended: the task file (a diff),
  the project's files (added / modified / removed, by size and mtime), new memories, messages that
  arrived. The baseline is `.state/precheck/<task_id>.json`.
- **What it answers.** The pre-check model (`llm.precheck_model`, on the `llm:` endpoint) is offered
  one tool, `precheck_result {material_change: bool, reason: str}`. Only `material_change: false`
  skips; a reply without the tool, a failing call (HTTP error, timeout, no key) or a malformed answer
  counts as a change: the gate fails open and the work runs (event `precheck_passed`, `failed: true`).
- **What always passes, without asking.** A message waiting in the loop's inbox (SPEC §11); no
  baseline yet (the first run); with `every_iteration`, a step that was not attempted at the last
  check (new work: the checklist moved on, which is a material change by itself).

The engine calls `before_iteration` / `after_iteration` (every_iteration); the schedule runner
(kiro.core.scheduled) calls `check_run(loop)` when a fire is due and `remember(loop)` when a run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kiro import timeutil
from kiro.fs.atomic import atomic_write
from kiro.fs.ownwrites import TEMP_SUFFIX
from kiro.status import Status
from kiro.store import events as ev
from kiro.store.messages import Inbox
from kiro.usage import Usage

if TYPE_CHECKING:
    from kiro.core.conditions import Stop
    from kiro.core.hooks import LoopHandle

Scope = Literal["run", "iteration"]

MAX_FILES = 20_000  # files compared per project; more are not looked at (the digest says so)
MAX_LISTED = 40  # changed files named in the digest
MAX_DIFF_LINES = 80  # lines of the task file's diff in the digest
MAX_MEMORIES = 10
REPLY_TOKENS = 200
# Never part of "what changed": kiro's own bookkeeping, version-control internals, caches.
SKIP_NAMES = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache",
                        ".pytest_cache", ".ruff_cache", ".tox", ".kiro"})
KIRO_OWN = frozenset({".state", ".hooks", "Logs", "Dashboard.md"})
_IN_PROGRESS = r"(?m)^(\s*[-*+]\s+)\[-\]"  # compiled when first used (re's cache)

TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "precheck_result",
        "description": "Say whether anything changed since the last run that is worth a full run of the agent.",
        "parameters": {
            "type": "object",
            "properties": {
                "material_change": {"type": "boolean",
                                    "description": "true if the agent should run now; false if nothing material "
                                                   "changed and the run can be skipped"},
                "reason": {"type": "string", "description": "one sentence: why"},
            },
            "required": ["material_change", "reason"],
        },
    },
}

SYSTEM = """You are the pre-check gate of an autonomous coding loop. Running the full agent is costly.
You get a digest of what changed since the agent's last run. Decide whether anything MATERIAL changed:
something that gives the agent new work or new information (a changed task list, new or edited project
files made by someone else, new messages or memories, a failing step that can now succeed). Kiro's own
bookkeeping is already left out. Answer only by calling the tool precheck_result."""


@dataclass
class Snapshot:
    """What the loop's world looked like when a run (or iteration) ended: the baseline."""

    at: str
    task_text: str = ""
    files: dict[str, list[int]] = field(default_factory=dict)  # path -> [size, mtime_ns]
    files_truncated: bool = False
    memory_max_id: int = 0
    messages: int = 0
    attempted_step: str | None = None  # the step the last iteration worked on (every_iteration)


@dataclass
class Decision:
    passed: bool
    reason: str
    asked: bool = False  # the pre-check model was called
    failed: bool = False  # the call failed or gave no answer: passed by failing open
    stopped: bool = False  # a stop condition ended the wait for the answer: the caller stops, no event
    changes: str = ""
    usage: Usage = field(default_factory=Usage)


# -- the baseline ----------------------------------------------------------------------------


def _baseline_path(loop: LoopHandle) -> Path:
    return loop.ws.state_dir / "precheck" / f"{loop.state.task_id}.json"


def load(loop: LoopHandle) -> Snapshot | None:
    try:
        raw = json.loads(_baseline_path(loop).read_text(encoding="utf-8"))
        return Snapshot(**{k: v for k, v in raw.items() if k in Snapshot.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None  # none yet, or unreadable: the gate passes (fails open)


def _walk(root: Path, ws_root: Path) -> tuple[dict[str, list[int]], bool]:
    """path (relative to the project) -> [size, mtime_ns]; strings, not Paths: one stat a file."""
    files: dict[str, list[int]] = {}
    top, own = str(root), str(ws_root)
    cut = len(top) + 1
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            it = os.scandir(folder)
        except OSError:
            continue
        with it:
            for entry in it:
                name = entry.name
                if name in SKIP_NAMES or (name in KIRO_OWN and folder == own) or name.endswith(TEMP_SUFFIX):
                    continue  # (a temp file: kiro's atomic write of Dashboard.md or a task file, there a moment)
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        if len(files) >= MAX_FILES:
                            return files, True
                        st = entry.stat(follow_symlinks=False)
                        files[entry.path[cut:]] = [st.st_size, st.st_mtime_ns]
                except OSError:
                    continue
    return files, False


def _memory_max_id(loop: LoopHandle) -> int:
    db = loop.ws.memory_db()
    if not db.exists():
        return 0
    import sqlite3  # here: a run without the pre-check gate never needs it (a start's imports, issue #12)

    with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True,
                                                                                timeout=5)) as conn:
        row = conn.execute("SELECT max(id) FROM memories").fetchone()
        return int(row[0] or 0)
    return 0


def _new_memories(loop: LoopHandle, after: int) -> list[str]:
    db = loop.ws.memory_db()
    if not db.exists():
        return []
    import sqlite3  # here: a run without the pre-check gate never needs it (a start's imports, issue #12)

    with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True,
                                                                                timeout=5)) as conn:
        rows = conn.execute("SELECT source, content FROM memories WHERE id > ? ORDER BY id LIMIT ?",
                            (after, MAX_MEMORIES)).fetchall()
        return [f"{src}: {' '.join(str(text).split())[:200]}" for src, text in rows]
    return []


def take(loop: LoopHandle, attempted_step: str | None = None) -> Snapshot:
    try:
        task_text = loop.task_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        task_text = ""
    task_text = re.sub(_IN_PROGRESS, r"\1[ ]", task_text)  # kiro's own `[-]` while a step runs is no change
    files, truncated = _walk(loop.project_dir, loop.ws.root.resolve())
    with contextlib.suppress(ValueError):
        files.pop(str(loop.task_path.resolve().relative_to(loop.project_dir.resolve())), None)  # described apart
    return Snapshot(at=timeutil.iso(), task_text=task_text, files=files, files_truncated=truncated,
                    memory_max_id=_memory_max_id(loop), messages=len(Inbox(loop.ws, loop.state.task_id).all()),
                    attempted_step=attempted_step)


def save(loop: LoopHandle, snap: Snapshot) -> None:
    """Atomic but not fsync'd: a baseline lost in a crash only makes the next gate pass."""
    path = _baseline_path(loop)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(asdict(snap), ensure_ascii=False), fsync=False)


async def remember(loop: LoopHandle, attempted_step: str | None = None) -> None:
    """Save the baseline the next check compares with: call it when a run (or iteration) ends."""
    if loop.cfg.llm.precheck_model is None:
        return
    snap = await asyncio.to_thread(take, loop, attempted_step)
    await asyncio.to_thread(save, loop, snap)


# -- the digest ------------------------------------------------------------------------------


def describe(loop: LoopHandle, before: Snapshot, now: Snapshot,
             step_line: str | None) -> tuple[str, str]:
    """(the digest for the pre-check model, a one-line summary for the event)."""
    s = loop.state
    lines = [f"Task {s.title or s.task_id!r} ({s.task_id}); the last check's baseline was taken {before.at} (when "
             f"the agent's last run or turn ended); now {now.at}."]
    if step_line:
        lines.append(step_line)
    if before.task_text == now.task_text:
        lines.append("\nTask file: unchanged.")
        task_note = "task file unchanged"
    else:
        import difflib

        diff = list(difflib.unified_diff(before.task_text.splitlines(), now.task_text.splitlines(), "before",
                                         "now", lineterm="", n=1))
        lines.append("\nTask file changed:")
        lines.extend(diff[:MAX_DIFF_LINES])
        if len(diff) > MAX_DIFF_LINES:
            lines.append(f"... ({len(diff) - MAX_DIFF_LINES} more diff lines)")
        task_note = "task file changed"
    added = sorted(set(now.files) - set(before.files))
    removed = sorted(set(before.files) - set(now.files))
    modified = sorted(p for p in set(now.files) & set(before.files) if now.files[p] != before.files[p])
    if added or removed or modified:
        lines.append(f"\nProject files: {len(added)} added, {len(modified)} modified, {len(removed)} removed:")
        listed = [f"+ {p} ({now.files[p][0]} bytes)" for p in added] + \
                 [f"~ {p} ({before.files[p][0]} -> {now.files[p][0]} bytes)" for p in modified] + \
                 [f"- {p}" for p in removed]
        lines.extend(listed[:MAX_LISTED])
        if len(listed) > MAX_LISTED:
            lines.append(f"... and {len(listed) - MAX_LISTED} more")
    else:
        lines.append("\nProject files: none added, modified or removed.")
    if now.files_truncated:
        lines.append(f"(only the first {MAX_FILES} project files were compared)")
    memories = _new_memories(loop, before.memory_max_id) if now.memory_max_id > before.memory_max_id else []
    lines.append(f"\nNew memories: {len(memories) or 'none'}" + (":" if memories else "."))
    lines.extend(f"- {m}" for m in memories)
    arrived = max(now.messages - before.messages, 0)
    lines.append(f"\nMessages that arrived (all already delivered): {arrived or 'none'}.")
    summary = (f"{task_note}; files: {len(added)} added, {len(modified)} modified, {len(removed)} removed; "
               f"{len(memories)} new memories; {arrived} messages")
    return loop.redact.text("\n".join(lines)), summary


# -- asking the pre-check model --------------------------------------------------------------


async def ask(loop: LoopHandle, digest: str) -> Decision:
    """One call to the pre-check model. Any failure passes (fails open)."""
    import openai  # here: only a loop with a pre-check model loads the client

    from kiro.executors.openai_agent import SharedClient, endpoint, message_of, usage_of

    llm = loop.cfg.llm
    model = llm.precheck_model or ""
    base_url, api_key = endpoint(llm)
    if api_key is None:
        return Decision(True, f"the pre-check could not run: no API key in ${llm.api_key_env}", failed=True)
    shared = SharedClient(base_url, api_key, llm)
    del api_key
    call = asyncio.ensure_future(shared.chat({
        "model": model, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": digest}],
        "tools": [TOOL], "max_tokens": REPLY_TOKENS, "temperature": 0}))
    # a stop hook, a moved task file or a signal ends the wait for the answer (SPEC §6: within 1 s)
    watch = asyncio.ensure_future(loop.wait(llm.request_timeout_seconds * (llm.max_retries + 1) + 5))
    try:
        done, _ = await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
        if call not in done:
            call.cancel()
            await asyncio.wait({call})
            return Decision(True, "stopped while the pre-check model answered", asked=True, failed=True,
                            stopped=True)
        response = call.result()
    except (openai.OpenAIError, ValueError) as exc:  # ValueError: a reply that is not a JSON object
        status = getattr(exc, "status_code", None)
        what = f"HTTP {status}" if status else type(exc).__name__
        return Decision(True, f"the pre-check call failed ({what}); running anyway", asked=True, failed=True)
    finally:
        watch.cancel()
        await shared.close()
    usage = Usage(api_calls=1)
    counted = usage_of(response)
    if counted is not None:
        usage.prompt_tokens, usage.completion_tokens, total = counted
        usage.total_tokens = total or usage.prompt_tokens + usage.completion_tokens
        price = llm.prices.get(model)
        if price is not None:
            usage.cost_usd = (usage.prompt_tokens * price.input_per_1m
                              + usage.completion_tokens * price.output_per_1m) / 1_000_000
    listed = message_of(response).get("tool_calls")
    for tc in listed if isinstance(listed, list) else []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or fn.get("name") != "precheck_result":
            continue
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict) or not isinstance(args.get("material_change"), bool):
            return Decision(True, "the pre-check answer was malformed; running anyway", asked=True, failed=True,
                            usage=usage)
        reason = " ".join(str(args.get("reason") or "").split())[:500] or "(no reason given)"
        return Decision(bool(args["material_change"]), reason, asked=True, usage=usage)
    return Decision(True, "the pre-check model did not call precheck_result; running anyway", asked=True,
                    failed=True, usage=usage)


# -- the gate --------------------------------------------------------------------------------


async def decide(loop: LoopHandle, scope: Scope, step_id: str | None = None,
                 step_line: str | None = None) -> Decision:
    """Pass or skip, without side effects beyond the model call (its usage is in the decision)."""
    if Inbox(loop.ws, loop.state.task_id).has_pending():
        return Decision(True, "a message is waiting")
    before = await asyncio.to_thread(load, loop)
    if before is None:
        return Decision(True, "no earlier run to compare with")
    if scope == "iteration" and step_id is not None and step_id != before.attempted_step:
        return Decision(True, f"step {step_id} was not tried at the last check: new work")
    now = await asyncio.to_thread(take, loop)
    digest, summary = describe(loop, before, now, step_line)
    decision = await ask(loop, digest)
    decision.changes = summary
    return decision


async def check(loop: LoopHandle, scope: Scope, step_id: str | None = None, step_line: str | None = None,
                next_check_seconds: float | None = None) -> bool:
    """Decide, count the call's usage, and log `precheck_passed` or `precheck_skipped`. True: run."""
    model = loop.cfg.llm.precheck_model
    if model is None:
        return True
    decision = await decide(loop, scope, step_id, step_line)
    if decision.stopped:
        return True  # the caller's next stop check ends the loop; neither passed nor skipped
    if decision.asked:
        loop.state.usage.add(decision.usage)
        loop.guardrails.record_side_call(decision.usage)
    if decision.passed:
        loop.emit(ev.PrecheckPassed(model=model, scope=scope, reason=decision.reason, asked=decision.asked,
                                    failed=decision.failed, changes=decision.changes or None))
        return True
    loop.emit(ev.PrecheckSkipped(model=model, scope=scope, reason=decision.reason, changes=decision.changes,
                                 next_check_seconds=next_check_seconds))
    return False


async def check_run(loop: LoopHandle) -> bool:
    """Before a scheduled run starts; False means skip this fire (the event `precheck_skipped` is
    logged). `remember(loop)` when a run that went ahead ends."""
    return await check(loop, "run")


# -- every_iteration: the engine's hooks -----------------------------------------------------


async def before_iteration(loop: LoopHandle, step_id: str, attempts: int) -> tuple[Stop | None, bool]:
    """(a stop condition that ended the wait, go ahead?). A skipped iteration sleeps
    `llm.precheck_sleep_seconds` (status `sleeping`; a stop hook or a message ends it), then the
    loop looks again."""
    line = f"The step now due: {step_id}, tried {attempts} time(s) already."
    last_error = loop.state.steps[step_id].last_error if step_id in loop.state.steps else None
    if last_error:
        line += f" Its last attempt failed with: {' '.join(last_error.split())[:300]}"
    seconds = loop.cfg.llm.precheck_sleep_seconds
    if await check(loop, "iteration", step_id, line, next_check_seconds=seconds):
        stop = loop.interrupt_check()
        return stop, stop is None
    s = loop.state
    loop.transition(Status.SLEEPING, "precheck_skipped")
    s.sleep_until = timeutil.iso(timeutil.now() + timedelta(seconds=seconds))
    await loop.asave()
    try:
        stop = await loop.wait(seconds, messages=True)
    finally:
        s.sleep_until = None
    if stop is None:
        loop.transition(Status.RUNNING, "precheck_over")
    return stop, False


async def after_iteration(loop: LoopHandle, step_id: str) -> None:
    await remember(loop, attempted_step=step_id)
