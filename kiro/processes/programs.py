"""Which programs `run_command` may run, and how: the agent writes the project's files, so a
program that reads code or configuration from them hands the agent arbitrary code execution.

Three rules, checked when the config loads (`tools.shell.allow`) and again before every run:

1. REFUSED programs run code from files or arguments the agent controls: shells, interpreters,
   `env`/`xargs`/`find`/`nohup`-style launchers, build tools and package managers (`make`, `npm`,
   `pip`, `cargo`, `pytest` ... run Makefiles, package.json scripts, setup.py, build.rs, conftest.py),
   editors and pagers with shell escapes, `sed`/`awk` (`e` command, `system()`), `tar`, `rsync`,
   `ssh`. An allow entry naming one is a config error, unless `tools.shell.trust_agent_code: true`
   says the person accepts that the agent runs code of its own (with kiro's user, minus capabilities).
   An entry that is a path (`./run.sh`) is refused the same way: the agent can rewrite the file.
2. `git` only as `git <subcommand>` for the subcommands in GIT_SUBCOMMANDS, never `git` alone; a few
   arguments that run programs or write outside the project (`--output`, `-O`, `--no-index`,
   `--exec`, `--upload-pack`, `-c`) are refused at run time.
3. Every allowed program runs with HOME and XDG_CONFIG_HOME set to an empty temporary folder (no
   `~/.gitconfig`, `~/.npmrc`, ... the agent could have written). git also runs pinned to the real
   repository around the project (GIT_DIR/GIT_WORK_TREE from a real `.git`, GIT_CEILING_DIRECTORIES;
   refused when there is none, so files named HEAD, commondir, config in the project are never a
   repository) with no system or global config, and with fsmonitor, hooks, pager, editor, external
   diff, credential helpers, askpass and non-file transports switched off by `GIT_CONFIG_*`.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

_SHELLS = "sh bash dash zsh ksh mksh fish csh tcsh ash busybox toybox"
_LAUNCHERS = ("env nohup nice ionice timeout setsid stdbuf chroot unshare nsenter setpriv sudo su doas "
              "runuser xargs find parallel watch flock script strace ltrace gdb time exec command "
              "eval source")
_INTERPRETERS = ("python python2 python3 pypy pypy3 ipython node nodejs deno bun ruby irb perl php lua luajit "
                 "tclsh wish Rscript R julia java jshell groovy scala kotlin osascript pwsh powershell awk "
                 "gawk mawk nawk sed gsed ed ex expect guile racket sbcl clisp ghci runghc swift dotnet")
_BUILD = ("make gmake cmake ninja meson scons bazel gradle gradlew mvn ant rake bundle gem cargo go rustc gcc cc "
          "clang npm npx yarn pnpm corepack pip pip3 pipx uv uvx poetry pdm hatch conda tox nox pytest py.test "
          "jest vitest mocha tsc webpack vite composer dotnet just task invoke fab")
_OTHERS = ("vi vim nvim emacs nano less more most man tar rsync ssh scp sftp docker podman kubectl systemd-run "
           "crontab at batch git-shell")

REFUSED: dict[str, str] = {}
for _names, _why in (
    (_SHELLS, "a shell: runs any command it is given"),
    (_LAUNCHERS, "runs another program named in its arguments"),
    (_INTERPRETERS, "an interpreter: runs code from its arguments or from files the agent writes"),
    (_BUILD, "runs code from project files the agent writes (Makefile, package.json, setup.py, conftest.py, "
             "build scripts)"),
    (_OTHERS, "can run shell commands (shell escapes, remote commands, hooks)"),
):
    for _n in _names.split():
        REFUSED.setdefault(_n, _why)

# git subcommands that only read or write the work tree and the repository, with hooks, pager,
# editor and external helpers switched off. Not `config`, `submodule`, `bisect`, `rebase`, `difftool`,
# `filter-branch`, `clone`/`fetch`/`push` (they run commands or reach the network).
GIT_SUBCOMMANDS = frozenset({
    "status", "diff", "log", "show", "ls-files", "grep", "blame", "rev-parse", "describe", "shortlog", "branch",
    "add", "rm", "mv", "commit", "restore", "switch", "checkout", "stash", "reset", "tag", "diff-files",
    "diff-index", "cat-file", "rev-list", "reflog", "whatchanged", "show-ref", "ls-tree",
})
# Options of the allowed subcommands that run a program, read outside the repository or write a
# file anywhere. git accepts any unambiguous prefix of a long option (`--outp=x`), so prefixes count.
GIT_REFUSED_LONG = ("--output", "--open-files-in-pager", "--no-index", "--exec", "--upload-pack",
                    "--receive-pack", "--ext-diff", "--git-dir", "--work-tree", "--exec-path", "--template",
                    "--separate-git-dir", "--pathspec-from-file", "--contents")
GIT_REFUSED_SHORT = ("-O",)

# -c overrides for every git command (GIT_CONFIG_COUNT/KEY_n/VALUE_n; they beat any config file).
GIT_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("core.gitProxy", ""),
    ("credential.helper", ""),
    ("pager.log", "false"),
    ("pager.diff", "false"),
    ("pager.show", "false"),
    ("protocol.allow", "never"),
    ("protocol.file.allow", "always"),
    ("uploadpack.packObjectsHook", ""),
    ("core.alternateRefsCommand", ""),
    ("gpg.program", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("safe.bareRepository", "explicit"),
)


def program_name(word: str) -> str:
    return os.path.basename(word)


def _versioned(name: str) -> str:
    """python3.12 -> python3, pip3.11 -> pip3, node18 -> node: version suffixes name the same program."""
    base = re.sub(r"[\d.]+$", "", name)
    return base if base else name


def refusal(entry: str) -> str | None:
    """Why an allow-list entry is refused (None when it is allowed), for a config error."""
    try:
        words = shlex.split(entry)
    except ValueError as exc:
        return f"{entry!r} cannot be split into words ({exc})"
    if not words:
        return "an empty entry allows nothing; remove it"
    prog = words[0]
    name = program_name(prog)
    if "/" in prog and not os.path.isabs(prog):
        return (f"{entry!r} names a file by a relative path, which the agent can rewrite; allow installed "
                f"programs only")
    why = REFUSED.get(name) or REFUSED.get(_versioned(name))
    if why is not None:
        return f"{entry!r}: {name} is {why}" if why.startswith("a") else f"{entry!r}: {name} {why}"
    if name == "git":
        if len(words) < 2:
            return ("'git' alone allows every git subcommand (config, submodule foreach, bisect run ...); allow "
                    "them one by one, e.g. 'git status', 'git diff'")
        if words[1] not in GIT_SUBCOMMANDS:
            return (f"{entry!r}: git {words[1]} is not one of the git subcommands kiro can run safely "
                    f"({', '.join(sorted(GIT_SUBCOMMANDS))})")
    return None


def refused_arguments(argv: Sequence[str]) -> str | None:
    """Run time: arguments of an allowed program that would run code or write outside the project."""
    if program_name(argv[0]) != "git":
        return None
    for arg in argv[2:]:  # all of them: `--` may be an option's value (`git grep -e -- -O<program>`)
        name = arg.split("=", 1)[0]
        long_hit = name.startswith("--") and len(name) > 3 and any(bad.startswith(name) for bad in GIT_REFUSED_LONG)
        short_hit = not arg.startswith("--") and any(arg.startswith(bad) for bad in GIT_REFUSED_SHORT)
        if long_hit or short_hit:
            return (f"git argument {arg!r} can run a program, read outside the repository or write a file "
                    f"anywhere, so kiro refuses it")
    return None


class NoRepository(Exception):
    pass


def real_repository(start: Path) -> tuple[Path, Path]:
    """(git dir, work tree) of the git checkout `start` is in: the nearest `.git` folder (or `.git`
    file of a linked worktree or submodule) at or above `start`. The folder itself is never taken
    as a bare repository, whatever files named HEAD or config it holds."""
    for folder in (start, *start.parents):
        dot = folder / ".git"
        if dot.is_dir() and (dot / "HEAD").is_file():
            return dot.resolve(), folder
        if dot.is_file():
            try:
                text = dot.read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            if text.startswith("gitdir:"):
                target = Path(text[len("gitdir:"):].strip())
                target = (folder / target).resolve() if not target.is_absolute() else target.resolve()
                if (target / "HEAD").is_file():
                    return target, folder
    raise NoRepository(f"{start} is not inside a git checkout (no .git folder at or above it)")


def git_environment(cwd: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The environment git runs with: pinned to the real repository, every helper off."""
    git_dir, work_tree = real_repository(cwd)
    out = {k: v for k, v in env.items() if not k.startswith("GIT_")}
    out.update({
        "GIT_DIR": str(git_dir),
        "GIT_WORK_TREE": str(work_tree),
        "GIT_CEILING_DIRECTORIES": str(work_tree.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_EDITOR": "false",
        "EDITOR": "false",
        "VISUAL": "false",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "false",
        "SSH_ASKPASS": "false",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_CONFIG_COUNT": str(len(GIT_OVERRIDES)),
    })
    for i, (key, value) in enumerate(GIT_OVERRIDES):
        out[f"GIT_CONFIG_KEY_{i}"] = key
        out[f"GIT_CONFIG_VALUE_{i}"] = value
    return out


def safe_home_environment(env: Mapping[str, str], home: Path, project: Path) -> dict[str, str]:
    """No per-user configuration: HOME and the XDG folders point at an empty folder (git then
    finds no user.email in ~/.gitconfig: EMAIL gives commits an address unless the repository
    configures one). PATH keeps only absolute folders outside the project, so a program the
    agent wrote (`./git`) is never the one that runs."""
    out = dict(env)
    project = project.resolve()
    kept = []
    for folder in out.get("PATH", os.defpath).split(os.pathsep):
        if not folder or not os.path.isabs(folder):
            continue
        real = Path(os.path.realpath(folder))
        if real == project or project in real.parents:
            continue
        kept.append(folder)
    out["PATH"] = os.pathsep.join(kept)
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        out[name] = str(home)
    out.setdefault("EMAIL", "kiro-agent@localhost")
    return out
