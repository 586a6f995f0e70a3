"""What a person does while a loop runs: ends a wait, answers a request, edits the task file, approves or
rejects proposed steps (SPEC §11, kiro.store.approval).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from pydantic import Field

from kiro.store.events import Event
from kiro.store.models import empty_list


class WaitEnded(Event):
    """A wait (`backoff`, or a guardrail's: `limit` names it) is over: `seconds` is the time really slept,
    less than `planned` when a stop condition (`stopped_by`) cut it short. `kiro loop stats` adds these up."""

    event: Literal["wait_ended"] = "wait_ended"
    limit: str
    seconds: float
    planned: float
    stopped_by: str | None = None


class RequestResolved(Event):
    """A request the loop left for a person (a review note, an intervention) is answered: moved to Logs/resolved/.
    The normal end of a review point, not a warning."""

    event: Literal["request_resolved"] = "request_resolved"
    message: str


class TaskEdited(Event):
    """kiro changed the task file (a box, or its frontmatter put back)."""

    event: Literal["task_edited"] = "task_edited"
    path: str | None = None
    message: str = ""


class ProposalApproved(Event):
    """A person approved a proposal (moved it to Approved/): its steps were added."""

    event: Literal["proposal_approved"] = "proposal_approved"
    proposal: str
    steps: list[str] = Field(default_factory=empty_list)


class ProposalRejected(Event):
    """A person rejected a proposal (moved it to Rejected/): the agent is told."""

    event: Literal["proposal_rejected"] = "proposal_rejected"
    proposal: str
    steps: list[str] = Field(default_factory=empty_list)
