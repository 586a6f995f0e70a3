"""Pages `kiro serve` renders on the server: the digest (SPEC §14, kiro.views.digest) as HTML, and the
loops' cards the dashboard's first page shows before its script runs (`loop_cards`).

The markdown is rendered by markdown-it-py with its `js-default` preset: raw HTML in the text (a task's
title, an error message) is escaped, and links other than http(s), mailto and relative ones are dropped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from kiro.views import digest as view

_FILE_LINK = re.compile(r"\[([^\]\n]+)\]\(\.\./\.\./[^)\s]*\)")  # a workspace file, linked from Logs/digest/

STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; margin: 0; background: #0f1419; color: #d6dde6; }
main { max-width: 1100px; margin: 0 auto; padding: 20px 28px 60px; }
a { color: #6cb6ff; } nav { margin-bottom: 8px; }
h1 { font-size: 24px; margin: 8px 0; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #2a3441; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border: 1px solid #2a3441; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #18202a; } code { background: #18202a; padding: 1px 4px; border-radius: 4px; font-size: 12px; }
form { float: right; } input { background: #18202a; color: inherit; border: 1px solid #2a3441; padding: 3px 6px; }
"""

# The token came in the address (?token=): keep it for the dashboard, out of the address bar and history.
SCRIPT = """
const p = new URLSearchParams(location.search);
if (p.get("token")) {
  sessionStorage.setItem("kiro-token", p.get("token"));
  p.delete("token");
  history.replaceState(null, "", location.pathname + (p.toString() ? "?" + p : ""));
}
document.addEventListener("DOMContentLoaded", () => {
  const t = document.getElementById("token");
  if (t) t.value = sessionStorage.getItem("kiro-token") || "";
});
"""


def digest(found: dict[str, Any], redact: Callable[[str], str]) -> str:
    """The digest as one HTML page, every text through `redact`."""
    from markdown_it import MarkdownIt

    text = _FILE_LINK.sub(lambda m: f"`{m.group(1)}`", redact(view.render(found)))
    body = MarkdownIt("js-default").render(text)
    date = html.escape(found["date"])
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>kiro digest {date}</title>'
            f"<style>{STYLE}</style><script>{SCRIPT}</script></head><body><main>"
            f'<nav><a href="/">← dashboard</a><form method="get" action="/digest">'
            f'<input name="date" type="date" value="{date}" aria-label="date">'
            f'<input id="token" name="token" type="hidden"> <button>Show</button></form></nav>'
            f"{body}</main></body></html>")


def loop_cards(rows: list[dict[str, Any]]) -> str:
    """The dashboard's cards as the server sees the loops now (rows of `kiro loop status --json`): each loop's
    title, status, id, task file and steps, in the markup the page's script patches (dashboard.html), so a
    screenshot taken before any script ran shows the loops, not "Loading…". Every value is escaped."""
    if not rows:
        return ("<div class=empty>No loops in this workspace yet. Start one above, or with <code>kiro loop start "
                "--task Specs/&lt;feature&gt;/tasks.md</code>.</div>")
    out = []
    for r in rows:
        status = str(r.get("status") or "")
        total, done = r.get("steps_total") or 0, r.get("steps_done") or 0
        e = html.escape
        out.append(
            f"<article class='card s-{e(status)}' data-task-id='{e(str(r.get('task_id', '')))}'><div class=body>"
            f"<div class=top><div class=title>{e(str(r.get('title') or r.get('task_path') or ''))}</div>"
            f"<span class='pill s-{e(status)}' data-role=status>{e(status.replace('_', ' '))}</span></div>"
            f"<div class=tid>{e(str(r.get('task_id', '')))} · {e(str(r.get('task_path', '')))}</div>"
            f"<div class=stats><div class=stat><div class=k>Steps</div><div class=v data-role=steps>{done}/"
            f"{total or '–'}</div></div></div></div></article>")
    return "".join(out)
