"""The box is worked out once per loop (kiro.executors.shell.loop_box, kiro.processes.sandbox.box_for keeps it
between steps), yet what changes between two steps is sealed in the next one (SPEC §15): a task file a person
adds, in Specs/ or in a `.kiro/specs/` that was not there when the loop's first step ran, is read-only to the
second step's process as to the first's."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from kiro.executors.shell import loop_box
from kiro.processes import sandbox
from kiro.processes.spawn import run_process
from kiro.store.config import Config
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace

pytestmark = pytest.mark.skipif(sandbox.unusable() is not None, reason=f"no usable bwrap: {sandbox.unusable()}")

TASK = "---\nexecutor: shell\n---\n- [ ] 1. Step\n"


def step(ws: KiroWorkspace, task: Path, script: str) -> int:
    """One step's process in the loop's box (network off: no pasta needed to show what it may write)."""
    cfg = Config(sandbox_network="off")
    env = {"PATH": os.environ["PATH"], "HOME": str(ws.root / "home")}
    box = loop_box(cfg, ws, ws.root, task, env)
    assert box is not None
    result = asyncio.run(run_process(["bash", "-c", script], cwd=ws.root, env=env, timeout=120, box=box))
    return result.returncode


def test_a_task_file_added_between_two_steps_is_read_only_in_the_second_steps_box(ws: Workspace) -> None:
    own = ws.task(TASK)
    kws = KiroWorkspace(ws.root)
    assert not (ws.root / ".kiro").exists()
    assert step(kws, own, "echo first > first.txt") == 0  # the first step: its box kept for the next
    assert (ws.root / "first.txt").read_text() == "first\n"
    added = {".kiro/specs/new/tasks.md": ws.task(TASK, ".kiro/specs/new/tasks.md"),  # a person, between steps
             "Specs/added/tasks.md": ws.task(TASK, "Specs/added/tasks.md")}
    tried = {}
    for name, path in added.items():
        tried[name] = step(kws, own, f"echo 'executor: codex' >> {name}") != 0 and path.read_text() == TASK
        print(f"{'held   ' if tried[name] else 'ESCAPED'} {name} appended to by the second step")
    print(f"{sum(tried.values())} of {len(tried)} held")
    assert all(tried.values()), tried
    assert step(kws, own, "echo second > second.txt") == 0  # the project is still the step's to write
    assert (ws.root / "second.txt").read_text() == "second\n"


def test_what_the_box_shows_of_a_tools_install_is_bound_once_and_its_credentials_stay_masked(
        ws: Workspace, cli_home: Path) -> None:
    """A tool installed in the emptied $HOME (`~/tool/bin` on PATH, its `lib/`, a credentials file beside them,
    and a `bin/` on PATH inside a folder named like a secret): the step runs the tool, reads its lib, not its
    credentials, and finds the bin/ under the masked folder. `~/tool` is bound once: the PATH folder inside it
    is not bound again (a mount fewer per step)."""
    tool = cli_home / "tool"
    for folder in ("bin", "lib", "secrets/bin"):
        (tool / folder).mkdir(parents=True)
    (tool / "lib" / "data.txt").write_text("lib data\n")
    (tool / "credentials.toml").write_text("token = 'kiro-test-secret'\n")
    for prog in (tool / "bin" / "prog", tool / "secrets" / "bin" / "inner"):
        prog.write_text(f"#!/bin/sh\ncat {tool}/lib/data.txt\n")
        prog.chmod(0o755)
    env = {"PATH": f"{tool / 'bin'}:{tool / 'secrets' / 'bin'}:{os.environ['PATH']}", "HOME": str(cli_home)}
    own = ws.task(TASK)
    box = loop_box(Config(sandbox_network="off"), KiroWorkspace(ws.root), ws.root, own, env)
    assert box is not None
    argv = box.prefix(ws.root, env, ["prog"])
    box.release()
    binds = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind-try"]
    assert str(tool) in binds and str(tool / "bin") not in binds, binds
    # the masked folder holds a few KiB at most (RAM: a step cannot fill the machine's memory through it), and what
    # is written there stays in the box
    script = (f"prog > out.txt; inner >> out.txt; cat {tool}/credentials.toml >> out.txt 2>&1 || true; "
              f"head -c 1048576 /dev/zero > {tool}/secrets/fill 2>/dev/null; "
              f"echo filled $(wc -c < {tool}/secrets/fill) >> out.txt")
    result = asyncio.run(run_process(["bash", "-c", script], cwd=ws.root, env=env, timeout=120, box=box))
    seen = (ws.root / "out.txt").read_text()
    print(seen)
    assert result.returncode == 0 and seen.startswith("lib data\nlib data\n"), (result, seen)
    assert "kiro-test-secret" not in seen
    filled = int(seen.rpartition("filled ")[2])
    assert filled <= 64 << 10, f"a masked folder took {filled} bytes"
    assert not (tool / "secrets" / "fill").exists()


def ro_binds(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind-try"]


def test_the_task_file_is_sealed_by_specs_own_bind_and_stays_read_only(ws: Workspace) -> None:
    """The task file lies in Specs/, bound read-only: its own bind is left out (a mount fewer at every step), and
    a step still cannot write it, replace it or move it away."""
    own = ws.task(TASK)
    kws = KiroWorkspace(ws.root)
    env = {"PATH": os.environ["PATH"], "HOME": str(ws.root / "home")}
    box = loop_box(Config(sandbox_network="off"), kws, ws.root, own, env)
    assert box is not None
    binds = ro_binds(box.prefix(ws.root, env, ["true"]))
    box.release()
    assert os.path.realpath(ws.root / "Specs") in binds and os.path.realpath(own) not in binds, binds
    rel = own.relative_to(ws.root)
    tries = {"append": f"echo '- [x] 9. Mine' >> {rel}", "replace": f"echo x > t.md && mv t.md {rel}",
             "move away": f"mv {rel} moved.md", "remove": f"rm -f {rel}"}
    held = {name: step(kws, own, script) != 0 and own.read_text() == TASK for name, script in tries.items()}
    for name, ok in held.items():
        print(f"{'held   ' if ok else 'ESCAPED'} {name} the task file")
    print(f"{sum(held.values())} of {len(held)} held")
    assert all(held.values()), held


def test_a_read_only_bind_inside_another_is_kept_where_something_lies_between_or_it_is_a_link(tmp_path: Path) -> None:
    """The bind left out only where the outer read-only bind shows it as it is: not under a folder bound
    read-write between them (the inner one would be writable), nor for a link (its target is what is sealed)."""
    project = tmp_path / "project"
    (project / "Specs" / "open").mkdir(parents=True)
    inner = project / "Specs" / "open" / "tasks.md"
    inner.write_text(TASK)
    plain = project / "Specs" / "plain.md"
    plain.write_text(TASK)
    target = tmp_path / "elsewhere.md"
    target.write_text(TASK)
    link = project / "Specs" / "link.md"
    link.symlink_to(target)
    box = sandbox.Box(rw=(project, project / "Specs" / "open"),
                      ro=(project / "Specs", inner, plain, link), network="off")
    binds = ro_binds(box.prefix(project, {"PATH": os.environ["PATH"]}, ["true"]))
    box.release()
    assert str(project / "Specs") in binds and str(inner) in binds and str(link) in binds, binds
    assert str(plain) not in binds, binds


def test_a_credential_put_in_a_shown_install_between_two_steps_is_masked_in_the_next(
        ws: Workspace, cli_home: Path) -> None:
    """The box's command line is worked out once per loop and kept on the box (`Box.prefix`), yet a credentials
    file a tool writes in its install (shown read-only) between two steps is masked in the second step's box."""
    tool = cli_home / "tool"
    (tool / "bin").mkdir(parents=True)
    (tool / "lib").mkdir()
    env = {"PATH": f"{tool / 'bin'}:{os.environ['PATH']}", "HOME": str(cli_home)}
    kws = KiroWorkspace(ws.root)
    own = ws.task(TASK)
    for _ in range(2):  # the first step makes the missing control folders: the box of the second is kept
        box = loop_box(Config(sandbox_network="off"), kws, ws.root, own, env)
        assert box is not None
        first = box.prefix(ws.root, env, ["true"])
        box.release()
    assert str(tool) in ro_binds(first) and str(tool / "credentials.toml") not in first, first
    (tool / "credentials.toml").write_text("token = 'kiro-test-secret'\n")  # the tool logs in, between two steps
    assert loop_box(Config(sandbox_network="off"), kws, ws.root, own, env) is box  # the loop's box, kept
    second = box.prefix(ws.root, env, ["true"])
    box.release()
    assert str(tool / "credentials.toml") in second, second
    result = asyncio.run(run_process(["bash", "-c", f"cat {tool}/credentials.toml > seen.txt 2>&1 || true"],
                                     cwd=ws.root, env=env, timeout=120, box=box))
    assert result.returncode == 0 and "kiro-test-secret" not in (ws.root / "seen.txt").read_text()


