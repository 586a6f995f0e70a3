"""The event log: `Logs/<task_id>.jsonl`, one JSON object per line, appended and flushed as it
happens (SPEC §8), and the typed records it holds (SPEC §10).

Every kind of event is one class of typed fields with a `Literal` `event` tag (`Event`; type-checked
as a dataclass is, checked again when built); `parse` reads any of them by that tag (`MODELS`). The
engine emits typed records; listeners (the log, the terminal,
Dashboard.md, reports, notifiers, a server) receive them. On disk a record is
`{"ts", "task_id", "iteration", "event", ...the kind's fields}`, exactly the keys the call set.

Readers never crash on what they find: a torn last line is skipped, an unknown kind (a newer kiro's)
or a record that does not fit its model reads as `GenericEvent` with every key kept.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple, dataclass_transform

from kiro import diskfull, safeio, timeutil
from kiro.bounds import EVENT_FIELD_CHARS, clip_fields
from kiro.records import (
    FieldError,
    check_any,
    check_bool,
    check_float,
    check_int,
    check_number,
    check_str,
    check_texts,
)
from kiro.redact import Redactor

# -- the fields of a kind, read from its annotations ------------------------------------------
#
# Not pydantic (issue #12): building ~50 pydantic models was a tenth of `kiro loop start`'s
# instructions, and each kind's validator was built again on first use in every run. The types
# events use are few; each gets a check that takes what pydantic's lax mode took of them (a number
# written as text, a StrEnum, a tuple for a list) and turns it into the plain value that is written.


class _Field(NamedTuple):
    """One field of a kind: its check, its default (or a factory making one per event), its key in
    the record. In a class body (`field()`) the check is not known yet, and the key is "" unless given."""

    check: Callable[[Any], Any]
    default: Any
    factory: Callable[[], Any] | None
    key: str


def field(*, default: Any = None, default_factory: Callable[[], Any] | None = None, key: str | None = None) -> Any:
    """A field's default made per event (`default_factory`), or its name in the record when that is
    not a Python name (`key`: `from`). Only in a class body of an Event."""
    return _Field(check_any, default, default_factory, key or "")


_REQUIRED = object()


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "str": check_str, "int": check_int, "float": check_float, "bool": check_bool, "Any": check_any,
    "list[str]": check_texts, "int | float": check_number,
}
_LITERAL = re.compile(r"Literal\[(['\"])(.*)\1\]")


def _check_for(owner: str, name: str, annotation: str) -> Callable[[Any], Any]:
    """The check of one annotation as written in a class body (a string: `from __future__ import
    annotations`). An annotation this does not know is a bug in this file, said at import."""
    if annotation in _CHECKS:
        return _CHECKS[annotation]
    if annotation.endswith(" | None") and annotation[:-7] in _CHECKS:
        inner = _CHECKS[annotation[:-7]]
        return lambda v: None if v is None else inner(v)
    literal = _LITERAL.fullmatch(annotation)
    if literal:
        kind = literal.group(2)

        def same(v: Any) -> str:
            if v != kind:
                raise FieldError(f"{kind!r} is wanted, not {v!r}"[:200])
            return kind
        return same
    raise TypeError(f"{owner}.{name}: kiro.events has no check for the annotation {annotation!r}")


@dataclass_transform(kw_only_default=True, field_specifiers=(field,))
class Event:
    """The envelope every event shares; subclasses add their fields and fix `event`.

    Built from keyword fields (`StepStarted(step_id="1", attempt=2)`), each checked; a field the kind
    does not have, or a required one missing, is a FieldError (a ValueError). `from_record` reads a
    record (its keys as written: `from`, not `from_`)."""

    ts: str = field(default_factory=timeutil.iso)
    task_id: str = ""
    iteration: int = 0
    event: str = ""

    ENVELOPE: ClassVar[tuple[str, ...]] = ("ts", "task_id", "iteration", "event")
    _FIELDS: ClassVar[dict[str, _Field]] = {}  # every field, the base's first, each with its check and key
    _BY_KEY: ClassVar[dict[str, str]] = {}  # a record's key (or the field's name) -> the field's name
    _set: tuple[str, ...]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _collect_fields(cls)

    def __init__(self, /, **values: Any) -> None:
        fields, by_key = self._FIELDS, self._BY_KEY
        given: set[str] = set()
        for key, value in values.items():
            name = by_key.get(key)
            if name is None:
                raise FieldError(f"{type(self).__name__} has no field {key!r} (a typo, or a newer kiro's field)")
            try:
                self.__dict__[name] = fields[name].check(value)
            except FieldError as exc:
                raise FieldError(f"{type(self).__name__}.{name}: {exc}") from None
            given.add(name)
        for name, f in fields.items():
            if name not in given:
                if f.factory is not None:
                    self.__dict__[name] = f.factory()
                elif f.default is _REQUIRED:
                    raise FieldError(f"{type(self).__name__} needs the field {name!r}")
                else:
                    self.__dict__[name] = f.default
        self._set = tuple(name for name in fields if name in given)  # in the order the class names them

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Event:
        """The event a record holds (keys as written on disk); FieldError if it does not fit."""
        return cls(**record)

    def to_record(self) -> dict[str, Any]:
        """The JSON object written to the log: the envelope, then the fields the emitter set
        (a field left at its default is not written, as before events were typed)."""
        record: dict[str, Any] = {"ts": self.ts, "task_id": self.task_id, "iteration": self.iteration,
                                  "event": self.event}
        fields = self._FIELDS
        for name in self._set:
            key = fields[name].key
            if key not in record:
                record[key] = self.__dict__[name]
        return record

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.to_record().items())})"

    # -- a thin read-only mapping view, for listeners written against the dict records ---------

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_record().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.to_record()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_record()


def _collect_fields(cls: type[Event]) -> None:
    """`cls._FIELDS`: its base's, then its own annotations in the order written; `cls._BY_KEY`."""
    fields = dict(cls._FIELDS)
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if annotation.startswith("ClassVar") or name.startswith("_"):
            continue
        value = cls.__dict__.get(name, _REQUIRED)
        spec = value if isinstance(value, _Field) else _Field(check_any, value, None, "")
        fields[name] = _Field(_check_for(cls.__name__, name, annotation), spec.default, spec.factory, spec.key or name)
        if isinstance(value, _Field):
            delattr(cls, name)  # the instance's own value is read, never the spec
    cls._FIELDS = fields
    cls._BY_KEY = {**{name: name for name in fields}, **{f.key: name for name, f in fields.items()}}


