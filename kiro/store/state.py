"""Loop state: the pydantic model of `.state/autonomous_loop_<task_id>.json` (kiro.store.statestore writes
and reads it, keeps its backups and holds the per-loop lock).

Field names and meanings follow the source spec (seed 004, "State File Format"); SPEC §4 adds
`schema_version`, `workspace`, `pid`, `host`, `executor`, `stop_reason`, `timeout_reached`,
`usage`, `steps` and `history`.
"""

from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PrivateAttr
from pydantic_core import to_json

from kiro import timeutil
from kiro.status import RECORDED, Status, success_rate
from kiro.store.models import empty_dict, empty_list, made, models_within
from kiro.store.receipts import Receipt, ReviewRound, StoredModel
from kiro.store.workspace import TASK_ID_RE
from kiro.usage import Usage

SCHEMA_VERSION = 1
HISTORY_KEPT = 200
FAILED_KEPT = 100  # failed_steps: the newest attempts (total_failures counts them all)
STEPS_KEPT = 200  # steps{}: records of steps with something to say (attempts, an error, a retry time)
TEXT_KEPT = 4000  # characters of last_prompt / last_response / errors kept in the state



def clip(text: str | None, limit: int = TEXT_KEPT) -> str:
    if not text:
        return ""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n[... {len(text) - limit} characters cut ...]\n" + text[-half:]


def first_line(text: str | None, limit: int = 200) -> str:
    """The first line of a text (an error, a question), cut to `limit` characters with an ellipsis."""
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


_Model = StoredModel  # kiro.store.receipts: a state file's record (its config, and what a record keeps)


RETRY_HORIZON_DAYS = 366


def _iso_time(value: str) -> str:
    """A time kiro wrote: ISO 8601 (a hand-edited "tomorrow" is refused at load, not mid-loop)."""
    try:
        timeutil.parse(value)
    except (ValueError, TypeError):
        raise ValueError(f"not an ISO 8601 time like 2026-01-31T09:00:00+00:00 (got {value[:40]!r})") from None
    return value


def _retry_time(value: str) -> str:
    """`next_retry_at`: a time, and not beyond any backoff kiro would choose (year 2999 is a hang)."""
    when = timeutil.parse(_iso_time(value))
    if when > timeutil.now() + timedelta(days=RETRY_HORIZON_DAYS):
        raise ValueError(f"{value[:40]!r} is more than {RETRY_HORIZON_DAYS} days ahead")
    return value


IsoTime = Annotated[str, AfterValidator(_iso_time)]
RetryTime = Annotated[str, AfterValidator(_retry_time)]


class CurrentStep(_Model):
    step_id: str
    description: str
    status: Literal["pending", "in_progress", "completed", "failed", "waiting_retry", "interrupted"] = "pending"
    started_at: IsoTime | None = None


class CompletedStep(_Model):
    step_id: str
    description: str
    completed_at: IsoTime
    duration_seconds: float
    iteration: int | None = None
    attempts: int = 1
    summary: str = ""
    checkpoint: str | None = None  # the step's git commit (SPEC §9); None: no commit, see checkpoint_note
    checkpoint_note: str | None = None  # why there is no commit: "no changes", "failed: ..."
    agent: str | None = None  # the agent CLI that did it (command executor; a fallback agent's name)
    receipt: Receipt | None = None  # what kiro saw when it counted the step done (SPEC §14, kiro.core.evidence)


class FailedStep(_Model):
    step_id: str
    description: str
    failed_at: IsoTime
    error: str
    retry_count: int
    iteration: int | None = None


class Context(_Model):
    last_prompt: str = ""
    last_response: str = ""
    environment: dict[str, str] = Field(default_factory=empty_dict)


class StopConditions(_Model):
    task_in_done: bool = False
    max_iterations_reached: bool = False
    failure_threshold_exceeded: bool = False
    stop_hook_triggered: bool = False
    manual_intervention: bool = False