def test_specs_pointed_at_another_folder_between_two_steps_is_read_only_in_the_next(ws: Workspace) -> None:
    """Specs/ a link to a folder of the project, pointed at another one between two steps (the same name, there
    both times): the second step's box seals the folder it names now, not the one it named when the box was
    worked out (box_for looks at which file is at each path, not only whether one is)."""
    for name in ("specs-a", "specs-b"):
        ws.task(TASK, f"{name}/feature/tasks.md")
    shutil.rmtree(ws.root / "Specs", ignore_errors=True)
    (ws.root / "Specs").symlink_to("specs-a")
    own = ws.task(TASK, "own/tasks.md")
    kws = KiroWorkspace(ws.root)
    assert step(kws, own, "echo first > first.txt") == 0
    assert step(kws, own, "echo x >> specs-b/feature/tasks.md") == 0  # not a task area yet: the project's
    ws.write("specs-b/feature/tasks.md", TASK)
    (ws.root / "Specs-new").symlink_to("specs-b")
    os.replace(ws.root / "Specs-new", ws.root / "Specs")  # a person points Specs/ elsewhere, between steps
    assert step(kws, own, "echo x >> specs-b/feature/tasks.md") != 0
    assert (ws.root / "specs-b/feature/tasks.md").read_text() == TASK
    assert step(kws, own, "echo x >> specs-a/feature/tasks.md") == 0  # no longer a task area: the project's