_collect_fields(Event)  # the envelope: the base's own fields


class GenericEvent(Event):
    """A record read from disk that no model here describes (an unknown or newer kind): every key
    kept, as read."""

    ts: Any = ""
    task_id: Any = ""
    iteration: Any = 0
    event: str = "unknown"

    def __init__(self, /, **values: Any) -> None:
        self._record = dict(values)
        for name in self.ENVELOPE:
            self.__dict__[name] = values[name] if name in values else self._FIELDS[name].default
        self.event = str(self.event)
        self._set = ()

    def to_record(self) -> dict[str, Any]:
        first = {name: self._record[name] for name in self.ENVELOPE if name in self._record}
        return {**first, **self._record}  # exactly the keys that were read, the envelope's first


# -- the loop's life -------------------------------------------------------------------------


class LoopStarted(Event):
    event: Literal["loop_started"] = "loop_started"
    task_path: str
    executor: str
    max_iterations: int
    pid: int | None = None
    workspace: str = ""


class LoopResumed(Event):
    event: Literal["loop_resumed"] = "loop_resumed"
    task_path: str
    executor: str
    max_iterations: int
    pid: int | None = None
    workspace: str = ""


class StateChanged(Event):
    event: Literal["state_changed"] = "state_changed"
    from_: str = field(key="from")
    to: str
    reason: str | None = None


class StateRecovered(Event):
    event: Literal["state_recovered"] = "state_recovered"
    message: str = ""
    path: str | None = None