class Metrics(_Model):
    total_duration_seconds: float = 0.0
    average_step_duration: float = 0.0
    success_rate: float | None = None  # kiro.status.success_rate: None while no step has finished


class StepRecord(_Model):
    attempts: int = 0
    last_error: str | None = None
    next_retry_at: RetryTime | None = None
    last_verify_output: str | None = None
    # SPEC §14 `review:` (kiro.core.review): the step's review rounds so far, for its receipt; the rounds
    # before `reviews_counted_from` were shown to a person at a pause, and no longer count to max_rounds.
    # The list is replaced, never changed in place (the journal compares a record's fields by value). Written only
    # when there are any: most steps' records (journaled at every save) stay as small as before.
    reviews: list[ReviewRound] = Field(default_factory=empty_list, exclude_if=lambda v: not v)
    reviews_counted_from: int = Field(0, exclude_if=lambda v: not v)
    # of `attempts`, the runs a feature sent back to the agent (kiro.core.hooks.Reopen: a reviewer's changes): no
    # failure, so not counted toward max_step_retries nor in the receipt's attempts
    reopened: int = Field(0, exclude_if=lambda v: not v)


class Transition(_Model):
    at: str
    from_status: str = Field(alias="from")
    to: str
    reason: str | None = None


class RollbackRecord(_Model):
    """One `kiro loop rollback` (SPEC §9)."""

    at: str
    to_step: str
    checkpoint: str | None = None  # the commit whose files came back
    commit: str | None = None  # the rollback's own commit (None: the files already matched)
    method: Literal["restore", "revert"] = "restore"
    undone: list[str] = Field(default_factory=empty_list)  # steps no longer completed
    unchecked: list[str] = Field(default_factory=empty_list)  # boxes unchecked (parents included)


class GitInfo(_Model):
    """Git checkpoints and isolation of one loop (SPEC §9, kiro.git.checkpoints)."""

    checkpoints: bool = False
    isolation: Literal["none", "worktree"] = "none"
    merge: Literal["manual", "auto"] = "manual"
    toplevel: str | None = None  # the main work tree
    project_rel: str = ""  # the project directory, relative to the work tree's top
    worktree: str | None = None  # the loop's own work tree (isolation: worktree)
    branch: str | None = None  # the branch kiro commits on (None: a detached HEAD)
    base_branch: str | None = None  # the main tree's branch when the loop started: the merge target
    base_commit: str | None = None  # HEAD when the loop started (None: no commit yet)
    merge_status: Literal["merging", "merged", "conflict", "left"] | None = None
    merge_commit: str | None = None
    conflict_files: list[str] = Field(default_factory=empty_list)
    rollbacks: list[RollbackRecord] = Field(default_factory=empty_list)


class ParallelAttempt(_Model):
    """One step's attempt run beside others in its own worktree and branch (`parallel: N`, kiro.core.parallel):
    what resume needs to know which worktree and branch are that step's and how far it got."""

    step_id: str
    branch: str
    worktree: str
    base: str  # the commit its worktree was made from
    # running: the attempt runs (a kill: it runs again); done: its work is the branch's commit `commit`;
    # merging: that work is being brought into the loop's tree (a kill: brought in again, the same); conflict:
    # it conflicted with what was merged before it, also when run again (left for a person to look at);
    # reopened: brought in, then sent back to its agent (a reviewer's changes): its next attempt starts from it
    status: Literal["running", "done", "merging", "conflict", "reopened"] = "running"
    commit: str | None = None
    attempt: int = 1  # the attempt at the step it is (a failed one, once the state counts it, is not taken again)


class ScheduleInfo(_Model):
    """A recurring task's schedule and where it stands (SPEC §11, kiro.core.schedule)."""

    expression: str  # "every 2s", "cron 0 9 * * *"
    stateful: bool = True
    phase: Literal["waiting", "running"] = "waiting"  # between runs, or in one
    run_started_at: str | None = None
    run_iteration_base: int = 0  # `iteration` when the current run started: max_iterations counts per run
    run_elapsed_base: float = 0.0  # run time when it started: timeout_seconds counts per run
    run_tokens_base: int = 0  # usage.total_tokens when it started, for the run's report
    fires: int = 1  # fires the current run stands for (more than 1: a catch-up run)


