"""Reading the files a person (or an agent) can put anything into, without hanging or blowing up.

One reader for config, state, task and hook files: it opens without blocking (a FIFO in place of a
file does not wait for a writer), takes only regular files (no folder, FIFO, device or socket), caps
the size (a symlink to /dev/zero is not read forever), and names a symlink loop as one. One loader
for the YAML in them (`load_yaml`, PyYAML's safe loader): nesting depth and alias expansion are
bounded before it loads (a 5,000-deep document or a "billion laughs" alias bomb is refused in
milliseconds instead of recursing or expanding).

Errors are `UnreadableFile` (a `UserError`): one line naming the file, what is wrong with it and the
fix; callers that own a more specific error type (ConfigError, TaskFileError, StateError) re-raise it
as theirs with the `reason`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiro.errors import UserError

if TYPE_CHECKING:
    import yaml

KIB = 1024
MIB = 1024 * KIB

CONFIG_MAX_BYTES = 1 * MIB  # a config file; the documented defaults are ~10 KiB
TASK_MAX_BYTES = 16 * MIB  # a task file; the largest in the corpus is well under 1 MiB
STATE_MAX_BYTES = 64 * MIB  # a state file; one with 1,000 completed steps is ~0.5 MiB
SMALL_MAX_BYTES = 64 * KIB  # lock pid files, hooks read for their text

YAML_MAX_DEPTH = 64  # nesting of mappings and lists
YAML_MAX_NODES = 100_000  # nodes after expanding every alias


class UnreadableFile(UserError):
    """A file kiro cannot or will not read; `reason` says why without naming the file."""

    def __init__(self, name: str, reason: str, fix: str) -> None:
        super().__init__(f"{name}: {reason}; {fix}" if fix else f"{name}: {reason}")
        self.name = name
        self.reason = reason
        self.fix = fix


def file_kind(mode: int) -> str:
    """What a non-regular file is, for a person: "a folder", "a FIFO (named pipe)", ..."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / KIB:.0f} KiB" if n >= KIB else f"{n} bytes"


