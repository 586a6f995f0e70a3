"""kiro's own git runs nothing a step wrote (issue #39 item 1, SPEC §15): an adversarial suite.

A boxed shell step (real bubblewrap) plants, in the project, every way the git program can be made to run
a program: repositories of its own below the project (`sub/.git` with a clean or process filter, fsmonitor,
hooks, `core.hooksPath`, textconv, an external diff, a merge driver, `include.path`, core programs; deeper
down; behind a gitfile), and `.gitattributes` in the work tree naming the drivers, fsmonitor and hooks the
person's own `.git/config` has. Then kiro's git does what a loop does: a checkpoint per step (real git),
the worktree's merge with `isolation: worktree`, a rollback. Each planted program appends its name to a
canary file outside the project, which no program in the box can reach (the box's file system is read-only
there): a line in it is a program that ran outside the box, as the person.

The table printed names each attack, by class and place, and whether it held. Run against the previous
main's kiro/git (its checkpoints ran `git add -A` and `git status`, which recursed into the nested
repositories) the nested-repository rows escaped.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from kiro.processes import sandbox
from tests.conftest import FAST_CONFIG, Workspace
from tests.gitutil import git, init_repo

pytestmark = pytest.mark.skipif(sandbox.unusable() is not None, reason=f"no usable bwrap: {sandbox.unusable()}")

# Each planted program: `<name>` appended to the canary, stdin passed on (a filter must give content back).
PROGRAM = '#!/bin/sh\necho "$1" >> {canary}\ncat\n'

# (class, tag): the attacks a step plants. A tag is what its program writes to the canary.
NESTED = {
    "nested repo: filter clean": "filter-clean",
    "nested repo: filter process": "filter-process",
    "nested repo: fsmonitor": "fsmonitor",
    "nested repo: core.hooksPath": "hookspath",
    "nested repo: .git/hooks": "hook",
    "nested repo: textconv": "textconv",
    "nested repo: diff.external": "diff-external",
    "nested repo: merge driver": "merge-driver",
    "nested repo: include.path": "include",
    "nested repo: core programs (pager, editor, ssh, askpass, credential)": "core-program",
    "nested repo, deeper in an untracked folder": "deep-filter",
    "nested repo behind a gitfile": "gitfile-filter",
}
TOP = {
    "top work tree: .gitattributes names the person's filter": "person-filter",
    "top work tree: .gitattributes names the person's textconv": "person-textconv",
    "top work tree: .gitattributes names the person's merge driver": "person-merge",
    "top repo: the person's fsmonitor": "person-fsmonitor",
    "top repo: the person's hooks": "person-hook",
}
HOOKS = ("pre-commit", "post-commit", "post-index-change", "reference-transaction", "post-checkout",
         "post-merge", "pre-auto-gc", "commit-msg", "prepare-commit-msg")

# What the boxed step runs: `$EVIL <tag>` is the planted program (in the project: the step writes it).
PLANT = r"""
set -e
EVIL="$PWD/.evil/run"
mkdir -p .evil && printf '#!/bin/sh\necho "$1" >> %s\ncat\n' "$CANARY" > .evil/run && chmod +x .evil/run
G="git -c user.name=agent -c user.email=agent@box -c init.defaultBranch=main -c core.hooksPath=/dev/null"
repo() {  # repo DIR ATTRIBUTES: a repository with a committed file, then changed to as many bytes (git
  # must read it to tell: through the filter the attributes name)
  mkdir -p "$1" && (cd "$1" && $G init -q && echo one > f.txt && echo "$2" > .gitattributes \
    && $G add f.txt .gitattributes && $G commit -qm one && echo two > f.txt)
}
set_() { git -C "$1" config "$2" "$3"; }
hooks() { for h in $HOOKS; do printf '#!/bin/sh\n"%s" %s </dev/null\n' "$EVIL" "$2" > "$1/$h"; chmod +x "$1/$h"; done; }
repo sub-filter '* filter=x' && set_ sub-filter filter.x.clean "$EVIL filter-clean"
set_ sub-filter filter.x.smudge "$EVIL filter-clean"
repo sub-process '* filter=p' && set_ sub-process filter.p.process "$EVIL filter-process"
repo sub-fsmon '' && set_ sub-fsmon core.fsmonitor "$EVIL" && set_ sub-fsmon core.fsmonitorHookVersion 1
mkdir -p .evilhooks && hooks .evilhooks hookspath
repo sub-hookspath '' && set_ sub-hookspath core.hooksPath "$PWD/.evilhooks"
repo sub-hook '' && hooks sub-hook/.git/hooks hook
repo sub-textconv '* diff=t' && set_ sub-textconv diff.t.textconv "$EVIL textconv"
repo sub-ext '' && set_ sub-ext diff.external "$EVIL diff-external"
repo sub-merge '* merge=m' && set_ sub-merge merge.m.driver "$EVIL merge-driver"
printf '[filter "z"]\n\tclean = %s include\n' "$EVIL" > .evil/inc.cfg
repo sub-include '* filter=z' && set_ sub-include include.path "$PWD/.evil/inc.cfg"
repo sub-core ''
for k in core.pager core.editor core.sshCommand core.askPass sequence.editor; do
  set_ sub-core $k "$EVIL core-program"
