"""YAML frontmatter: the one reader and the one writer, for task files, proposals and reports.

Frontmatter is a first line `---`, YAML, and a line `---` (or `...`); trailing whitespace and a
CRLF line end are allowed on either line. The YAML is read with PyYAML's safe loader through
`safeio.load_yaml` (depth and alias guards); errors name the file line.

The writer sets keys and keeps every other byte: a person's comments, order, quoting, line ends
and the text below stay as written. python-frontmatter re-serialises the whole block, so it is not
used: kiro's edit of a task file must be its own line and nothing else (SPEC §2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kiro.fs import safeio

_NEVER_CLOSED = ("frontmatter opened with '---' on line 1 is never closed; "
                 "add a '---' line after the YAML keys (or remove the first line)")


class FrontmatterError(ValueError):
    """Frontmatter kiro cannot read (or edit); `line` is the 1-based line of the file it concerns."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"{line}: {problem}")
        self.line = line
        self.problem = problem


class Frontmatter(NamedTuple):  # (a NamedTuple, as kiro.store.tasks' TaskCounts)
    data: dict[str, Any]
    """The keys; `{}` without frontmatter or with an empty one."""
    lines: dict[str, int]
    """1-based file line of each top-level key (of a repeated key the last, which YAML keeps)."""
    close: int | None = None
    """0-based index of the closing line; None: the text has no frontmatter."""
    rest: int = 0
    """Offset in the text of what follows the frontmatter (0 without one)."""


def _split(text: str) -> tuple[str, int, int] | None:
    """(the YAML between the delimiter lines, the closing line's index, the offset after it), or None
    when the text has no frontmatter. FrontmatterError when it is never closed."""
    end = text.find("\n")
    if (text if end < 0 else text[:end]).rstrip() != "---":
        return None
    inner: list[str] = []
    index = 1
    while end >= 0:
        start = end + 1
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if line.rstrip() in ("---", "..."):
            return "".join(f"{line}\n" for line in inner), index, len(text) if end < 0 else end + 1
        inner.append(line.rstrip("\r"))
        index += 1
    raise FrontmatterError(1, _NEVER_CLOSED)


def read(text: str) -> Frontmatter:
    """The frontmatter of `text` (a BOM already removed). FrontmatterError when it is never closed,
    is not YAML, is refused by the YAML guards, or is not a mapping of keys."""
    found = _split(text)
    if found is None:
        return Frontmatter({}, {})
    body, close, rest = found
    if not body.strip():
        return Frontmatter({}, {}, close, rest)
    yaml = safeio.yaml_module()

    try:
        data, node = safeio.load_yaml(body)
    except safeio.YamlRefused as exc:
        raise FrontmatterError(2, f"frontmatter YAML refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise FrontmatterError(mark.line + 2 if mark is not None else 2,
                               f"frontmatter is not valid YAML: {' '.join(str(problem).split())}") from None
    if data is None:
        return Frontmatter({}, {}, close, rest)
    if not isinstance(data, dict):
        raise FrontmatterError(2, f"frontmatter must be YAML keys like 'title: My task', not a {type(data).__name__}")
    lines = {key: line + 1 for key, line in safeio.yaml_key_lines(node, nested=False).items()}
    return Frontmatter({str(k): v for k, v in data.items()}, lines, close, rest)


def body(text: str) -> str:
    """What follows the frontmatter of `text`: all of it when there is none or it is never closed
    (the YAML is not read)."""
    try:
        found = _split(text)
    except FrontmatterError:
        return text
    return text if found is None else text[found[2]:]


def _dump(fields: Mapping[str, Any], newline: str) -> str:
    """`fields` as block YAML lines, in their order, through PyYAML's safe dumper (libyaml's where
    PyYAML has it: its text reads back as the same data where PyYAML's own emitter's may not, a
    string holding NEL for one)."""
    yaml = safeio.yaml_module()

    dumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(dict(fields), Dumper=dumper, sort_keys=False, allow_unicode=True,
                         default_flow_style=False, width=1000, line_break=newline))


def write(fields: Mapping[str, Any], text: str = "") -> str:
    """`text` with `fields` set in its frontmatter, and every other byte as it was: a key's line is
    replaced, a new key goes on a line of its own before the closing line, and a text without
    frontmatter gets a block of `fields` at the top (`write(fields)` is a new block on its own).
    Lines end as most of the text's do. The edit is read back: FrontmatterError when the
    frontmatter cannot be read, or when one line cannot say the value without changing what the
    other keys say (a key whose value runs over several lines)."""
    newline = "\r\n" if (crlf := text.count("\r\n")) and crlf * 2 >= text.count("\n") else "\n"
    found = read(text)
    if found.close is None:
        return f"---{newline}{_dump(fields, newline)}---{newline}{text}"
    changed = {key: value for key, value in fields.items() if key not in found.data or found.data[key] != value}
    if not changed:
        return text
    lines = text[:found.rest].split("\n")
    added: list[str] = []
    for key, value in changed.items():
        entry = _dump({key: value}, newline).removesuffix("\n")  # a CRLF's "\r" stays: "\n" joins the lines
        at = found.lines.get(key)
        if at is None:
            added.append(entry)
        else:
            lines[at - 1] = entry.removesuffix("\r") + ("\r" if lines[at - 1].endswith("\r") else "")
    lines[found.close:found.close] = added
    new = "\n".join(lines) + text[found.rest:]
    try:
        after = read(new).data
    except FrontmatterError:
        after = None
    if after != {**found.data, **{str(k): v for k, v in fields.items()}}:
        keys = ", ".join(repr(key) for key in changed)
        entries = _dump(changed, "\n").strip().replace("\n", "; ")
        raise FrontmatterError(min(found.lines.get(str(k), found.close + 1) for k in changed),
                               f"cannot set frontmatter key {keys} without rewriting other keys; "
                               f"write '{entries}' into the frontmatter by hand")
    return new
