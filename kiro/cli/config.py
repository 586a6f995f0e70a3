"""`kiro config`: the configuration as editors and people see it. `schema` prints the JSON Schema of
config/autonomous_loop.yaml (or of a task file's frontmatter), made from the same pydantic models kiro reads
the file with (kiro.store.config); `show` prints the effective config and where each value came from."""

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from kiro.cli import HelpGroup, guarded

app = typer.Typer(
    cls=HelpGroup,
    help="The configuration: its JSON Schema, for editors, and the effective config with where each value came from.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.command("schema")
@guarded
def schema(
    frontmatter: Annotated[bool, typer.Option("--frontmatter", help="The schema of a task file's frontmatter "
                                              "instead.")] = False,
) -> None:
    """Print the JSON Schema of config/autonomous_loop.yaml: every key with its type, default and description. The config `kiro init` writes names the schema file beside it on its first line (`# yaml-language-server: $schema=autonomous_loop.schema.json`), so VS Code and Neovim (yaml-language-server) complete and check its keys; `kiro config schema > config/autonomous_loop.schema.json` brings that file up to date after an upgrade."""
    from kiro.store.config import config_schema, frontmatter_schema
    from kiro.views import console

    console.print_json(frontmatter_schema() if frontmatter else config_schema())


@app.command("show")
@guarded
def show(
    workspace: Annotated[Path | None, typer.Option("--workspace", "-w", help="The workspace whose config to show.",
                                                   show_default=False)] = None,
    task: Annotated[Path | None, typer.Option("--task", help="Also apply this task file's frontmatter.",
                                              metavar="<path>", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: each key's value and where it came from.")
                       ] = False,
) -> None:
    """Print the effective config, every key with its value and where that value came from: the config file's line (config/autonomous_loop.yaml:12), the task's frontmatter line (with --task), an environment variable (KIRO_AGENT), or the default. Secrets kiro knows of are shown as [REDACTED]."""
    from kiro.store import tasks
    from kiro.store.config import resolve_config
    from kiro.store.redact import Redactor
    from kiro.store.workspace import Workspace
    from kiro.views import console

    ws = Workspace.find(workspace)
    task_file = tasks.load(task.resolve()) if task is not None else None
    origins: dict[str, str] = {}
    config = resolve_config(workspace_root=ws.root, frontmatter=dict(task_file.frontmatter) if task_file else None,
                            task_path=task_file.path if task_file else None,
                            frontmatter_lines=task_file.frontmatter_lines if task_file else None,
                            origins_out=origins)
    redact = Redactor.for_run(config)
    rows = []
    for key, value in _leaves(config.model_dump(mode="json", by_alias=True)):
        came = _origin(key, origins)
        rows.append({"key": key, "value": redact.data(value), "from": came})
    if as_json:
        console.print_json(rows)
        return
    width = max(len(r["key"]) for r in rows)
    for r in rows:
        console.write(f"{r['key']:<{width}}  {json.dumps(r['value'], ensure_ascii=False)}  ({r['from']})\n", flush=False)
    console.write("")


def _leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Each dotted key of a config dump that holds no mapping of keys (an empty mapping is a leaf)."""
    if isinstance(value, dict) and value and not prefix.endswith(("prices", "on_event")):
        return [leaf for key, sub in value.items() for leaf in _leaves(sub, f"{prefix}.{key}" if prefix else key)]
    return [(prefix, value)]



def _origin(key: str, origins: dict[str, str]) -> str:
    """Where `key`'s value came from: its own origin; else that of a mapping above it that was set whole
    (`backend: temporal`, a variable holding a mapping), not one written key by key (a section's line is not
    where the defaults of its other keys came from); else the default."""
    if key in origins:
        return origins[key]
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:n])
        if parent in origins and not any(k.startswith(parent + ".") for k in origins):
            return origins[parent]
    return "default"