class StopCondition(Event):
    event: Literal["stop_condition"] = "stop_condition"
    status: str
    reason: str
    message: str
    exit_code: int
    limit: str | None = None
    value: Any = None
    figure: Any = None


class LoopFinished(Event):
    event: Literal["loop_finished"] = "loop_finished"
    status: str
    reason: str
    exit_code: int
    message: str
    iterations: int
    report: str | None = None


# -- one iteration ---------------------------------------------------------------------------


class IterationStarted(Event):
    event: Literal["iteration_started"] = "iteration_started"
    step_id: str


class Reinjected(Event):
    event: Literal["reinjected"] = "reinjected"
    reason: str
    step_id: str
    chars: int = 0


class StepStarted(Event):
    event: Literal["step_started"] = "step_started"
    step_id: str
    description: str = ""
    attempt: int = 1


class ToolCalled(Event):
    event: Literal["tool_called"] = "tool_called"
    tool: str
    arguments: Any = None
    ok: bool = True
    seconds: float | None = None
    error: str | None = None


class ModelCalled(Event):
    event: Literal["model_called"] = "model_called"
    turn: int
    model: str
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[str] = field(default_factory=list)


class ContextWrapped(Event):
    event: Literal["context_wrapped"] = "context_wrapped"
    tokens: int
    threshold: int | float
    window: int | None = None
    turn: int = 0
    restart: int = 0


class StepCompleted(Event):
    event: Literal["step_completed"] = "step_completed"
    step_id: str
    description: str = ""
    duration_seconds: float = 0.0
    attempt: int = 1
    checked: list[str] = field(default_factory=list)


class StepFailed(Event):
    event: Literal["step_failed"] = "step_failed"
    step_id: str
    attempt: int
    error: str
    consecutive_failures: int = 0


class StepInterrupted(Event):
    event: Literal["step_interrupted"] = "step_interrupted"
    step_id: str
    reason: str


class StepRecovered(Event):
    event: Literal["step_recovered"] = "step_recovered"
    step_id: str
    description: str | None = None


class VerifyFailed(Event):
    event: Literal["verify_failed"] = "verify_failed"
    step_id: str
    command: str
    output: str = ""


class Backoff(Event):
    event: Literal["backoff"] = "backoff"
    step_id: str
    seconds: float
    attempts: int = 0


class GuardrailTriggered(Event):
    event: Literal["guardrail_triggered"] = "guardrail_triggered"
    limit: str
    value: Any = None
    figure: Any = None
    action: str = ""
    message: str = ""
    seconds: float | None = None


class HumanRequested(Event):
    event: Literal["human_requested"] = "human_requested"
    step_id: str
    question: str
    path: str | None = None


# -- around the loop -------------------------------------------------------------------------


class TaskMoved(Event):
    event: Literal["task_moved"] = "task_moved"
    from_: str = field(key="from")
    to: str
    area: str | None = None


class TaskEdited(Event):
    event: Literal["task_edited"] = "task_edited"
    path: str | None = None
    message: str = ""


class LoopWarning(Event):
    event: Literal["warning"] = "warning"
    message: str


class ReportWritten(Event):
    event: Literal["report_written"] = "report_written"
    kind: str
    path: str | None = None


class NotifierFailed(Event):
    event: Literal["notifier_failed"] = "notifier_failed"
    kind: str
    error: str
    command: str | None = None  # logs before redaction landed; no longer written (it may hold a token)


# -- messages (SPEC §11, kiro.messages) ------------------------------------------------------


class MessageReceived(Event):
    event: Literal["message_received"] = "message_received"
    message_id: str
    from_: str = field(key="from")
    via: str | None = None
    queued_at: str | None = None
    chars: int = 0


class MessageDelivered(Event):
    event: Literal["message_delivered"] = "message_delivered"
    message_id: str
    from_: str = field(key="from")
    where: str | None = None


class MessageSent(Event):
    event: Literal["message_sent"] = "message_sent"
    message_id: str
    to: str
    chars: int = 0


# -- the pre-check gate (SPEC §11, kiro.precheck) --------------------------------------------


