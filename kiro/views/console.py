"""The one module that imports rich: renderers for events, tables, progress and errors.

rich is imported lazily, on first use: errors, `--json` and the plain status table print without it,
so that `kiro loop status` starts fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from typing import TYPE_CHECKING

from kiro import timeutil
from kiro.status import percent
from kiro.store.redact import Redactor, last_run, written_in  # every line passes them: not imported a line
from kiro.usage import dollars

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from typing import Any

    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

    from kiro.store.events import Event

_consoles: dict[str, Console] = {}


def __getattr__(name: str) -> Any:
    """`console.out` and `console.err`: rich consoles, made on first use."""
    if name in ("out", "err"):
        found = _consoles.get(name)
        if found is None:
            from rich.console import Console

            found = _consoles[name] = Console(stderr=name == "err", highlight=False, soft_wrap=True)
        return found
    raise AttributeError(name)


def _text(message: str = "", style: str = "") -> Text:
    from rich.text import Text

    return Text(message, style=style)


_ANSI = {"red": "31", "yellow": "33", "green": "32", "bold": "1", "cyan": "36", "dim": "2", "white": "37",
         "bold green": "1;32", "bold red": "1;31", "dark_orange": "33"}


def _colour(stream: Any) -> bool:
    """Whether `_paint` colours for this stream: a terminal, and no NO_COLOR."""
    return not os.environ.get("NO_COLOR") and bool(getattr(stream, "isatty", lambda: False)())


def _paint(text: str, style: str | None, stream: Any) -> str:
    """ANSI colour for a terminal (not for pipes, not with NO_COLOR)."""
    code = _ANSI.get(style or "")
    if not code or os.environ.get("NO_COLOR") or not getattr(stream, "isatty", lambda: False)():
        return text
    return f"\x1b[{code}m{text}\x1b[0m"

_TONE_STYLE = {"active": "green", "waiting": "cyan", "warn": "yellow", "neutral": "white", "good": "bold green",
               "bad": "bold red"}


def _status_style(status: str, default: str = "") -> str:
    from kiro.status import Status

    try:
        return _TONE_STYLE[Status(status).tone]
    except ValueError:
        return default


# -- the one door out: every line below passes `clean` -----------------------------------------------

_redactor: list[Redactor] = []  # the one every line passes: the environment's secrets, then each loop's


def redact_with(redactor: Redactor) -> None:
    """Every later line also passes `redactor` (a loop's own, `Redactor.for_run`, before its outcome)."""
    _redactor[:] = [_known() | redactor]


def _known() -> Redactor:
    """The environment's secrets, the loops' given to `redact_with`, and those of the config resolved last
    in this process (its error, or its executor's, is printed before any loop runs)."""
    if not _redactor:
        _redactor.append(Redactor.from_environment(None))
    latest = last_run()
    if latest is not None and latest is not _merged[0]:
        _merged[0] = latest
        _redactor[0] = _redactor[0] | latest
    return _redactor[0]


_merged: list[Redactor | None] = [None]  # the last run's redactor, once merged into `_redactor`


def clean(text: str) -> str:
    """`text` with every secret kiro knows of cut: the environment's, the running loops' (`redact_with`),
    and what the text itself shows to be one (a URL's password, a word in a credential format: a config
    error that echoes a value); and with no control character a terminal would obey (`printable`)."""
    text = printable(_known().text(text))
    own = written_in(text)
    return own.text(text) if own is not None else text


# What a line may not carry to a terminal from a task file's or an agent's words: a C0 control but tab and
# newline, DEL, and ESC unless it starts one of kiro's own colours (`_ANSI`). Such an escape would set the
# clipboard (OSC 52), the window's title, clear the screen or hide text; it is shown as `cat -v` does (^[).
_OWN_COLOURS = "|".join(sorted({re.escape(code) for code in _ANSI.values()} | {"0"}))
_UNSAFE = re.compile(rf"\x1b(?!\[(?:{_OWN_COLOURS})m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f]")


def printable(text: str) -> str:
    """`text` with every control character a terminal would act on shown instead (`^[`, `^G`, `^?`)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda m: "^?" if m.group() == "\x7f" else "^" + chr(ord(m.group()) + 64), text)


def printable_data(value: Any) -> Any:
    """`printable` on every string inside `value`: a loop's row, before rich shows it on a terminal."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: printable_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_data(v) for v in value]
    return value


def error(message: str) -> None:
    """One line on stderr: `kiro: <message>`. Printed as is (paths may hold brackets)."""
    sys.stderr.write(_paint(clean(f"kiro: {message}"), "red", sys.stderr) + "\n")
    sys.stderr.flush()


_warned: list[str] = []  # warnings printed on stderr, that a loop's event printer then does not repeat


def warning(message: str) -> None:
    sys.stderr.write(_paint(clean(f"kiro: warning: {message}"), "yellow", sys.stderr) + "\n")
    sys.stderr.flush()
    _warned.append(clean(message))


def line(text: str, style: str | None = None) -> None:
    sys.stdout.write(_paint(clean(text), style, sys.stdout) + "\n")
    sys.stdout.flush()


def write(text: str, *, flush: bool = True) -> None:
    """`text` (whole lines: a table, a JSON document, an event) on stdout, cleaned."""
    sys.stdout.write(clean(text))
    if flush:
        sys.stdout.flush()


def _current_or_next(r: dict[str, Any]) -> str:
    """The current step; between a scheduled task's runs, when the next run starts."""
    return str(r.get("current_step") or (f"next run {r['next_run']}" if r.get("next_run") else "-"))


def plain_table(rows: Sequence[dict[str, Any]]) -> str:
    """The status table as plain aligned text: fast to print for any number of loops (a rich
    table costs milliseconds per row), and easy to read in a pipe."""
    headers = ("TASK ID", "STATUS", "ITER", "SUCCESS", "CURRENT STEP", "DURATION", "ETA", "COST", "TASK")
    table = [headers] + [
        (r["task_id"], r["status"], f"{r['iteration']}/{r['max_iterations']}", percent(r['success_rate']),
         _short(_current_or_next(r), 40), r["duration"], r.get("eta") or "-", r.get("cost") or "-", r["task_path"])
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    room = shutil.get_terminal_size((160, 24)).columns - sum(widths[:-1]) - 2 * (len(headers) - 1)
    widths[-1] = max(12, min(widths[-1], room))
    lines = []
    colour = _colour(sys.stdout)  # once per table, not an isatty call per row
    for n, row in enumerate(table):
        cells = [c if len(c) <= w else c[: w - 1] + "…" for c, w in zip(row, widths, strict=True)]
        padded = [c.ljust(w) for c, w in zip(cells, widths, strict=True)]
        if colour and n == 0:
            padded = [_paint(c, "bold", sys.stdout) for c in padded]
        elif colour:
            padded[1] = _paint(padded[1], _status_style(row[1]), sys.stdout)
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def print_json(data: Any) -> None:
    write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def status_text(status: str, note: str | None = None) -> Text:
    """A status, coloured; with a sleeping loop's note ("sleeping (claude limit, resumes 03:10 UTC)")."""
    return _text(f"{status} ({note})" if note else status, style=_status_style(status))


def _short(text: Any, limit: int = 160) -> str:
    s = str(text or "").strip().replace("\n", " ⏎ ")
    return s if len(s) <= limit else s[: limit - 1] + "…"


class _Blank(dict[str, "Any"]):
    def __missing__(self, key: str) -> str:
        return "?"


# git events (SPEC §9, kiro.git.checkpoints): a line each
_GIT_LINES: dict[str, tuple[str, str]] = {
    "checkpoint_created": ("  checkpoint {commit} for step {step_id}", "dim"),
    "checkpoint_skipped": ("  no checkpoint for step {step_id}: nothing changed", "dim"),
    "checkpoint_recovered": ("step {step_id}'s checkpoint {commit} was made before a restart", "cyan"),
    "checkpoint_failed": ("no checkpoint for step {step_id}: {error}", "yellow"),
    "checkpoint_left_out": ("  step {step_id}'s checkpoint leaves out {files}: {reason}", "yellow"),
    "git_lock_cleared": ("removed a stale git lock {path}", "cyan"),
    "agent_silent": ("  {agent} has printed nothing for {seconds}s (still running; ended after {idle_timeout}s "
                     "of silence: step_idle_timeout_seconds)", "yellow"),
    "request_resolved": ("answered: {message}", "cyan"),
    "worktree_created": ("worktree {path} on branch {branch}", "cyan"),
    "worktree_recreated": ("worktree {path} was half made by a killed `git worktree add`: made again", "yellow"),
    "worktree_removed": ("worktree of {branch} removed (the branch stays)", "dim"),
    "branch_left": ("branch {branch} left for review (worktree {worktree})", "bold"),
    "merge_completed": ("merged {branch} into {into} as {commit}", "green"),
    "merge_conflict": ("merging {branch} into {into} conflicts: {files}", "red"),
    "merge_failed": ("could not merge {branch}: {error}", "red"),
    "merge_resumed": ("finishing a merge of {branch} a kill interrupted: {files}", "cyan"),
    "parallel_step_started": ("step {step_id} runs beside others in {worktree}", "cyan"),
    "parallel_step_finished": ("  step {step_id}'s side-by-side attempt: {outcome}", "dim"),
    "parallel_conflict": ("step {step_id}'s work conflicts with the steps merged before it: {files}", "yellow"),
    "rollback_resumed": ("finishing a rollback a kill interrupted: {files}", "cyan"),
    "rolled_back": ("rolled back to step {to_step} ({commit}); undone: {undone}", "bold"),
}


def format_event(e: dict[str, Any], *, with_task: bool = False) -> Text | None:
    """A human line for one event, or None for events not worth a line."""
    parts = event_parts(e, with_task=with_task)
    if parts is None:
        return None
    from rich.text import Text

    t = Text(parts[0][0], style=parts[0][1])
    for text, style in parts[1:]:
        t.append(text, style=style)
    return t


# Control codes rich's Text drops (rich.control.STRIP_CONTROL_CODES): BEL, BS, VT, FF, CR. Removed by a regex, not
# `str.translate` with a table: a line with a character beyond ASCII (every step's `▶`, `✓`) is translated a
# character at a time, each a failed lookup in the table (~20 K instructions a line, two lines a step: issue #41)
_RICH_STRIPS = re.compile("[\x07\x08\x0b\x0c\r]")


def event_plain(e: dict[str, Any], *, with_task: bool = False) -> str | None:
    """`format_event` as the plain text rich prints of it when there is no terminal (no colour, soft
    wrap), without importing rich; a ValueError for text with a tab (rich expands tabs by cell widths)."""
    parts = event_parts(e, with_task=with_task)
    if parts is None:
        return None
    text = "".join(p[0] for p in parts)
    if "\t" in text:
        raise ValueError("a tab: rich expands it")
    return _RICH_STRIPS.sub("", text)


def event_parts(e: dict[str, Any], *, with_task: bool = False) -> list[tuple[str, str]] | None:
    """The pieces of `format_event`'s line, each with its style."""
    kind = e.get("event")
    ts = str(e.get("ts", ""))[11:19]
    prefix = f"{ts} "
    if with_task:
        prefix += f"[{e.get('task_id')}] "
    it = e.get("iteration")
    sid = e.get("step_id")
    t = _Parts(prefix, "dim")
    if kind in ("loop_started", "loop_resumed"):
        verb = "started" if kind == "loop_started" else "resumed"
        t.append(f"loop {e.get('task_id')} {verb}: {e.get('task_path')} (executor {e.get('executor')}, "
                 f"max {e.get('max_iterations')} iterations, pid {e.get('pid')})", style="bold")
    elif kind == "step_started":
        desc = e.get("description")
        # a step with no number has its text for id: shown once, not as "<text> <text>"
        t.append(f"[{it}] ▶ {sid} {_short(desc, 100)}" if desc != sid else f"[{it}] ▶ {_short(sid, 100)}")
        if (e.get("attempt") or 1) > 1:
            t.append(f" (attempt {e.get('attempt')})", style="yellow")
    elif kind == "step_completed":
        t.append(f"[{it}] ✓ {sid} done in {e.get('duration_seconds')}s{_so_far(e)}", style="green")
    elif kind == "step_failed":
        t.append(f"[{it}] ✗ {sid} failed (attempt {e.get('attempt')}): {_short(e.get('error'))}{_so_far(e)}",
                 style="red")
        if e.get("log"):  # whole, on a line of its own: a path cut short opens nothing
            t.append(f"\n{' ' * len(prefix)}full output: {e.get('log')}", style="dim")
    elif kind == "verify_failed":
        t.append(f"[{it}] verify `{e.get('command')}` failed", style="red")
    elif kind == "backoff":
        t.append(f"waiting {e.get('seconds')}s before retrying {sid}", style="cyan")
    elif kind == "reinjected":
        t.append(f"[{it}] context reinjected ({e.get('reason')})", style="dim")
    elif kind == "tool_called":
        said = f" ({e.get('status')})" if e.get("status") else ""
        t.append(f"[{it}]   {e.get('tool')} {_short(e.get('arguments'), 100)}{said}", style="dim")
    elif kind == "permission_answered":
        paths = f" {_short(', '.join(e.get('paths') or []), 100)}" if e.get("paths") else ""
        if e.get("allowed"):
            t.append(f"[{it}]   allowed {e.get('tool')}{paths}", style="dim")
        else:
            t.append(f"[{it}]   refused {e.get('tool')}{paths}: {_short(e.get('reason'), 200)}", style="yellow")
    elif kind == "plan_updated":
        t.append(f"[{it}]   plan: {_short('; '.join(e.get('entries') or []), 200)}", style="dim")
    elif kind == "task_moved":
        t.append(f"task moved: {e.get('from')} → {e.get('to')}", style="cyan")
    elif kind == "step_recovered":
        t.append(f"step {sid} was finished before a restart; recorded as completed", style="cyan")
    elif kind == "guardrail_triggered":
        t.append(f"guardrail {e.get('limit')}={e.get('value')} hit ({e.get('figure')})", style="yellow")
    elif kind == "wait_ended":
        cut = f" of {timeutil.human_duration(e.get('planned'))}, cut short: {e.get('stopped_by')}" \
            if e.get("stopped_by") else ""
        t.append(f"waited {timeutil.human_duration(e.get('seconds'))} ({e.get('limit')}{cut})", style="dim")
    elif kind == "precheck_skipped":
        after = e.get("next_check_seconds")
        t.append(f"pre-check ({e.get('model')}): nothing material changed, {e.get('scope')} skipped: "
                 f"{_short(e.get('reason'), 200)}" + (f"; looking again in {after:g}s" if after else ""), style="cyan")
    elif kind == "precheck_passed":
        t.append(f"pre-check ({e.get('model')}): {e.get('scope')} goes ahead: {_short(e.get('reason'), 200)}",
                 style="yellow" if e.get("failed") else "dim")
    elif kind == "human_requested":
        t.append(f"the agent asks a person: {_short(e.get('question'))} → {e.get('path')}", style="yellow")
    elif kind == "warning":
        t.append(f"warning: {_short(e.get('message'), 300)}", style="yellow")
    elif kind == "report_written":
        t.append(f"wrote {e.get('path')}", style="dim")
    elif kind == "stop_condition":
        t.append(f"stop: {e.get('message')}", style="bold")
    elif kind == "loop_finished":
        status = str(e.get("status"))
        n = e.get("iterations")
        t.append(f"loop {e.get('task_id')} {status} after {n} iteration{'' if n == 1 else 's'} "
                 f"(exit {e.get('exit_code')})", style=_status_style(status, "bold"))
    elif kind == "schedule_fired":
        extra = f", catching up {e.get('missed')} missed fire(s)" if e.get("catch_up") else ""
        t.append(f"run {e.get('run')} of {e.get('schedule')} starts{extra}", style="bold")
    elif kind == "run_finished":
        t.append(f"run {e.get('run')} done → {e.get('report')}; next run at {e.get('next_run_at')}", style="green")
    elif kind == "run_summary_saved":
        t.append(f"run {e.get('run')} summary saved ({e.get('source')}, {e.get('chars')} chars)", style="dim")
    elif kind == "state_changed":
        return None
    elif kind in _GIT_LINES:
        text, style = _GIT_LINES[kind]
        fields = {k: (str(v)[:12] if k == "commit" and v else v) for k, v in e.items()}
        if isinstance(fields.get("files"), list):
            fields["files"] = ", ".join(str(f) for f in fields["files"][:10])
        t.append(text.format_map(_Blank(fields)), style=style)
    elif kind == "iteration_started":
        t.append(f"[{it}] iteration {it}: step {sid}", style="dim")
    elif kind == "step_interrupted":
        t.append(f"[{it}] ■ {sid} interrupted ({e.get('reason')})", style="yellow")
    else:
        rest = {k: v for k, v in e.items() if k not in ("ts", "task_id", "iteration", "event")}
        t.append(f"{kind.replace('_', ' ') if isinstance(kind, str) else kind}: {_short(_fields(rest), 200)}"
                 if rest else str(kind), style="dim")
    return t.parts


def _so_far(e: dict[str, Any]) -> str:
    cost = e.get("cost_usd")
    return f" · {dollars(cost)} so far" if isinstance(cost, int | float) and cost else ""


def _fields(fields: dict[str, Any]) -> str:
    """An event's fields as a person reads them: `step 1, reason stop`, lists joined, nested values as
    compact JSON."""
    out = []
    for key, value in fields.items():
        if value is None or value == "" or value == [] or value == {}:
            continue
        if isinstance(value, list):
            shown = ", ".join(str(v) for v in value)
        elif isinstance(value, dict):
            shown = json.dumps(value, default=str, separators=(", ", ": "))
        elif key.endswith("_usd") and isinstance(value, int | float):
            key, shown = key.removesuffix("_usd"), dollars(value)
        else:
            shown = str(value)
        out.append(f"{key.removesuffix('_id').replace('_', ' ')} {shown}")
    return ", ".join(out)


class _Parts:
    """What format_event appends, kept as (text, style) pairs."""

    def __init__(self, text: str, style: str) -> None:
        self.parts = [(text, style)]

    def append(self, text: str, style: str = "") -> None:
        self.parts.append((printable(text), style))  # a terminal shows rich's text as it is


class EventPrinter:
    """Listener that prints events as the loop runs: through rich on a terminal (colour), else the
    same text without importing rich (`event_plain`; ~30 ms of a run's start-up, issue #12)."""

    def __init__(self, *, with_task: bool = False, verbose: bool = False) -> None:
        self.with_task = with_task
        self.verbose = verbose
        self.plain = not getattr(sys.stdout, "isatty", lambda: False)()

    def __call__(self, event: Event | dict[str, Any]) -> None:
        kind = event.get("event") if isinstance(event, dict) else event.event
        if not self.verbose and kind in ("tool_called", "model_called", "iteration_started", "reinjected",
                                         "report_written", "permission_answered", "plan_updated"):
            return  # before the record is made: a step's `iteration_started` is not dumped for nothing
        e = event if isinstance(event, dict) else event.as_record()  # the record the loop made, not another
        if e.get("event") == "warning" and clean(str(e.get("message"))) in _warned:
            _warned.remove(clean(str(e.get("message"))))  # the start's warning, on stderr already: once
            return
        try:
            self.show(e)
        except OSError as exc:  # no one reads the output any more, or it cannot be written: the loop goes on
            from kiro.views import output

            output.cannot_write(sys.stdout, exc)

    def show(self, e: dict[str, Any]) -> None:
        """Print one event's line (an OSError is the caller's)."""
        if self.plain:
            try:
                line = event_plain(e, with_task=self.with_task)
            except ValueError:  # a tab: rich lays it out
                pass
            else:
                if line is not None:
                    write(line + "\n")
                return
        text = format_event(e, with_task=self.with_task)
        if text is not None:
            __getattr__("out").print(text)


def status_table(rows: Sequence[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title=None, show_lines=False, header_style="bold")
    for col in ("task id", "status", "iteration", "success", "current step", "duration", "ETA", "cost", "task"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["task_id"], status_text(r["status"], r.get("sleep_note")), f"{r['iteration']}/{r['max_iterations']}",
            percent(r['success_rate']),
            _text(_short(_current_or_next(r), 50)),  # Text: a str cell is rich markup
            r["duration"], r.get("eta") or "-", r.get("cost") or "-",
            _text(r["task_path"]),
        )
    return table


def print_table(table: Any) -> None:
    __getattr__("out").print(table)


def detail_table(r: dict[str, Any]) -> Table | Group:
    """One loop in detail; how its last run ended (`cause`) under the table, on a line of its own that
    is never cut or folded (it holds the attempt log's path: one that is wrapped mid-word is no path)."""
    rows = [
        ("Task id", r["task_id"]),
        ("Task", f"{r.get('title') or ''} ({r['task_path']})"),
        ("Status", r["status"] + (f" ({r['stop_reason']})" if r.get("stop_reason") else "")),
        ("Iteration", f"{r['iteration']}/{r['max_iterations']}"),
        ("Steps", f"{r.get('steps_done', '-')}/{r.get('steps_total', '-')}"),
        ("Success rate", percent(r['success_rate'])),
        ("Current step", r.get("current_step") or "-"),
        ("Failures", f"{r['consecutive_failures']} consecutive / {r['failure_threshold']} threshold, "
                     f"{r['total_failures']} total"),
        ("Duration", r["duration"]),
        ("ETA", r.get("eta") or "-"),
        ("Executor", r.get("executor") or "-"),
        ("Process", str(r.get("pid") or "-")),
    ]
    if r.get("sleeping_because") or r.get("sleep_until"):
        until = r.get("sleep_until")
        when = f"until {str(until)[11:19]} UTC" if until else ""
        rows.append(("Sleeping", " ".join(x for x in (r.get("sleeping_because") or "", when) if x)
                     + (f" ({r['sleep_note']})" if r.get("sleep_note") else "")))
    if r.get("schedule"):
        rows.append(("Schedule", f"{r['schedule']}" + ("" if r.get("stateful") else " (not stateful)")))
        rows.append(("Runs", f"{r.get('runs', 0)}, last finished {r.get('last_run_at') or '-'}"))
        rows.append(("Next run", r.get("next_run") or "-"))
    if r.get("usage", {}).get("api_calls"):
        u = r["usage"]
        rows.append(("Usage", f"{u['api_calls']} calls, {u['total_tokens']} tokens, {dollars(u['cost_usd'])}"))
    elif r.get("cost"):
        rows.append(("Cost", r["cost"]))
    if r.get("report_path"):
        rows.append(("Report", r["report_path"]))
    if r.get("hint"):
        rows.append(("Next", r["hint"]))
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, status_text(v) if k == "Status" else Text(str(v)))
    if not r.get("cause"):
        return table
    from rich.console import Group

    return Group(table, Text(f" Cause: {r['cause']}", style=_status_style(r["status"])))


def text(message: str) -> Text:
    return _text(message)


def watch(render: Callable[[], Any], ticks: Iterable[None], plain: Callable[[], str | None] | None = None) -> None:
    """Redraw `render()` in place on every tick (a file change, or the interval) until Ctrl-C.

    Not on a terminal (a pipe, a file, `watch` under a supervisor) there is no "in place": the view
    is printed again, as plain text, each time it changes."""
    out = __getattr__("out")
    if not out.is_terminal:
        _watch_plain(render, ticks, plain)
        return
    from rich.live import Live

    with _until_interrupted() as stopping, Live(render(), console=__getattr__("out"), auto_refresh=False) as live:
        for _ in ticks:
            if stopping():
                break
            live.update(render(), refresh=True)


def _watch_plain(render: Callable[[], Any], ticks: Iterable[None], plain: Callable[[], str | None] | None) -> None:
    out = __getattr__("out")
    last: str | None = None

    def show() -> None:
        nonlocal last
        text = plain() if plain is not None else None
        if text is None:
            with out.capture() as captured:
                out.print(render())
            text = captured.get()
        if text != last:
            write(text + "\n")  # a blank line between two views
            last = text

    with _until_interrupted() as stopping:
        show()
        for _ in ticks:
            if stopping():
                break
            show()


def watch_json(data: Callable[[], Any], interval: float) -> None:
    """One compact JSON document per line every `interval` seconds until Ctrl-C (or a closed pipe)."""
    import time

    with contextlib.suppress(BrokenPipeError), _until_interrupted() as stopping:
        while not stopping():
            write(json.dumps(data(), ensure_ascii=False, default=str) + "\n")
            time.sleep(interval)


@contextlib.contextmanager
def _until_interrupted() -> Iterator[Callable[[], bool]]:
    """A watch's body until Ctrl-C: yields whether SIGINT came. The handler notes it, then raises
    KeyboardInterrupt to cut short a wait (ended quietly here). A KeyboardInterrupt can be lost on its way
    (raised in a finaliser or a callback, Python prints "Exception ignored" and goes on): the note still
    ends the watch at its next turn. Off the main thread (no signal handler there): Python's own."""
    import signal
    import threading

    came = False

    def interrupted(signum: int, frame: object) -> None:
        nonlocal came
        came = True
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, interrupted) if main else None
    try:
        yield lambda: came
    except KeyboardInterrupt:
        pass
    finally:
        if main:
            signal.signal(signal.SIGINT, before)


def progress_view(title: str, steps: Sequence[dict[str, Any]], done: int, total: int) -> None:
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    out = __getattr__("out")
    out.print(Text(clean(title), style="bold"))  # the task file's words, as it is now: not through a loop's redactor
    bar = ProgressBar(total=max(total, 1), completed=done, width=40)
    t = Table.grid(padding=(0, 1))
    t.add_row(bar, Text(f"{done}/{total} steps ({(done / total if total else 0):.0%})"))
    out.print(t)
    table = Table(header_style="bold")
    with_git = any(s.get("checkpoint") for s in steps)
    for col in ("step", "status", "attempts", "duration", *(("checkpoint",) if with_git else ()), "description"):
        table.add_column(col, overflow="fold")
    for s in steps:
        style = {"done": "green", "in_progress": "yellow", "failed": "red", "optional": "dim"}.get(s["status"], "")
        cp = s.get("checkpoint") or "-"
        # the task file's words as Text: a str cell is rich markup (`[link=...]` would make a hyperlink)
        cells = [Text(("  " * s.get("depth", 0)) + clean(s["step_id"])), Text(s["status"], style=style),
                 str(s.get("attempts") or "-"), s.get("duration") or "-"]
        if with_git:
            cells.append(cp if cp.startswith("(") else cp[:12])
        table.add_row(*cells, Text(_short(clean(s["description"]), 70)))
    out.print(table)
