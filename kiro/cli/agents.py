"""`kiro agents`: the agent CLI presets, whether each is installed, its version, the exact
command line kiro would run, and the box (bubblewrap) it would run in."""

import os
from pathlib import Path
from typing import Annotated

import typer

from kiro.cli import guarded


@guarded
def agents(
    name: Annotated[str | None, typer.Argument(help="One preset's details (its command line, credential, box).",
                                               show_default=False)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Every preset's details.")] = False,
    workspace: Annotated[Path | None, typer.Option("--workspace", "-w", help="The workspace whose config to use.",
                                                   show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the agent CLI presets (`agent:` / --agent), one line each: installed or not, version, the credential it would use. `kiro agents NAME` (or --verbose) adds the exact command line and the box it runs in."""
    from kiro.errors import UserError
    from kiro.executors.agents import describe
    from kiro.executors.shell import loop_box
    from kiro.plugins import AGENTS
    from kiro.processes import sandbox
    from kiro.store.settings import settings_for
    from kiro.store.workspace import Workspace
    from kiro.views import console

    ws = Workspace.find(workspace)
    located = settings_for(ws)
    config = located.config
    box = None
    if sandbox.unusable() is None:  # the box a loop's steps run in (None with sandbox: off)
        box = loop_box(config, located.ws, located.ws.root / config.project_dir, None, os.environ)
    if name is not None and name not in AGENTS.names():
        raise UserError(f"no agent preset {name!r}: choose {', '.join(AGENTS.names())}")
    rows = describe(config, box, name)  # with a name, only its CLI is asked its version
    why = sandbox.unusable()
    for row in rows:
        row["bwrap_usable"] = why is None
    if as_json:
        console.print_json(rows)
        return
    compact = name is None and not verbose
    if box is not None:
        console.line("sandbox: bwrap, usable here" + ("" if compact else f" ({box.describe()})"), style="bold")
    elif config.sandbox == "off":
        console.line(f"sandbox: off (sandbox: off in the config){'' if why else '; bwrap is usable here'}",
                     style="bold")
    else:
        console.line(f"sandbox: none: {why}; steps run unconfined", style="bold")
    if compact:  # one line each (the details: a name, or --verbose)
        table = [(("* " if row["selected"] else "  ") + row["name"],
                  (row["version"] or ("version unknown (--version timed out)" if row["version_timed_out"]
                                      else "installed")) if row["installed"] else "not installed",
                  str(row["billing"]).split(";")[0] if row["installed"] else f"install: {row['install']}")
                 for row in rows]
        wide = [max(len(cells[i]) for cells in table) for i in range(2)]
        for cells in table:
            console.line(f"{cells[0]:<{wide[0]}}  {cells[1]:<{wide[1]}}  {cells[2]}")
        console.line("(* the config's agent) details: kiro agents NAME, or kiro agents --verbose", style="dim")
        return
    for row in rows:
        mark = "installed" if row["installed"] else f"not installed ({row['install']})"
        version = f" {row['version']}" if row["version"] else ""
        if row["version_timed_out"]:
            version = (f", version unknown: `{row['program']} --version` timed out (asked again when the CLI "
                       f"changes)")
        chosen = "  <- agent in config" if row["selected"] else ""
        console.line(f"{row['name']}: {mark}{version}{chosen}", style="bold")
        console.line(f"  command: {row['command']}   (prompt on {row['prompt']})")
        idle = row["idle_timeout_seconds"]
        console.line(f"  idle timeout: {idle:g} s" if isinstance(idle, int | float) else "  idle timeout: off")
        if row["env"]:
            console.line(f"  reads: {', '.join(row['env'])}")
        console.line(f"  credential: {row['billing']}")
        if row["sandbox"] is not None:
            console.line(f"  box: read-write {', '.join(row['sandbox']['rw'])}; read-only "
                         f"{', '.join(row['sandbox']['ro']) or 'nothing more'}; the rest of "
                         f"{row['sandbox']['home'] or '$HOME'} empty, the rest of the file system read-only")
