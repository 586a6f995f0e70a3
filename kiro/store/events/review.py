"""A second agent's review of a step (SPEC §14, kiro.core.review).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from kiro.store.events import Event


class ReviewStarted(Event):
    """A second agent (or command) reviews a step its executor says is done and verify passed (SPEC §14)."""

    event: Literal["review_started"] = "review_started"
    step_id: str
    round: int
    reviewer: str


class ReviewApproved(Event):
    """The reviewer answered `REVIEW: APPROVE`: the step counts as done (its receipt holds the round)."""

    event: Literal["review_approved"] = "review_approved"
    step_id: str
    round: int
    reviewer: str


class ReviewRequestedChanges(Event):
    """The reviewer asked for changes: the step runs again with `reasons` in its prompt, or (`paused`) the
    loop pauses for a person after max_rounds, or after a reviewer whose answer kiro could not read."""

    event: Literal["review_requested_changes"] = "review_requested_changes"
    step_id: str
    round: int
    reviewer: str
    reasons: str
    paused: bool = False
