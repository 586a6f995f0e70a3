"""`kiro agents`: the agent CLI presets, whether each is installed, its version, and the exact
command line kiro would run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kiro.cli import guarded


@guarded
def agents(
    workspace: Annotated[Path | None, typer.Option("--workspace", "-w", help="The workspace whose config to use.",
                                                   show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the agent CLI presets (`agent:` / --agent): installed or not, version, and the exact command line."""
    from kiro.executors.agents import describe
    from kiro.store.settings import settings_for
    from kiro.store.workspace import Workspace
    from kiro.views import console

    ws = Workspace.find(workspace)
    rows = describe(settings_for(ws).config)
    if as_json:
        console.print_json(rows)
        return
    for row in rows:
        mark = "installed" if row["installed"] else f"not installed ({row['install']})"
        version = f" {row['version']}" if row["version"] else ""
        chosen = "  <- agent in config" if row["selected"] else ""
        console.line(f"{row['name']}: {mark}{version}{chosen}", style="bold")
        console.line(f"  command: {row['command']}   (prompt on {row['prompt']})")
        idle = row["idle_timeout_seconds"]
        console.line(f"  idle timeout: {idle:g} s" if isinstance(idle, int | float) else "  idle timeout: off")
        if row["env"]:
            console.line(f"  reads: {', '.join(row['env'])}")
        console.line(f"  credential: {row['billing']}")
