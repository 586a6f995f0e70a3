"""The fast read path: `kiro loop status`, `state`, `logs` and `progress` with the standard library only
(`progress` draws its table with rich, as the full CLI does).

`python -m kiro` (and the `kiro` script) come here first. When the command line is one of those read
commands, with options this module understands, and the workspace holds nothing it has doubts
about, it prints the answer itself: no Typer (whose option validators import pydantic), no pydantic,
no yaml, no asyncio, no filelock. Anything else, or any doubt (a state file that is not exactly what
kiro writes, an error to report, a config not yet checked, a terminal that wants colour), and it
returns None before printing a byte: the full CLI then runs and says what it always says. So the
output is the full path's, byte for byte (tests/test_fastread.py compares them).

- The config. Reading it needs yaml and pydantic; what a read command needs of it is
  `state_directory`, and whether it is valid (a broken config is read with defaults, with a warning).
  So the full path, after resolving the config for a read command, records what it found in
  `.state/read_path.json` (the config file's size, mtime and inode; kiro's version; the state
  directory). While the file and the config-changing environment (`KIRO_*` config variables,
  `OPENAI_BASE_URL`) are as recorded, that answer holds; otherwise the full path runs once more.
- The state. A state file (its journal replayed, kiro.journal) is taken only when it has exactly the
  shape kiro writes (every field, in order, each of its type: `state_shape_ok`); one that does not is
  left to pydantic and its backups.
- The summary (`.state/autonomous_loop_<task_id>.summary`, written by the loop on every save; format
  in kiro.journal): what `status` shows of a loop, a few hundred bytes, read instead of the state.
- `logs --tail N` reads the event log backwards from its end, a block at a time, until it has N
  events: the cost is that of N events, not of the whole log.
"""

from __future__ import annotations

import atexit
import gc
import json
import math
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any

READ_COMMANDS = ("status", "state", "logs", "progress")
STAMP_NAME = "read_path.json"


class Fallback(Exception):
    """The fast path will not answer this one: the full CLI does."""


# -- entry -----------------------------------------------------------------------------------------


def entry() -> None:
    """`python -m kiro` and the `kiro` script."""
    # The last exit handler to run (they run last-registered first): what the process still holds is
    # left out of the interpreter's final collection, which walks every object kiro and pydantic made
    # (~5% of a one-step `kiro loop start`, bench/startup.py --instructions). A cycle of garbage left
    # at that moment is not collected; the system takes the memory back. No write of kiro's waits on
    # it: its files are written through descriptors it closes, or in `with` blocks.
    atexit.register(gc.freeze)
    code = run(sys.argv[1:])
    if code is None:
        from kiro import faststart

        code = faststart.run(sys.argv[1:])
    if code is None:
        from kiro.cli import main

        main()
        return
    sys.exit(code)


def run(argv: list[str]) -> int | None:
    """Answer a read command and return its exit code, or None (nothing printed) for the full CLI."""
    if len(argv) < 2 or argv[0] != "loop" or argv[1] not in READ_COMMANDS or os.environ.get("KIRO_NO_FAST_READ"):
        return None
    try:
        opts = _parse(argv[1], argv[2:])
        render = _COMMANDS[argv[1]](opts)
    except Fallback:
        return None
    except Exception:
        if os.environ.get("KIRO_FAST_READ_STRICT"):  # tests: a bug here must not hide behind the full path
            raise
        return None
    try:
        render()
        sys.stdout.flush()
    except OSError as exc:
        from kiro import output

        if isinstance(exc, BrokenPipeError):  # `kiro loop logs --json | head -1`
            output.to_devnull(sys.stdout)
        elif output.stdout_full(exc):  # `kiro loop status > /dev/full`
            return output.stdout_failed(exc)
        else:
            raise
    return 0


# -- the command line ------------------------------------------------------------------------------

_VALUED = {"--task-id": "task_id", "--task": "task", "--workspace": "workspace", "-w": "workspace",
           "--tail": "tail", "-n": "tail"}
_FLAGS = {"--json": "json"}
_ALLOWED = {"status": {"task_id", "task", "workspace", "json"}, "state": {"task_id", "task", "workspace", "json"},
            "logs": {"task_id", "task", "workspace", "json", "tail"},
            "progress": {"task_id", "task", "workspace", "json"}}


