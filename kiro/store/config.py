"""Configuration: pydantic models for `config/autonomous_loop.yaml`, and the layered resolve.

Precedence, lowest first: defaults < config file < task frontmatter < environment (`KIRO_*`)
< command-line flags (SPEC §7). Every model forbids unknown keys; errors name the file, the
line and the key, and suggest the closest known key.
"""

import copy
import functools
import os
import re
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from kiro.errors import ConfigError
from kiro.fs import safeio
from kiro.plugins import AGENTS, no_pydantic_plugins
from kiro.store import redact
from kiro.store.models import empty_dict, empty_list, inner_types, made, models_within
from kiro.store.workspace import CONFIG_RELPATH

if TYPE_CHECKING:
    import yaml


def _none_is_empty(value: Any) -> Any:
    """`llm:` with every child commented out is YAML null; a person means "all defaults", not an error."""
    return {} if value is None else value


# The `on_event` keys: a loop that completed, failed, paused, hit a limit, and any end at all.
ON_EVENT_KINDS = ("completed", "failed", "paused", "limit", "finished")
# The `notify_on` kinds sent to the `notify` URLs (kiro.core.digest): the digest at `digest_at`, a loop's end,
# a question for a person, a step proposal or task file waiting for approval, a usage limit longer than
# `max_limit_wait_seconds`.
NotifyKind = Literal["digest", "loop_finished", "human_requested", "approval_waiting", "usage_limit"]
NOTIFY_KINDS: tuple[NotifyKind, ...] = get_args(NotifyKind)


_QUIET = "kiro_value_not_shown"  # a validation error whose value is not echoed: it may hold a secret


def _plain_text(value: Any) -> Any:
    """No text in the config may hold a NUL character (no path, command, argument or URL can) or a byte
    that is not UTF-8 (from a `KIRO_*` variable or a flag; no state file can): the first file call on it
    would end kiro with an internal error, in a loop already started."""
    texts = value if isinstance(value, list) else value.values() if isinstance(value, dict) else [value]
    for text in texts:
        if not isinstance(text, str):
            continue
        if "\0" in text:
            raise ValueError("holds a NUL character (\\0), which no path, command or name can hold")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: Python's stand-in for a byte that is not UTF-8
            raise ValueError("holds a byte that is not UTF-8 (shown as \\udc..); give it as UTF-8 text") from None
    return value


_PLAIN_TEXT = AfterValidator(_plain_text)


class _Strict(BaseModel):
    # defer_build: a model's validator is built when a config is first resolved, not at import (a read
    # command that never resolves one never builds it)
    # The line under each field is its description: read from the source only when a schema is made
    # (`_described`), not by pydantic's use_attribute_docstrings at import, where parsing this file's source
    # cost every command, a read command too, about a third of kiro's own start-up (issue #41).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Every field that can hold text gets `_plain_text`, as its first validator after its type's: one
        place, where a `field_validator("*")` wrapped every field of every section (ints and flags too) when the
        validators were built, at every command's start (issue #41)."""
        super().__pydantic_init_subclass__(**kwargs)
        for field in cls.model_fields.values():
            if _PLAIN_TEXT not in field.metadata and any(inner is str for inner in inner_types(field.annotation)):
                field.metadata.append(_PLAIN_TEXT)


class LoopSettings(_Strict):
    """`autonomous_loop:` — the source spec's keys (seed 004), same names and defaults, plus kiro's few."""

    max_iterations: int = Field(100, ge=1)
    """stop after this many iterations (exit 4)."""
    failure_threshold: int = Field(3, ge=1)
    """consecutive failed iterations that end the loop as failed (exit 5)."""
    timeout_seconds: float = Field(43200.0, gt=0)  # 12 h: a night (SPEC §7 says 3600)
    """run-time limit for the loop, summed over resumes (exit 4): 12 h, a night."""
    reinject_every_n_iterations: int = Field(10, ge=0)
    """resend the full task context every N iterations (0 = never on a schedule)."""
    reinject_after_failure: bool = True
    """resend the full task context after a failed iteration."""
    reinject_if_stale_seconds: float = Field(300.0, ge=0)
    """resend the full task context when the state has not changed for this long."""
    state_directory: str = ".state"
    """state files, locks, backups/ and archive/, relative to the workspace."""
    save_state_every_iteration: bool = True  # only true: see _state_every_iteration
    """always: crash safety rests on it (false is refused)."""
    backup_state_every_n_iterations: int = Field(10, ge=0)
    """copy the state into backups/ (the last 5 are kept; 0 = never)."""
    check_done_folder: bool = True
    """a task moved to Done/ is finished (exit 0)."""
    check_needs_action_folder: bool = True
    """a task moved to Needs_Action/ waits for a person (exit 6)."""
    check_stop_hook: bool = True
    """honour .hooks/stop_autonomous_loop[_<task_id>].md (exit 3)."""
    log_every_iteration: bool = True
    """iteration events in Logs/<task_id>.jsonl."""
    create_progress_reports: bool = True
    """markdown reports in Logs/progress_reports/."""
    progress_report_every_n_iterations: int = Field(25, ge=1)
    """write a progress report every N iterations."""
    retry_failed_steps: bool = True
    """try a failed step again rather than giving up on it."""
    max_step_retries: int = Field(3, ge=0)
    """retries of one step before the loop fails (exit 5)."""
    exponential_backoff: bool = True
    """double the wait after each failure of the same step."""
    auto_move_to_done: bool = True
    """move the task file from Specs/ to Done/ when every step is done."""
    create_completion_report: bool = True
    """Logs/completion_reports/<task_id>.md."""
    archive_state_file: bool = True
    """move the finished state file into .state/archive/."""
    # kiro's own additions
    backoff_base_seconds: float = Field(2.0, ge=0)
    """the first wait after a failure."""
    backoff_max_seconds: float = Field(300.0, ge=0)
    """the longest wait between attempts."""
    iteration_delay_seconds: float = Field(0.0, ge=0)
    """a pause between iterations."""

    @field_validator("save_state_every_iteration")
    @classmethod
    def _state_every_iteration(cls, value: bool) -> bool:
        """kiro saves the state at every step boundary; its crash safety (a resumed loop never reruns
        a completed step) rests on that, so `false` is refused rather than accepted and ignored."""
        if value is not True:
            raise ValueError("false is not supported: kiro saves the state at every step boundary, which its "
                             "crash safety depends on; set it to true or remove the key")
        return value


class ResourceLimits(_Strict):
    """`resource_limits:` (seed 004, "Resource Limits")."""

    max_memory_mb: int | None = Field(1024, ge=1)
    """stop when kiro's resident memory passes this (exit 4)."""
    # Waits (kiro.core.guardrails.resource_wait); null by default, not the seed's 80 and 100 (README "Where kiro
    # differs"): kiro's own bookkeeping would hit 100 writes a minute in a fast loop.
    max_cpu_percent: float | None = Field(None, gt=0)
    """% of one CPU over any minute, kiro + its ended steps; above it, wait."""
    max_disk_writes_per_minute: int | None = Field(None, ge=1)
    """4 KiB pages written per minute (kernel-counted), kiro + its ended steps; wait."""
    max_api_calls_per_minute: int | None = Field(60, ge=1)
    """model calls per minute, shared by all loops of a process (waits)."""


class Price(_Strict):
    input_per_1m: float = Field(ge=0)
    """USD per million input tokens."""
    output_per_1m: float = Field(ge=0)
    """USD per million output tokens."""


