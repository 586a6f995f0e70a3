"""The box a step's processes run in: Debian's bubblewrap (`bwrap`), no daemon, root or not.

`sandbox: bwrap` (the default where bwrap is installed and usable) runs every process kiro starts
for a step (a shell step, verify, an agent CLI, `run_command`) as

    [nsenter --net=<the loop's network namespace>] bwrap --die-with-parent --unshare-pid --as-pid-1
          [--unshare-net] [--cap-drop ALL]
          --ro-bind / / --dev /dev --size S --tmpfs /dev/shm --remount-ro /dev --proc /proc
          --size S --tmpfs /tmp --size S --tmpfs $HOME
          --bind <project> ... --ro-bind <kiro's folders> ... --tmpfs .state/serve
          -- /bin/sh -c INIT kiro-box <argv>

- the whole file system read-only; the project directory read-write (and the task file's folder,
  when it lies outside the project: the agent CLI checks its box there);
- kiro's control folders (`.state/`, `.hooks/`, `config/`, `Logs/`, `.kiro/worktrees/`, the task areas
  `Done/` `Needs_Action/` and the approval folders) and `.git` re-bound read-only on top: kiro's own
  git runs outside the box. One of the workspace's (or the project's `.git`) that does not exist
  when the step starts, where the step could create it, is made, empty, for the box to bind (so the
  step cannot: a task in `Needs_Action/`, a `.git` with hooks kiro's git would run), once per loop: kept
  for the loop's next step, and removed when the process's loops end if it is still empty (`tidy`;
  a `.git` after each step, `Box.release`: renamed, empty, into the state folder and back in for the
  next step, as removing a folder costs a disk with online discard ~2-4 ms a step); kiro's own writes
  to it meanwhile keep it.
  `.kiro/worktrees` is read-only also for a step that runs in one of its worktrees, whose own
  worktree alone is bound read-write over it (another loop's stays out of reach even when the task
  file's folder, read-write, is the workspace root);
- `$HOME` an empty tmpfs plus, read-write, exactly the agent CLI's own config and auth files
  (each preset names them: `Preset.home_paths`), plus `sandbox_paths.rw` / `.ro`;
- a private `/tmp` (a project under /tmp is bound after it, so it stays the real one);
- what the tmpfs on /tmp and $HOME would hide of the command's own environment stays visible,
  read-only: its PATH folders with their install prefix (~/.pyenv for its shims; entries named like a
  credential masked), the program's folder, the files its command line names (`python /tmp/agent.py`),
  the files the CLI's own variables name (`AIDER_MODEL_METADATA_FILE`), and git's `~/.gitconfig`;
- `/tmp`, `/dev/shm` and the emptied `$HOME` are RAM with a size cap each (`TMPFS_BYTES`: 1 GiB, at most an
  eighth of the machine's memory), and `/dev` is read-only: a step cannot fill the machine's memory;
- `.state/serve/`, where `kiro serve` keeps its token, is an empty tmpfs in every box, whatever else
  `sandbox_paths` grants: a step cannot read the token that steers every loop. Each masked folder (this one,
  a credential folder in a shown install prefix) holds at most `MASK_BYTES`, and what a step writes there
  stays in its box;
- a network namespace of kiro's own (`sandbox_network`, `Network`): `on` (the default) is one namespace
  per loop (and per set of ports below), made at the loop's first boxed step, that every box of the loop
  joins, connected once to the internet through `pasta` (Debian's passt, as rootless podman does), ended
  with the loop; a step's processes still end with the step (its PID namespace), so nothing one step
  leaves listening is there for the next. No way back to the machine:
  no port of the host's 127.0.0.1 (`kiro serve`, databases) and no abstract unix socket is reachable,
  except the loopback ports of the agent's model endpoint (`Box.ports`: a base URL on 127.0.0.1 the
  person gave the CLI in its environment or its config files: kiro.executors.agents.Preset.endpoints);
  `off` gives each box a network namespace of its own with nothing in it; `host` is the person's explicit
  grant of the host's network (every 127.0.0.1 service, as before). Without pasta installed, `on` runs
  with the host's network and the step-start line says so (install passt);
- its own PID namespace with a fresh /proc: kiro's processes are not there to kill or read, and
  `--die-with-parent` ends the box's init when bwrap or kiro dies, which ends everything inside,
  also what left the process group (`setsid`);
- as root, no capabilities (`--cap-drop ALL`; bwrap sets no-new-privs), so nothing inside remounts
  what is read-only;
- the environment as kiro gives it; no `--new-session`: a step is already in a session of its own
  with no terminal (spawn's `start_new_session`), and staying in bwrap's process group lets the
  SIGTERM that ends a step reach the command itself (a graceful end) before the SIGKILL.

A reviewer's box (`box_for(read_only=True)`, kiro.core.review) is the same but for the project (and the
task file's folder), read-only in it too: a reviewer reads the step's work, it never changes it.

`sandbox: off` runs steps as before.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import re
import select
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from kiro.errors import ExecutorError, UserError

INSTALL = "apt-get install bubblewrap"
PASTA_INSTALL = "apt-get install passt"
PROBE_TIMEOUT = 10.0
NETWORKS = ("on", "off", "host")  # sandbox_network: the internet only / none / the host's, as a person grants it
SERVE_FOLDER = "serve"  # in the state folder: where `kiro serve` keeps its token (kiro.serve.auth); masked in every box
TMPFS_BYTES = 1 << 30  # the most each of the box's RAM folders (/tmp, /dev/shm, $HOME) may hold...
TMPFS_SHARE = 8  # ...and at most this fraction of the machine's memory
MASK_BYTES = 4096  # what a step may write in a folder the box masks (`.state/serve/`, a credential folder)

# kiro's folders a step reads but never writes, by their name in the workspace (and in the project).
# Folders only: a file kiro replaces by rename (Dashboard.md, rewritten by every loop) cannot be bound
# safely, as bwrap fails a step whose file was renamed over while it set the box up; kiro rewrites it anyway.
CONTROL = (".state", ".hooks", "config", "Logs", ".git", ".kiro/worktrees", "Done", "Needs_Action", "Pending_Approval",
           "Approved", "Rejected")


HOME_READ = (".gitconfig", ".config/git/config")  # git's identity and settings: read-only in the empty $HOME
SECRET_NAME = r"(?i)credential|token|secret|password|\.pem$|\.key$|^\.env$|^auth"  # compiled when first used
# The box's init (pid 1 of its PID namespace, `--as-pid-1`): runs the command, reaps what is orphaned
# meanwhile, and exits with its status. bwrap's own init is not waited for by bwrap, so the CPU and the
# disk writes of a step would not reach kiro's RUSAGE_CHILDREN (resource_limits reads them); this one is.
# A SIGTERM to the group reaches the command (pid 1 ignores it); its end, or bwrap's, ends the namespace.
INIT = '"$@"; exit $?'
PREFIX_PARTS = ("lib", "lib64", "pyvenv.cfg")  # what a program in <prefix>/bin loads from its prefix
_BOXES_KEPT = 256  # boxes (and what they show of a command's environment) kept for the next step: many loops


@cache
def bwrap_path() -> str | None:
    from kiro.processes.groups import which

    return which("bwrap")


@cache
def pasta_path() -> str | None:
    from kiro.processes.groups import which

    return which("pasta")


@cache
def nsenter_path() -> str | None:
    from kiro.processes.groups import which

    return which("nsenter")


@cache
def tmpfs_bytes() -> int:
    """The size cap of each RAM folder in the box: TMPFS_BYTES, or less on a machine with little memory."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return TMPFS_BYTES
    return max(64 << 20, min(TMPFS_BYTES, memory // TMPFS_SHARE))


@cache
def unusable() -> str | None:
    """Why bwrap cannot box a step here (not installed, or refused: no user namespaces for a user
    that is not root, a seccomp filter...), or None when it can. Probed once per process."""
    tool = bwrap_path()
    if tool is None:
        return f"bwrap is not installed ({INSTALL})"
    probe = [tool, *_base(), "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap cannot run ({exc})"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"bwrap cannot make a box here ({said[:200]})"
    return None


def wanted(setting: str | None) -> bool:
    """Whether steps run in the box: `bwrap` asked for, or no setting (the default) and bwrap usable."""
    if setting == "off":
        return False
    return setting == "bwrap" or unusable() is None


def _root() -> bool:
    return os.geteuid() == 0


def _base(*, own_network: bool = True) -> list[str]:
    args = ["--die-with-parent", "--unshare-pid", "--as-pid-1"]
    if own_network:
        args.append("--unshare-net")
    if _root():
        args += ["--cap-drop", "ALL"]
    size = str(tmpfs_bytes())
    return [*args, "--ro-bind", "/", "/", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev", "--proc", "/proc", "--size", size, "--tmpfs", "/tmp"]


def _within(path: Path, folder: Path) -> bool:
    """`path` is `folder` or lies in it, by their names (absolute paths; no file system call). Compares the
    parts' prefix: `folder in path.parents` walks every parent, a Path built for each (a box's argv asks
    this thousands of times)."""
    parts = folder.parts
    return path.parts[:len(parts)] == parts


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


# The control folders kiro made for the boxes of this process (and the missing parents it made with
# them, `.kiro` of `.kiro/worktrees`), with how many boxes bind each now. One no box binds any more stays,
# empty, for the loop's next step (`_idle`: made once per loop, not per step) until `tidy`, at the end of
# the process's loops; but a `.git` goes with the last box that binds it: kiro's git would take it for a
# repository.
_held: dict[Path, int] = {}
_made: set[Path] = set()
_idle: set[Path] = set()
# A `.git` made for the boxes goes after each step (kiro's git would take it for a repository), but not by
# rmdir: removing a folder frees its block, which a disk mounted with online discard makes cost ~2-4 ms, at every
# step. It is renamed, empty, into the state folder (kiro's own, read-only in every box: SPARE_PREFIX) and back
# in for the loop's next step; `tidy` removes these at the end of the process's loops.
SPARE_PREFIX = ".box-spare-"
_spares: dict[Path, Path] = {}  # a `.git` this process made -> where it waits, empty, between steps


def tidy() -> None:
    """The loops of this process have ended (or the process does): remove the control folders made for
    their boxes that no box binds now and that are still empty (what kiro wrote in one keeps it)."""
    for folder in sorted(_idle, key=lambda p: len(p.parts), reverse=True):
        if not _held.get(folder):
            _remove(folder)
    _idle.clear()
    for folder, spare in list(_spares.items()):
        if not _held.get(folder):
            del _spares[folder]
            with contextlib.suppress(OSError):
                spare.rmdir()


def _put_back(folder: Path) -> bool:
    """The `.git` kept for `folder` (`_set_aside`) renamed back in place; False: none kept, or `folder` is
    there now (made meanwhile: bound as it is)."""
    spare = _spares.get(folder)
    if spare is None or os.path.lexists(folder):
        return False
    try:
        os.rename(spare, folder)
    except OSError:
        return False
    return True


def _set_aside(folder: Path, state: Path | None) -> bool:
    """`folder`, a `.git` made for the boxes and still empty, renamed into the state folder `state` for the
    loop's next step (`_put_back`). False: not done (no state folder on its disk, or something was written in
    it meanwhile, which stays where it was), and `_remove` is left to try."""
    if state is None:
        return False
    if state not in _swept:
        _swept.add(state)
        _sweep(state)
    spare = _spares.get(folder) or state / f"{SPARE_PREFIX}{os.getpid()}-{next(_numbers)}"
    try:
        os.rename(folder, spare)  # an empty folder, or one something wrote in meanwhile: looked at below
    except OSError:
        return False
    _spares[folder] = spare
    _tidy_at_exit()
    try:
        with os.scandir(spare) as entries:
            empty = next(entries, None) is None
    except OSError:
        empty = False
    if not empty:  # not kiro's to keep: back where it was written
        del _spares[folder]
        with contextlib.suppress(OSError):
            if not os.path.lexists(folder):
                os.rename(spare, folder)
    return True


def _sweep(state: Path) -> None:
    """Remove the spare folders a killed kiro left in `state` (its pid is in their name and ends no more),
    still empty: once per state folder and process."""
    try:
        names = [e.name for e in os.scandir(state) if e.name.startswith(SPARE_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(SPARE_PREFIX):].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its kiro runs
        except ProcessLookupError:
            pass
        except OSError:
            continue  # another user's process: running
        with contextlib.suppress(OSError):
            (state / name).rmdir()


def _tidy_at_exit() -> None:
    """A process that ends without `run_loops`' own `tidy` (a worker) tidies as it exits."""
    if not _tidy_registered:
        _tidy_registered.append(True)
        atexit.register(tidy)


_numbers = itertools.count()
_tidy_registered: list[bool] = []
_swept: set[Path] = set()  # the state folders `_sweep` has looked at


def _remove(folder: Path) -> None:
    """`folder`, and the parents made with it that no box binds, deepest first, while they are empty."""
    for level in (folder, *folder.parents):
        if level not in _made or any(_held.get(p) for p in _made if _within(p, level) and p != level):
            break
        try:
            level.rmdir()
        except OSError:
            break  # not empty (kiro put something there) or already gone
        _made.discard(level)


@dataclass(frozen=True, eq=False)
class Box:
    """Where one step's process may write. Paths are absolute; `home` is made an empty tmpfs."""

    rw: tuple[Path, ...] = ()
    ro: tuple[Path, ...] = ()
    home: Path | None = None
    network: str = "on"  # NETWORKS
    ports: tuple[int, ...] = ()  # host loopback ports reachable from the box's own network (`on`)
    masked: tuple[Path, ...] = ()  # folders that are an empty tmpfs in the box (kiro serve's token)
    home_rw: tuple[Path, ...] = field(default=())  # the agent CLI's own files under `home`, for `describe`
    missing: tuple[Path, ...] = ()  # control folders (in `ro`) absent when the box was planned
    read_only: bool = False  # the project read-only too: a reviewer's box
    state: Path | None = None  # kiro's state folder, where a `.git` made for the box waits between steps
    # The command lines `prefix` worked out for this box (a loop's), by what they depend on, with the folders whose
    # entries they looked at and their mtimes: worked out once per loop, not per step (kept while those stay)
    _argv: dict[tuple[object, ...], tuple[tuple[tuple[Path, int], ...], list[str]]] = field(
        default_factory=dict, init=False, compare=False, hash=False, repr=False)

    def hold(self) -> tuple[bool, ...]:
        """Make the missing control folders, empty, for the box to bind read-only (their missing parents
        too); each is kept until the last box of this process that binds it lets go (`release`). Makes the
        masked folders too (kept: `kiro serve`'s), only now that a step runs: a refused start makes nothing.
        Returns whether each masked folder is one now (one that cannot be made is not masked)."""
        masked = tuple(map(_folder, self.masked))
        for folder in self.missing:
            _idle.discard(folder)
            if _put_back(folder):
                _made.add(folder)
                _held[folder] = _held.get(folder, 0) + 1
                continue
            for level in reversed((folder, *folder.parents)):
                if os.path.lexists(level):
                    continue
                try:
                    level.mkdir()
                except FileExistsError:
                    continue  # another process made it at this instant: it is there to bind
                except OSError:
                    break  # a read-only disk, a file in the way: the bind is skipped, as before
                _made.add(level)
            _held[folder] = _held.get(folder, 0) + 1
        return masked

    def release(self) -> None:
        """The step has ended: a folder `hold` made that no other box of this process binds is left for
        the loop's next step (`tidy` removes it, when still empty); a `.git` is removed now."""
        for folder in self.missing:
            count = _held.get(folder, 0) - 1
            if count > 0:
                _held[folder] = count
                continue
            _held.pop(folder, None)
            if folder.name == ".git":
                if folder in _made and _set_aside(folder, self.state):
                    _made.discard(folder)
                else:
                    _remove(folder)
            elif folder in _made:
                _tidy_at_exit()
                _idle.add(folder)

    async def link(self, loop: str | None) -> Network | None:
        """The network namespace this box's bwrap joins (`on` with pasta installed): one kept for `loop` (a loop's
        ledger token) and this box's ports (`Network.held`), or with no loop one of its own; the caller gives it
        back when the box has ended. None: no network (`off`), the host's (`host`), or no pasta (the host's,
        said at start)."""
        if self.network != "on" or pasta_path() is None:
            return None
        return await Network.held(self.ports, loop)

    def own_network(self) -> bool:
        return self.network == "off" or (self.network == "on" and pasta_path() is not None)

    def prefix(self, cwd: Path, env: Mapping[str, str], argv: Sequence[str] = (),
               link: Network | None = None) -> list[str]:
        """The bwrap command line to put before `argv`, run in `cwd` with `env`. Its HOME gets an empty
        tmpfs (also one that is not the box's: run_command's own temporary home). What the tmpfs on
        /tmp or $HOME would hide of the folders on its PATH, of the program's folder and of the files
        its command line names (`python /tmp/agent.py`) stays visible read-only: the command runs
        as kiro gives it. `link`: the network namespace it joins (`Box.link`). Makes the missing control
        folders it binds (`hold`): the caller `release`s the box when the command has ended."""
        tool = bwrap_path()
        if tool is None:
            raise FileNotFoundError(2, f"bwrap is not installed ({INSTALL})", "bwrap")
        masked_made = self.hold()
        child_home = env.get("HOME")
        path = env.get("PATH", "")
        # joining the network kept for the loop (`link`), or a namespace of its own: without a link a box that
        # should have its own network gets none, never the host's
        join = link.join_args() if link is not None else []
        key = (str(cwd), child_home, path, argv[0] if argv else None, _named(argv), tuple(join), masked_made)
        kept = self._argv.get(key)
        if kept is not None and _unchanged(kept[0]):
            return list(kept[1])
        args = [*join, tool, *_base(own_network=self.own_network() and link is None)]
        homes = [p for p in (self.home, Path(child_home) if child_home else None)
                 if p is not None and p.is_absolute() and p != Path("/")]
        for folder in dict.fromkeys(homes):  # an empty home, writable, gone with the step
            args += ["--size", str(tmpfs_bytes()), "--tmpfs", str(folder)]
        hidden = [Path("/tmp"), *homes]
        shown, masked, scanned = _shown(hidden, env, argv)
        args += [*self._mounts(homes, shown, masked), "--chdir", str(cwd), "--", "/bin/sh", "-c", INIT, "kiro-box"]
        if len(self._argv) >= _BOXES_KEPT:
            self._argv.clear()
        self._argv[key] = (scanned, args)
        return list(args)

    def _mounts(self, homes: list[Path], shown: list[Path], masked: list[Path]) -> list[str]:
        """The bind and tmpfs options of `prefix` after the base ones and the homes' tmpfs, in the order bwrap
        needs them: parents before what lies in them; at one depth, read-only after read-write (it wins). A
        read-only bind inside another, with nothing bound or emptied between them, is left out: the outer one
        shows it read-only already (a bind mount fewer, e.g. the task file in Specs/)."""
        shown = [p for p in shown if not any(_within(p, q) for q in (*self.rw, *self.ro))]
        mounts = [(p, 0, ["--bind-try", str(p), str(p)]) for p in dict.fromkeys(self.rw)]
        mounts += [(p, 1, ["--ro-bind-try", str(p), str(p)]) for p in dict.fromkeys(self.ro)]
        mounts += [(p, 1, ["--ro-bind-try", str(p), str(p)]) for p in shown]
        # a masked folder is an empty tmpfs of MASK_BYTES: what a step writes there stays in its box and cannot fill
        # the machine's memory; not remounted read-only (bwrap reads the whole mount table again for a remount, at
        # every step, and it would guard nothing: the folder's own files are not there to change)
        mask = ["--size", str(MASK_BYTES), "--tmpfs"]
        mounts += [(p, 2, [*mask, str(p)] if p.is_dir() else ["--ro-bind", "/dev/null", str(p)]) for p in masked]
        mounts += [(p, 3, [*mask, str(p)]) for p in self.masked if p.is_dir()]
        # what is mounted before the binds (rank -1: the base's, the homes' tmpfs) and the other binds and masks
        between = [*((b, -1) for b in (*BASE_MOUNTS, *homes)), *((p, rank) for p, rank, _ in mounts if rank != 1)]
        read_only = [p for p, rank, _ in mounts if rank == 1]

        def covered(p: Path) -> bool:
            """p, its own real path (a link's bind would make its target read-only), lies in another read-only
            bind q with nothing mounted between them (nor on q after it: a mask)."""
            return os.path.realpath(p) == str(p) and any(
                q != p and _within(p, q) and not any(
                    _within(b, q) and _within(p, b) and (b != q or rank > 1) for b, rank in between)
                for q in read_only)

        out: list[str] = []
        for path, rank, mount in sorted(mounts, key=lambda m: (len(m[0].parts), m[1])):
            if rank != 1 or not covered(path):
                out += mount
        return out

    def describe(self) -> str:
        """One line: what the box lets a step write, e.g. `project read-write; .state .hooks config Logs .git
        read-only; home: ~/.claude, ~/.claude.json (the rest empty)`."""
        home = ", ".join(_tilde(p, self.home) for p in self.home_rw)
        ro = self.ro[1:] if self.read_only else self.ro  # a reviewer's: the project first (box_for)
        names = sorted({_control(p) for p in ro if _control(p) in CONTROL}, key=CONTROL.index)
        others = [p for p in ro if _control(p) not in CONTROL]
        project = (self.ro if self.read_only else self.rw)[:1]
        # a path in the project by its name there (`Specs`), and not what lies in another named (the task file):
        # one line for every loop of a workspace
        extra = [p.relative_to(project[0]).as_posix() if project and _within(p, project[0]) and p != project[0]
                 else _tilde(p, self.home) for p in others if not any(_within(p, q) and p != q for q in others)]
        net = f"; {self.network_said()}"
        mode = "read-only" if self.read_only else "read-write"
        return (f"project {mode}; {' '.join([*names, *extra]) or 'nothing more'} read-only; "
                f"home: {home + ' (the rest empty)' if home else 'empty'}{net}")


    def network_said(self) -> str:
        """The box's network, for the step-start line."""
        if self.network == "off":
            return "network off"
        if self.network == "host":
            return "network: the host's (sandbox_network: host; every service on this machine is reachable)"
        if pasta_path() is None:
            return (f"network: the host's, as pasta is not installed ({PASTA_INSTALL}): every service on this "
                    f"machine is reachable")
        granted = f"; host's 127.0.0.1:{','.join(map(str, self.ports))} (the model endpoint)" if self.ports else ""
        return f"network: its own (pasta): the internet, no service on this machine{granted}"


class NetworkError(ExecutorError):
    """pasta could not connect a box's network namespace: the step fails, saying so."""


class Network:
    """A network namespace of kiro's own, connected to the internet by pasta (as rootless podman does), that the
    boxes of one loop join (`join_args`: `nsenter --net`, bwrap has no option to join one), one box at a time,
    instead of each making its own (`--unshare-net`) with a pasta of its own: ~60 ms of CPU a step less
    (docs/guides/box-cost.md).

    Made for the loop's first box that needs it (`held`) and kept, idle, for its next (`give_back`): one per loop
    and set of `ports` (a box reaches the host's 127.0.0.1 on exactly its own ports, as before: a shell step's box
    does not get the agent's model port), one more for each box of the loop that runs at the same time as
    another (parallel steps: each its own, so their servers' ports do not meet), never one of another loop's.
    Ended when the loop ends (`close_networks`, kiro.core.engine), when kiro exits (atexit), and when kiro is
    killed, however: the holder of the namespace reads a pipe only kiro writes (its end is the holder's), pasta
    gets SIGKILL from the kernel (`setpriv --pdeathsig`) and from kiro's reaper. A box's processes end with it
    (its own PID namespace): nothing of one step listens in the namespace for the next. One whose pasta or
    holder has ended, or is ending, is not used again: the next box gets a new one.

    No port of the host is forwarded into the namespace but `ports` (its 127.0.0.1:port reaches the host's
    127.0.0.1:port), none of the namespace's to the host, and the gateway's address is not the host
    (`--no-map-gw`). As root the holder makes a network namespace only; otherwise a user namespace too (the
    person's uid mapped to itself), which the box's bwrap joins with it and makes its own inside."""

    def __init__(self, ports: Sequence[int] = (), loop: str | None = None) -> None:
        self.ports = tuple(ports)
        self.loop = loop  # the loop it is kept for; None: one box's, ended with it
        self._holder: subprocess.Popen[bytes] | None = None  # in the namespace, until its stdin ends
        self._proc: subprocess.Popen[bytes] | None = None  # pasta, while it runs

    @classmethod
    async def held(cls, ports: Sequence[int], loop: str | None) -> Network:
        """A network for one box: an idle one kept for `loop` and `ports`, or a new one (none idle: the first
        box, or one running beside another; or what held the idle ones has ended)."""
        if loop is not None:
            _loops.add(loop)
            idle = _networks.get((loop, tuple(ports)), [])
            while idle:
                net = idle.pop()
                if net.alive():
                    return net
                net.close()  # pasta or the holder ended mid-loop
        net = cls(ports, loop)
        try:
            await net._open()
        except BaseException:
            net.close()
            raise
        return net

    def give_back(self) -> None:
        """Its box has ended (every process in it): kept, idle, for the loop's next box; ended when it has no
        loop or its loop has ended meanwhile."""
        if self.loop is None or self.loop not in _loops:
            self.close()
            return
        _networks.setdefault((self.loop, self.ports), []).append(self)
        _close_networks_at_exit()

    def alive(self) -> bool:
        """Still there to join: its holder and its pasta run, neither ending (`_running`)."""
        return (self._holder is not None and _running(self._holder)
                and self._proc is not None and _running(self._proc))

    def join_args(self) -> list[str]:
        """What to put before bwrap's command line for it to run in this namespace (and, when kiro is not root,
        in the user namespace that owns it: bwrap makes its own inside it)."""
        assert self._holder is not None
        tool = nsenter_path() or "nsenter"  # util-linux, as unshare: its absence is exec's error, the step's
        ns = f"/proc/{self._holder.pid}/ns"  # kiro's child, not collected before `close`: its pid is not reused
        return [tool, f"--net={ns}/net", *([] if _root() else [f"--user={ns}/user", "--preserve-credentials"]), "--"]

    async def _open(self) -> None:
        """Make the namespace (its holder) and connect it (pasta). Raises NetworkError."""
        from kiro.processes import groups

        tool = groups.which("unshare")
        if tool is None:
            raise NetworkError("the box's network cannot be made: unshare is not installed (apt-get install "
                               "util-linux)")
        argv = [tool, "--net", *([] if _root() else ["--user", "--map-current-user"]), "--", "/bin/sh", "-c",
                "echo; read _"]  # says it is in the namespace, then holds it until kiro's end of stdin closes
        loop = asyncio.get_running_loop()
        self._holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        assert self._holder.stdout is not None
        if not await loop.run_in_executor(None, self._holder.stdout.readline):
            said = await loop.run_in_executor(None, self._holder.communicate)
            lines = [x for x in said[1].decode(errors="replace").splitlines() if x.strip()]
            raise NetworkError(f"the box's network namespace cannot be made ({(lines or ['exit status'])[-1]})")
        for pipe in (self._holder.stdout, self._holder.stderr):  # it says nothing more: only its stdin is kept
            if pipe is not None:
                pipe.close()
        opened: list[int] = []
        try:
            try:
                opened.append(os.open(f"/proc/{self._holder.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
                if not _root():  # the holder's user namespace owns the network one: pasta joins both
                    opened.append(os.open(f"/proc/{self._holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                raise NetworkError(f"the box's network namespace cannot be opened ({exc.strerror})") from None
            await self._pasta(opened)
        finally:
            for fd in opened:
                os.close(fd)

    async def _pasta(self, fds: list[int]) -> None:
        """Start pasta on the namespace (`fds`: its network one, and its user one when kiro is not root) and
        wait until it has connected it. pasta stays in the foreground, kiro's child in a session of its own;
        `close` ends it with the loop, and the kernel when kiro dies, however it dies (`setpriv --pdeathsig`;
        kiro's reaper too, kiro.processes.groups.register, also where setpriv is missing). A pasta that forked
        into the background outlived a kiro that was killed, each with an inotify instance (watching
        /proc/self/fd, which tells no one of a namespace's end), until none were left for the machine. It
        tells kiro it is ready by writing its pid to a pipe (`--pid`)."""
        import tempfile  # here: only a box's own network uses it (a loop's start imports it not)

        from kiro.processes import groups

        tool = pasta_path()
        assert tool is not None
        setpriv = groups.setpriv_path()
        ready_r, ready_w = os.pipe()
        ports = ",".join(map(str, self.ports)) or "none"
        argv = [*([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []), tool,
                *(["--runas", "0:0"] if _root() else []), "--config-net", "--quiet", "--foreground",
                "--no-netns-quit", "--tcp-ports", "none", "--udp-ports", "none", "--tcp-ns", ports,
                "--udp-ns", "none", "--no-map-gw", "--netns", f"/proc/self/fd/{fds[0]}",
                *(["--userns", f"/proc/self/fd/{fds[1]}"] if len(fds) > 1 else []),
                "--pid", f"/proc/self/fd/{ready_w}"]
        env = dict(os.environ)
        mark = groups.start_reaper()
        if mark is not None:
            env[mark[0]] = mark[1]  # the reaper's second pass finds it also before it is registered
        loop = asyncio.get_running_loop()
        try:
            with tempfile.TemporaryFile() as err:
                try:  # not asyncio's: `close` collects it at once, also where no event loop runs any more
                    self._proc = subprocess.Popen(argv, pass_fds=(*fds, ready_w), env=env, stdin=subprocess.DEVNULL,
                                                  stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
                finally:
                    os.close(ready_w)
                groups.register(self._proc.pid)
                readable: asyncio.Future[None] = loop.create_future()

                def wake() -> None:
                    if not readable.done():
                        readable.set_result(None)

                loop.add_reader(ready_r, wake)
                try:
                    await readable
                finally:
                    loop.remove_reader(ready_r)
                if os.read(ready_r, 64):  # its pid; nothing: it ended first
                    return
                code = await loop.run_in_executor(None, self._proc.wait)
                err.seek(0)
                said = [line for line in err.read().decode(errors="replace").splitlines()
                        if line.strip() and "syslog" not in line]
        finally:
            os.close(ready_r)
        raise NetworkError(f"pasta could not connect the box's network ({(said or [f'exit {code}'])[-1]})")

    def close(self) -> None:
        """End pasta and the holder (the namespace goes with the last process in it) and collect them: the loop
        (or, with no loop, the step) has ended, or they have and the next step gets a new one."""
        from kiro.processes import groups

        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()  # nothing of it to keep: the boxes it connected have ended
            _wait_ended(proc, PASTA_END_WAIT)
            groups.unregister(proc.pid)
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.kill()
            _wait_ended(holder, PASTA_END_WAIT)
            for pipe in (holder.stdin, holder.stdout, holder.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def _running(proc: subprocess.Popen[bytes]) -> bool:
    """`proc` runs and the kernel has not begun to end it. A killed pasta closes its files, its tap device among
    them (the namespace's route goes with it), before kiro can collect it: slow where other namespaces come and go
    (rtnl lock, RCU grace periods; up to 190 ms measured beside two loops making namespaces), and a step started
    in that while joined a namespace no pasta served. The kernel marks it ending (PF_EXITING in
    /proc/<pid>/stat's flags) before it closes anything (its main thread's flag: pasta and the holder have no
    other thread)."""
    if proc.poll() is not None:
        return False
    try:
        flags = int(Path(f"/proc/{proc.pid}/stat").read_bytes().rpartition(b")")[2].split()[6])
    except (OSError, IndexError, ValueError):  # no /proc to read: poll's word, as before
        return True
    return not flags & PF_EXITING


PF_EXITING = 0x4  # include/linux/sched.h: do_exit has begun


def _wait_ended(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Collect `proc` once it has ended, waiting at most `timeout` seconds: woken by the kernel through a
    pidfd the moment it ends. Popen.wait(timeout=) polls with sleeps growing to 50 ms, and this runs on the
    event loop after every step with its own network: ~5 sleeps a step, every loop of the process stalled."""
    try:
        pidfd = os.pidfd_open(proc.pid)  # not collected yet (only here), so the pid is still pasta's
    except OSError:  # no descriptor left: as before
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
        return
    try:
        select.select([pidfd], [], [], timeout)  # readable once the process has ended
    finally:
        os.close(pidfd)
    proc.poll()


PASTA_END_WAIT = 10.0  # seconds for a SIGKILLed pasta to be gone (at once, but for a machine out of breath)
# The networks kept, idle, for each loop (its ledger's token) and ports, and the loops that have some in use or kept
_networks: dict[tuple[str, tuple[int, ...]], list[Network]] = {}
_loops: set[str] = set()


def close_networks(loop: str | None = None) -> None:
    """The loop `loop` has ended (None: every loop of the process, as it exits): end the networks kept for it (one
    still in use ends when its box gives it back)."""
    for key, nets in list(_networks.items()):
        if loop is None or key[0] == loop:
            del _networks[key]
            for net in nets:
                net.close()
    if loop is None:
        _loops.clear()
    else:
        _loops.discard(loop)


def _close_networks_at_exit() -> None:
    if not _networks_registered:
        _networks_registered.append(True)
        atexit.register(close_networks)


_networks_registered: list[bool] = []


BASE_MOUNTS = (Path("/dev"), Path("/dev/shm"), Path("/proc"), Path("/tmp"))  # what `_base` mounts on the root

# What `_shown` found, by what it was asked: kept while the folders whose entries it read (`_secrets`) are
# unchanged (their mtime): a credential file made in one meanwhile is masked at the next step, as before.
_shown_kept: dict[tuple[object, ...], tuple[tuple[tuple[Path, int], ...], tuple[list[Path], list[Path]]]] = {}


def _mtime(folder: Path) -> int:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return -1


def _unchanged(scanned: tuple[tuple[Path, int], ...]) -> bool:
    """Each folder looked into has the mtime it had then (nothing made, removed or renamed in it since)."""
    return all(_mtime(folder) == mtime for folder, mtime in scanned)


def _folder(path: Path) -> bool:
    """`path` is a folder now: made (mode 0o700) where it was missing. One `stat` where it is one already."""
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return True
    except OSError:
        pass
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return False
    return True


def _named(argv: Sequence[str]) -> tuple[str, ...]:
    """The files the command line names (`python /tmp/agent.py`): absolute paths that are there."""
    return tuple(a for a in argv[1:] if os.path.isabs(a) and os.path.exists(a))


def _shown(hidden: list[Path], env: Mapping[str, str], argv: Sequence[str]) -> tuple[
        list[Path], list[Path], tuple[tuple[Path, int], ...]]:
    """`_show`, kept from step to step while the folders it looked into are unchanged; with those folders and
    their mtimes."""
    key = (tuple(hidden), env.get("PATH", ""), argv[0] if argv else None, _named(argv))
    kept = _shown_kept.get(key)
    if kept is not None and _unchanged(kept[0]):
        return *kept[1], kept[0]
    scanned: list[tuple[Path, int]] = []
    found = _show(hidden, env, argv, scanned)
    if len(_shown_kept) >= _BOXES_KEPT:
        _shown_kept.clear()
    _shown_kept[key] = (tuple(scanned), found)
    return *found, tuple(scanned)


def _show(hidden: list[Path], env: Mapping[str, str], argv: Sequence[str],
          scanned: list[tuple[Path, int]]) -> tuple[list[Path], list[Path]]:
    """What the tmpfs on /tmp and $HOME would hide of the command's environment, to show read-only: the
    files its command line names, its PATH folders and its program's folder, each with the install
    prefix it is the bin/ of (~/.pyenv for ~/.pyenv/shims, a virtual environment, a node version), but
    never a whole hidden area or `~/.local` (only their lib/). Also what to mask in a shown prefix: its
    entries named like a credential (~/.cargo/credentials.toml)."""
    from kiro.processes.groups import which

    def under(path: Path) -> bool:
        return any(_within(path, area) for area in hidden)

    tops = {*hidden, *(area / ".local" for area in hidden)}
    folders = [Path(p) for p in env.get("PATH", "").split(os.pathsep) if os.path.isabs(p)]
    program = argv[0] if argv else None
    named = [Path(a) for a in argv[1:] if os.path.isabs(a) and os.path.exists(a)]
    if program:
        found = program if "/" in program else which(program, env.get("PATH", os.defpath))
        if found and os.path.isabs(found):
            folders += [Path(found).parent, Path(os.path.realpath(found)).parent]
    shown: list[Path] = []
    masked: list[Path] = []
    for folder in folders:
        for one in dict.fromkeys((folder, _real(folder))):
            if not under(one) or one in tops or not one.is_dir():
                continue
            shown.append(one)
            prefix = one.parent
            if prefix in tops or not under(prefix) or any(_within(area, prefix) for area in hidden):
                shown += [prefix / name for name in PREFIX_PARTS if os.path.lexists(prefix / name)]
                continue
            shown.append(prefix)
            scanned.append((prefix, _mtime(prefix)))  # before it is read: what is made meanwhile is seen next time
            masked += _secrets(prefix)
    shown += [path for path in named if under(path) and path not in tops]
    return _outermost(list(dict.fromkeys(shown)), [*masked, *hidden]), list(dict.fromkeys(masked))


def _outermost(shown: list[Path], covers: list[Path]) -> list[Path]:
    """`shown` without what another of them, bound before it, already shows as it is (`~/.pyenv/shims` in a shown
    `~/.pyenv`): a bind mount fewer for each, at every step. Only a path that is its own real path covers
    another (not a link's name), and not across something masked or hidden (`covers`) in between or on itself
    (`~/tool/secrets/bin` in a masked `~/tool/secrets`), which the inner one's own bind shows again."""
    real = {q for q in shown if os.path.realpath(q) == str(q)}
    return [p for p in shown if not any(
        q != p and _within(p, q) and not any(_within(c, q) and _within(p, c) for c in covers)
        for q in real)]


def _secrets(folder: Path) -> list[Path]:
    """The files and folders in `folder` named like a credential (not symlinks: bwrap mounts on none)."""
    try:
        return [Path(entry.path) for entry in os.scandir(folder) if re.search(SECRET_NAME, entry.name)
                and not entry.is_symlink() and (entry.is_file() or entry.is_dir())]
    except OSError:
        return []


def _tilde(path: Path, home: Path | None) -> str:
    if home is not None and _within(path, home) and path != home:
        return "~/" + path.relative_to(home).as_posix()
    return str(path)


# The boxes worked out (`box_for`), by what they were asked for: with the paths each looked at on disk and
# what it saw there. A loop's next step gets the same box while those stay as they were (a control folder
# or an agent's file made meanwhile gets a new one): a box is worked out once per loop, not per step.
_boxes: dict[tuple[object, ...], tuple[tuple[Path, ...], tuple[tuple[int, int, int, bool] | None, ...], Box]] = {}


def _seen(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int, bool] | None, ...]:
    """What is at each path (`_there`): one `lstat` each, a second `stat` only for a link."""
    return tuple(map(_there, paths))


def _there(path: Path) -> tuple[int, int, int, bool] | None:
    """None where nothing is at `path`; else which file it is (device, inode: a folder or a link put in place of
    another is another, and the box was worked out with the real path of the one before), its type, and whether
    what it names is there (a link: its target)."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), not stat.S_ISLNK(st.st_mode) or os.path.exists(path)


def box_for(*, project: Path, workspace: Path, state_dir: Path, task_file: Path | None = None,
            home: Path | None = None, home_paths: Iterable[Path] = (), read_paths: Iterable[Path] = (),
            extra_rw: Sequence[str] = (), extra_ro: Sequence[str] = (), network: str = "on",
            ports: Iterable[int] = (), read_only: bool = False, task_areas: Iterable[Path] = (),
            task_path: Path | None = None) -> Box:
    """The box of a step run in `project` for the loop of `workspace` (`_plan`): the one worked out for the
    loop's previous step while what it looked at on disk is unchanged (what is at each path: ~30 `lstat`s
    instead of the realpath of each folder, of the task areas and of the task file)."""
    home_paths, read_paths, ports, task_areas = tuple(home_paths), tuple(read_paths), tuple(ports), tuple(task_areas)
    key = (project, workspace, state_dir, task_file, home, home_paths, read_paths, tuple(extra_rw), tuple(extra_ro),
           network, ports, read_only, task_areas, task_path)
    kept = _boxes.get(key)
    if kept is not None and _seen(kept[0]) == kept[1]:
        return kept[2]
    looked = tuple(dict.fromkeys((*map(Path, home_paths), *(home / name for name in HOME_READ if home is not None),
                                  *(Path(base) / name for base in (workspace, project) for name in CONTROL),
                                  Path(state_dir), *task_areas, *([task_path] if task_path is not None else []))))
    seen = _seen(looked)
    box = _plan(project=project, workspace=workspace, state_dir=state_dir, task_file=task_file, home=home,
                home_paths=home_paths, read_paths=read_paths, extra_rw=extra_rw,
                extra_ro=(*extra_ro, *(os.path.realpath(p) for p in task_areas if p.is_dir()),
                          *([os.path.realpath(task_path)] if task_path is not None else [])),
                network=network, ports=ports, read_only=read_only)
    if len(_boxes) >= _BOXES_KEPT:
        _boxes.clear()
    _boxes[key] = (looked, seen, box)
    return box


def _plan(*, project: Path, workspace: Path, state_dir: Path, task_file: Path | None = None,
          home: Path | None = None, home_paths: Iterable[Path] = (), read_paths: Iterable[Path] = (),
          extra_rw: Sequence[str] = (), extra_ro: Sequence[str] = (), network: str = "on",
          ports: Iterable[int] = (), read_only: bool = False) -> Box:
    """The box of a step run in `project` for the loop of `workspace`. `home_paths`: the agent CLI's
    own files and folders (read-write); `read_paths`: files its variables name (read-only);
    `extra_rw` / `extra_ro`: the person's `sandbox_paths`; `network`: `sandbox_network`; `ports`:
    the host's loopback ports its own network reaches (the agent's model endpoint); `read_only`: the
    project and the task file's folder read-only too (a reviewer's box: it only reads the step's work)."""
    project = _real(project)
    rw = [] if read_only else [project]
    if task_file is not None and not read_only and not _within(_real(task_file), project):
        # the agent checks its box there; its folder, not the file alone: an edit that writes a new file
        # and renames it over the old (sed -i, most editors) needs the folder
        rw.append(_real(task_file).parent)
    home_rw = [Path(p) for p in home_paths if Path(p).exists()]
    rw += home_rw
    ro: list[Path] = [home / name for name in HOME_READ if home is not None and (home / name).is_file()]
    ro += [Path(p) for p in read_paths if not any(_within(Path(p), q) for q in rw)]
    rw += [Path(p).expanduser() for p in extra_rw]
    missing: list[Path] = []
    workspace = _real(workspace)
    for base in dict.fromkeys((workspace, project)):
        for name in CONTROL:
            folder = base / name
            if not os.path.lexists(folder):
                # kiro's own, missing where the step could make it (of a project that is not the workspace,
                # only `.git`, where kiro's git would run: its other names there are the project's to make)
                if (base == workspace or name == ".git") and any(_within(folder, area) for area in rw):
                    missing.append(folder)
                    ro.append(folder)
            elif not _within(project, _real(folder)) or name == ".kiro/worktrees":
                # a step in a worktree: the others stay read-only, its own (the project, deeper) read-write
                ro.append(_real(folder))
    state = _real(state_dir)
    if state.exists() and not _within(project, state):
        ro.append(state)
    ro += [Path(p).expanduser() for p in extra_ro]
    if read_only:  # under what it binds read-write (the agent's copy of the task file, in `.state/`)
        ro.insert(0, project)
    serve = state / SERVE_FOLDER  # kiro serve's token: never in a box, whatever sandbox_paths grants (made by `hold`)
    return Box(rw=tuple(dict.fromkeys(rw)), ro=tuple(dict.fromkeys(ro)), home=home, network=network,
               ports=tuple(sorted(set(ports))) if network == "on" else (), masked=(serve,),
               home_rw=tuple(home_rw), missing=tuple(dict.fromkeys(missing)), read_only=read_only,
               state=state if state.is_dir() else None)


def _control(path: Path) -> str:
    """The name CONTROL knows `path` by: its own, or `.kiro/worktrees` (a Kiro spec's folder beside it in
    `.kiro/` is the person's, and the agent's to work in)."""
    return ".kiro/worktrees" if path.name == "worktrees" and path.parent.name == ".kiro" else path.name


def status_line(setting: str | None) -> str | None:
    """What to tell a person when a loop starts, with no box yet: None when the box is on (the caller
    names it), else why steps run unconfined."""
    if setting == "off":
        return None
    why = unusable()
    if why is None:
        return None
    if setting == "bwrap":
        raise SandboxUnavailable(f"sandbox: bwrap was asked for, but {why}; install it ({INSTALL}) or set "
                                 f"sandbox: off to run steps unconfined")
    return (f"steps run unconfined: {why}; install it ({INSTALL}) to run each step in a box, or set "
            f"sandbox: off to say so and silence this line")


class SandboxUnavailable(UserError):
    """`sandbox: bwrap` was asked for and bwrap cannot box a step here."""