done
set_ sub-core credential.helper "!$EVIL core-program"
repo deep/er/sub '* filter=d' && set_ deep/er/sub filter.d.clean "$EVIL deep-filter"
# a repository whose .git is a gitfile naming a git folder elsewhere in the project
repo .gf-src '* filter=g' && set_ .gf-src filter.g.clean "$EVIL gitfile-filter"
mv .gf-src gitfile && mv gitfile/.git .gf-gitdir && printf 'gitdir: %s\n' "$PWD/.gf-gitdir" > gitfile/.git
git --git-dir=.gf-gitdir config core.worktree "$PWD/gitfile"
# the top work tree: attributes naming the drivers the person's own config defines
printf '* filter=lfs diff=pdf merge=pm\n' > .gitattributes
echo "$STEP" > "top-$STEP.txt"
"""
AGAIN = r"""
set -e
for d in sub-filter sub-process sub-fsmon sub-hookspath sub-hook sub-textconv sub-ext sub-merge sub-include \
         sub-core deep/er/sub gitfile; do
  printf 'ab%s\n' "$STEP" > "$d/f.txt"; echo new > "$d/new-$STEP.txt"
done
echo "$STEP" > "top-$STEP.txt"
"""


def _tasks(canary: Path) -> str:
    def block(script: str, step: str) -> str:
        lines = [f"export CANARY='{canary}' HOOKS='{' '.join(HOOKS)}' STEP={step}", *script.strip().splitlines()]
        return "  ```sh\n" + "".join(f"  {ln}\n" for ln in lines) + "  ```\n"

    return ("---\ntitle: Hostile\nexecutor: shell\n---\n# Plan\n"
            f"- [ ] 1. Plant\n{block(PLANT, '1')}"
            f"- [ ] 2. Dirty them again\n{block(AGAIN, '2')}"
            f"- [ ] 3. And again\n{block(AGAIN, '3')}")


def _person(root: Path, program: Path) -> None:
    """The person's own setup, in `.git/` (which no step can write): drivers, fsmonitor and hooks."""
    for key, tag in (("filter.lfs.clean", "person-filter"), ("filter.lfs.smudge", "person-filter"),
                     ("filter.lfs.process", "person-filter"), ("diff.pdf.textconv", "person-textconv"),
                     ("merge.pm.driver", "person-merge"), ("core.fsmonitor", "person-fsmonitor")):
        git(root, "config", key, f"{program} {tag}")
    for hook in HOOKS:
        h = root / ".git" / "hooks" / hook
        h.write_text(f'#!/bin/sh\n"{program}" person-hook </dev/null\n')
        h.chmod(0o755)


def _run(ws: Workspace, tmp_path: Path, place: str) -> tuple[dict[str, bool], set[str], str, str]:
    outside = tmp_path / "outside"  # beside the project: read-only (and hidden) in the box
    outside.mkdir()
    canary = outside / "CANARY"
    person_program = outside / "person-driver"
    person_program.write_text(PROGRAM.format(canary=canary))
    person_program.chmod(0o755)
    init_repo(ws.root)
    _person(ws.root, person_program)
    config = FAST_CONFIG + "  max_step_retries: 0\nsandbox: bwrap\ncheckpoints: git\n"
    if place == "worktree":
        config += "isolation: worktree\nmerge: auto\n"
    ws.write("config/autonomous_loop.yaml", config)
    ws.task(_tasks(canary))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "hostile", timeout=600)
    log = r.stdout + r.stderr
    status = ws.state("hostile")["status"] if r.returncode == 0 else f"exit {r.returncode}"
    log += f"\nstatus: {status}\n"
    tree = git(ws.root, "ls-tree", "-r", "main") if r.returncode == 0 else ""  # what the loop committed
    # a rollback reads the work tree too
    r = ws.kiro("loop", "rollback", "--task-id", "hostile", "--to-step", "1", timeout=300)
    log += r.stdout + r.stderr
    fired = set(canary.read_text().split()) if canary.exists() else set()
    held = {f"{place}: {cls}": tag not in fired for cls, tag in {**NESTED, **TOP}.items()}
    return held, fired, log, tree


def _table(held: dict[str, bool]) -> None:
    by: dict[str, list[bool]] = defaultdict(list)
    for name, ok in held.items():
        print(f"  {name:92} {'held' if ok else 'ESCAPED (ran outside the box)'}")
        by[name.split(": ", 2)[1].split(",")[0]].append(ok)
    for cls, oks in by.items():
        print(f"  class {cls:40} tried {len(oks):2}, held {sum(oks):2}")
    print(f"  {sum(held.values())} of {len(held)} held")


@pytest.mark.parametrize("place", ["work tree", "worktree"])
def test_nothing_a_step_plants_runs_in_kiros_git(ws: Workspace, tmp_path: Path, place: str) -> None:
    held, fired, log, tree = _run(ws, tmp_path, place)
    print(f"\nkiro's git against a hostile boxed step, the loop in its {place} (isolation: "
          f"{'worktree' if place == 'worktree' else 'none'})")
    _table(held)
    assert "sandbox: bwrap" in log and "status: completed" in log, log
    assert not fired, f"programs ran outside the box: {sorted(fired)}\n{log}"
    assert all(held.values())
    # the nested repositories are in no checkpoint (a gitlink would drag in their config for whoever checks
    # it out), each checkpoint names them, the steps' own files are committed; they stay, untracked
    recorded = {line.split("\t", 1)[1] for line in tree.splitlines()}
    modes = {line.split()[0] for line in tree.splitlines()}
    assert "160000" not in modes
    assert {"top-1.txt", "top-2.txt", "top-3.txt", ".gitattributes"} <= recorded, recorded
    assert not any(p.startswith(("sub-", "deep/", "gitfile/")) for p in recorded), recorded
    left = [e for e in ws.events("hostile")
            if e["event"] == "checkpoint_left_out" and "another repository" in e["reason"]]
    assert left and "sub-filter" in left[0]["files"], log
