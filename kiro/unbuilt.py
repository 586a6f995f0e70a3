"""Keys kiro accepts (they are in the SPEC) but does not act on yet. Each one that is set gets one
warning line when a loop starts or resumes, so no setting is silently ignored. Remove an entry here
when its feature is built."""

from __future__ import annotations

from kiro.config import Config
from kiro.tasks import TaskFile
from kiro.workspace import Workspace


def not_built_warnings(cfg: Config, task: TaskFile | None, ws: Workspace) -> list[str]:
    out = []
    scheduled = task is not None and task.frontmatter.get("schedule") is not None
    if cfg.llm.precheck_model is not None and cfg.llm.precheck == "scheduled_runs" and not scheduled:
        out.append(f"llm.precheck_model ({cfg.llm.precheck_model!r}) gates scheduled runs, and this task has no "
                   f"`schedule`: every iteration runs; set llm.precheck: every_iteration to gate each iteration")
    for key in ("max_cpu_percent", "max_disk_writes_per_minute"):
        value = getattr(cfg.resource_limits, key)
        if value is not None:
            out.append(f"resource_limits.{key} ({value}) is not enforced yet; set it to null to silence this")
    return out
