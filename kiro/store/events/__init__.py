"""The event log: `Logs/<task_id>.jsonl`, one JSON object per line, appended and flushed as it
happens (SPEC §8), and the typed records it holds (SPEC §10).

Every kind of event is one pydantic model with a `Literal` `event` tag; `event_adapter()` reads any of
them (a discriminated union). The kinds only some runs emit are made, on first use, in a module per family
(`kiro.store.events.git`, `.agent`, ...); every kind is read from here (`from kiro.store.events import X`).
The engine emits typed records; listeners (the log, the terminal, Dashboard.md, reports, notifiers, a
server) receive them. On disk a record is
`{"ts", "task_id", "iteration", "event", ...the kind's fields}`, exactly the keys the call set.

Readers never crash on what they find: a torn last line is skipped, an unknown kind (a newer kiro's)
or a record that does not fit its model reads as `GenericEvent` with every key kept.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every kind's annotations from their
# text when it builds each class (31M of the module's ~150M instructions; issue #41).
import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from kiro import jsonl, timeutil
from kiro.fs import diskfull, safeio
from kiro.fs.bounds import EVENT_FIELD_CHARS, clip_fields
from kiro.store.logread import read_events
from kiro.store.models import empty_list
from kiro.store.redact import Redactor


class Event(BaseModel):
    """The envelope every event shares; subclasses add their fields and fix `event`. Built from
    keyword fields (`StepStarted(step_id="1", attempt=2)`), each checked in pydantic's lax mode; a
    field the kind does not have, or a required one missing, is a ValidationError."""

    # defer_build: a kind's validator is built when it is first used, not at import (~50 kinds)
    model_config = ConfigDict(extra="forbid", populate_by_name=True, defer_build=True)
    # The record `Loop.emit` made, kept for its listeners (the terminal's line, the mapping view below):
    # an event is dumped once however many listeners read it. Dropped when a field is set (`__setattr__`).
    __slots__ = ("_record",)

    ts: str = Field(default_factory=timeutil.iso)
    task_id: str = ""
    iteration: int = 0
    event: str

    ENVELOPE: ClassVar[tuple[str, ...]] = ("ts", "task_id", "iteration", "event")

    def to_record(self) -> dict[str, Any]:
        """The JSON object written to the log: the envelope, then the fields the emitter set
        (a field left at its default is not written, as before events were typed). A new dict each call."""
        return dict(self.as_record())

    def stamped(self, task_id: str, iteration: int) -> dict[str, Any]:
        """Set the envelope's `task_id` and `iteration`, and return the record (kept: read, not changed, by
        the caller and every later reader until a field is set again)."""
        fields = self.__dict__  # as pydantic sets a field of a model that does not validate assignments,
        fields["task_id"] = task_id  # without dropping the kept record: it is replaced just below
        fields["iteration"] = iteration
        self.__pydantic_fields_set__.update(("task_id", "iteration"))
        record = self._dump()
        object.__setattr__(self, "_record", record)
        return record

    def _dump(self) -> dict[str, Any]:
        record: dict[str, Any] = {"ts": self.ts, "task_id": self.task_id, "iteration": self.iteration,
                                  "event": self.event}
        record.update(self.model_dump(exclude_unset=True, by_alias=True))  # an envelope key set: same value, same place
        return record

    def as_record(self) -> dict[str, Any]:
        """`to_record()` for reading only: the record kept by `stamped`, not a copy of it."""
        try:
            return object.__getattribute__(self, "_record")  # type: ignore[no-any-return]
        except AttributeError:  # not stamped: made, not kept (a field may still be set)
            return self._dump()

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        with contextlib.suppress(AttributeError):
            object.__delattr__(self, "_record")

    # -- a thin read-only mapping view, for listeners written against the dict records ---------

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_record().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.as_record()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.as_record()


class GenericEvent(Event):
    """A record read from disk that no model here describes (an unknown or newer kind): every key
    kept, as read."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)

    ts: Any = ""
    task_id: Any = ""
    iteration: Any = 0
    event: str = "unknown"

    def _dump(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True, by_alias=True)  # exactly the keys that were read