def _parse(command: str, args: list[str]) -> dict[str, Any]:
    """The options of a read command, as click would read them; anything unusual is a Fallback."""
    opts: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in _FLAGS and not eq:
            key = _FLAGS[name]
            opts[key] = True
        elif name in _VALUED:
            key = _VALUED[name]
            if not eq:
                if i + 1 >= len(args):
                    raise Fallback
                value = args[i + 1]
                i += 1
            if value.startswith("-") and key != "tail":
                raise Fallback  # let click decide what `--task-id --json` means
            opts[key] = value
        else:
            raise Fallback
        if key not in _ALLOWED[command]:
            raise Fallback
        i += 1
    if "tail" in opts:
        try:
            opts["tail"] = int(opts["tail"].strip())
        except ValueError:
            raise Fallback from None
        if opts["tail"] < 0:
            raise Fallback  # the Typer path says what is wrong
    return opts


# -- the workspace ---------------------------------------------------------------------------------


def _workspace(opts: dict[str, Any]) -> Any:
    """The workspace with its state directory, when the full path's answer for it is on record."""
    from kiro.errors import KiroError
    from kiro.workspace import Workspace

    try:
        ws = Workspace.find(opts.get("workspace"))
    except KiroError:
        raise Fallback from None
    if _config_env():
        raise Fallback
    config = ws.config_file
    try:
        st = os.stat(config)
    except FileNotFoundError:
        state_directory = ".state"
    except OSError:
        raise Fallback from None
    else:
        state_directory = _stamped_state_directory(ws.root, st)
    ws = ws.with_state_directory(state_directory)
    try:
        ws.check_folders()
    except KiroError:
        raise Fallback from None
    return ws


# kiro.config.ENV_KEYS (tests/test_fastread.py keeps them equal)
CONFIG_ENV_KEYS = frozenset({"KIRO_MAX_ITERATIONS", "KIRO_FAILURE_THRESHOLD", "KIRO_TIMEOUT_SECONDS", "KIRO_EXECUTOR",
                             "KIRO_EXECUTOR_COMMAND", "KIRO_AGENT", "KIRO_MODEL", "KIRO_VERIFY", "KIRO_BASE_URL",
                             "KIRO_PROJECT_DIR", "KIRO_INCLUDE_OPTIONAL"})


def _config_env() -> bool:
    """Whether the environment sets config (kiro.config._env_settings would read it)."""
    for var, value in os.environ.items():
        upper = var.upper()
        if value != "" and upper.startswith("KIRO_") and ("__" in var or upper in CONFIG_ENV_KEYS):
            return True
    return "OPENAI_BASE_URL" in os.environ


