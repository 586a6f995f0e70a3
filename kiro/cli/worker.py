"""`kiro worker`: a Temporal worker for the temporal backend (SPEC §12, docs/scale-out.md §10)."""

import socket
from pathlib import Path
from typing import Annotated

import typer

from kiro.cli import guarded


@guarded
def worker(
    workspace: Annotated[Path | None, typer.Option("--workspace", "-w", show_default=False,
                                                   help="Read backend settings from this workspace's config (and, "
                                                        "with --role workspace, run its loops).")] = None,
    config: Annotated[Path | None, typer.Option("--config", show_default=False,
                                                help="Read the backend settings from this config file instead.")] = None,
    role: Annotated[str, typer.Option("--role", help="step: run step attempts in --clone | workspace: run this "
                                                     "workspace's loops (one per workspace; `kiro loop start` "
                                                     "starts it when none runs).")] = "step",
    clone: Annotated[Path | None, typer.Option("--clone", show_default=False,
                                               help="This worker's own git clone of the project (cloned from "
                                                    "--remote when missing). Required for --role step.")] = None,
    remote: Annotated[str | None, typer.Option("--remote", show_default=False,
                                               help="The project's git remote URL (default: the clone's origin).")] = None,
    name: Annotated[str | None, typer.Option("--name", show_default=False,
                                             help="This worker's name in events and commits (default: the host name).")] = None,
    max_concurrent_steps: Annotated[int, typer.Option("--max-concurrent-steps", min=1,
                                                      help="Step attempts this worker runs at once.")] = 4,
) -> None:
    """Run a Temporal worker for `backend: temporal`. Step role (default): runs step attempts of any workspace's loops in its own clone of the project and pushes each completed step to branch kiro/<task_id>. Workspace role: runs this workspace's loops (the engine, which writes the state files, logs and reports). SIGTERM stops it."""
    from kiro.errors import UserError
    from kiro.store.settings import settings_for
    from kiro.store.workspace import Workspace

    if role not in ("step", "workspace"):
        raise UserError(f"--role {role!r}: choose step or workspace")
    ws = Workspace.find(workspace)
    cfg = settings_for(ws, config_file=config).config
    if cfg.backend.kind != "temporal":
        raise UserError(f"{ws.relative_name(ws.root / 'config' / 'autonomous_loop.yaml')}: backend is "
                        f"{cfg.backend.kind}; `kiro worker` serves backend: temporal (set backend.kind: temporal)")
    try:
        from kiro.temporal import run_worker
    except ImportError as exc:
        from kiro.temporal import MISSING

        raise UserError(f"{MISSING} ({exc})") from None
    if role == "step" and clone is None:
        raise UserError("--clone DIR is required: each step worker works in its own git clone of the project")
    run_worker.main(ws, cfg, role=role, clone=clone, remote=remote, name=name or socket.gethostname(),
                    max_concurrent=max_concurrent_steps)