# -- the loop's life -------------------------------------------------------------------------


class LoopStarted(Event):
    """A process began a new loop on a task file."""

    event: Literal["loop_started"] = "loop_started"
    task_path: str
    executor: str
    max_iterations: int
    pid: int | None = None
    workspace: str = ""


class StateChanged(Event):
    """The loop's status changed (`from` → `to`), and why."""

    event: Literal["state_changed"] = "state_changed"
    from_: str = Field(alias="from")
    to: str
    reason: str | None = None


class StopCondition(Event):
    """A stop condition held (a hook, Done/, a limit, failures): the loop ends with `exit_code`."""

    event: Literal["stop_condition"] = "stop_condition"
    status: str
    reason: str
    message: str
    exit_code: int
    limit: str | None = None
    value: Any = None
    figure: Any = None


class LoopFinished(Event):
    """The run ended: its status, reason, exit code and the report written."""

    event: Literal["loop_finished"] = "loop_finished"
    status: str
    reason: str
    exit_code: int
    message: str
    iterations: int
    report: str | None = None


# -- one iteration ---------------------------------------------------------------------------


class IterationStarted(Event):
    """An iteration began on the current step."""

    event: Literal["iteration_started"] = "iteration_started"
    step_id: str


class StepStarted(Event):
    """An attempt at a step began."""

    event: Literal["step_started"] = "step_started"
    step_id: str
    description: str = ""
    attempt: int = 1


class StepCompleted(Event):
    """A step was done and verified: its box checked, its duration, agent and cost."""

    event: Literal["step_completed"] = "step_completed"
    step_id: str
    description: str = ""
    duration_seconds: float = 0.0
    attempt: int = 1
    checked: list[str] = Field(default_factory=empty_list)
    agent: str | None = None  # the agent CLI that did the step (command executor)
    cost_usd: float | None = None  # the loop's cost so far, when its executor reports one


# -- around the loop -------------------------------------------------------------------------


class TaskMoved(Event):
    """The task file was moved between Specs/, Done/ and Needs_Action/."""

    event: Literal["task_moved"] = "task_moved"
    from_: str = Field(alias="from")
    to: str
    area: str | None = None


class ReportWritten(Event):
    """A markdown report was written (completion, progress, intervention, escalation, review)."""

    event: Literal["report_written"] = "report_written"
    kind: str
    path: str | None = None


# The kinds above are those every run emits; a listener asks about another kind by its tag
# (`event.event == "step_failed"`), which makes no class. The others, the warnings too, live in modules of their
# own, kiro.store.events.<family>, imported when one of their names is first asked for here (a module
# `__getattr__`, PEP 562): pydantic takes ~1.5-2 M instructions to make each class, and a run of shell steps that
# all pass makes none of them (issue #41). `ev.CheckpointCreated` and `from kiro.store.events import
# CheckpointCreated` read as before; a reader of the log (`parse`, `event_adapter`) imports every family.
_FAMILIES: dict[str, str] = {
    "agent": "Reinjected ToolCalled PermissionAnswered PlanUpdated ModelCalled ContextWrapped AgentRan AgentSilent "
             "UsageLimit",
    "failure": "StepFailed GuardrailTriggered VerifyFailed TestsShrank Backoff",
    "recovery": "StepRecovered LoopResumed StateRecovered StepInterrupted StepReopened",
    "person": "HumanRequested StepsProposed ProtectedPathsChanged WaitEnded RequestResolved TaskEdited "
              "ProposalApproved ProposalRejected",
    "messages": "MessageReceived MessageDelivered MessageSent",
    "precheck": "PrecheckPassed PrecheckSkipped",
    "git": "CheckpointCreated CheckpointSkipped CheckpointLeftOut CheckpointFailed CheckpointRecovered GitLockCleared "
           "WorktreeCreated WorktreeRecreated WorktreeRemoved BranchLeft MergeCompleted MergeConflict "
           "ParallelStepStarted ParallelStepFinished ParallelConflict MergeFailed MergeResumed RollbackResumed "
           "RolledBack",
    "schedule": "ScheduleFired RunSummarySaved RunFinished",
    "temporal": "WorkerLost",
    "warning": "LoopWarning NotifierFailed",
    "review": "ReviewStarted ReviewApproved ReviewRequestedChanges",
}
_FAMILY_OF: dict[str, str] = {name: family for family, names in _FAMILIES.items() for name in names.split()}

