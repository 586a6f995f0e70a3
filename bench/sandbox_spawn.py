"""What the bubblewrap box costs a step (issue #28): `true` through run_process with and without the
box, and the stop-hook reaction of a loop whose steps run in it.

    python bench/sandbox_spawn.py [--runs 50] [--hooks 10]

- spawn: the median and p95 of N spawns of `true` in a project folder, unboxed and boxed (the box
  of a shell step: / read-only, project read-write, kiro's folders read-only, empty $HOME, private
  /tmp, own PID namespace).
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
from pathlib import Path

from kiro.processes import sandbox
from kiro.processes.spawn import run_process

sys.path.insert(0, str(Path(__file__).parent))
from hook_reaction import one_round  # noqa: E402  (a sibling script, not a package)


async def spawn(n: int, cwd: Path, box: sandbox.Box | None) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        result = await run_process(["true"], cwd=cwd, box=box)
        assert result.ok, result
        out.append(time.perf_counter() - started)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--hooks", type=int, default=10)
    args = ap.parse_args()
    why = sandbox.unusable()
    if why is not None:
        print(f"no box here: {why}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = workspace(root / "spawn", "bwrap")
        box = sandbox.box_for(project=project, workspace=project, state_dir=project / ".state",
                              home=Path.home())
        asyncio.run(spawn(3, project, None))  # warm: the reaper, the program lookup
        asyncio.run(spawn(3, project, box))
        bare = asyncio.run(spawn(args.runs, project, None))
        boxed = asyncio.run(spawn(args.runs, project, box))
        print(f"spawn of `true` over {args.runs} runs: unboxed {figures(bare)}; boxed {figures(boxed)}; "
              f"the box adds {(statistics.median(boxed) - statistics.median(bare)) * 1000:.2f} ms a step (median)")
        for setting in ("off", "bwrap"):
            reactions = hook_rounds(root / f"hook-{setting}", setting, args.hooks)
            print(f"stop-hook reaction, sandbox: {setting}, over {len(reactions)} hooks: {figures(reactions)}")


if __name__ == "__main__":
    main()
