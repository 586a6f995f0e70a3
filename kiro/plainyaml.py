"""The plain YAML kiro's own files are mostly written in, read without PyYAML (issue #12).

Importing PyYAML is a sixth of `kiro loop start`'s instructions, and the YAML a start reads is
nearly always plain: a task's frontmatter (`title: Add login`, `executor: shell`) and a config of
nested `key: value` lines with comments. `load(text)` reads that subset and returns what PyYAML's
safe loader returns for it, with the line of every key (`a.b.c` -> 1-based line); for anything
else it returns None and the caller reads the text with PyYAML, which also words every error.

The subset: block mappings indented with spaces, comments (whole lines, or after a value and a
space), blank lines; keys that are plain names; values that are a nested mapping, nothing (null),
or one scalar whose meaning in YAML 1.1 is not in doubt: a whole number without leading zeros, a
decimal like 0.8, PyYAML's true/false/null spellings, a word or words starting with a letter
(letters, digits, spaces and `_ . , / ( ) + -`), a path starting with a dot (`.`, `./src`), a URL
(`http://127.0.0.1:8080/v1`, not in a flow list), a quoted text without escapes, `{}`, or a flow
list `[a, "b c", 3]` of such scalars. A repeated key, a tab, a block list, an anchor, a `{...}`
mapping, more than MAX_DEPTH levels: None. tests/test_plainyaml.py compares it with PyYAML on
generated documents.
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 12

_BOOL = {
    **dict.fromkeys(("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
}
_NULL = frozenset(("null", "Null", "NULL", "~"))
_WORDS = r"[A-Za-z][A-Za-z0-9 _.,/()+-]*?"
# a URL (`base_url: http://127.0.0.1:8080/v1`): a scheme, `://`, no space, comma, quote, bracket, brace
# or `#`, and no `:` at the end (that would be YAML's `key: value`); a text to YAML 1.1
_URL = r"[A-Za-z][A-Za-z0-9+.-]*://[A-Za-z0-9._~:/?@!$&'()*+;=%-]*[A-Za-z0-9._~/?@!$&'()*+;=%-]"
# one scalar, then maybe a comment; the groups: double-quoted, single-quoted, decimal, whole, word
_SCALAR = (r'"([^"\\\x00-\x08\x0a-\x1f\x7f]*)"|\'([^\'\x00-\x08\x0a-\x1f\x7f]*)\''
           r"|(-?(?:0|[1-9][0-9]*)\.[0-9]+)|(-?(?:0|[1-9][0-9]{0,17}))"
           r"|(~|\.\.?(?:/[A-Za-z0-9_./-]*)?|" + _WORDS + r"[A-Za-z0-9.)])")
_VALUE = re.compile(r"(?:" + _SCALAR.replace(r"|(~|", r"|(" + _URL + r"|~|") + r")(?:[ ]+#.*)?")
_ITEM = r"[ ]*(?:" + _SCALAR.replace(" _.,/()+-", " _./()+-") + r")[ ]*"  # a flow list's item (compiled on use): no URL
# what PyYAML's reader refuses (yaml/reader.py: all but \t \n \r, \x20-\x7e, \x85, \xa0-\ud7ff,
# \ue000-\ufffd and beyond \uffff), and the line breaks of YAML 1.1 other than \n and \r (\x85,
# \u2028, \u2029). Written as the few ranges it is, not as PyYAML's negated class: compiling that
# one took 7 ms, more than all of this module's reading.
_UNREADABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
_LINE = re.compile(r"( *)([A-Za-z_][A-Za-z0-9_.-]*):(?:[ ]+(.*?))?[ ]*")


def _scalar(m: re.Match[str]) -> Any:
    """The value of a matched `_SCALAR`."""
    double, single, decimal, whole, word = m.group(1, 2, 3, 4, 5)
    if double is not None:
        return double
    if single is not None:
        return single
    if decimal is not None:
        return float(decimal)
    if whole is not None:
        return int(whole)
    if word in _BOOL:
        return _BOOL[word]
    if word in _NULL:
        return None
    return word


def _value(text: str) -> tuple[bool, Any]:
    """(understood, value) of what follows `key: `."""
    if text.startswith("{"):  # only the empty mapping
        return (True, {}) if re.fullmatch(r"\{\}(?:[ ]+#.*)?", text) else (False, None)
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1:].strip() and not re.fullmatch(r"[ ]+#.*", text[end + 1:])):
            return False, None
        inner = text[1:end]
        if not inner.strip():
            return True, []
        items = []
        for part in inner.split(","):
            m = re.fullmatch(_ITEM, part)
            if m is None:
                return False, None
            items.append(_scalar(m))
        return True, items
    m = _VALUE.fullmatch(text)
    if m is None:
        return False, None
    return True, _scalar(m)


def load(text: str) -> tuple[dict[str, Any], dict[str, int]] | None:
    """(the mapping, the line of each dotted key) when `text` is in the plain subset, else None.
    A text with only comments and blank lines is `({}, {})`, as PyYAML's None is read by kiro."""
    if _UNREADABLE.search(text):
        return None  # PyYAML's reader refuses these characters and says where, or breaks the line at them
    root: dict[str, Any] = {}
    lines: dict[str, int] = {}
    # the open mappings, innermost last: (the indent of its keys, the mapping, the keys that lead to it)
    stack: list[tuple[int, dict[str, Any], tuple[str, ...]]] = [(0, root, ())]
    pending: tuple[str, dict[str, Any]] | None = None  # a `key:` with no value yet, and its mapping
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        stripped = line.strip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        if "\t" in line or "\r" in line:
            return None
        m = _LINE.fullmatch(line)
        if m is None:
            return None
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3) or None
        if key in _BOOL or key in _NULL:
            return None  # PyYAML's key would not be this text
        if pending is not None:
            parent_indent = stack[-1][0]
            if indent > parent_indent:  # the pending key opens a mapping
                name, parent = pending
                child: dict[str, Any] = {}
                parent[name] = child
                stack.append((indent, child, (*stack[-1][2], name)))
                if len(stack) > MAX_DEPTH:
                    return None
            else:
                pending[1][pending[0]] = None
            pending = None
        while indent < stack[-1][0]:
            stack.pop()
        if indent != stack[-1][0]:
            return None  # a dedent to no open level, or an indent without a key to open it
        _, mapping, path = stack[-1]
        if key in mapping:
            return None  # PyYAML keeps the last; kiro's config calls it an error: let PyYAML's path say so
        lines[".".join((*path, key))] = number
        if rest is None or rest.startswith("#"):  # nothing, or a comment: null, or a mapping's first line
            mapping[key] = None
            pending = (key, mapping)
            continue
        understood, value = _value(rest)
        if not understood:
            return None
        mapping[key] = value
    if pending is not None:
        pending[1][pending[0]] = None
    return root, lines