def _recorded_status(value: Status) -> Status:
    if value not in RECORDED:
        raise ValueError(f"{value!r} is shown by `status`, never recorded")
    return value


def _plain_task_id(value: str) -> str:
    """The task id names files (`.state/autonomous_loop_<id>.json`): a plain name, never a path."""
    if not TASK_ID_RE.match(value) or ".." in value:
        raise ValueError(f"{value[:40]!r} is not a plain task id (letters, digits, '_', '-', '.')")
    return value


class LoopState(_Model):
    schema_version: int = SCHEMA_VERSION
    task_id: Annotated[str, AfterValidator(_plain_task_id)]
    task_path: str
    status: Annotated[Status, AfterValidator(_recorded_status)] = Status.PENDING
    started_at: IsoTime = Field(default_factory=timeutil.iso)
    updated_at: IsoTime = Field(default_factory=timeutil.iso)
    iteration: int = 0
    max_iterations: int = 100
    consecutive_failures: int = 0
    failure_threshold: int = 3
    total_failures: int = 0
    total_successes: int = 0
    current_step: CurrentStep | None = None
    completed_steps: list[CompletedStep] = Field(default_factory=empty_list)
    failed_steps: list[FailedStep] = Field(default_factory=empty_list)
    context: Context = Field(default_factory=made(Context))
    stop_conditions: StopConditions = Field(default_factory=made(StopConditions))
    metrics: Metrics = Field(default_factory=made(Metrics))
    # added by kiro (SPEC §4)
    workspace: str = ""
    pid: int | None = None
    host: str | None = None
    executor: str | None = None
    # the settings `start` was given on its command line (dotted paths: executor, agent, llm.model);
    # `resume` applies them again unless it names its own (kiro.core.runner.prepare_resume)
    overrides: dict[str, Any] = Field(default_factory=empty_dict)
    billing: str | None = None  # the credential its agent CLI bills, as at its start; every resume keeps it
    stop_reason: str | None = None
    stop_message: str | None = None  # how the last run ended, one line (the error that ended it), for `status`
    sleep_until: str | None = None  # while `sleeping`: when the wait ends (backoff, a budget, Retry-After)
    sleep_note: str | None = None  # while `sleeping`, what for in a few words ("claude limit, resumes 03:10 UTC")
    timeout_reached: bool = False
    timeout_seconds: float | None = None
    title: str | None = None
    usage: Usage = Field(default_factory=made(Usage))
    steps: dict[str, StepRecord] = Field(default_factory=empty_dict)
    history: list[Transition] = Field(default_factory=empty_list)
    guardrails: dict[str, Any] = Field(default_factory=empty_dict)  # budgets kept over a restart (kiro.core.guardrails)
    runs: int = 0
    finished_at: IsoTime | None = None
    report_path: str | None = None
    steps_total: int | None = None
    steps_done: int | None = None
    git: GitInfo | None = None
    parallel: list[ParallelAttempt] = Field(default_factory=empty_list)  # steps in flight side by side (`parallel: N`)
    # recurring tasks (SPEC §11): `runs` then counts scheduled runs
    last_run_at: IsoTime | None = None
    next_run_at: IsoTime | None = None
    schedule: ScheduleInfo | None = None
    # the steps whose boxes were checked when the step in flight began (kiro.core.evidence): a box checked
    # since, found after a kill, was checked during the attempt, not by a person between runs
    boxes_checked_before: list[str] | None = None
    reviewed_steps: int = 0  # completed steps a person was shown at a review pause (kiro.core.features.ReviewPoints)
    journal_seq: int = 0  # the last journal record this snapshot includes (kiro.store.journal)
    # (the completed_steps list, how many of its durations are summed, the sum): refresh_metrics
    # adds only the new ones
    _durations: tuple[object, int, float] = PrivateAttr(default=(None, 0, 0.0))

    @classmethod
    def model_rebuild(cls, *, force: bool = False, raise_errors: bool = True, _parent_namespace_depth: int = 2,
                      _types_namespace: Any = None) -> bool | None:
        """Built inside out (kiro.store.models), as pydantic does on the state's first use (it calls this): each
        record the state holds before the state, which then uses each one's schema as it is. Built from the top,
        the state's schema holds every record's schema made anew, and each record made on its own later
        (`CompletedStep`, its `Receipt`, `GitInfo`...) makes its own once more: ~48 M instructions against ~33 M
        (issue #41)."""
        if not cls.__pydantic_complete__:
            for model in models_within(cls):
                if model is not cls:
                    model.model_rebuild()
        return super().model_rebuild(force=force, raise_errors=raise_errors,
                                     _parent_namespace_depth=_parent_namespace_depth + 1,
                                     _types_namespace=_types_namespace)

    # -- transitions -----------------------------------------------------------------------

    def transition(self, to: Status | str, reason: str | None = None) -> bool:
        """Move the state machine; every change is recorded in the bounded `history`. The only
        writer of `status` (a string is turned into a `Status`, or raises)."""
        to = Status(to)
        if to not in RECORDED:
            raise ValueError(f"{to!r} is shown by `status`, never recorded")
        if to == self.status and reason == self.stop_reason:
            return False
        self.history.append(Transition.model_validate({"at": timeutil.iso(), "from": self.status, "to": to,
                                                        "reason": reason}))
        if len(self.history) > HISTORY_KEPT:
            del self.history[: len(self.history) - HISTORY_KEPT]
        self.status = to
        return True

    def step_record(self, step_id: str) -> StepRecord:
        rec = self.steps.get(step_id)
        if rec is None:
            rec = self.steps[step_id] = StepRecord()
        return rec

    def refresh_metrics(self) -> None:
        self.metrics.success_rate = success_rate(self.total_successes, self.total_failures)
        done = self.completed_steps
        if done:
            seen, counted, total = self._durations
            if seen is not done or counted > len(done):
                counted, total = 0, 0.0
            total += sum(c.duration_seconds for c in done[counted:])
            self._durations = (done, len(done), total)
            self.metrics.average_step_duration = round(total / len(done), 3)

    def bound(self) -> None:
        """Keep the lists that grow with failures bounded: failed_steps to the newest FAILED_KEPT,
        steps{} to records that say something (a record with no attempts, error or retry time is
        what an absent one means), at most STEPS_KEPT of them."""
        if len(self.failed_steps) > FAILED_KEPT:
            del self.failed_steps[: len(self.failed_steps) - FAILED_KEPT]
        steps = self.steps
        if steps:
            idle = [k for k, r in steps.items() if not (r.attempts or r.last_error or r.next_retry_at
                                                        or r.last_verify_output or r.reviews or r.model_extra)]
            for k in idle:
                del steps[k]
            for k in list(steps)[: max(0, len(steps) - STEPS_KEPT)]:
                del steps[k]

    def dump_json(self) -> str:
        return state_text(self.model_dump(mode="json", by_alias=True))


def state_text(data: dict[str, Any]) -> str:
    """A state file's text, from the state as `model_dump(mode="json", by_alias=True)` gives it: indented JSON,
    written by pydantic's own encoder (Python's `json.dumps(indent=2)` has no C encoder: ~5x the CPU, ~8 ms for
    a state of 200 completed steps, paid at a loop's first save and at its end; issue #41). The same text as
    `json.dumps(data, indent=2, ensure_ascii=False)` but for how a float under 1e-4 is spelled (`0.00001` for
    `1e-05`: the same number)."""
    return to_json(data, indent=2).decode("utf-8")


def effective_status(state: LoopState, alive: bool) -> Status:
    """What `status` shows: a state that says running whose process is gone is `interrupted`."""
    return state.status.shown(alive)


def to_jsonable(state: LoopState) -> dict[str, Any]:
    return state.model_dump(mode="json", by_alias=True)
