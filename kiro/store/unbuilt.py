"""Settings that would be silently ignored, each said in one warning line when a loop starts or resumes:
keys kiro accepts but does not act on for this loop (today: `llm.precheck_model` on a task without a
schedule while `llm.precheck` is `scheduled_runs`; every key of the SPEC is built, and a key added before
its feature gets an entry here until it is), and a task's frontmatter key that is a typo of one kiro reads
(`max_iteration: 5`; kiro.store.config.frontmatter_typos)."""

from __future__ import annotations

from kiro.store.config import Config, frontmatter_typos
from kiro.store.tasks import TaskFile
from kiro.store.workspace import Workspace


def not_built_warnings(cfg: Config, task: TaskFile | None, ws: Workspace) -> list[str]:
    out = []
    scheduled = task is not None and task.frontmatter.get("schedule") is not None
    if cfg.llm.precheck_model is not None and cfg.llm.precheck == "scheduled_runs" and not scheduled:
        out.append(f"llm.precheck_model ({cfg.llm.precheck_model!r}) gates scheduled runs, and this task has no "
                   f"`schedule`: every iteration runs; set llm.precheck: every_iteration to gate each iteration")
    if task is not None and task.frontmatter:
        where = ws.relative(task.path) if task.path is not None else "the task file"
        out += frontmatter_typos(task.frontmatter, task.frontmatter_lines, where)
    return out
