"""`kiro loop watch`: the supervisor in the foreground (or --detach)."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from kiro.cli import guarded


@guarded
def watch(
    workspace: Annotated[Path | None, typer.Option("--workspace", "-w", help="The workspace folder.",
                                                   show_default=False)] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Use this config file.", show_default=False)] = None,
    max_parallel: Annotated[int | None, typer.Option(
        "--max-parallel", min=1, show_default=False,
        help="Loops running at once (default: max_parallel_loops).")] = None,
    executor: Annotated[str | None, typer.Option("--executor", help="shell | command | openai for new loops.",
                                                 show_default=False)] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Run in the background; print the process id.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")] = False,
) -> None:
    """Supervise the workspace: start a loop for every task file that appears in Specs/ (at most max_parallel_loops at once), keep paused loops alive at no CPU cost, and continue them when their hook file is deleted or their task is moved back to Specs/. Stop it with Ctrl-C or SIGTERM: running loops save their state and are continued by the next `kiro loop watch`."""
    import asyncio

    from kiro.core.backends import backend_for, start_in_background
    from kiro.core.supervisor import Supervisor, check_watch_free
    from kiro.errors import RunError, UserError
    from kiro.store.events import Listener
    from kiro.store.workspace import Workspace, current_folder
    from kiro.views import console

    if executor is not None and executor not in ("shell", "command", "openai"):
        raise UserError(f"--executor {executor!r}: choose shell, command or openai")
    ws = Workspace.find(workspace)
    backend = backend_for(ws, config)
    if backend.name == "temporal":
        if detach:
            raise UserError("kiro loop watch --detach is not built for backend: temporal; run it in the foreground "
                            "(the loops themselves run in the workspace worker)")
        from kiro.temporal.watching import watch as watch_temporal

        raise typer.Exit(watch_temporal(ws, config_file=config, overrides={"executor": executor},
                                        max_parallel=max_parallel, quiet=quiet))
    if detach:
        ws.check_is_workspace()  # a supervisor in the background, out of sight, in a folder made a workspace by mistake
        check_watch_free(ws)
        out_path = ws.logs / "watch.out"
        pid_file = ws.state_dir / "watch.pid"

        def up(pid: int) -> bool:
            return pid_file.exists() and pid_file.read_text().strip() == str(pid)

        argv = [a for a in sys.argv[1:] if a != "--detach"]
        code = start_in_background(argv, out=out_path, cwd=current_folder() or ws.root, ready=up)
        if code is not None:
            raise RunError(f"the background supervisor exited at once (exit {code}); see {ws.relative(out_path)}")
        console.line(pid_file.read_text().strip())
        return
    listeners: list[Listener] = [] if quiet else [console.EventPrinter(with_task=True)]
    from kiro.cli.launch import say_note

    sup = Supervisor(ws, config_file=config, overrides={"executor": executor}, listeners=listeners,
                     max_parallel=max_parallel, on_note=None if quiet else say_note)
    if not quiet:  # every folder it takes task files from (kiro.store.workspace.task_files)
        console.line(f"watching {sup.ws.specs}/ and {sup.ws.root / '.kiro/specs'}/*/tasks.md (at most {sup.limit} "
                     f"loops at once); Ctrl-C to stop", style="bold")
    code = asyncio.run(sup.run())
    if not quiet:
        console.line("stopped watching: running loops saved their state; the next `kiro loop watch` continues them")
    raise typer.Exit(code)
