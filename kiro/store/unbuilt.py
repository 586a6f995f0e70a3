"""Keys kiro accepts but does not act on for this loop (today: `llm.precheck_model` on a task without a
schedule while `llm.precheck` is `scheduled_runs`). Each gets one warning line when a loop starts or
resumes, so no setting is silently ignored. Every key of the SPEC is built; a key added before its
feature gets an entry here until it is."""

from __future__ import annotations

from kiro.store.config import Config
from kiro.store.tasks import TaskFile
from kiro.store.workspace import Workspace


def not_built_warnings(cfg: Config, task: TaskFile | None, ws: Workspace) -> list[str]:
    out = []
    scheduled = task is not None and task.frontmatter.get("schedule") is not None
    if cfg.llm.precheck_model is not None and cfg.llm.precheck == "scheduled_runs" and not scheduled:
        out.append(f"llm.precheck_model ({cfg.llm.precheck_model!r}) gates scheduled runs, and this task has no "
                   f"`schedule`: every iteration runs; set llm.precheck: every_iteration to gate each iteration")
    return out
