"""git (SPEC §9, kiro.git.checkpoints): checkpoints, worktrees, merges, steps side by side, rollback.

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from pydantic import Field

from kiro.store.events import Event
from kiro.store.models import empty_list


class CheckpointCreated(Event):
    """A step's git checkpoint commit was made."""

    event: Literal["checkpoint_created"] = "checkpoint_created"
    step_id: str
    commit: str | None = None


class CheckpointSkipped(Event):
    """A step made no checkpoint commit (nothing changed, or checkpoints are off), and why."""

    event: Literal["checkpoint_skipped"] = "checkpoint_skipped"
    step_id: str
    reason: str


class CheckpointLeftOut(Event):
    """Files a step's checkpoint does not hold although they differ from HEAD, and why (kiro cannot tell
    they are the step's: a person's, another loop's, another repository)."""

    event: Literal["checkpoint_left_out"] = "checkpoint_left_out"
    step_id: str
    files: list[str]
    reason: str


class CheckpointFailed(Event):
    """git could not make a step's checkpoint commit."""

    event: Literal["checkpoint_failed"] = "checkpoint_failed"
    step_id: str
    error: str


class CheckpointRecovered(Event):
    """A checkpoint commit made before a kill was found and recorded."""

    event: Literal["checkpoint_recovered"] = "checkpoint_recovered"
    step_id: str
    commit: str | None = None


class GitLockCleared(Event):
    """A stale `index.lock` left by a killed git was removed."""

    event: Literal["git_lock_cleared"] = "git_lock_cleared"
    path: str


class WorktreeCreated(Event):
    """A git worktree and branch were made for a loop or a step."""

    event: Literal["worktree_created"] = "worktree_created"
    path: str
    branch: str


class WorktreeRecreated(Event):
    """A worktree a kill left half-added (its checkout unfinished) was removed, to be added again."""

    event: Literal["worktree_recreated"] = "worktree_recreated"
    path: str
    branch: str


class WorktreeRemoved(Event):
    """A finished worktree was removed."""

    event: Literal["worktree_removed"] = "worktree_removed"
    branch: str


class BranchLeft(Event):
    """A loop's branch was left for review (`merge: manual`)."""

    event: Literal["branch_left"] = "branch_left"
    branch: str
    worktree: str | None = None


class MergeCompleted(Event):
    """A branch was merged back into the loop's branch."""

    event: Literal["merge_completed"] = "merge_completed"
    branch: str
    into: str | None = None
    commit: str | None = None


class MergeConflict(Event):
    """A merge back conflicted: the files named."""

    event: Literal["merge_conflict"] = "merge_conflict"
    branch: str
    into: str | None = None
    files: list[str] = Field(default_factory=empty_list)


class ParallelStepStarted(Event):
    """`parallel: N`: a step's attempt began in its own worktree, beside others (kiro.core.parallel)."""

    event: Literal["parallel_step_started"] = "parallel_step_started"
    step_id: str
    branch: str
    worktree: str


class ParallelStepFinished(Event):
    """A side-by-side attempt ended: ok (its work is `commit` on its branch, merged in plan order) or failed."""

    event: Literal["parallel_step_finished"] = "parallel_step_finished"
    step_id: str
    outcome: str
    commit: str | None = None


class ParallelConflict(Event):
    """A side-by-side step's work conflicts with what was merged before it: it runs again on the merged
    tree (`again` false), or, when that conflicts too, waits for a person (`again` true)."""

    event: Literal["parallel_conflict"] = "parallel_conflict"
    step_id: str
    files: list[str] = Field(default_factory=empty_list)
    again: bool = False


class MergeFailed(Event):
    """A merge back failed for another reason than a conflict."""

    event: Literal["merge_failed"] = "merge_failed"
    branch: str
    files: list[str] = Field(default_factory=empty_list)
    error: str = ""


class MergeResumed(Event):
    """A merge interrupted by a kill was finished."""

    event: Literal["merge_resumed"] = "merge_resumed"
    branch: str
    files: list[str] = Field(default_factory=empty_list)


class RollbackResumed(Event):
    """A rollback interrupted by a kill was finished."""

    event: Literal["rollback_resumed"] = "rollback_resumed"
    branch: str | None = None
    files: list[str] = Field(default_factory=empty_list)


class RolledBack(Event):
    """`kiro loop rollback`: the project back at a step's checkpoint, later boxes unchecked."""

    event: Literal["rolled_back"] = "rolled_back"
    at: str
    to_step: str
    checkpoint: str | None = None
    commit: str | None = None
    method: str | None = None
    undone: list[str] = Field(default_factory=empty_list)
    unchecked: list[str] = Field(default_factory=empty_list)