def _stamp_key(st: os.stat_result) -> list[Any]:
    from kiro import __version__

    return [__version__, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def _stamped_state_directory(root: Path, st: os.stat_result) -> str:
    try:
        record = json.loads((root / ".state" / STAMP_NAME).read_bytes())
    except (OSError, ValueError):
        raise Fallback from None
    if not isinstance(record, dict) or record.get("config") != _stamp_key(st):
        raise Fallback
    state_directory = record.get("state_directory")
    if not isinstance(state_directory, str):
        raise Fallback
    return state_directory


_checked: tuple[Path, str] | None = None


def record_config_checked(root: Path, state_directory: str) -> None:
    """The full path resolved the config for a read command without complaint: note it, so that the
    next read command may take the fast path while the config file stays as it is. The note is
    written when the command ends with exit 0 (`write_config_checked`): a command that fails changes
    no file."""
    global _checked
    _checked = (root, state_directory)


def write_config_checked() -> None:
    global _checked
    if _checked is None:
        return
    root, state_directory = _checked
    _checked = None
    if _config_env():
        return
    folder = root / ".state"
    try:
        st = os.stat(root / "config" / "autonomous_loop.yaml")
        if not folder.is_dir():
            return
        record = {"config": _stamp_key(st), "state_directory": state_directory}
        path = folder / STAMP_NAME
        try:
            if json.loads(path.read_bytes()) == record:
                return
        except (OSError, ValueError):
            pass
        tmp = folder / f".{STAMP_NAME}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        return


# -- state files -----------------------------------------------------------------------------------

# The fields of kiro.state's models, in order, with their types (tests/test_fastread.py checks them
# against the pydantic models). A file whose shape differs in any way is left to pydantic.
# Types: int float bool str iso retry any; "?x" optional; "[x" list of; "{x" dict of str to; a tuple: literals.
_MODELS: dict[str, tuple[tuple[str, Any], ...]] = {
    "CurrentStep": (("step_id", "str"), ("description", "str"),
                    ("status", ("pending", "in_progress", "completed", "failed", "waiting_retry", "interrupted")),
                    ("started_at", "?iso")),
    "CompletedStep": (("step_id", "str"), ("description", "str"), ("completed_at", "iso"),
                      ("duration_seconds", "float"), ("iteration", "?int"), ("attempts", "int"), ("summary", "str"),
                      ("checkpoint", "?str"), ("checkpoint_note", "?str")),
    "FailedStep": (("step_id", "str"), ("description", "str"), ("failed_at", "iso"), ("error", "str"),
                   ("retry_count", "int"), ("iteration", "?int")),
    "Context": (("last_prompt", "str"), ("last_response", "str"), ("environment", "{str")),
    "StopConditions": (("task_in_done", "bool"), ("max_iterations_reached", "bool"),
                       ("failure_threshold_exceeded", "bool"), ("stop_hook_triggered", "bool"),
                       ("manual_intervention", "bool")),
    "Metrics": (("total_duration_seconds", "float"), ("average_step_duration", "float"), ("success_rate", "float")),
    "Usage": (("prompt_tokens", "int"), ("completion_tokens", "int"), ("total_tokens", "int"), ("api_calls", "int"),
              ("cost_usd", "float")),
    "StepRecord": (("attempts", "int"), ("last_error", "?str"), ("next_retry_at", "?retry"),
                   ("last_verify_output", "?str")),
    "Transition": (("at", "str"), ("from", "str"), ("to", "str"), ("reason", "?str")),
    "RollbackRecord": (("at", "str"), ("to_step", "str"), ("checkpoint", "?str"), ("commit", "?str"),
                       ("method", ("restore", "revert")), ("undone", "[str"), ("unchecked", "[str")),
    "GitInfo": (("checkpoints", "bool"), ("isolation", ("none", "worktree")), ("merge", ("manual", "auto")),
                ("toplevel", "?str"), ("project_rel", "str"), ("worktree", "?str"), ("branch", "?str"),
                ("base_branch", "?str"), ("base_commit", "?str"),
                ("merge_status", ("merging", "merged", "conflict", "left", None)), ("merge_commit", "?str"),
                ("conflict_files", "[str"), ("rollbacks", "[RollbackRecord")),
    "LoopState": (("schema_version", "int"), ("task_id", "str"), ("task_path", "str"), ("status", "status"),
                  ("started_at", "iso"), ("updated_at", "iso"), ("iteration", "int"), ("max_iterations", "int"),
                  ("consecutive_failures", "int"), ("failure_threshold", "int"), ("total_failures", "int"),
                  ("total_successes", "int"), ("current_step", "?CurrentStep"), ("completed_steps", "[CompletedStep"),
                  ("failed_steps", "[FailedStep"), ("context", "Context"), ("stop_conditions", "StopConditions"),
                  ("metrics", "Metrics"), ("workspace", "str"), ("pid", "?int"), ("host", "?str"),
                  ("executor", "?str"), ("stop_reason", "?str"), ("sleep_until", "?str"), ("timeout_reached", "bool"),
                  ("timeout_seconds", "?float"), ("title", "?str"), ("usage", "Usage"), ("steps", "{StepRecord"),
                  ("history", "[Transition"), ("guardrails", "{any"), ("runs", "int"), ("finished_at", "?iso"),
                  ("report_path", "?str"), ("steps_total", "?int"), ("steps_done", "?int"), ("git", "?GitInfo"),
                  ("last_run_at", "?iso"), ("next_run_at", "?iso"), ("schedule", "?ScheduleInfo"),
                  ("journal_seq", "int")),
    "ScheduleInfo": (("expression", "str"), ("stateful", "bool"), ("phase", ("waiting", "running")),
                     ("run_started_at", "?str"), ("run_iteration_base", "int"), ("run_elapsed_base", "float"),
                     ("run_tokens_base", "int"), ("fires", "int")),
}
RECORDED = frozenset({"pending", "running", "sleeping", "paused", "stopped", "completed", "failed", "max_iterations",
                      "timed_out"})
RETRY_HORIZON = timedelta(days=366)


def _parse_time(text: str) -> datetime:
    dt = datetime.fromisoformat(text)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _ok(value: Any, kind: Any) -> bool:
    if isinstance(kind, tuple):
        return value in kind and (value is None or isinstance(value, str))
    if kind[0] == "?":
        return value is None or _ok(value, kind[1:])
    if kind[0] == "[":
        return isinstance(value, list) and all(_ok(v, kind[1:]) for v in value)
    if kind[0] == "{":
        return isinstance(value, dict) and all(isinstance(k, str) and _ok(v, kind[1:]) for k, v in value.items())
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return type(value) is int
    if kind == "float":
        return type(value) is float and math.isfinite(value)
    if kind == "bool":
        return type(value) is bool
    if kind == "any":
        return True
    if kind == "status":
        return value in RECORDED and isinstance(value, str)
    if kind in ("iso", "retry"):
        if not isinstance(value, str):
            return False
        try:
            when = _parse_time(value)
        except (ValueError, TypeError):
            return False
        return kind == "iso" or when <= datetime.now(UTC) + RETRY_HORIZON
    fields = _MODELS[kind]
    if not isinstance(value, dict) or len(value) < len(fields):
        return False
    keys = iter(value)
    for (name, sub), key in zip(fields, keys, strict=False):
        if name != key or not _ok(value[name], sub):
            return False
    return True


def state_shape_ok(data: Any, task_id: str) -> bool:
    """Whether `data` is a state exactly as kiro writes it: pydantic would take it as it is, and dump
    it back the same."""
    from kiro.workspace import TASK_ID_RE

    return (_ok(data, "LoopState") and data["task_id"] == task_id and bool(TASK_ID_RE.match(task_id))
            and ".." not in task_id)


def _no_constants(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity: pydantic refuses them


def _read_state(path: Path) -> Any:
    """The state in `path` with its journal (if any) replayed, as StateStore._read reads it."""
    from kiro import journal, safeio

    def read() -> bytes:
        return safeio.read_bytes(path, limit=safeio.STATE_MAX_BYTES)

    try:
        raw = read()
        if journal.journal_path(path).exists():
            data = journal.with_journal(path, raw, read)
            if not _finite(data):
                raise Fallback
            return data
        return json.loads(raw, parse_constant=_no_constants)
    except FileNotFoundError:
        raise
    except (ValueError, OSError, safeio.UnreadableFile):
        raise Fallback from None


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere (pydantic refuses them in a state)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _load_state(ws: Any, task_id: str) -> tuple[dict[str, Any], Path]:
    """A loop's state, from its state file or the archive's (as StateStore.load)."""
    for path in (ws.state_file(task_id), ws.archived_state_file(task_id)):
        if not path.exists():
            continue
        data = _read_state(path)
        if not state_shape_ok(data, task_id):
            raise Fallback
        return data, path
    raise Fallback  # no such loop: the full path says so


def _state_files(ws: Any) -> list[tuple[str, Path]]:
    """(task id, path) of every state file, main folder first then the archive, as StateStore.all_states
    walks them (unsorted)."""
    return [(tid, Path(path)) for tid, path in _state_entries(str(ws.state_dir))]


def _state_entries(state_dir: str) -> list[tuple[str, str]]:
    """(task id, path) of every state file, main folder first then the archive; a task id once."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for folder in (state_dir, os.path.join(state_dir, "archive")):
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            raise Fallback from None
        for entry in entries:
            name = entry.name
            if not (name.startswith("autonomous_loop_") and name.endswith(".json")) or len(name) < 21:
                continue
            tid = name[16:-5]
            if tid not in seen:
                seen.add(tid)
                out.append((tid, entry.path))
    return out


# -- the summary: what `status` shows of a loop ------------------------------------------------------
#
# Written by the loop on every save, beside its state file (`autonomous_loop_<id>.summary`, format and
# writer in kiro.journal, which owns it; this module reads it). It lacks the loop's history, so a
# sleeping loop's row (which says why it sleeps) comes from the state.

SUMMARY_NEEDS = ("task_id", "task_path", "title", "status", "stop_reason", "updated_at", "iteration", "max_iterations",
                 "consecutive_failures", "failure_threshold", "total_failures", "steps_done", "steps_total",
                 "executor", "pid", "report_path", "sleep_until", "runs", "metrics", "usage", "current_step",
                 "schedule", "last_run_at", "next_run_at")


def _summary_ok(data: Any, task_id: str) -> bool:
    """A summary kiro wrote for this loop, with every field a status row needs (kiro wrote it from a
    checked state: the shape is enough)."""
    return (type(data) is dict and data.get("task_id") == task_id and data.get("status") in RECORDED
            and data["status"] != "sleeping" and all(k in data for k in SUMMARY_NEEDS)
            and type(data["updated_at"]) is str and type(data["metrics"]) is dict and type(data["usage"]) is dict)


SUMMARY_MAGIC = b"kiro-summary 1 "  # kiro.journal.SUMMARY_MAGIC


def decode_summary(data: bytes) -> dict[str, Any] | None:
    """kiro.journal.decode_summary, without importing kiro.journal (typing, threading: ~5 ms of a
    status that must cost little more than starting Python). tests/test_fastread.py compares them."""
    if not data.startswith(SUMMARY_MAGIC):
        return None
    head, _, rest = data.partition(b"\n")
    parts = head[len(SUMMARY_MAGIC):].split()
    try:
        crc, length = int(parts[0], 16), int(parts[1])
    except (IndexError, ValueError):
        return None
    body = rest[:length]
    from zlib import crc32

    if len(body) != length or crc32(body) != crc:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _status_sources(ws: Any) -> list[dict[str, Any]]:
    """What `status` shows of every loop, in StateStore.all_states' order: per loop its summary,
    else its state (plain strings, no Path, where this runs once per loop)."""
    return [_status_source(tid, path)[0] for tid, path in _state_entries(str(ws.state_dir))]


def _status_source(tid: str, path: str) -> tuple[dict[str, Any], bool]:
    """What `status` shows of one loop, and whether it came from its summary."""
    data = None
    for _ in range(3):  # a summary read while it is rewritten fails its CRC: read it again
        try:
            fd = os.open(path[:-5] + ".summary", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            break
        try:
            data = decode_summary(_read_fd(fd))
        except OSError:
            break
        finally:
            os.close(fd)
        if data is not None:
            break
    if _summary_ok(data, tid):
        return data, True  # type: ignore[return-value]
    data = _read_state(Path(path))
    if not state_shape_ok(data, tid):
        raise Fallback
    return data, False


def _read_fd(fd: int, limit: int = 1 << 20) -> bytes:
    """Up to `limit` bytes of a small file (a summary: a few hundred bytes), without allocating the
    limit for each one."""
    data = os.read(fd, 16384)
    if len(data) < 16384:
        return data
    parts = [data]
    size = len(data)
    while size < limit:
        more = os.read(fd, min(1 << 16, limit - size))
        if not more:
            break
        parts.append(more)
        size += len(more)
    return b"".join(parts)


# -- rows (kiro.views.loop_row on plain data) ----------------------------------------------------------


class _Locks:
    """Which lock files some process holds: /proc/locks read once (kiro.locks.is_held, batched)."""

    def __init__(self) -> None:
        self.table: set[tuple[int, int, int]] | None = None

    def held(self, path: str) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        if self.table is None:
            try:
                text = Path("/proc/locks").read_text()
            except OSError:
                raise Fallback from None
            table = set()
            for line in text.splitlines():
                fields = line.split()
                if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields[:2]:
                    continue
                try:
                    major, minor, ino = fields[5].split(":")
                    table.add((int(major, 16), int(minor, 16), int(ino)))
                except ValueError:
                    continue
            self.table = table
        return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in self.table


def _human_duration(seconds: float | None) -> str:
    global _human_duration  # noqa: PLW0603 - bind the real one on first use (no import per row)
    from kiro.timeutil import human_duration

    _human_duration = human_duration
    return human_duration(seconds)


_STATUSES: dict[str, Any] = {}


def _status_of(value: str) -> Any:
    """kiro.status.Status(value), from a table built once (the enum's lookup costs more, per row)."""
    if not _STATUSES:
        from kiro.status import Status

        _STATUSES.update({s.value: s for s in Status})
    return _STATUSES[value]


def loop_row(ws: Any, s: dict[str, Any], locks: _Locks, global_hook: bool) -> dict[str, Any]:
    """kiro.views.loop_row for a state (or summary) as plain data."""
    recorded = _status_of(s["status"])
    alive = locks.held(f"{ws.state_dir}/autonomous_loop_{s['task_id']}.lock") if recorded.may_be_alive else False
    status = _status_of("interrupted") if recorded.is_active and not alive else recorded
    metrics = s["metrics"]
    duration = metrics["total_duration_seconds"]
    if alive and status.is_active:
        duration += max(0.0, (datetime.now(UTC) - _parse_time(s["updated_at"])).total_seconds())
    cur = s["current_step"]
    eta = None
    if status.is_active or status in ("paused", "interrupted"):
        total, done, avg = s["steps_total"], s["steps_done"], metrics["average_step_duration"]
        if total is not None and done is not None and avg and total - done > 0:
            eta = _human_duration((total - done) * avg)
    command = f"kiro loop resume --task-id {s['task_id']}"
    if status.is_resumable:
        hint: str | None = "kiro loop resume --all" if global_hook else command
    else:
        flag = status.resume_flag
        hint = f"{command} {flag.format(more=s['max_iterations'] * 2)}" if flag else None
    return {
        "task_id": s["task_id"],
        "task_path": s["task_path"],
        "title": s["title"],
        "status": str(status),
        "recorded_status": str(recorded),
        "stop_reason": s["stop_reason"],
        "iteration": s["iteration"],
        "max_iterations": s["max_iterations"],
        "success_rate": metrics["success_rate"],
        "current_step": f"{cur['step_id']} {cur['description']}" if cur else None,
        "current_step_id": cur["step_id"] if cur else None,
        "steps_done": s["steps_done"],
        "steps_total": s["steps_total"],
        "consecutive_failures": s["consecutive_failures"],
        "failure_threshold": s["failure_threshold"],
        "total_failures": s["total_failures"],
        "duration_seconds": round(duration, 3),
        "duration": _human_duration(duration),
        "eta": eta,
        "executor": s["executor"],
        "pid": s["pid"] if alive else None,
        "alive": alive,
        "updated_at": s["updated_at"],
        "usage": s["usage"],
        "report_path": s["report_path"],
        **_schedule_fields(s),
        **_sleep_fields(s, status),
        "hint": hint,
    }


def _sleep_reason(to: str, reason: str | None) -> str | None:
    """Why the loop sleeps, from its last transition (kiro.views.sleep_fields)."""
    return reason if to == "sleeping" else None


def _sleep_fields(s: dict[str, Any], status: Any) -> dict[str, Any]:
    """kiro.views.sleep_fields: why a sleeping loop sleeps, and until when; {} otherwise."""
    if status != "sleeping":
        return {}
    if "history" in s:  # a state file
        last = s["history"][-1] if s["history"] else None
        reason = _sleep_reason(last["to"], last["reason"]) if last is not None else None
    else:  # a summary
        reason = s["sleep_reason"]
    return {"sleeping_because": reason, "sleep_until": s["sleep_until"]}


def _schedule_fields(s: dict[str, Any]) -> dict[str, Any]:
    """kiro.views.schedule_fields: a recurring task's schedule, runs and next run; {} for a plain loop."""
    sc = s["schedule"]
    if sc is None:
        return {}
    next_run = None
    if s["next_run_at"] and s["status"] != "completed":
        at = _parse_time(s["next_run_at"])
        left = (at - datetime.now(UTC)).total_seconds()
        when = at.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        next_run = f"in {_human_duration(left)} ({when})" if left > 0 else f"due now ({when})"
    return {"schedule": sc["expression"], "stateful": sc["stateful"], "runs": s["runs"],
            "last_run_at": s["last_run_at"], "next_run_at": s["next_run_at"], "next_run": next_run}


def _resolve(ws: Any, opts: dict[str, Any], *, required: bool = True) -> str | None:
    """kiro.views.resolve_task_id, for the cases that need no error and no task-file parsing."""
    from kiro.workspace import TASK_ID_RE

    tid = opts.get("task_id")
    if tid:
        if not TASK_ID_RE.match(tid) or ".." in tid:
            raise Fallback
        return str(tid)
    if opts.get("task"):
        from kiro.errors import KiroError

        try:
            rel = ws.relative(ws.resolve_task(opts["task"]))
        except KiroError:
            raise Fallback from None
        found = []
        for tid, path in _state_files(ws):
            data = _read_state(path)
            if not state_shape_ok(data, tid):
                raise Fallback
            if data["task_path"] == rel:
                found.append(data)
        if not found:
            raise Fallback  # the task file's frontmatter may name the loop: the full path looks
        found.sort(key=lambda d: d["updated_at"], reverse=True)
        return str(found[0]["task_id"])
    if not required:
        return None
    files = _state_files(ws)
    if len(files) != 1:
        raise Fallback  # none, or several: an error the full path words
    return files[0][0]


def _plain_terminal() -> bool:
    """Whether rich would print to stdout exactly the plain text (no colour, no terminal)."""
    if sys.stdout.isatty():
        return False
    return not any(os.environ.get(v) for v in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"))


# -- the commands ------------------------------------------------------------------------------------


def _write_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def _status(opts: dict[str, Any]) -> Any:
    ws = _workspace(opts)
    tid = _resolve(ws, opts, required=False)
    locks = _Locks()
    global_hook = ws.global_hook_file.exists()
    if tid is not None:
        data, _path = _load_state(ws, tid)
        row = loop_row(ws, data, locks, global_hook)

        def detail() -> None:
            from kiro import console

            if opts.get("json"):
                _write_json(row)
            else:
                console.print_table(console.detail_table(row))

        return detail
    from kiro import console
    from kiro.statusindex import StatusIndex

    state_dir = str(ws.state_dir)
    index = StatusIndex(state_dir, global_hook)
    entries = _state_entries(state_dir)
    kind = "json" if opts.get("json") else f"table {console.table_key()}"

    def lock_free(tid: str) -> bool:
        return not locks.held(f"{state_dir}/autonomous_loop_{tid}.lock")

    known = index.output(kind, entries, lock_free)
    if known is not None:  # nothing changed since the last status: its answer (kiro.statusindex)
        return lambda: sys.stdout.write(known)
    rows = []
    for tid, path in entries:
        def make(tid: str = tid, path: str = path) -> tuple[dict[str, Any], bool]:
            data, from_summary = _status_source(tid, path)
            return loop_row(ws, data, locks, global_hook), from_summary

        rows.append(index.row(tid, path, make, lambda tid=tid: lock_free(tid)))  # type: ignore[misc]
    rows.sort(key=lambda r: r["updated_at"], reverse=True)  # the sources' order: each row has its updated_at
    if not rows and not opts.get("json"):
        raise Fallback  # "no loops in ...": rich prints it

    def table() -> None:
        if opts.get("json"):
            text = index.text(kind, lambda: json.dumps(rows, indent=2, ensure_ascii=False, default=str) + "\n")
        else:
            text = index.text(kind, lambda: console.plain_table(rows) + "\n")
        sys.stdout.write(text)
        index.save()

    return table


def _state(opts: dict[str, Any]) -> Any:
    ws = _workspace(opts)
    tid = _resolve(ws, opts)
    assert tid is not None
    data, _path = _load_state(ws, tid)
    return lambda: _write_json(data)


def _logs(opts: dict[str, Any]) -> Any:
    ws = _workspace(opts)
    tid = _resolve(ws, opts)
    assert tid is not None
    path = ws.event_log(tid)
    if not path.exists():
        raise Fallback  # no log (or no loop): the full path words it
    tail = opts.get("tail")
    as_json = bool(opts.get("json"))
    if not as_json and not _plain_terminal():
        raise Fallback
    from kiro import safeio

    try:
        fd = safeio.open_regular(path, fix="move it away; kiro starts a new one")
    except (OSError, safeio.UnreadableFile):
        raise Fallback from None
    try:
        events = _tail_events(fd, tail) if tail is not None else _all_events(fd)
    finally:
        os.close(fd)
    if as_json:
        lines = [json.dumps(e, ensure_ascii=False) for e in events]
    else:
        from kiro.console import event_plain

        try:
            lines = [text for e in events if (text := event_plain(e)) is not None]
        except ValueError:
            raise Fallback from None

    def show() -> None:
        write = sys.stdout.write
        for text in lines:
            write(text + "\n")

    return show


def _all_events(fd: int) -> list[dict[str, Any]]:
    with open(fd, "rb", closefd=False) as fh:
        out = []
        for raw in fh:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


TAIL_BLOCK = 64 * 1024


def _tail_events(fd: int, n: int) -> list[dict[str, Any]]:
    """The last `n` well-formed events (as kiro.events.read_events would end), read backwards from the
    file's end a block at a time: a torn or broken line is skipped as there."""
    if n <= 0:
        return []
    end = os.fstat(fd).st_size
    found: list[dict[str, Any]] = []
    carry = b""  # the start of a line whose beginning lies in an earlier block
    pos = end
    first = True
    while pos > 0 and len(found) < n:
        size = min(TAIL_BLOCK, pos)
        pos -= size
        block = os.pread(fd, size, pos) + carry
        lines = block.split(b"\n")
        carry = lines[0] if pos > 0 else b""
        complete = lines[1:] if pos > 0 else lines
        if first:
            first = False
            if complete and complete[-1] == b"":
                complete.pop()  # the newline that ends the file
        for raw in reversed(complete):
            _take(raw, found)
            if len(found) >= n:
                break
    if pos == 0 and carry and len(found) < n:
        _take(carry, found)
    found.reverse()
    return found


def _take(raw: bytes, found: list[dict[str, Any]]) -> None:
    if not raw.strip():
        return
    try:
        record = json.loads(raw)
    except ValueError:
        return
    if isinstance(record, dict):
        found.append(record)


# -- progress ----------------------------------------------------------------------------------------
#
# kiro.views.progress on plain data. The task file is parsed by kiro.tasks (which imports PyYAML only
# for frontmatter): frontmatter this module can vouch for without YAML (`_plain_frontmatter`) is
# blanked out first (same lines, so the same steps); any other frontmatter goes to the full path.

_FM_LINE = None  # compiled on first use
_YAML_WORDS = frozenset({"yes", "no", "true", "false", "on", "off", "null"})  # YAML 1.1 non-strings, lowercased
_STRING_KEYS = ("title", "instructions", "kiro_task_id")  # kiro.tasks.KIRO_STRING_KEYS (tests compare them)


def _plain_frontmatter(lines: list[str]) -> int:
    """The index of the closing `---` of frontmatter that PyYAML would read as a flat mapping of plain
    words (and, outside kiro's text keys, whole numbers), which kiro.tasks accepts as is; 0 when there
    is no frontmatter. Anything this cannot vouch for is a Fallback."""
    global _FM_LINE
    if not lines or lines[0].rstrip() != "---":
        return 0
    if _FM_LINE is None:
        import re

        _FM_LINE = re.compile(r"([a-z_][a-z0-9_]*): ([A-Za-z][A-Za-z0-9 _.,/()+-]*[A-Za-z0-9.)]|[A-Za-z]|[0-9]{1,9})")
    for i in range(1, len(lines)):
        line = lines[i]
        if line.rstrip() in ("---", "..."):
            return i
        m = _FM_LINE.fullmatch(line)
        if m is None:
            raise Fallback
        value = m.group(2)
        if value.lower() in _YAML_WORDS or (value[0].isdigit() and m.group(1) in _STRING_KEYS):
            raise Fallback
    raise Fallback  # never closed: the full path words the error


def _progress(opts: dict[str, Any]) -> Any:
    if not _plain_terminal():
        raise Fallback  # rich would colour the table
    ws = _workspace(opts)
    tid = _resolve(ws, opts)
    assert tid is not None
    state, _path = _load_state(ws, tid)
    path = ws.absolute(state["task_path"])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        raise Fallback from None  # moved, missing, a link: the full path finds it or says so
    try:
        import stat as stat_

        st = os.fstat(fd)
        if not stat_.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            raise Fallback
        raw = _read_fd(fd, 1 << 20)
    finally:
        os.close(fd)
    from kiro import tasks
    from kiro.errors import KiroError

    try:
        text, bom = tasks._decode(raw, path)
    except KiroError:
        raise Fallback from None
    lines = text.split("\n")
    close = _plain_frontmatter(lines)
    if close:
        text = "\n".join([""] * (close + 1) + lines[close + 1:])  # the same lines, the frontmatter's empty
    tf = tasks._parse(text, path, bom, raw)
    if not tf.steps:
        raise Fallback  # the full path's error
    data = _progress_data(state, tf)

    def show() -> None:
        from kiro import console

        if opts.get("json"):
            _write_json(data)
            return
        console.progress_view(f"{data['title']} ({data['task_path']})", data["steps"], data["steps_done"],
                              data["steps_total"])
        if data.get("schedule"):
            console.line(f"schedule {data['schedule']}: {data.get('runs', 0)} run(s); "
                         f"next run {data.get('next_run') or '-'}")

    return show


def _progress_data(state: dict[str, Any], task: Any) -> dict[str, Any]:
    """kiro.views.progress for a state as plain data and a parsed task file that was found where the
    state says."""
    durations: dict[str, float] = {}
    completed_attempts: dict[str, int] = {}
    checkpoints: dict[str, str | None] = {}
    for c in state["completed_steps"]:
        durations[c["step_id"]] = c["duration_seconds"]
        completed_attempts[c["step_id"]] = c["attempts"]
        checkpoints[c["step_id"]] = c["checkpoint"] or (f"({c['checkpoint_note']})" if c["checkpoint_note"] else None)
    rows: list[dict[str, Any]] = []
    cur = state["current_step"]
    depth: dict[int, int] = {}
    for st in task.steps:
        d = 0 if st.parent is None else depth.get(st.parent, 0) + 1
        depth[st.index] = d
        rec = state["steps"].get(st.id)
        if st.done:
            status = "done"
        elif cur is not None and cur["step_id"] == st.id and cur["status"] in ("in_progress", "waiting_retry",
                                                                                "failed"):
            status = "in_progress" if cur["status"] == "in_progress" else "failed"
        elif st.optional:
            status = "optional"
        else:
            status = "todo"
        rows.append({
            "step_id": st.id, "description": st.title or st.text, "status": status, "optional": st.optional,
            "depth": d, "leaf": st.is_leaf,
            "attempts": (rec["attempts"] if rec and rec["attempts"] else
                         completed_attempts.get(st.id, 0) if st.done else 0),
            "last_error": rec["last_error"] if rec else None,
            "duration_seconds": durations.get(st.id),
            "duration": _human_duration(durations[st.id]) if st.id in durations else None,
            "checkpoint": checkpoints.get(st.id) if st.done else None,
        })
    done = sum(1 for r in rows if r["status"] == "done")
    git = state["git"]
    branch = git["branch"] if git is not None and git["checkpoints"] else None
    return {"task_id": state["task_id"], "task_path": state["task_path"], "title": state["title"] or state["task_path"],
            "steps_done": done, "steps_total": len(rows), "steps": rows, "error": None, "branch": branch,
            **_schedule_fields(state)}


_COMMANDS = {"status": _status, "state": _state, "logs": _logs, "progress": _progress}