class PrecheckPassed(Event):
    event: Literal["precheck_passed"] = "precheck_passed"
    model: str
    scope: str  # "run" | "iteration"
    reason: str
    asked: bool = False  # the pre-check model was called (else: a message waits, no baseline, new work)
    failed: bool = False  # the call failed or gave no answer: the gate failed open
    changes: str | None = None


class PrecheckSkipped(Event):
    event: Literal["precheck_skipped"] = "precheck_skipped"
    model: str
    scope: str
    reason: str  # the pre-check model's
    changes: str = ""  # what the digest held, in one line
    next_check_seconds: float | None = None  # every_iteration: how long the loop sleeps before it looks again


# -- approval of agent-proposed steps (SPEC §11, kiro.approval) ----------------------------


class StepsProposed(Event):
    event: Literal["steps_proposed"] = "steps_proposed"
    proposal: str
    steps: list[str] = field(default_factory=list)
    after: str | None = None


class ProposalApproved(Event):
    event: Literal["proposal_approved"] = "proposal_approved"
    proposal: str
    steps: list[str] = field(default_factory=list)


class ProposalRejected(Event):
    event: Literal["proposal_rejected"] = "proposal_rejected"
    proposal: str
    steps: list[str] = field(default_factory=list)


# -- git (SPEC §9, kiro.checkpoints) --------------------------------------------------------


class CheckpointCreated(Event):
    event: Literal["checkpoint_created"] = "checkpoint_created"
    step_id: str
    commit: str | None = None


class CheckpointSkipped(Event):
    event: Literal["checkpoint_skipped"] = "checkpoint_skipped"
    step_id: str
    reason: str


class CheckpointFailed(Event):
    event: Literal["checkpoint_failed"] = "checkpoint_failed"
    step_id: str
    error: str


class CheckpointRecovered(Event):
    event: Literal["checkpoint_recovered"] = "checkpoint_recovered"
    step_id: str
    commit: str | None = None


class GitLockCleared(Event):
    event: Literal["git_lock_cleared"] = "git_lock_cleared"
    path: str


class WorktreeCreated(Event):
    event: Literal["worktree_created"] = "worktree_created"
    path: str
    branch: str


class WorktreeRecreated(Event):
    """A worktree a kill left half-added (its checkout unfinished) was removed, to be added again."""

    event: Literal["worktree_recreated"] = "worktree_recreated"
    path: str
    branch: str


class WorktreeRemoved(Event):
    event: Literal["worktree_removed"] = "worktree_removed"
    branch: str


class BranchLeft(Event):
    event: Literal["branch_left"] = "branch_left"
    branch: str
    worktree: str | None = None


class MergeCompleted(Event):
    event: Literal["merge_completed"] = "merge_completed"
    branch: str
    into: str | None = None
    commit: str | None = None


class MergeConflict(Event):
    event: Literal["merge_conflict"] = "merge_conflict"
    branch: str
    into: str | None = None
    files: list[str] = field(default_factory=list)


class MergeFailed(Event):
    event: Literal["merge_failed"] = "merge_failed"
    branch: str
    files: list[str] = field(default_factory=list)
    error: str = ""


class MergeResumed(Event):
    event: Literal["merge_resumed"] = "merge_resumed"
    branch: str
    files: list[str] = field(default_factory=list)


class RollbackResumed(Event):
    event: Literal["rollback_resumed"] = "rollback_resumed"
    branch: str | None = None
    files: list[str] = field(default_factory=list)


class RolledBack(Event):
    event: Literal["rolled_back"] = "rolled_back"
    at: str
    to_step: str
    checkpoint: str | None = None
    commit: str | None = None
    method: str | None = None
    undone: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


# -- schedules (SPEC §11, kiro.schedule) ---------------------------------------------------------


class ScheduleFired(Event):
    """A scheduled task's run starts: its boxes were unchecked."""

    event: Literal["schedule_fired"] = "schedule_fired"
    run: int
    schedule: str
    catch_up: bool = False
    missed: int = 0  # fires missed while nothing ran, made up by this one run
    unchecked: int = 0  # boxes kiro unchecked for this run