if TYPE_CHECKING:  # what mypy reads: the same names, where they are made
    from kiro.store.events.agent import *  # noqa: F403
    from kiro.store.events.failure import *  # noqa: F403
    from kiro.store.events.git import *  # noqa: F403
    from kiro.store.events.messages import *  # noqa: F403
    from kiro.store.events.person import *  # noqa: F403
    from kiro.store.events.precheck import *  # noqa: F403
    from kiro.store.events.recovery import *  # noqa: F403
    from kiro.store.events.review import *  # noqa: F403
    from kiro.store.events.schedule import *  # noqa: F403
    from kiro.store.events.temporal import *  # noqa: F403
    from kiro.store.events.warning import *  # noqa: F403

    KINDS: tuple[type[Event], ...]  # every kind
    MODELS: dict[str, type[Event]]  # every kind by the tag it fixes
    EVENT_NAMES: frozenset[str]  # every tag


def __getattr__(name: str) -> Any:
    """A kind of a family (its module imported), or one of the tables of every kind; kept once made."""
    family = _FAMILY_OF.get(name)
    if family is not None:
        value = getattr(importlib.import_module(f"kiro.store.events.{family}"), name)
    elif name in ("KINDS", "MODELS", "EVENT_NAMES"):
        tags = models()
        value = {"KINDS": tuple(tags.values()), "MODELS": tags, "EVENT_NAMES": frozenset(tags)}[name]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


@functools.cache
def models() -> dict[str, type[Event]]:
    """Every kind by the tag it fixes (`event`), this module's and every family's (each imported)."""
    modules = [sys.modules[__name__]] + [importlib.import_module(f"kiro.store.events.{f}") for f in _FAMILIES]
    return {cls.model_fields["event"].default: cls for module in modules for cls in vars(module).values()
            if isinstance(cls, type) and issubclass(cls, Event) and cls.__module__ == module.__name__
            and cls not in (Event, GenericEvent)}


@functools.cache
def event_adapter() -> TypeAdapter[Event]:
    """The reader of any kind (the discriminated union), built on first use: building it builds every
    kind's validator, which a run that only writes events never needs."""
    union: Any = Annotated[Union[tuple(models().values())], Field(discriminator="event")]  # noqa: UP007
    return TypeAdapter(union)

Listener = Callable[[Event], None]


def parse(record: dict[str, Any]) -> Event:
    """A record read from disk as its typed event; anything that does not fit (an unknown kind,
    a newer kiro's fields) as a `GenericEvent`. Never raises on a dict."""
    kind = record.get("event")
    if isinstance(kind, str) and kind in models():
        try:
            return event_adapter().validate_python(record)
        except ValidationError:
            pass
    try:
        return GenericEvent.model_validate({**record, "event": str(kind if kind is not None else "unknown")})
    except (ValidationError, TypeError, ValueError):  # keys pydantic will not take as fields
        return GenericEvent(event=str(kind))


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
        self.append_record(event.as_record() if isinstance(event, Event) else event)

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
            text = jsonl.line(record)
            if len(text) > EVENT_FIELD_CHARS:  # no string in a shorter line can be longer than the cap
                text = jsonl.line(clip_fields(record, EVENT_FIELD_CHARS))
            line = self.redact.text(text) + "\n"
        data = line.encode("utf-8")
        written = 0
        with contextlib.suppress(OSError):  # the whole line in one write, as a rule; else, below
            written = os.write(self._fh, data)
        if written == len(data):
            return
        rest = memoryview(data)

        def write_rest() -> None:  # one line, written whole even across a retry after a full disk
            nonlocal written
            while written < len(rest):
                written += os.write(self._fh, rest[written:])

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


def read_typed(path: Path, *, offset: int = 0) -> Iterator[Event]:
    """Every well-formed event in the file as its typed record (`parse`)."""
    for record in read_events(path, offset=offset):
        yield parse(record)
