"""The reference pages, generated from the code at every `mkdocs build` (mkdocs-gen-files): never written by
hand, so they cannot drift. Commands and flags from the Typer app (Typer's own doc generation), config keys from
the pydantic config model, events from the event models, exit codes from the status enum, routes from the
server app."""

from __future__ import annotations

import json
import re
import tempfile
import typing
from pathlib import Path
from typing import Any

import mkdocs_gen_files
import typer
import typer.cli
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kiro.status import Status, StopReason
from kiro.store import config as config_model
from kiro.store.events import KINDS, Event

GENERATED = "<!-- generated from the code by docs/_gen/reference.py at build time: do not edit -->\n\n"


def cell(text: str) -> str:
    """One table cell: one line, `|` escaped, and `<task_id>` shown as text outside code spans (not as HTML)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;") for i, part in enumerate(parts))


def type_name(annotation: Any) -> str:
    """`int | None`, `list[str]`, `'on' | 'off'`: the annotation as a reader writes it."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType")):
        return " \\| ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__ if not issubclass(annotation, BaseModel) else "mapping"
    return str(annotation).replace("typing.", "")


def default_of(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "—"
    return f"`{json.dumps(value)}`"


def models_in(annotation: Any) -> list[type[BaseModel]]:
    found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    for arg in typing.get_args(annotation):
        found += models_in(arg)
    return found


def config_rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows: list[str] = []
    described = config_model.field_descriptions(model)
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        rows.append(f"| `{key}` | {type_name(field.annotation)} | {default_of(field)} | "
                    f"{cell(described.get(name, ''))} |")
        for sub in models_in(field.annotation):
            if sub is config_model.Price:
                rows += config_rows(sub, key + ".<model>.")
            else:
                rows += config_rows(sub, key + ".")
    return rows


def config_page() -> str:
    head = "| key | type | default | what it does |\n| --- | --- | --- | --- |\n"
    top: list[str] = []
    sections: list[str] = []
    described = config_model.field_descriptions(config_model.Config)
    for name, field in config_model.Config.model_fields.items():
        subs = models_in(field.annotation)
        if not subs:
            top.append(f"| `{name}` | {type_name(field.annotation)} | {default_of(field)} | "
                       f"{cell(described.get(name, ''))} |")
            continue
        rows = [row for sub in subs for row in config_rows(sub)]
        sections.append(f"## `{name}:`\n\n{cell(described.get(name, ''))}\n\n" + head + "\n".join(rows) + "\n")
    return (GENERATED + "# Configuration keys\n\n"
            "Every key of `config/autonomous_loop.yaml`, from the config model (`kiro/store/config.py`). Every key is\n"
            "optional. Precedence, lowest first: defaults < the config file < task frontmatter < environment\n"
            "(`KIRO_MAX_ITERATIONS`, `KIRO_EXECUTOR`, `KIRO_AGENT`, `KIRO_MODEL`, ..., or any key as\n"
            "`KIRO_<SECTION>__<KEY>`) < flags. An unknown key or a bad value is an error naming the file, line and key,\n"
            "with the closest known key suggested. `kiro config schema` prints the same as a JSON Schema, for your\n"
            "editor. `backend:` is one of two shapes, chosen by `kind`: `local` (the default) or `temporal`.\n\n"
            "## Top-level keys\n\n" + head + "\n".join(top) + "\n\n" + "\n".join(sections))


def events_page() -> str:
    out = [GENERATED, "# Events\n\n",
           "Every line of `Logs/<task_id>.jsonl` is one event, from the event models (`kiro/store/events/`): the\n"
           "envelope `ts`, `task_id`, `iteration`, `event`, then the kind's fields (a field left at its default is\n"
           "not written). The same records reach the terminal, the dashboard, `kiro serve`'s SSE and WebSocket and\n"
           "`on_event` notifiers. An unknown kind (a newer kiro's) is read with every key kept.\n\n"]
    for kind in sorted(KINDS, key=lambda k: str(k.model_fields["event"].default)):
        name = kind.model_fields["event"].default
        out.append(f"## `{name}`\n\n{cell(kind.__doc__ or '')}\n\n")
        fields = [(n, f) for n, f in kind.model_fields.items() if n not in Event.ENVELOPE]
        if fields:
            out.append("| field | type | default |\n| --- | --- | --- |\n")
            for n, f in fields:
                out.append(f"| `{f.alias or n}` | {type_name(f.annotation)} | {default_of(f)} |\n")
            out.append("\n")
    return "".join(out)


def exit_codes_page() -> str:
    rows = []
    for status in Status:
        code = status.exit_code
        plain = StopReason.of(None, status)  # the limit a loop recorded in this status reached
        flag = plain.flag.format(more="N", timeout="SECONDS") if plain is not None and plain.flag else ""
        rows.append(f"| `{status.value}` | {'—' if code is None else code} | {status.group} | "
                    f"{'yes' if status.is_resumable else 'no'} | {cell(flag)} |")
    reasons = []
    for r in StopReason:
        raise_first = r.advice is not None and r.flag is None  # a config key, named by the advice
        advice = r.advice.split(", then")[0] if raise_first and r.advice else ""
        flag = r.flag.format(more="N", timeout="SECONDS") if r.flag else ""
        reasons.append(f"| `{r.value}` | `{r.status}` | {'—' if r.exit_code is None else r.exit_code} | "
                       f"{cell(advice or flag)} | {r.bucket if r.exit_code is None else ''} | {cell(r.label)} |")
    return (GENERATED + "# Statuses and exit codes\n\n"
            "A loop's status and the code `kiro loop start` and `resume` exit with when a run ends in it, from the\n"
            "status enum (`kiro/status.py`). `—`: the loop has not ended. A pause because a person is needed\n"
            "(Needs_Action/, `request_human`, a review point) exits 6; kiro itself exits 1 when it cannot go on (bad\n"
            "config, unreadable task, a lock held by another process), with one line on stderr.\n\n"
            "| status | exit code | dashboard section | plain `resume` goes on | resume needs |\n"
            "| --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
            "## Stop reasons\n\n"
            "Why a loop left `running`: `stop_reason` of the state file, `reason` of `loop_finished`, the `limit` of\n"
            "a wait; from the stop reason enum (`kiro/status.py`, [adding one](../guides/extending.md)). A wait leaves\n"
            "the loop `sleeping` and counts in a line of `kiro loop stats`' \"Time spent waiting\". `error` exits with\n"
            "the code of the error that stopped kiro (1 unless it says otherwise).\n\n"
            "| reason | status | exit code | before resuming | waiting line of `stats` | Dashboard.md says |\n"
            "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(reasons) + "\n")


def api_page() -> str:
    from starlette.routing import Route, WebSocketRoute

    from kiro.serve.app import create_app
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace

    with tempfile.TemporaryDirectory() as tmp:
        gate = create_app(StateStore(Workspace(Path(tmp))), "doc-token", frozenset({"127.0.0.1"}))
        rows = []
        for route in gate.app.routes:  # type: ignore[attr-defined]
            if isinstance(route, WebSocketRoute):
                methods = "WebSocket"
            elif isinstance(route, Route):
                methods = ", ".join(sorted(m for m in (route.methods or ()) if m != "HEAD"))
            else:
                continue
            doc = (route.endpoint.__doc__ or "").strip()
            rows.append(f"| {methods} | `{route.path}` | {cell(doc)} |")
    return (GENERATED + "# REST, SSE and WebSocket routes\n\n"
            "The routes of `kiro serve`, from the server app (`kiro/serve/app.py`). Every route but `GET /healthz`\n"
            "needs `Authorization: Bearer <token>` or `?token=<token>`; see [the dashboard and the API]"
            "(../guides/dashboard.md).\n\n"
            "| method | path | what it does |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")


def cli_page() -> str:
    from kiro import cli

    cli._register()
    command = typer.main.get_command(cli._app)
    ctx = typer.Context(command, info_name="kiro")
    text = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="kiro", title="Commands and flags")
    text = re.sub(r"\[(serve|temporal|test)\]", r"\\[\1]", text)
    return GENERATED + text


PAGES = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/events.md": events_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/api.md": api_page,
}

for path, make in PAGES.items():
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(make())