class LLMSettings(_Strict):
    """`llm:` — the OpenAI-compatible endpoint the `openai` executor talks to."""

    base_url: str | None = None
    """null = OPENAI_BASE_URL if set, else OpenAI's own."""
    model: str = "gpt-4o-mini"
    """the model the openai executor asks (`--model`, `KIRO_MODEL`)."""
    api_key_env: str = "OPENAI_API_KEY"
    """the variable that holds the key (the key itself never goes here)."""
    max_turns_per_step: int = Field(15, ge=1)
    """model calls in one iteration before the attempt counts as failed."""
    max_retries: int = Field(2, ge=0)
    """retries of one request (429, 5xx, timeouts)."""
    request_timeout_seconds: float = Field(120.0, gt=0)
    """the longest one model request may take."""
    # the longest kiro sleeps on an endpoint's Retry-After (longer asks are cut to this; at most 30 days)
    max_retry_after_seconds: float = Field(21600.0, gt=0, le=30 * 86400)
    """the longest kiro sleeps when the endpoint says Retry-After (6 h; longer asks, up to the year 2343 or an HTTP
    date in 9999, are cut to this)."""
    context_window_tokens: int = Field(128000, ge=1)
    """the model's context window, for the wrap-up threshold."""
    wrap_up_threshold: float = Field(0.8, gt=0, le=1)
    """share of the context window at which the agent is told to wrap up."""
    precheck_model: str | None = None  # SPEC §11 pre-check gate (kiro.core.precheck)
    """a cheap model that decides, before a costly run, whether anything changed since the last one; "nothing changed"
    skips it (docs/guides/schedules.md, "The pre-check gate")."""
    precheck: Literal["scheduled_runs", "every_iteration"] = "scheduled_runs"
    """scheduled_runs: gate each run of a `schedule:` task | every_iteration: also gate each retry of a step (new steps
    and waiting messages always pass)."""
    precheck_sleep_seconds: float = Field(300.0, gt=0)  # every_iteration: the wait after a skipped iteration
    """every_iteration: how long a skipped loop sleeps before it looks again."""
    prices: dict[str, Price] = Field(default_factory=empty_dict)
    """model -> {input_per_1m: USD, output_per_1m: USD}, for cost limits."""

    _empty_prices = field_validator("prices", mode="before")(_none_is_empty)

    @field_validator("base_url")
    @classmethod
    def _usable_url(cls, value: str | None) -> str | None:
        """An http(s) URL with a host and a port in range, or one line now rather than an internal error at
        the loop's first request. The value is not echoed: a base_url may hold a password."""
        if value is None:
            return value
        from urllib.parse import urlsplit

        from pydantic_core import PydanticCustomError

        fix = "write it like http://127.0.0.1:8080/v1"
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError as exc:
            raise PydanticCustomError(_QUIET, f"is not a URL kiro can use ({exc}); {fix}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PydanticCustomError(_QUIET, f"should be an http:// or https:// URL with a host; {fix}")
        return value


class ShellToolSettings(_Strict):
    enabled: bool = False
    """offer run_command to the agent."""
    trust_agent_code: bool = False
    """true: allow those too, accepting that the agent runs code of its own."""
    allow: list[str] = Field(default_factory=empty_list)
    """commands it may run, e.g. ["git status", "git diff", ls]; programs that run code the agent writes (shells,
    python, make, npm, pytest ...) are refused unless trust_agent_code (docs/security.md)."""
    timeout_seconds: float = Field(120.0, gt=0)
    """one run_command's limit; the command is ended after it."""
    max_output_chars: int = Field(20000, ge=100)
    """longer output is cut before the model sees it."""


    @field_validator("allow")
    @classmethod
    def _refuse_code_runners(cls, allow: list[str], info: ValidationInfo) -> list[str]:
        """Programs that run code the agent can write are refused (kiro.processes.programs), unless the person
        says they trust that code."""
        from kiro.processes.programs import refusal

        if info.data.get("trust_agent_code"):
            return allow
        for entry in allow:
            why = refusal(entry)
            if why is not None:
                raise ValueError(f"{why}; remove it, or set tools.shell.trust_agent_code: true to accept that "
                                 f"the agent runs code of its own")
        return allow


class ToolsSettings(_Strict):
    shell: ShellToolSettings = Field(default_factory=made(ShellToolSettings))
    """`run_command`: whether the agent may run commands, and which."""

    _empty_shell = field_validator("shell", mode="before")(_none_is_empty)


_HH_MM = r"^([01]\d|2[0-3]):[0-5]\d$"


class ActiveHours(_Strict):
    start: str = Field(pattern=_HH_MM)
    """local time the window opens, HH:MM."""
    end: str = Field(pattern=_HH_MM)
    """local time the window closes, HH:MM."""


class Guardrails(_Strict):
    token_budget_per_hour: int | None = Field(None, ge=1)
    """sleep when the last hour used more tokens than this."""
    max_total_tokens: int | None = Field(None, ge=1)
    """stop the loop beyond this many tokens (exit 4)."""
    max_cost_usd: float | None = Field(None, gt=0)
    """stop the loop beyond this cost, from llm.prices (exit 4)."""
    max_actions_per_minute: int | None = Field(None, ge=1)
    """a cap on side-effect tool calls (write/edit/run/add_steps/memory_save) per minute."""
    idle_timeout_seconds: float | None = Field(None, gt=0)
    """stop when nothing has happened for this long (exit 4)."""
    active_hours: ActiveHours | None = None
    """work only between these local times, e.g. {start: "09:00", end: "17:30"}."""
    loop_detection_repeats: int = Field(3, ge=2)
    """the same action repeated this many times counts as a stuck agent."""
    max_consecutive_turns: int | None = Field(None, ge=1)  # SPEC §11: model turns without a `sleep` call
    """after this many model turns without a `sleep` call, kiro forces a sleep."""
    forced_sleep_seconds: float = Field(60.0, gt=0)
    """the forced sleep's length (a stop hook or a message still ends it)."""


class Approval(_Strict):
    agent_steps: bool = True  # SPEC §11: add_steps proposes (Pending_Approval/) instead of editing the task file
    """add_steps writes Pending_Approval/steps_<task_id>_<n>.md for a person to move to Approved/ (steps inserted, as
    edited) or Rejected/ (the agent is told)."""


class SandboxPaths(_Strict):
    """`sandbox_paths:` — more of the file system for the box (kiro.processes.sandbox): `rw` read-write,
    `ro` read-only on top. Absolute paths or `~/...`; each must exist."""

    rw: list[str] = Field(default_factory=empty_list)
    """read-write."""
    ro: list[str] = Field(default_factory=empty_list)
    """read-only."""

    @field_validator("rw", "ro")
    @classmethod
    def _existing(cls, paths: list[str]) -> list[str]:
        found = []
        for raw in paths:
            path = os.path.expanduser(raw)
            if not os.path.isabs(path):
                raise ValueError(f"{raw!r} is not an absolute path; write it as /path/to/it or ~/path")
            if not os.path.exists(path):
                raise ValueError(f"{raw!r} does not exist ({path}); create it, or remove it from the list")
            found.append(os.path.normpath(path))
        return found


class LocalBackend(_Strict):
    """SPEC §12's default: loops run in kiro's own processes."""

    kind: Literal["local"] = "local"
    """local = in kiro's own processes | temporal = each loop a Temporal workflow, each step on a `kiro worker`."""


class TemporalBackend(_Strict):
    """SPEC §12: each loop a Temporal workflow, each step attempt an activity on a `kiro worker`
    (docs/scale-out.md). Read only by kiro/temporal/ and the CLI; the local path never imports temporalio."""

    kind: Literal["temporal"]
    """temporal = each loop a Temporal workflow, each step on a `kiro worker` with its own git clone."""
    address: str = "127.0.0.1:7233"  # the Temporal frontend, HOST:PORT
    """the Temporal frontend."""
    namespace: str = "default"
    """the Temporal namespace kiro's workflows live in."""
    task_queue: str = "kiro"  # the queue `kiro worker` processes poll for step attempts
    """the queue `kiro worker` processes poll for steps."""
    heartbeat_seconds: float = Field(5.0, gt=0, le=60)  # a worker's step heartbeats; lost after 3 missed
    """a worker heartbeats each step; 3 missed = the step is retried elsewhere."""


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # compiled by `re` when first used


class AgentEnv(_Strict):
    """Which of kiro's environment variables reach an agent CLI (kiro.executors.agents.billing). By
    default a CLI that has a login gets none of the API key variables it would bill instead of that
    login (Claude Code bills ANTHROPIC_API_KEY before a subscription); `pass` lets such a variable
    through (the key is billed, and the start line says so); `drop` keeps any variable from the CLI."""

    # `pass` is a Python keyword: the field is pass_, read and written as `pass`
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True, populate_by_name=True,
                              serialize_by_alias=True)

    drop: list[str] = Field(default_factory=empty_list)
    """variables kept from the agent CLI, whatever their name."""
    pass_: list[str] = Field(default_factory=empty_list, alias="pass")
    """variables let through to the agent CLI that kiro would keep from it (an API key it would bill before its
    login, a variable that is not its own)."""

    @field_validator("drop", "pass_")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not re.match(_ENV_NAME, name)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _not_both(self) -> "AgentEnv":
        both = sorted(set(self.drop) & set(self.pass_))
        if both:
            raise ValueError(f"{both[0]} is under both drop and pass; keep it in one")
        return self


