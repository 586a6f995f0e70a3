"""What a person does while a loop runs: ends a wait, answers a request, edits the task file, approves or
rejects proposed steps (SPEC §11, kiro.store.approval).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from pydantic import Field

from kiro.store.events import Event
from kiro.store.models import empty_list


class HumanRequested(Event):
    """The agent asked for a person (`request_human`): the loop pauses (exit 6)."""

    event: Literal["human_requested"] = "human_requested"
    step_id: str
    question: str
    path: str | None = None


class StepsProposed(Event):
    """The agent proposed new steps: a proposal waits in Pending_Approval/."""

    event: Literal["steps_proposed"] = "steps_proposed"
    proposal: str
    steps: list[str] = Field(default_factory=empty_list)
    after: str | None = None


class ProtectedPathsChanged(Event):
    """A step created, changed or deleted protected paths: they were put back and the attempt failed;
    `proposal`: the file in Pending_Approval/ a person moves to Approved/ to let the change through."""

    event: Literal["protected_paths_changed"] = "protected_paths_changed"
    step_id: str
    changes: list[str] = Field(default_factory=empty_list)  # "changed tests/test_a.py"
    proposal: str | None = None
    not_put_back: list[str] = Field(default_factory=empty_list)


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