def read_bytes(path: Path | str, *, limit: int, name: str | None = None, fix: str = "", dir_fd: int | None = None,
               follow_symlinks: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (`path` relative to `dir_fd` when given; with
    `follow_symlinks` False, a symbolic link at `path` is refused, not followed).

    FileNotFoundError passes through (a missing file is the caller's business: often normal); any
    other problem raises UnreadableFile naming `name` (default: the path), the problem and `fix`.
    """
    shown = name if name is not None else str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableFile(shown, "is a symlink loop" if follow_symlinks else "is a symbolic link", fix) from None
        if exc.errno == errno.EISDIR:
            raise UnreadableFile(shown, "is a folder, not a file", fix) from None
        raise UnreadableFile(shown, f"cannot be read ({exc.strerror or exc})", fix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(shown, f"is {file_kind(st.st_mode)}, not a file", fix)
        if st.st_size > limit:
            raise UnreadableFile(shown, f"is {_size(st.st_size)}, over the {_size(limit)} kiro reads", fix)
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, min(MIB, limit + 1 - total))
            except OSError as exc:
                raise UnreadableFile(shown, f"cannot be read ({exc.strerror or exc})", fix) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while being read
                raise UnreadableFile(shown, f"is over the {_size(limit)} kiro reads", fix)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_regular(path: Path | str, *, name: str | None = None, fix: str = "", write: bool = False) -> int:
    """A file descriptor on a regular file, opened without blocking (reading, or appending with
    `write`, which creates the file). FileNotFoundError passes through when reading; anything
    that is not a regular file raises UnreadableFile."""
    shown = name if name is not None else str(path)
    flags = os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    flags |= (os.O_WRONLY | os.O_APPEND | os.O_CREAT) if write else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableFile(shown, "is a symlink loop", fix) from None
        if exc.errno == errno.EISDIR:
            raise UnreadableFile(shown, "is a folder, not a file", fix) from None
        if exc.errno == errno.ENXIO:
            raise UnreadableFile(shown, "is a FIFO (named pipe), not a file", fix) from None
        raise UnreadableFile(shown, f"cannot be opened ({exc.strerror or exc})", fix) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnreadableFile(shown, f"is {file_kind(st.st_mode)}, not a file", fix)
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def folder_fd(folder: Path | str) -> Iterator[int]:
    """A descriptor on the folder `folder` (an absolute path, resolved), reached from / one name at a time
    without following a symbolic link: a folder on the way that became a symlink since `folder` was
    resolved (a swap between a check by path and the write) raises UnreadableFile instead of leading the
    write elsewhere. Write into it by name with `dir_fd` (kiro.fs.atomic.atomic_write)."""
    path = Path(folder)
    if not path.is_absolute():
        raise ValueError(f"folder_fd needs an absolute path, not {folder!r}")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.parts[1:]:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                link = exc.errno in (errno.ELOOP, errno.ENOTDIR)
                why = "a symbolic link or a file" if link else exc.strerror or str(exc)
                raise UnreadableFile(str(path), f"{part!r} on its way is not a plain folder ({why})", "") from None
            os.close(fd)
            fd = nfd
        yield fd
    finally:
        os.close(fd)


def check_file_or_absent(path: Path | str, *, name: str | None = None, fix: str = "") -> None:
    """Raise UnreadableFile unless `path` is absent or (through symlinks) a regular file: for a file
    kiro will append to, checked before the loop starts rather than failing mid-run."""
    shown = name if name is not None else str(path)
    try:
        os.lstat(path)
    except FileNotFoundError:
        return
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UnreadableFile(shown, "is a symlink to something missing", fix) from None
    except OSError as exc:
        reason = "is a symlink loop" if exc.errno == errno.ELOOP else f"cannot be examined ({exc.strerror})"
        raise UnreadableFile(shown, reason, fix) from None
    if not stat.S_ISREG(mode):
        raise UnreadableFile(shown, f"is {file_kind(mode)}, not a file", fix)


class YamlRefused(ValueError):
    """YAML too deep or expanding too far to load; the message says which, and where."""


# PyYAML's own reader (`yaml.reader.Reader`) compiles this character class as PyYAML is imported: its ranges up
# to U+10FFFF cost `re` ~13 ms (~57 M instructions, a twentieth of a `kiro loop start`), for a reader kiro uses
# only where libyaml is missing and to word a syntax error. The same set of characters, spelled by what is not
# printable, compiles in ~1 ms; placed in `re`'s cache under the reader's spelling, the import finds it there.
_YAML_NON_PRINTABLE = "[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010ffff]"
_YAML_NON_PRINTABLE_SAME = "[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x84\x86-\x9F\uD800-\uDFFF\uFFFE\uFFFF]"


def yaml_module() -> types.ModuleType:
    """PyYAML, imported through here by kiro's code (its first import in a process is ~57 M instructions
    lighter: `_YAML_NON_PRINTABLE`). Where `re` keeps no such cache, PyYAML compiles its own."""
    if "yaml" not in sys.modules:
        import re

        cache = getattr(re, "_cache", None)
        if isinstance(cache, dict):
            cache[str, _YAML_NON_PRINTABLE, 0] = re.compile(_YAML_NON_PRINTABLE_SAME)
    import yaml

    return yaml


def yaml_loader() -> type:
    """PyYAML's safe loader: libyaml's (CSafeLoader) where PyYAML has it, else its own."""
    yaml = yaml_module()

    loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return loader


def load_yaml(text: str, loader: type | None = None) -> tuple[Any, yaml.Node | None]:
    """(the data, the node it was built from) of a YAML text a person or an agent wrote, through
    `loader` (a subclass of `yaml_loader()`; default: that). The one place kiro loads such YAML:
    a text too deep or expanding too far is refused first (YamlRefused), before the loader
    recurses or expands it. A syntax error is PyYAML's YAMLError, with the line in its mark."""
    yaml = yaml_module()

    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate (an environment value's undecodable byte)
        raise yaml.reader.ReaderError("<unicode string>", exc.start, ord(text[exc.start]), "utf-8",
                                      "special characters are not allowed") from None
    shape = yaml_shape_problem(text)
    if shape is not None:
        raise YamlRefused(shape)
    reader = (loader or yaml_loader())(text)
    try:
        node = reader.get_single_node()
        return (reader.construct_document(node) if node is not None else None), node
    except (yaml.scanner.ScannerError, yaml.parser.ParserError, yaml.composer.ComposerError):
        if not isinstance(reader, yaml.SafeLoader):
            # libyaml's words leave out what it found (a tab, an alias's name, an escape character):
            # PyYAML's own parser words the same error with it (within the depth checked above)
            try:
                yaml.compose(text, Loader=yaml.SafeLoader)
            except yaml.MarkedYAMLError as own:
                raise own from None
        raise
    finally:
        reader.dispose()


def yaml_key_lines(node: yaml.Node | None, *, nested: bool = True) -> dict[str, int]:
    """The 1-based line of each key of a loaded mapping, by dotted path (`llm.model`; only the
    top-level keys unless `nested`); of two equal keys the later, as in the loaded mapping."""
    lib = yaml_module()

    lines: dict[str, int] = {}
    active: set[int] = set()

    def walk(node: yaml.MappingNode, prefix: tuple[str, ...]) -> None:
        active.add(id(node))
        for key_node, value_node in node.value:
            if not isinstance(key_node, lib.ScalarNode):
                continue
            path = (*prefix, str(key_node.value))
            lines[".".join(path)] = key_node.start_mark.line + 1
            if nested and isinstance(value_node, lib.MappingNode) and id(value_node) not in active:
                walk(value_node, path)  # (an alias to a mapping still open is a recursive one: not again)
        active.discard(id(node))

    if isinstance(node, lib.MappingNode):
        walk(node, ())
    return lines


def yaml_shape_problem(text: str) -> str | None:
    """Why a YAML text is too deep or expands too far to load safely, or None when it is fine (or
    malformed: the real loader then reports the syntax error with its line).

    Walks the event stream only (no recursion, no construction): each collection's expanded size is
    counted as it closes, each alias adds the size of what it names, and an alias to a collection
    still open (a recursive structure) is refused outright.
    """
    yaml = yaml_module()

    fast: type | None = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return _yaml_shape_walk(text, fast)
        except yaml.YAMLError:
            # the libyaml of PyYAML 6.0.4 calls more than 1,000 levels a syntax error ("exceeded
            # maximum nesting depth"); PyYAML's own loader, which reads the text next, would recurse
            # until Python's stack runs out: PyYAML's own event parser (no recursion) tells which it is
            pass
    try:
        return _yaml_shape_walk(text, yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    except RecursionError:  # pragma: no cover - the event parser does not recurse; belt and braces
        return f"nested more than {YAML_MAX_DEPTH} levels deep"


def _yaml_shape_walk(text: str, loader_cls: type) -> str | None:
    """`yaml_shape_problem` through `loader_cls`'s event parser; its YAMLError is the caller's."""
    yaml = yaml_module()

    sizes: list[int] = [0]  # per open collection: nodes inside so far
    anchors_open: list[str | None] = [None]
    anchored: dict[str, int] = {}
    for event in yaml.parse(text, Loader=loader_cls):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(sizes) > YAML_MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else "?"
                return f"nested more than {YAML_MAX_DEPTH} levels deep (line {line})"
            sizes.append(0)
            anchors_open.append(event.anchor)
        elif isinstance(event, yaml.CollectionEndEvent):
            inner = sizes.pop() + 1
            anchor = anchors_open.pop()
            if anchor is not None:
                anchored[anchor] = inner
            sizes[-1] += inner
        elif isinstance(event, yaml.ScalarEvent):
            sizes[-1] += 1
            if event.anchor is not None:
                anchored[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in anchors_open:
                return f"the alias *{event.anchor} refers to a collection that contains it (a recursive alias)"
            sizes[-1] += anchored.get(event.anchor or "", 1)
        else:
            continue
        if sum(sizes) > YAML_MAX_NODES:
            return (f"expands to more than {YAML_MAX_NODES:,} values through its aliases "
                    f"(an alias bomb); write the values out")
    return None