class RunSummarySaved(Event):
    """The summary of a finished run, saved as a memory tagged `schedule:<task_id>`."""

    event: Literal["run_summary_saved"] = "run_summary_saved"
    run: int
    source: str  # "model" (the agent wrote it) or "kiro" (made from the steps' summaries)
    memory_id: int | None = None
    chars: int = 0
    note: str | None = None  # why kiro wrote it, when the model did not


class RunFinished(Event):
    """A scheduled task's run is done; the loop waits for the next fire."""

    event: Literal["run_finished"] = "run_finished"
    run: int
    report: str
    next_run_at: str | None = None
    duration_seconds: float = 0.0


# -- the temporal backend (SPEC §12, docs/scale-out.md) ----------------------------------------


class WorkerLost(Event):
    """A `kiro worker` died (or went silent) during this step's attempt; Temporal ran it again elsewhere.
    `tries`: the try that finished (1 = nothing was lost); `worker`: the one that finished it."""

    event: Literal["worker_lost"] = "worker_lost"
    step_id: str
    tries: int
    worker: str


KINDS: tuple[type[Event], ...] = (
    LoopStarted, LoopResumed, StateChanged, StateRecovered, StopCondition, LoopFinished,
    IterationStarted, Reinjected, StepStarted, ToolCalled, ModelCalled, ContextWrapped, StepCompleted,
    StepFailed, StepInterrupted, StepRecovered, VerifyFailed, Backoff, GuardrailTriggered, HumanRequested,
    TaskMoved, TaskEdited, LoopWarning, ReportWritten, NotifierFailed,
    MessageReceived, MessageDelivered, MessageSent, StepsProposed, ProposalApproved, ProposalRejected,
    CheckpointCreated, CheckpointSkipped, CheckpointFailed, CheckpointRecovered, GitLockCleared, WorktreeCreated,
    WorktreeRecreated, WorktreeRemoved, BranchLeft, MergeCompleted, MergeConflict, MergeFailed, MergeResumed,
    RollbackResumed,
    RolledBack, ScheduleFired, RunSummarySaved, RunFinished,
    PrecheckPassed, PrecheckSkipped, WorkerLost,
)
MODELS: dict[str, type[Event]] = {cls._FIELDS["event"].default: cls for cls in KINDS}  # the name each kind fixes
EVENT_NAMES: frozenset[str] = frozenset(MODELS)

Listener = Callable[[Event], None]


def make(kind: str, /, **fields: Any) -> Event:
    """The compatibility path: an event from its name and keyword fields (`emit("name", **fields)`).
    An unknown name or a field the kind does not have raises: a typo is a bug, not a new event."""
    model = MODELS.get(kind)
    if model is None:
        raise ValueError(f"unknown event {kind!r}; add a model for it to kiro/events.py")
    return model.from_record(fields)


def parse(record: dict[str, Any]) -> Event:
    """A record read from disk as its typed event; anything that does not fit (an unknown kind,
    a newer kiro's fields) as a `GenericEvent`. Never raises on a dict."""
    kind = record.get("event")
    model = MODELS.get(kind) if isinstance(kind, str) else None
    if model is not None:
        try:
            return model.from_record(record)
        except (FieldError, TypeError):  # TypeError: a key that is not a text
            pass
    try:
        return GenericEvent(**{**record, "event": str(kind if kind is not None else "unknown")})
    except TypeError:  # a key that is not a text
        return GenericEvent(event=str(kind))


def make_event(task_id: str, iteration: int, event: str, fields: dict[str, Any]) -> dict[str, Any]:
    """One event record as a dict (validated by its model). Kept for callers that build records by hand."""
    ev = make(event, **fields)
    ev.task_id, ev.iteration = task_id, iteration
    return ev.to_record()