def _registered_agent(value: str) -> str:
    if value not in AGENTS:
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": AGENTS.choices()})
    return value


class _RegisteredNames:
    """The JSON Schema of an agent name: an enum of the names registered now (kiro.plugins.AGENTS)."""

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**handler(schema), "enum": list(AGENTS.names())}


# a preset's name, as registered (kiro.plugins.AGENTS: kiro's own and those installed packages add)
AgentName = Annotated[str, AfterValidator(_registered_agent), _RegisteredNames()]


class Review(_Strict):
    """`review:` (SPEC §14, kiro.core.review): after a step is done and verified, a second agent (a preset or
    ACP agent, run like a step attempt) or a command (the prompt on stdin, like `executor_command`) reviews
    it and must end with `REVIEW: APPROVE` or `REVIEW: CHANGES <reasons>`."""

    agent: AgentName | None = None
    """the reviewing agent: any preset or ACP agent (claude, codex, ...), run like a step attempt."""
    command: str | None = None
    """or a command line given the review prompt on its stdin, like executor_command."""
    when: Literal["step", "checkpoint", "task"] = "step"
    """step: after every step; checkpoint: at Kiro "Checkpoint" steps, the work since the last one; task: once,
    when the last box is done, the loop's whole work."""
    max_rounds: int = Field(2, ge=1, le=20)
    """rounds of changes before the loop pauses for a person (exit 6, a note in Needs_Action/)."""

    @field_validator("command")
    @classmethod
    def _command_line(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is empty; give the reviewer's command line (the prompt comes on its stdin)")
        return value

    @model_validator(mode="after")
    def _one_reviewer(self) -> "Review":
        if (self.agent is None) == (self.command is None):
            raise ValueError("needs exactly one of agent (a preset: claude, codex, ...) or command (a command line "
                             "given the review prompt on stdin)")
        return self


def _speaks_acp(agent: str | None) -> bool:
    """Whether the preset called `agent` is spoken to over the Agent Client Protocol (its `speaks_acp`)."""
    return agent is not None and agent in AGENTS and bool(getattr(AGENTS.load(agent), "speaks_acp", False))


class Config(_Strict):
    """The whole of `config/autonomous_loop.yaml`; every key has a default."""

    autonomous_loop: LoopSettings = Field(default_factory=made(LoopSettings))
    """the loop's limits, state, stop conditions, reports and retries."""
    resource_limits: ResourceLimits = Field(default_factory=made(ResourceLimits))
    """Resource limits (null = no limit)."""
    executor: Literal["openai", "command", "shell"] | None = None
    """openai | command | shell; null = command when executor_command or agent is set, else openai when an endpoint is
    set, else shell when the step has a command block."""
    executor_command: str | None = None
    """for `command`, your own command line, e.g. "my-agent --task {task_file}"; placeholders {prompt_file} {task_file}
    {step_id} {project_dir}."""
    agent: AgentName | None = None
    """a preset: a maintained command line and output parser (tokens, cost, errors) for an agent CLI, or an agent kiro
    speaks the Agent Client Protocol to (names ending in -acp, and acp); `kiro agents` lists them, with those installed
    packages add. executor_command, when set, overrides the command line."""
    agent_args: list[str] = Field(default_factory=empty_list)
    """extra arguments appended to the agent's command line, e.g. ["--model", "x"]."""
    command_success: Literal["checkbox", "exit_code"] = "checkbox"
    """checkbox: exit 0 and the agent checked the box | exit_code: exit 0 alone."""
    step_timeout_seconds: float = Field(1800.0, gt=0)
    """one step's limit; the whole process group is killed after it."""
    step_idle_timeout_seconds: float | None = Field(None, gt=0)
    """end an attempt whose process printed nothing for this long; null = off for executor_command, the preset's value
    (600) with `agent`."""
    project_dir: str = "."
    """where the agent works, relative to the workspace."""
    verify: str | None = None
    """a command that must exit 0 for a step to count; task frontmatter overrides."""
    llm: LLMSettings = Field(default_factory=made(LLMSettings))
    """The openai executor: any OpenAI-compatible Chat Completions endpoint."""
    tools: ToolsSettings = Field(default_factory=made(ToolsSettings))
    """The agent's tools."""
    guardrails: Guardrails = Field(default_factory=made(Guardrails))
    """Guardrails (null = off)."""
    approval: Approval = Field(default_factory=made(Approval))
    """whether steps an agent adds wait for a person in Pending_Approval/."""
    max_parallel_loops: int = Field(4, ge=1)
    """loops `kiro loop watch` runs at once."""
    include_optional: bool = False
    """also run optional steps (`- [ ]* ...`)."""
    pause_at_checkpoints: bool = False  # pause for a person after a Kiro "Checkpoint" step (kiro.core.features)
    """pause (exit 6) after a Kiro "Checkpoint - ..." step, with a review note in Needs_Action/; `kiro loop resume`
    goes on."""
    pause_every: int | None = Field(None, ge=1)  # pause for a person after every N completed steps
    """pause the same way after every N completed steps."""
    # Steps at the same time, each in its own git worktree, merged back in plan order (kiro.core.parallel):
    # the open steps marked `(P)`, or with `parallel_by: depends` every step whose `_Depends:` are done.
    parallel: int = Field(1, ge=1, le=32)
    """run up to N open steps at once, each in its own git worktree and branch, merged back in plan order (needs git
    checkpoints; 1 = one after another)."""
    parallel_by: Literal["marker", "depends"] = "marker"
    """marker: the steps marked `(P)` after their number | depends: every step whose `_Depends: 1.2, 3_` lines name
    only done steps."""
    on_event: dict[str, str] = Field(default_factory=empty_dict)
    """completed | failed | paused | limit | finished -> shell command, e.g. {completed: "notify-send kiro done"}."""
    secret_env: list[str] = Field(default_factory=empty_list)
    """more variables whose values are secrets, besides *_KEY, *_TOKEN, *_SECRET, *PASSWORD* ...: kiro cuts their
    values from every file, log and prompt."""
    checkpoints: Literal["git", "off"] | None = None  # None: git inside a git work tree (kiro.git.checkpoints)
    """git | off; null = git when project_dir is inside a git work tree, else off."""
    isolation: Literal["none", "worktree"] = "none"
    """none | worktree: each loop in .kiro/worktrees/<task_id> on branch kiro/<task_id>."""
    # None: bwrap when installed and usable, else unconfined with one line saying so (kiro.processes.sandbox)
    sandbox: Literal["bwrap", "off"] | None = None
    """bwrap | off; null = bwrap when installed and usable (apt-get install bubblewrap), else unconfined with one line
    saying so. In the box: the project read-write; .state .hooks config Logs .git read-only; $HOME empty but for the
    agent CLI's own config; a private /tmp; its own processes."""
    sandbox_paths: SandboxPaths = Field(default_factory=made(SandboxPaths))
    """more for the box: absolute or ~/ paths that exist."""
    # on: the box's own network, the internet only (pasta) | off: none | host: the host's, every service on it
    sandbox_network: Literal["on", "off", "host"] = "on"
    """on: the box's own network, the internet only (pasta) | off: no network in the box | host: this machine's
    network, every service on it."""
    merge: Literal["manual", "auto"] = "manual"
    """with isolation: worktree; manual = branch left for review | auto = merged back."""
    backend: LocalBackend | TemporalBackend = Field(default_factory=lambda: LocalBackend(), discriminator="kind")
    """Where loops run (SPEC §12, docs/scale-out.md)."""
    # While `agent` is at its usage limit, steps go to these agents in turn (their own presets; not
    # agent_args), and back to `agent` when its window resets (kiro.executors.command).
    fallback_agents: list[AgentName] = Field(default_factory=empty_list)
    """e.g. [codex, gemini]: while `agent` is at its usage limit, steps go to the next of these that is not, and back
    to `agent` when its window resets."""
    # The longest an agent CLI's usage limit is waited out (until its reset, or probed without one);
    # a longer wait ends the loop (exit 4, stop_reason max_limit_wait_seconds). 8 h: a night.
    max_limit_wait_seconds: float = Field(28800.0, gt=0, le=30 * 86400)
    """the longest kiro waits for an agent CLI's usage limit to reset (8 h); a longer one ends the loop (exit 4). No
    reset time given: it probes after 5 min, doubling to 1 h."""
    # what reaches an agent CLI (kiro.executors.agents.billing)
    agent_env: AgentEnv = Field(default_factory=made(AgentEnv))
    """which of kiro's variables reach the agent CLI (`drop`, `pass`); `kiro agents` and the start line say which
    credential it bills."""
    # An ACP agent's command line, one argument per item (`[gemini, --acp]`): needed by `agent: acp`,
    # and replaces an ACP preset's own (kiro.executors.agents.acp)
    acp_command: list[str] | None = None
    """an ACP agent's command line as a list, e.g. [gemini, --acp]: needed by `agent: acp`, replaces an ACP preset's
    own."""
    # SPEC §14 (kiro.core.evidence): verify's JUnit XML report, whose test counts may only grow, and the
    # globs of the paths no step may touch
    verify_report: str | None = None
    """a JUnit XML file verify writes (pytest --junitxml=PATH): a step whose report has fewer passed or more
    skipped/xfailed tests than the last completed step's fails, whatever verify's exit code."""
    protected_paths: list[str] = Field(default_factory=empty_list)
    """globs (tests/**, ci/*.yml) a step may not create, change or delete: it fails and they are put back; frontmatter
    can add globs, never remove."""
    # SPEC §14 digest (kiro.views.digest, kiro.core.digest): Logs/digest/<date>.md when a loop ends and each day
    # at `digest_at` (local time); `notify`: Apprise URLs the digest and the `notify_on` events are sent to
    digest_at: str | None = Field(None, pattern=_HH_MM)
    """"HH:MM" (local time): besides when a loop ends, write Logs/digest/<date>.md and send it each day at this time."""
    notify: list[str] = Field(default_factory=empty_list)
    """Apprise URLs (ntfy://, tgram://, slack://, json://...) the digest and the notify_on events are sent to."""
    notify_on: list[NotifyKind] = Field(default_factory=lambda: list(NOTIFY_KINDS))
    """which events are sent to notify: digest, loop_finished, human_requested, approval_waiting, usage_limit."""
    review: Review | None = None
    """a second agent (agent: NAME) or a command reviews each step before it counts (SPEC §14, kiro.core.review):
    {agent | command, when: step | checkpoint | task, max_rounds}."""

    _empty_sections = field_validator(
        "autonomous_loop", "resource_limits", "llm", "tools", "guardrails", "approval", "on_event", "agent_env",
        "sandbox_paths", mode="before"
    )(_none_is_empty)

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_by_name(cls, value: Any) -> Any:
        """`backend: local` / `backend: temporal` name the kind with its defaults."""
        if isinstance(value, str):
            return {"kind": value}
        return value

    @field_validator("backend", mode="after")
    @classmethod
    def _temporal_needs_git(cls, value: LocalBackend | TemporalBackend, info: ValidationInfo) -> Any:
        """The temporal backend moves a loop's work between machines on its git branch (docs/scale-out.md §7)."""
        if value.kind == "temporal":
            if info.data.get("checkpoints") == "off":
                raise ValueError("the temporal backend needs git checkpoints (each step's work travels as a commit on "
                                 "branch kiro/<task_id>); remove checkpoints: off, or use backend: local")
            if (info.data.get("parallel") or 1) > 1:
                raise ValueError("steps side by side (parallel) are not built on the temporal backend (each step's "
                                 "worker commits on the loop's one branch); use parallel: 1 or backend: local")
            if info.data.get("merge") == "auto":
                raise ValueError("the temporal backend leaves branch kiro/<task_id> for review; merge: auto is not "
                                 "built on it (docs/scale-out.md §12); use merge: manual or backend: local")
        return value

    @field_validator("acp_command")
    @classmethod
    def _acp_agent(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is None:
            return value
        if not value or not value[0].strip():
            raise ValueError("is empty; give the ACP agent's program and its arguments as a list, e.g. [gemini, --acp]")
        agent = info.data.get("agent")
        if not _speaks_acp(agent):
            acp = ", ".join(name for name in AGENTS.names() if name != "acp" and _speaks_acp(name))
            raise ValueError(f"is the command line of an ACP agent, but agent is {agent!r}; set agent: acp (or an "
                             f"ACP preset: {acp}), or remove acp_command")
        return value

    @field_validator("fallback_agents")
    @classmethod
    def _distinct_fallbacks(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if value and info.data.get("executor") in ("openai", "shell"):
            raise ValueError(f"fallback agents are agent CLIs, run by the command executor; executor is "
                             f"{info.data.get('executor')!r} (remove fallback_agents, or use an `agent`)")
        if "acp" in value:
            raise ValueError("'acp' has no command line of its own (acp_command is the configured agent's); name an "
                             "ACP preset (claude-acp, gemini-acp) as a fallback")
        named = [info.data.get("agent"), *value]
        twice = next((a for i, a in enumerate(value) if a in named[: i + 1]), None)
        if twice is not None:
            raise ValueError(f"{twice!r} is named twice (agent and fallback_agents together list each agent once)")
        return value

    @property
    def git_demanded(self) -> bool:
        """The person asked for git (`checkpoints: git` or `isolation: worktree`): a loop where it cannot work is
        refused before it starts (kiro.git.checkpoints.preflight)."""
        return self.checkpoints == "git" or self.isolation == "worktree"

    @model_validator(mode="after")
    def _review_on_temporal(self) -> "Config":
        """On the temporal backend the step's worker runs the reviewer in its clone (kiro.temporal.attempt): a
        command reviewer; an agent reviewer there is not built yet."""
        if self.backend.kind == "temporal" and self.review is not None and self.review.agent is not None:
            raise ValueError("review.agent is not built on the temporal backend yet (the worker runs the reviewer); "
                             "use review.command, or backend: local")
        return self

    @field_validator("verify_report")
    @classmethod
    def _report_of_verify(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not (isinstance(info.data.get("verify"), str) and info.data["verify"].strip()):
            raise ValueError("is the report the verify command writes, but no verify command is set; set verify "
                             "(e.g. pytest -q --junitxml=.kiro-verify.xml) or remove verify_report")
        return value

    @field_validator("notify")
    @classmethod
    def _apprise_urls(cls, value: list[str]) -> list[str]:
        """Each URL one Apprise knows (ntfy://, tgram://, slack://, mailto://, json://, ...). The URL is not
        echoed: it holds the service's token."""
        if not value:
            return value
        import apprise  # imported only when notify is set (about 0.1 s)
        from pydantic_core import PydanticCustomError

        for n, url in enumerate(value):
            if apprise.Apprise.instantiate(url, suppress_exceptions=True) is None:
                raise PydanticCustomError(_QUIET, f"item {n + 1} is not a URL Apprise can send to; write it like "
                                                  f"ntfy://TOPIC, tgram://BOT_TOKEN/CHAT_ID or json://HOST:PORT/PATH "
                                                  f"(https://github.com/caronc/apprise/wiki)")
        return value

    @field_validator("on_event")
    @classmethod
    def _known_events(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = [k for k in value if k not in ON_EVENT_KINDS]
        if unknown:
            raise ValueError(f"unknown event {unknown[0]!r}: use one of {', '.join(ON_EVENT_KINDS)} (a loop's "
                             f"every event is in Logs/<task_id>.jsonl; `kiro loop logs --follow --json` streams "
                             f"them)")
        return value

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare `off` as false (and `on` as true): `checkpoints: off` means "off"."""
        if value is False:
            return "off"
        if value is True:
            return "git"
        return value

    @field_validator("parallel", mode="before")
    @classmethod
    def _parallel_count(cls, value: Any) -> Any:
        """A number of steps: `true` is no count (YAML and pydantic would read it as 1)."""
        if isinstance(value, bool):
            raise ValueError("should be a number of steps, 1 or more")
        return value

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_off(cls, value: Any) -> Any:
        """`sandbox: off` (YAML false); `sandbox: on` means bwrap."""
        return {False: "off", True: "bwrap"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("sandbox_network", mode="before")
    @classmethod
    def _network_on_off(cls, value: Any) -> Any:
        """`on` / `off` / `host` (YAML reads on and off as true and false); anything else is refused."""
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str) and value.strip().lower() in ("on", "off", "host"):
            return value.strip().lower()
        raise ValueError(f"should be on, off or host (got {value!r})")


# Task frontmatter keys that set config values, and the dotted config path each one sets.
FRONTMATTER_KEYS: dict[str, str] = {
    "executor": "executor",
    "agent": "agent",
    "acp_command": "acp_command",
    "fallback_agents": "fallback_agents",
    "agent_env": "agent_env",
    "verify": "verify",
    "verify_report": "verify_report",
    "protected_paths": "protected_paths",
    "review": "review",
    "max_iterations": "autonomous_loop.max_iterations",
    "failure_threshold": "autonomous_loop.failure_threshold",
    "timeout_seconds": "autonomous_loop.timeout_seconds",
    "model": "llm.model",
    "include_optional": "include_optional",
    "pause_at_checkpoints": "pause_at_checkpoints",
    "pause_every": "pause_every",
    "parallel": "parallel",
    "parallel_by": "parallel_by",
    "sandbox": "sandbox",
    "sandbox_network": "sandbox_network",
}

# Frontmatter keys whose list adds to the config file's, never replaces it (SPEC §14: a task can protect more
# paths, never fewer).
ADD_ONLY_KEYS: frozenset[str] = frozenset({"protected_paths"})

# Every top-level task frontmatter key kiro reads: the ones above, and the task's own (kiro.store.tasks:
# title, instructions, kiro_task_id; kiro.core.schedule: schedule, stateful). Any other key is the person's.
TASK_KEYS: frozenset[str] = frozenset({*FRONTMATTER_KEYS, "title", "instructions", "kiro_task_id", "schedule",
                                       "stateful"})

# Command-line flags that set config values, by the dotted path they set; names errors in a flag's value.
# A path missing here is named `--<last-key-with-dashes>`, which is how Typer spells a parameter.
FLAG_NAMES: dict[str, str] = {
    "autonomous_loop.max_iterations": "--max-iterations",
    "autonomous_loop.failure_threshold": "--failure-threshold",
    "autonomous_loop.timeout_seconds": "--timeout",
    "executor": "--executor",
    "agent": "--agent",
    "llm.model": "--model",
}

# The documented `KIRO_*` variables and the dotted path each sets. Any other key is reachable as
# `KIRO_<SECTION>__<KEY>`; other `KIRO_*` names (KIRO_WORKSPACE, KIRO_DEBUG, ...) are not config.
ENV_KEYS: dict[str, str] = {
    "KIRO_MAX_ITERATIONS": "autonomous_loop.max_iterations",
    "KIRO_FAILURE_THRESHOLD": "autonomous_loop.failure_threshold",
    "KIRO_TIMEOUT_SECONDS": "autonomous_loop.timeout_seconds",
    "KIRO_EXECUTOR": "executor",
    "KIRO_EXECUTOR_COMMAND": "executor_command",
    "KIRO_AGENT": "agent",
    "KIRO_MODEL": "llm.model",
    "KIRO_VERIFY": "verify",
    "KIRO_BASE_URL": "llm.base_url",
    "KIRO_PROJECT_DIR": "project_dir",
    "KIRO_INCLUDE_OPTIONAL": "include_optional",
    "KIRO_SANDBOX": "sandbox",
}


# -- reading YAML ------------------------------------------------------------------------------


@functools.cache
def _loader() -> type:
    """PyYAML's safe loader (safeio.yaml_loader), reading `17:30` as the text "17:30".

    YAML 1.1 (PyYAML) reads an unquoted `17:30` as the base-60 integer 1050, which would turn
    `active_hours: {start: 09:00, end: 17:30}` into a baffling type error.
    """
    base: Any = safeio.yaml_loader()
    resolvers = {first: list(found) for first, found in base.yaml_implicit_resolvers.items()}
    base_60 = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
    for first in "-+0123456789":
        resolvers[first].insert(0, ("tag:yaml.org,2002:str", base_60))
    return type("ConfigLoader", (base,), {"yaml_implicit_resolvers": resolvers})


_MERGE_TAG = "tag:yaml.org,2002:merge"


def load_config_file(path: Path, *, display: str | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a config file: its mapping, and the 1-based line of every dotted key in it.

    The line map lets a validation error reported by key path point at the line to
    edit. `display` is how the file is named in errors (default: `path` as given). An empty file
    is `{}`. Unreadable, non-UTF-8 or malformed YAML, a duplicated key, or a top level that is not
    a mapping raise `ConfigError` naming the file and line.
    """
    name = display if display is not None else str(path)
    try:
        raw = safeio.read_bytes(path, limit=safeio.CONFIG_MAX_BYTES, name=name)
    except FileNotFoundError:
        raise ConfigError("config file not found", file=name) from None
    except safeio.UnreadableFile as exc:
        raise ConfigError(f"the config file {exc.reason}; replace it with a YAML file "
                          f"(`kiro init` writes the commented defaults)", file=name) from None
    # Starting a thousand loops reads the same file a thousand times: parse each text once.
    cached = _parsed.get((name, raw))
    if cached is not None:
        return copy.deepcopy(cached[0]), dict(cached[1])
    data, lines = _parse_config(raw, name)
    if len(_parsed) >= 16:
        _parsed.pop(next(iter(_parsed)))
    _parsed[(name, raw)] = (copy.deepcopy(data), dict(lines))
    return data, lines


_parsed: dict[tuple[str, bytes], tuple[dict[str, Any], dict[str, int]]] = {}


def _parse_config(raw: bytes, name: str) -> tuple[dict[str, Any], dict[str, int]]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8", file=name, line=line
        ) from None

    yaml = safeio.yaml_module()

    try:
        data, node = safeio.load_yaml(text, _loader())
    except safeio.YamlRefused as exc:
        raise ConfigError(f"YAML refused: {exc}", file=name) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, name) from None
    if node is not None:
        _check_duplicate_keys(node, name)

    if data is None:  # empty, only comments, or an explicit `null`
        return {}, {}
    if not isinstance(data, dict):
        assert node is not None
        raise ConfigError(
            f"the top level must be a mapping of keys (like `autonomous_loop:`), not {_kind(data)}",
            file=name, line=node.start_mark.line + 1,
        )
    return data, safeio.yaml_key_lines(node)


def _yaml_error(exc: "yaml.YAMLError", text: str, name: str) -> ConfigError:
    """PyYAML's multi-line report, as one line that names the line number."""
    yaml = safeio.yaml_module()

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        detail = f"{exc.problem} (column {mark.column + 1}"
        if exc.context and exc.context_mark is not None:
            detail += f", {exc.context} on line {exc.context_mark.line + 1}"
        return ConfigError(f"invalid YAML: {detail})", file=name, line=mark.line + 1)
    if isinstance(exc, yaml.reader.ReaderError):  # (libyaml's position counts bytes: find the character)
        line = text[: max(text.find(chr(exc.character)), 0)].count("\n") + 1
        problem = f"unacceptable character #x{exc.character:04x}"
        return ConfigError(f"invalid YAML: {problem}", file=name, line=line)
    return ConfigError(f"invalid YAML: {' '.join(str(exc).split())}", file=name)


def _check_duplicate_keys(node: "yaml.Node", name: str, active: frozenset[int] = frozenset()) -> None:
    """PyYAML keeps the last of two equal keys silently; a person almost always meant one of them."""
    yaml = safeio.yaml_module()

    if id(node) in active:  # a recursive alias
        return
    active = active | {id(node)}
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    raise ConfigError(
                        f"duplicate key {key_node.value!r} (first on line {seen[key_node.value]})",
                        file=name, line=line,
                    )
                seen[key_node.value] = line
            _check_duplicate_keys(value_node, name, active)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, name, active)


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {_clip(value)}"
    return f"the value {_clip(value)}"


def default_config_yaml() -> str:
    """The commented defaults that `kiro init` writes; the same text as `config/autonomous_loop.yaml`."""
    from importlib import resources  # not for every run: it imports tempfile, random, ...

    return resources.files("kiro").joinpath("default_config.yaml").read_text(encoding="utf-8")


SCHEMA_FILE = "autonomous_loop.schema.json"
"""The JSON Schema `kiro init` writes beside the config, which the config's first line names for editors."""

# How kiro's before-validators read YAML 1.1 spellings that the models' own types do not show: `sandbox: off` is
# false to PyYAML, `backend: temporal` names a kind with its defaults, an empty section is null.
_ALSO_ACCEPTED: dict[tuple[str, ...], list[dict[str, Any]]] = {
    ("checkpoints",): [{"type": "boolean"}],
    ("sandbox",): [{"type": "boolean"}],
    ("sandbox_network",): [{"type": "boolean"}],
    ("backend",): [{"enum": ["local", "temporal"]}],
    ("sandbox_paths",): [{"type": "null"}],
    ("llm", "prices"): [{"type": "null"}],
    ("tools", "shell"): [{"type": "null"}],
}


def _widen(schema: dict[str, Any], path: tuple[str, ...]) -> None:
    node = schema
    for key in path[:-1]:
        ref = node["properties"][key].get("$ref") or node["properties"][key]["anyOf"][0]["$ref"]
        node = schema["$defs"][ref.rsplit("/", 1)[1]]
    field = node["properties"][path[-1]]
    kept = {k: field.pop(k) for k in ("title", "description", "default") if k in field}
    alternatives = field.pop("anyOf", None) or [dict(field)]
    field.clear()
    field.update(kept, anyOf=[*alternatives, *_ALSO_ACCEPTED[path]])


@functools.cache
def _build() -> None:
    """Build the models' validators, each section's before the model that holds it, which then uses the
    section's schema as it is: built from the top, pydantic makes each section's schema twice (once inside
    the config's, once for the section's own default, `LoopSettings()`). The first build of every command that
    reads a workspace: no pydantic plugin is looked for from here on (kiro.plugins.no_pydantic_plugins)."""
    no_pydantic_plugins()
    for model in models_within(Config):
        model.model_rebuild()


@functools.cache
def field_descriptions(model: type[BaseModel]) -> dict[str, str]:
    """Each field of `model` with its description: the docstring under it in this file (as pydantic's
    use_attribute_docstrings reads it), or its Field's own. For the schema and docs/reference, when asked."""
    from pydantic._internal._docs_extraction import extract_docstrings_from_cls

    docs = extract_docstrings_from_cls(model, use_inspect=True)
    return {name: field.description or docs[name] for name, field in model.model_fields.items()
            if field.description or name in docs}


def _described(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with each field's description (`field_descriptions`), where use_attribute_docstrings put it."""
    nodes = {"Config": schema, **schema.get("$defs", {})}
    for model in models_within(Config):
        node = nodes.get(model.__name__)
        if node is None:
            continue
        for name, doc in field_descriptions(model).items():
            field = model.model_fields[name]
            prop = node.get("properties", {}).get(field.alias or name)
            if prop is not None and "description" not in prop:
                node["properties"][field.alias or name] = dict(sorted({**prop, "description": doc}.items()))
    return schema  # (pydantic sorts a field's keys)


def config_schema() -> dict[str, Any]:
    """The JSON Schema of `config/autonomous_loop.yaml`, from the config model: every key with its type,
    default and description, as kiro reads the file (YAML 1.1 `on`/`off` included)."""
    schema = _described(Config.model_json_schema(mode="validation"))
    for path in _ALSO_ACCEPTED:
        _widen(schema, path)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kiro: config/autonomous_loop.yaml"
    return schema


def frontmatter_schema() -> dict[str, Any]:
    """The JSON Schema of a task file's frontmatter: each key that sets a config value has that value's schema
    (`FRONTMATTER_KEYS`), besides the task's own keys; any other key is the person's and allowed."""
    config = config_schema()
    properties: dict[str, Any] = {}
    for key, dotted in FRONTMATTER_KEYS.items():
        node = config
        for part in dotted.split("."):
            node = node["properties"][part]
            ref = node.get("$ref")
            if ref is not None and part != dotted.rsplit(".", 1)[-1]:
                node = config["$defs"][ref.rsplit("/", 1)[1]]
        properties[key] = node
    every = {"type": "string", "pattern": r"^\d+(\.\d+)?[smhd]$"}
    properties.update({
        "title": {"type": "string", "description": "the task's title in status, reports and the dashboard."},
        "instructions": {"type": "string", "description": "added to every step's prompt."},
        "kiro_task_id": {"type": ["string", "null"], "description": "the loop's id, kept current by kiro."},
        "schedule": {"description": "run the task again and again: a cron string, {cron: ...} or {every: 30m}.",
                     "anyOf": [{"type": "string"},
                               {"type": "object", "properties": {"cron": {"type": "string"}, "every": every},
                                "additionalProperties": False}]},
        "stateful": {"type": "boolean", "default": True,
                     "description": "a scheduled run starts from what earlier runs recorded."},
    })
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "kiro: a task file's frontmatter",
            "type": "object", "properties": properties, "$defs": config.get("$defs", {}),
            "additionalProperties": True}


# -- resolving the layers ----------------------------------------------------------------------


class _Origin(NamedTuple):
    """Where a value came from, so that an error sends the person to the right place to fix it.

    A config file has a line per key (`lines`); a frontmatter key has one `line`; an environment
    variable or a flag has neither and is named by `label`. (A NamedTuple, as kiro.store.tasks' TaskCounts.)
    """

    path: str = ""
    label: str | None = None
    file: str | None = None
    line: int | None = None
    lines: Mapping[str, int] | None = None


def resolve_config(
    *,
    workspace_root: Path,
    config_file: Path | None = None,
    frontmatter: Mapping[str, Any] | None = None,
    task_path: Path | None = None,
    frontmatter_lines: Mapping[str, int] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    origins_out: dict[str, str] | None = None,
) -> Config:
    """The effective config: defaults < config file < task frontmatter < environment < flags.

    `config_file` (`--config`) must exist; without it `<workspace>/config/autonomous_loop.yaml` is
    read if present. Only the frontmatter keys in `FRONTMATTER_KEYS` count; the rest are the
    person's. `frontmatter_lines` maps a frontmatter key to its line in `task_path`. `env` defaults
    to `os.environ`. `overrides` are dotted paths set by flags; a None value means "not given".
    `origins_out`, when given, is filled with where each dotted key that is not a default came from
    (`config/autonomous_loop.yaml:12`, `Specs/x/tasks.md:3`, `environment KIRO_AGENT`, `--agent`): `kiro config show`.

    The layers are merged as plain mappings and validated once, so a bad value is reported with
    where it came from, as one `ConfigError` line.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    merged: dict[str, Any] = {}
    origins: dict[str, _Origin] = {}

    path = config_file
    if path is None and os.path.lexists(workspace_root / CONFIG_RELPATH):  # a symlink loop is an error, not "none"
        path = workspace_root / CONFIG_RELPATH
    if path is not None:
        name = _display(path, workspace_root)
        data, lines = load_config_file(path, display=name)
        _assign(merged, origins, (), data, _Origin(file=name, lines=lines))

    task_name = _display(task_path, workspace_root) if task_path is not None else None
    for key, value in (frontmatter or {}).items():
        if key in FRONTMATTER_KEYS:
            line = (frontmatter_lines or {}).get(key)
            dotted = FRONTMATTER_KEYS[key]
            origin = _Origin(dotted, label=f"frontmatter key {key!r}", file=task_name, line=line)
            if key in ADD_ONLY_KEYS and isinstance(value, list) and isinstance(merged.get(dotted), list):
                value = [*merged[dotted], *(v for v in value if v not in merged[dotted])]  # adds, never removes
            _assign(merged, origins, _split(dotted), value, origin)

    for var, dotted, value in _env_settings(environ):
        _assign(merged, origins, _split(dotted), value, _Origin(dotted, f"environment {var}"))

    for dotted, value in (overrides or {}).items():
        if value is not None:
            flag = FLAG_NAMES.get(dotted) or "--" + dotted.rsplit(".", 1)[-1].replace("_", "-")
            _assign(merged, origins, _split(dotted), value, _Origin(dotted, flag))

    llm = merged.get("llm")
    openai_base_url = environ.get("OPENAI_BASE_URL")
    if openai_base_url and (llm is None or (isinstance(llm, dict) and llm.get("base_url") is None)):
        _assign(merged, origins, ("llm", "base_url"), openai_base_url,
                _Origin("llm.base_url", "environment OPENAI_BASE_URL"))

    _fallbacks_in_scope(merged, origins)
    _build()
    try:
        config = Config.model_validate(merged)
    except ValidationError as exc:
        raise _validation_error(exc, origins) from None
    if origins_out is not None:
        origins_out.update({dotted: _where(dotted, origin) for dotted, origin in origins.items()})
    return config


def _where(dotted: str, origin: _Origin) -> str:
    """Where a value came from, as a person finds it: file:line, an environment variable, a flag."""
    line = origin.lines.get(dotted) if origin.lines is not None else origin.line
    if origin.file is not None:
        return f"{origin.file}:{line}" if line is not None else origin.file
    return origin.label or "default"


def _layer(origin: _Origin) -> int:
    """How late a value's layer comes: config file 0, task frontmatter 1, environment 2, flag 3."""
    label = origin.label or ""
    return 0 if origin.label is None else 1 if label.startswith("frontmatter") else 2 if \
        label.startswith("environment") else 3


def _fallbacks_in_scope(merged: dict[str, Any], origins: Mapping[str, _Origin]) -> None:
    """`fallback_agents` set in an earlier layer (the config file) than the agent or executor (a task's
    frontmatter, the environment, a flag) yields to them: a shell or openai task runs no agent CLI, and an
    agent chosen later (`--agent codex`) is the first agent, not its own fallback. Both in one layer stay
    as written (and are refused when they disagree: the person wrote both there)."""
    fallbacks, origin = merged.get("fallback_agents"), origins.get("fallback_agents")
    if not isinstance(fallbacks, list) or not fallbacks or origin is None:
        return
    executor, agent = origins.get("executor"), origins.get("agent")
    if executor is not None and _layer(executor) > _layer(origin) and merged.get("executor") in ("openai", "shell"):
        merged["fallback_agents"] = []
    elif agent is not None and _layer(agent) > _layer(origin):
        merged["fallback_agents"] = [name for name in fallbacks if name != merged.get("agent")]


def _display(path: Path, workspace_root: Path) -> str:
    """A path as a person reads it in an error: relative to the workspace when inside it."""
    for candidate in (path, Path(os.path.realpath(path))):  # as given first: a symlink is named, not its target
        try:
            return candidate.relative_to(os.path.realpath(workspace_root)).as_posix()
        except ValueError:
            continue
    return str(path)


def _split(dotted: str) -> tuple[str, ...]:
    return tuple(dotted.split("."))


def _assign(merged: dict[str, Any], origins: dict[str, _Origin], path: tuple[str, ...], value: Any,
            origin: _Origin) -> None:
    """Set `value` at `path` in `merged`, merging mappings key by key, and remember who set what."""
    target = merged
    for depth, key in enumerate(path[:-1]):
        if not isinstance(target.get(key), dict):
            target[key] = {}
            _forget(origins, ".".join(path[: depth + 1]))
        origins.setdefault(".".join(path[: depth + 1]), origin)
        target = target[key]
    if not path:
        _merge_into(target, value, (), origins, origin)
        return
    last = path[-1]
    if isinstance(value, Mapping) and isinstance(target.get(last), dict):
        _merge_into(target[last], value, path, origins, origin)
    else:
        _forget(origins, ".".join(path))
        target[last] = _plain(value)
        _remember(origins, path, value, origin)


def _merge_into(target: dict[Any, Any], value: Mapping[Any, Any], prefix: tuple[str, ...],
                origins: dict[str, _Origin], origin: _Origin) -> None:
    if prefix:
        origins[".".join(prefix)] = origin
    for key, sub in value.items():
        path = (*prefix, str(key))
        if isinstance(sub, Mapping) and isinstance(target.get(key), dict):
            _merge_into(target[key], sub, path, origins, origin)
        else:
            _forget(origins, ".".join(path))
            target[key] = _plain(sub)
            _remember(origins, path, sub, origin)


def _plain(value: Any) -> Any:
    """A copy of mappings, so that merging a later layer never edits an earlier layer's data."""
    if isinstance(value, Mapping):
        return {key: _plain(sub) for key, sub in value.items()}
    return value


def _remember(origins: dict[str, _Origin], path: tuple[str, ...], value: Any, origin: _Origin) -> None:
    origins[".".join(path)] = origin
    if isinstance(value, Mapping):
        for key, sub in value.items():
            _remember(origins, (*path, str(key)), sub, origin)


def _forget(origins: dict[str, _Origin], dotted: str) -> None:
    """Drop what an earlier layer set under `dotted`: the new value replaces it whole."""
    for key in [key for key in origins if key.startswith(dotted + ".")]:
        del origins[key]


# -- the environment ---------------------------------------------------------------------------


def _env_settings(environ: Mapping[str, str]) -> Iterator[tuple[str, str, Any]]:
    """(variable, dotted path, value) for each `KIRO_*` variable that sets config.

    The general `KIRO_<SECTION>__<KEY>` form comes first so that a documented short name, the
    more deliberate spelling, wins when both are set. An empty variable counts as unset.
    """
    general = sorted(var for var in environ if var.upper().startswith("KIRO_") and "__" in var)
    short = [var for var in environ if var.upper() in ENV_KEYS]
    for var in general:
        if environ[var] != "":
            dotted = ".".join(part.lower() for part in var[len("KIRO_"):].split("__"))
            yield var, dotted, _env_value(var, dotted, environ[var])
    for var in short:
        if environ[var] != "":
            dotted = ENV_KEYS[var.upper()]
            yield var, dotted, _env_value(var, dotted, environ[var])


_YAML_NULLS = frozenset({"null", "Null", "NULL", "~"})


def _env_value(var: str, dotted: str, text: str) -> Any:
    """An environment value is text; read it as a YAML value ("5", "true", "[a, b]", "null").

    A key that holds text (a command, a model, a URL) keeps the text as given, so that
    `KIRO_VERIFY="pytest -k 'a: b'"` is not mistaken for a mapping; only a YAML null spelling
    clears a key that may be null.
    """
    annotation = _annotation_at(_split(dotted))
    if annotation is not None and _accepts_text(annotation):
        return None if text.strip() in _YAML_NULLS and _is_optional(annotation) else text
    yaml = safeio.yaml_module()

    try:
        return safeio.load_yaml(text, _loader())[0]
    except safeio.YamlRefused as exc:
        raise ConfigError(f"environment {var}: YAML refused: {exc}", key=dotted) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(f"environment {var}: not a valid value: {problem}", key=dotted) from None


def _annotation_at(path: Sequence[str]) -> Any:
    """The declared type at a dotted path of `Config`, or None where no such key exists."""
    annotation: Any = Config
    for part in path:
        annotation = _without_none(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if field is None:
                return None
            annotation = field.annotation
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        else:
            return None
    return annotation


def _is_optional(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _without_none(annotation: Any) -> Any:
    if _is_optional(annotation):
        rest = [arg for arg in get_args(annotation) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _accepts_text(annotation: Any) -> bool:
    return _without_none(annotation) is str


# -- errors ------------------------------------------------------------------------------------


def _validation_error(exc: ValidationError, origins: Mapping[str, _Origin]) -> ConfigError:
    """pydantic's errors as one line: the first in full, naming its source; the others by key."""
    errors = exc.errors(include_url=False)
    more = ""
    if len(errors) > 1:
        others = [".".join(str(part) for part in error["loc"]) for error in errors[1:]]
        more = f" (and {len(others)} more: " + ", ".join(others[:3]) + (", ...)" if len(others) > 3 else ")")
    return _describe(errors[0], origins, more)


def _describe(error: ErrorDetails, origins: Mapping[str, _Origin], more: str) -> ConfigError:
    loc = tuple(str(part) for part in error["loc"])
    if loc[:1] == ("backend",) and loc[1:2] in (("local",), ("temporal",)):
        loc = loc[:1] + loc[2:]  # the union's tag is not a key
    key = ".".join(loc)
    origin = _origin_of(loc, origins)

    if error["type"] == "extra_forbidden":
        text = f"unknown key {key!r}{_suggestion(loc)}{more}"
    else:
        text = f"{key}: {_message(error)}{more}"

    if origin is None:
        return ConfigError(text, key=key)
    if origin.lines is not None:  # a config file: the line of the key, or of its nearest parent
        line = next((origin.lines[p] for p in _prefixes(loc) if p in origin.lines), None)
        return ConfigError(text, file=origin.file, line=line, key=key)
    if error["type"] != "extra_forbidden" and key == origin.path:
        text = _message(error) + more  # the label already says which key
    return ConfigError(f"{origin.label}: {text}", file=origin.file, line=origin.line, key=key)


def _prefixes(loc: tuple[str, ...]) -> Iterator[str]:
    """`a.b.c`, `a.b`, `a`: the key, then each parent, nearest first."""
    for end in range(len(loc), 0, -1):
        yield ".".join(loc[:end])


def _origin_of(loc: tuple[str, ...], origins: Mapping[str, _Origin]) -> _Origin | None:
    for dotted in _prefixes(loc):
        if dotted in origins:
            return origins[dotted]
    return None


def _message(error: ErrorDetails) -> str:
    """pydantic's message, minus its internals, plus the value it could not accept."""
    kind = error["type"]
    if kind == "missing":
        return "required key missing"
    if kind == _QUIET:
        return error["msg"]
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        message = "should be a mapping of keys"
    elif kind == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == _HH_MM:
        message = 'should be a 24-hour time like "09:00"'
    else:
        message = error["msg"].removeprefix("Value error, ").split(", unable to")[0]
    return f"{message} (got {_clip(error.get('input'))})"


def _clip(value: Any, limit: int = 60) -> str:
    """A refused value as its error line quotes it: what it shows to be a credential (`--token X`,
    `Bearer X`, a URL's password, a well-known key format) cut out first, then clipped."""
    text = repr(value)
    found = redact.written_in(text)
    if found is not None:
        text = found.text(text)
    # a list or a mapping is scanned as the command line its items would make (`--token X`)
    words = (" ".join(map(str, value)) if isinstance(value, list | tuple)
             else " ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else text)
    secrets = redact.command_secrets(words)
    if secrets:
        text = redact.Redactor(secrets, []).text(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _suggestion(loc: tuple[str, ...]) -> str:
    """" (did you mean 'x'?)" from the keys valid where the unknown one stands, else those keys."""
    model = _without_none(_annotation_at(loc[:-1]))
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    valid = list(model.model_fields)
    elsewhere = [dotted for dotted in _all_keys(Config) if dotted.rsplit(".", 1)[-1] == loc[-1]]
    if elsewhere:  # the very key, in another section, before a look-alike here
        return f" (did you mean {elsewhere[0]!r}?)"
    close = did_you_mean(loc[-1], valid)
    if close:
        return f" (did you mean {close!r}?)"
    shown = ", ".join(valid[:16]) + (", ..." if len(valid) > 16 else "")
    return f" (valid keys here: {shown})"


def did_you_mean(word: str, known: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The known word closest to `word`, when one is close enough (difflib's ratio at least `cutoff`):
    what every "did you mean" of kiro suggests."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def frontmatter_typos(frontmatter: Mapping[str, Any], lines: Mapping[str, int], where: str) -> list[str]:
    """One warning line for each frontmatter key that kiro does not read but that is a typo of one it
    does (`max_iteration`, `agnet`): such a key is the person's and stays as written, but it sets nothing.
    The bar is higher than for config keys, where any unknown key is an error: a task file's own keys
    (`status`, `tags`, `modified`) must not be taken for typos."""
    out = []
    for key in frontmatter:
        if key in TASK_KEYS:
            continue
        close = did_you_mean(key, sorted(TASK_KEYS), cutoff=0.8)
        if close is not None:
            at = f"{where}:{lines[key]}" if key in lines else where
            out.append(f"{at}: frontmatter key {key!r} is not one kiro reads (did you mean {close!r}?); "
                       f"kiro leaves it as it is and it sets nothing")
    if len(out) > TYPOS_SHOWN:  # a file of a thousand `model1:` keys: not a thousand lines
        out[TYPOS_SHOWN:] = [f"{where}: {len(out) - TYPOS_SHOWN} more frontmatter keys look like typos of keys kiro "
                             f"reads"]
    return out


TYPOS_SHOWN = 5


def _all_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, spec in model.model_fields.items():
        dotted = prefix + name
        yield dotted
        inner = _without_none(spec.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from _all_keys(inner, dotted + ".")
