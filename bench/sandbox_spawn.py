"""What the bubblewrap box costs a step (issue #28): `true` through run_process with and without the
box, and the stop-hook reaction of a loop whose steps run in it.

    python bench/sandbox_spawn.py [--runs 50] [--hooks 10] [--before DIR]

- spawn: the median and p95 of N spawns of `true` in a project folder, unboxed and boxed (the box
  of a shell step, asked for at each spawn as a step asks for its own: / read-only, project read-write,
  kiro's folders read-only, empty $HOME, private /tmp, own PID namespace), the box once per
  `sandbox_network`: `on` (its own network, connected by pasta), `off` (none), `host` (the host's).
- `--before DIR`: instead, the boxed spawns of the kiro package in DIR (a checkout of an earlier kiro, e.g.
  `git archive main kiro | tar -x -C DIR`) and of this checkout, in child processes taking turns
  (`--rounds`): before and after in one run, under the same load.
- stop hook: bench/hook_reaction.py's rounds (a loop waiting in backoff after a failed step, a hook
  dropped), with `sandbox: off` and `sandbox: bwrap`: the box must not slow the reaction.
Asserts only that every spawn succeeded and every round ended on the hook.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kiro.processes import sandbox
from kiro.processes.spawn import run_process

sys.path.insert(0, str(Path(__file__).parent))
from hook_reaction import one_round  # noqa: E402  (a sibling script, not a package)


async def spawn(n: int, cwd: Path, box: Callable[[], sandbox.Box] | None) -> list[float]:
    """`n` spawns of `true`; the box asked for at each, as a step asks for its own (shell.step_box); the spawns
    are one loop's steps (its ledger: with network `on` they join the loop's one network namespace)."""
    from kiro.processes import groups

    ledger = groups.Ledger(cwd / ".state" / "processes" / "bench.json")
    groups.current_ledger.set(ledger)
    out = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            result = await run_process(["true"], cwd=cwd, box=box() if box is not None else None)
            assert result.ok, result
            out.append(time.perf_counter() - started)
    finally:
        close = getattr(sandbox, "close_networks", None)  # a kiro before one network per loop has none
        if close is not None:
            close(ledger.token)
        ledger.close()
    return out


def figures(times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p95 = ms[max(0, int(round(0.95 * len(ms))) - 1)]
    return f"median {statistics.median(ms):.2f} ms, p95 {p95:.2f} ms"


def workspace(root: Path, setting: str) -> Path:
    for name in ("Specs/x", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "config/autonomous_loop.yaml").write_text(
        f"sandbox: {setting}\n"
        "autonomous_loop:\n  backoff_base_seconds: 36000\n  backoff_max_seconds: 36000\n"
        "  failure_threshold: 1000\n  max_step_retries: 1000\n  max_iterations: 100000\n"
        "  create_progress_reports: false\n")
    (root / "Specs/x/tasks.md").write_text("---\nexecutor: shell\n---\n- [ ] 1. Fails\n  ```sh\n  exit 1\n  ```\n")
    return root


def hook_rounds(root: Path, setting: str, hooks: int) -> list[float]:
    from kiro.core.runner import prepare_resume, prepare_start
    from kiro.store.workspace import Workspace

    ws = Workspace(workspace(root, setting))
    out = []
    for i in range(hooks):
        run = prepare_start(ws, "Specs/x/tasks.md", task_id="hook") if i == 0 else prepare_resume(ws, "hook")
        reaction, _ = one_round(run, ws.hook_file("hook"), 0.3)
        out.append(reaction)
    return out


def boxed_spawns(root: Path, runs: int, networks: tuple[str, ...]) -> dict[str, list[float]]:
    """The times of `true`, unboxed ("bare") and boxed with each of `networks`."""
    project = workspace(root / "spawn", "bwrap")
    asyncio.run(spawn(3, project, None))  # warm: the reaper, the program lookup
    times = {"bare": asyncio.run(spawn(runs, project, None))}
    for network in networks:
        def box(network: str = network) -> sandbox.Box:
            return sandbox.box_for(project=project, workspace=project, state_dir=project / ".state",
                                   home=Path.home(), network=network)

        asyncio.run(spawn(3, project, box))
        times[network] = asyncio.run(spawn(runs, project, box))
    times["argv"] = argv_times(project, runs * 5)
    return times


def argv_times(project: Path, n: int) -> list[float]:
    """kiro's own share of a boxed step, without the processes: the box asked for and its bwrap command line
    built, as for each step of a loop (the box kept between steps, and what it shows of the command's
    environment)."""
    import os

    env = dict(os.environ)
    out = []
    for _ in range(n):
        started = time.perf_counter()
        box = sandbox.box_for(project=project, workspace=project, state_dir=project / ".state", home=Path.home(),
                              network="off")
        box.prefix(project, env, ["bash", "-e", "-c", "true"])
        out.append(time.perf_counter() - started)
        box.release()
    return out


def report(times: dict[str, list[float]]) -> None:
    bare = times["bare"]
    print(f"spawn of `true` over {len(bare)} runs: unboxed {figures(bare)}")
    print(f"  kiro's own share of a boxed step (the box and its bwrap command line): {figures(times['argv'])}")
    for network, boxed in times.items():
        if network not in ("bare", "argv"):
            print(f"  boxed, network {network}: {figures(boxed)}; "
                  f"the box adds {(statistics.median(boxed) - statistics.median(bare)) * 1000:.2f} ms a step (median)")


def side_by_side(before: Path, runs: int, rounds: int) -> None:
    """Boxed spawns of the kiro package in `before` and of this checkout, in child processes taking turns
    (`rounds` each): on a loaded machine both see the same load. The children run without site's .pth files
    (`-S`), so an editable install of this checkout cannot stand in for `before`."""
    import json
    import os
    import subprocess
    import sysconfig

    sides: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    here = Path(__file__).resolve().parent.parent
    for _ in range(rounds):
        for side, package in (("before", before), ("after", here)):
            env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(package), sysconfig.get_paths()["purelib"]))}
            out = subprocess.run([sys.executable, "-S", __file__, "--spawn-only", "--runs", str(runs)], check=True,
                                 env=env, capture_output=True, text=True).stdout
            said = json.loads(out.splitlines()[-1])
            assert Path(said["kiro"]).resolve().is_relative_to(package.resolve()), said["kiro"]
            for key, values in said["times"].items():
                sides[side].setdefault(key, []).extend(values)
    for side, package in (("before", before), ("after", here)):
        print(f"{side} ({package}), {rounds} rounds taking turns:")
        report(sides[side])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--hooks", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4, help="with --before: turns each side takes")
    ap.add_argument("--before", type=Path, help="a checkout of an earlier kiro package, to measure beside this one")
    ap.add_argument("--spawn-only", action="store_true", help=argparse.SUPPRESS)  # a --before child
    args = ap.parse_args()
    why = sandbox.unusable()
    if why is not None:
        print(f"no box here: {why}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.spawn_only:
            import json

            import kiro

            times = boxed_spawns(root, args.runs, ("on", "off"))
            print(json.dumps({"kiro": kiro.__file__, "times": times}))
            return
        if args.before is not None:
            side_by_side(args.before, args.runs, args.rounds)
            return
        report(boxed_spawns(root, args.runs, ("on", "off", "host")))
        for setting in ("off", "bwrap"):
            reactions = hook_rounds(root / f"hook-{setting}", setting, args.hooks)
            print(f"stop-hook reaction, sandbox: {setting}, over {len(reactions)} hooks: {figures(reactions)}")


if __name__ == "__main__":
    main()