class EventLog:
    """Appends events to one JSONL file. Opened lazily, kept open, flushed per line. Every line
    passes through the loop's redactor on its way to disk."""

    def __init__(self, path: Path, redact: Redactor | None = None) -> None:
        self.path = path
        self.redact = redact or Redactor()
        self._fh: Any = None

    def __call__(self, event: Event | dict[str, Any]) -> None:
        self.append(event)

    def append(self, event: Event | dict[str, Any]) -> None:
        self.append_record(event.to_record() if isinstance(event, Event) else event)

    def append_record(self, record: dict[str, Any], *, clean_json: str | None = None) -> None:
        """`clean_json`: the record's JSON as `Redactor.record` of this log's redactor returned it
        (made and searched once for the loop's listeners and the log)."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = safeio.open_regular(self.path, write=True, fix="move it away")  # never blocks on a FIFO
            self._repair_torn_tail()
        if clean_json is not None and len(clean_json) <= EVENT_FIELD_CHARS:
            line = clean_json + "\n"
        else:
            text = json.dumps(record, ensure_ascii=False, default=str)
            if len(text) > EVENT_FIELD_CHARS:  # no string in a shorter line can be longer than the cap
                text = json.dumps(clip_fields(record, EVENT_FIELD_CHARS), ensure_ascii=False, default=str)
            line = self.redact.text(text) + "\n"
        data = memoryview(line.encode("utf-8"))
        written = 0

        def write_rest() -> None:  # one line, written whole even across a retry after a full disk
            nonlocal written
            while written < len(data):
                written += os.write(self._fh, data[written:])

        diskfull.retry(write_rest, self.path.name)

    def _repair_torn_tail(self) -> None:
        """After a crash the file may end mid-line: start the next record on a line of its own."""
        try:
            size = os.path.getsize(self.path)
            if size == 0:
                return
            with open(self.path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    os.write(self._fh, b"\n")
        except OSError:
            return

    def close(self) -> None:
        if self._fh is not None:
            os.close(self._fh)
            self._fh = None


def read_events(path: Path, *, offset: int = 0) -> Iterator[dict[str, Any]]:
    """Every well-formed event in the file; broken lines (a torn tail) are skipped."""
    try:
        fh = open(safeio.open_regular(path, fix="move it away; kiro starts a new one"), "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with fh:
        if offset:
            fh.seek(offset)
        for raw in fh:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


TAIL_BLOCK = 64 * 1024


def read_last(path: Path, n: int) -> list[dict[str, Any]]:
    """The last `n` events of `read_events(path)`, read backwards from the file's end a block at a
    time: the cost is that of `n` events, not of the whole log (`kiro loop logs --tail N`)."""
    try:
        fd = safeio.open_regular(path, fix="move it away; kiro starts a new one")
    except FileNotFoundError:
        return []
    try:
        return _last_events(fd, n)
    finally:
        os.close(fd)


def _last_events(fd: int, n: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if n <= 0:
        return found

    def take(raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            record = json.loads(raw)
        except ValueError:
            return  # a torn or broken line, skipped as read_events skips it
        if isinstance(record, dict):
            found.append(record)

    pos = os.fstat(fd).st_size
    carry = b""  # the start of a line whose beginning lies in an earlier block
    first = True
    while pos > 0 and len(found) < n:
        size = min(TAIL_BLOCK, pos)
        pos -= size
        lines = (os.pread(fd, size, pos) + carry).split(b"\n")
        carry = lines[0] if pos > 0 else b""
        complete = lines[1:] if pos > 0 else lines
        if first:
            first = False
            if complete and complete[-1] == b"":
                complete.pop()  # the newline that ends the file
        for raw in reversed(complete):
            take(raw)
            if len(found) >= n:
                break
    found.reverse()
    return found


def read_new(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Events appended since `offset` (complete lines only), and the new offset. For --follow."""
    try:
        with open(safeio.open_regular(path, fix="move it away; kiro starts a new one"), "rb") as fh:
            fh.seek(offset)
            data = fh.read(64 * 1024 * 1024)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    out: list[dict[str, Any]] = []
    for raw in data[: end + 1].splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out, offset + end + 1


def read_typed(path: Path, *, offset: int = 0) -> Iterator[Event]:
    """Every well-formed event in the file as its typed record (`parse`)."""
    for record in read_events(path, offset=offset):
        yield parse(record)
