"""`kiro init [DIR]`: create a workspace."""

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from kiro.cli import guarded


@guarded
def init(
    directory: Annotated[Path, typer.Argument(help="Where to create the workspace (created if missing).")] = Path("."),
    example: Annotated[bool, typer.Option("--example", help="Also add the bundled example task, "
                                          "Specs/hello/tasks.md, which the shell executor can run.")] = False,
) -> None:
    """Create a workspace: Specs/, Done/, Needs_Action/, Pending_Approval/, Approved/, Rejected/, Logs/, .state/, .hooks/ and a commented config/autonomous_loop.yaml showing every key and its default, with its JSON Schema beside it for editors (config/autonomous_loop.schema.json). Never overwrites an existing file."""
    from kiro.errors import UserError
    from kiro.store.approval import APPROVED, PENDING, REJECTED
    from kiro.store.config import SCHEMA_FILE, config_schema, default_config_yaml
    from kiro.store.workspace import Workspace, current_folder
    from kiro.views import console

    root = directory.expanduser()
    if not root.is_absolute() and current_folder() is None:
        raise UserError("the current folder no longer exists (deleted?); name the new workspace's folder "
                        "with an absolute path")
    try:
        root.mkdir(parents=True, exist_ok=True)
        ws = Workspace(root.resolve())
        created: list[str] = []
        for name in ("Specs", "Done", "Needs_Action", PENDING, APPROVED, REJECTED, "Logs", ".state", ".hooks", "config"):
            p = ws.root / name
            if not p.exists():
                p.mkdir(parents=True)
                created.append(name + "/")
        if not ws.config_file.exists():
            ws.config_file.write_text(default_config_yaml(), encoding="utf-8")
            created.append(str(ws.config_file.relative_to(ws.root)))
        schema = ws.config_file.with_name(SCHEMA_FILE)  # what the config's first line names, for editors
        if not schema.exists() and not schema.is_symlink():
            schema.write_text(json.dumps(config_schema(), indent=2) + "\n", encoding="utf-8")
            created.append(str(schema.relative_to(ws.root)))
        if example:
            source = resources.files("kiro").joinpath("examples", "hello")
            with resources.as_file(source) as src:
                for path in sorted(Path(src).rglob("*")):
                    if not path.is_file():
                        continue
                    rel = path.relative_to(src)
                    target = ws.root / rel
                    if target.exists():
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
                    created.append(rel.as_posix())
    except OSError as exc:  # a file in the way, no permission, a full disk: one line, not a traceback
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(root) else ""
        raise UserError(f"cannot create the workspace {str(root)!r}: {exc.strerror or exc}{where}") from None
    from kiro.git import ignore

    kept_out = ignore.keep_out(ws)  # inside a git work tree: kiro's folders stay out of the person's commits
    if created:
        console.line(f"workspace {ws.root}: created {', '.join(created)}")
    elif not kept_out:
        console.line(f"workspace {ws.root} is already set up; nothing changed")
    if kept_out:
        console.line(kept_out)
    if example:
        console.line(f"run the example: kiro loop start -w {ws.root} --task Specs/hello/tasks.md")
