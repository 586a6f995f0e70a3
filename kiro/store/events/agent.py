"""An agent's step: what kiro's own agent, an agent CLI or an ACP agent did (kiro.executors).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Any, Literal

from pydantic import Field

from kiro.store.events import Event
from kiro.store.models import empty_list


class ToolCalled(Event):
    """The agent called a tool (kiro's own agent, an agent CLI's stream, an ACP agent): its main argument, redacted."""

    event: Literal["tool_called"] = "tool_called"
    tool: str
    arguments: Any = None
    ok: bool = True
    seconds: float | None = None
    error: str | None = None
    kind: str | None = None  # an ACP agent's tool kind (read, edit, execute, ...)
    status: str | None = None  # an ACP agent's report of the call: pending, in_progress, completed, failed


class PermissionAnswered(Event):
    """An ACP agent asked to use a tool, or to read or write a file through kiro (kiro.executors.acp):
    kiro's answer, by the rules of its own agent's tools."""

    event: Literal["permission_answered"] = "permission_answered"
    tool: str  # the tool call's title, or fs/read_text_file, fs/write_text_file
    kind: str | None = None
    paths: list[str] = Field(default_factory=empty_list)
    allowed: bool
    reason: str | None = None  # why it was refused


class PlanUpdated(Event):
    """An ACP agent's plan for the step, as it reported it: each entry `[status] what`."""

    event: Literal["plan_updated"] = "plan_updated"
    entries: list[str] = Field(default_factory=empty_list)


class ModelCalled(Event):
    """kiro's own agent made one model call: its tokens, time and tool calls."""

    event: Literal["model_called"] = "model_called"
    turn: int
    model: str
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[str] = Field(default_factory=empty_list)


class ContextWrapped(Event):
    """kiro's agent reached its wrap-up threshold: its summary was saved and the next call starts afresh."""

    event: Literal["context_wrapped"] = "context_wrapped"
    tokens: int
    threshold: int | float
    window: int | None = None
    turn: int = 0
    restart: int = 0


class AgentRan(Event):
    """One run of an agent CLI within an attempt (the command executor), or of a reviewer (`review`): which
    agent, how it ended (completed, failed, usage_limit, ...) and what it spent."""

    event: Literal["agent_ran"] = "agent_ran"
    step_id: str
    attempt: int
    agent: str
    outcome: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    review: bool = False  # a reviewer's run (kiro.core.review): `attempt` is the review's round


class AgentSilent(Event):
    """An agent CLI has printed nothing for `seconds` (a minute, or a quarter of its idle timeout; then again):
    it may be retrying a dead endpoint. Said so that a silent night is seen; the idle timeout ends it."""

    event: Literal["agent_silent"] = "agent_silent"
    step_id: str
    agent: str
    seconds: float
    idle_timeout: float


class UsageLimit(Event):
    """An agent CLI said its usage window is used up: the loop waits for `resets_at` (or probes
    without one), or hands the step to `fallback`."""

    event: Literal["usage_limit"] = "usage_limit"
    agent: str
    step_id: str
    attempt: int
    resets_at: str | None = None
    message: str = ""
    fallback: str | None = None


class Reinjected(Event):
    """The full task context was sent to the agent again (on a schedule, after a failure, when stale)."""

    event: Literal["reinjected"] = "reinjected"
    reason: str
    step_id: str
    chars: int = 0