# -- writing: a flat mapping of plain values, as libyaml's emitter writes it ------------------------

_PLAIN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9_./()+-]*(?: [A-Za-z0-9_./()+-]+)*")
_KEY = re.compile(r"[a-z_][a-z0-9_]*")
# what PyYAML's implicit resolvers read as something other than text (yaml/resolver.py): a text that
# looks like one of these is written quoted
_NOT_TEXT = re.compile(
    r"yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
    r"|[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
    r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
    r"|[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+"
    r"|<<|~|null|Null|NULL|=|"
    r"[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"
    r"|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?"
    r"(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?")
_QUOTED = re.compile(r"[0-9A-Za-z.:+_=<~-]*")  # what such a look-alike may hold for this to quote it


def _written(value: Any, room: int) -> str | None:
    """`value` as libyaml writes it in a block mapping, or None when this cannot say."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        text = repr(value)
        return text if "." in text and "e" not in text and "n" not in text else None
    if type(value) is not str:
        return None
    if _NOT_TEXT.fullmatch(value):
        return f"'{value}'" if _QUOTED.fullmatch(value) and len(value) <= room else None
    if _PLAIN_TEXT.fullmatch(value) and (" " not in value or len(value) <= room):
        return value
    return None


def dump(data: dict[str, Any], *, sort_keys: bool = True, width: int = 80) -> str | None:
    """`yaml.safe_dump(data, sort_keys=..., width=...)`'s text for a flat mapping of names to plain
    values (None, bool, int, a float with a point, short ASCII text), without PyYAML; None for
    anything else (the caller dumps it with PyYAML). Long text is left to PyYAML, which folds it."""
    if not data:
        return None
    out = []
    for key in sorted(data) if sort_keys else data:
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key in _BOOL or key in _NULL:
            return None
        written = _written(data[key], min(width, 80) - len(key) - 12)
        if written is None:
            return None
        out.append(f"{key}: {written}\n")
    return "".join(out)
