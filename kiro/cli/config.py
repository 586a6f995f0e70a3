"""`kiro config`: the configuration as editors and people see it. `schema` prints the JSON Schema of
config/autonomous_loop.yaml (or of a task file's frontmatter), made from the same pydantic models kiro reads
the file with (kiro.store.config)."""

from __future__ import annotations

from typing import Annotated

import typer

from kiro.cli import HelpGroup, guarded

app = typer.Typer(
    cls=HelpGroup,
    help="The configuration: its JSON Schema, for editors.",
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
