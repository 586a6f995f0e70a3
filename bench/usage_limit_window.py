"""A 10-step task through a usage window: the real Claude Code (on a subscription token) against the
scripted Anthropic server of the tests, which answers every request with the service's usage-limit
response (HTTP 429 `rate_limit_error` with `anthropic-ratelimit-unified-status: rejected` and the
reset) until the window ends: a 2-hour window compressed to `--window` seconds (20), counted from
the first request.

    python bench/usage_limit_window.py [--window 20] [--steps 10] [--base ../kiro-previous]

Runs `kiro loop start` with this tree's kiro and with the previous main's (`--base`: its checkout
and .venv), each in a fresh workspace with the default config, and prints side by side: exit code,
wall time, steps done, failures counted, model calls answered with the limit and in all. Today's
main takes the limit for a failed attempt and ends with exit 5 after a few backoff retries; this
tree sleeps until the reset and finishes. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.agent_clis import CLIS, task_text  # noqa: E402
from tests.fakes import anthropic as fa  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def one_run(python: str, tree: Path, window: float, steps: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="kiro-bench-limit-") as tmp:
        root = Path(tmp) / "ws"
        for folder in ("Specs/feature", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / folder).mkdir(parents=True)
        (root / "Specs/feature/tasks.md").write_text(task_text(steps))
        (root / "config/autonomous_loop.yaml").write_text("agent: claude\n")
        cli = CLIS["claude"](Path(tmp))
        server = cli.start()
        answer = server.brain  # type: ignore[attr-defined]
        ends: list[float] = []
        limited = [0]

        def brain(rec: object) -> object:
            if not ends:
                ends.append(time.time() + window)
            if time.time() < ends[0]:
                limited[0] += 1
                return fa.usage_limit(ends[0])
            return answer(rec)

        server.brain = brain  # type: ignore[attr-defined]
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_", "ANTHROPIC_"))}
            env.update(cli.env())
            del env["ANTHROPIC_API_KEY"]
            env["CLAUDE_CODE_OAUTH_TOKEN"] = "sk-ant-oat01-bench"  # a subscription: its window is what runs out
            env["PYTHONPATH"] = str(tree)
            started = time.perf_counter()
            done = subprocess.run([python, "-m", "kiro", "loop", "start", "--task", "Specs/feature/tasks.md"],
                                  cwd=root, env=env, capture_output=True, text=True, timeout=window * 10 + 600)
            wall = time.perf_counter() - started
        finally:
            cli.close()
        states = sorted((p for p in (root / ".state").rglob("autonomous_loop_*.json") if "backups" not in p.parts),
                        key=lambda p: p.stat().st_mtime)
        state = json.loads(states[-1].read_text()) if states else {}
        return {"exit": done.returncode, "wall_s": round(wall, 1),
                "steps_done": len(state.get("completed_steps", [])), "failures": state.get("total_failures"),
                "stop_reason": state.get("stop_reason"), "limited_calls": limited[0],
                "calls": len(server.requests)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=20.0, help="seconds the usage window stays shut (20)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--base", type=Path, help="the previous main's checkout (with its .venv), run beside this tree")
    args = parser.parse_args()
    if CLIS["claude"](Path(tempfile.gettempdir())).installed is False:
        sys.exit("claude is not installed")
    runs = {"this tree": one_run(sys.executable, HERE, args.window, args.steps)}
    base_python = args.base / ".venv" / "bin" / "python" if args.base is not None else None
    if base_python is not None and base_python.exists():
        runs["previous main"] = one_run(str(base_python), args.base, args.window, args.steps)
    print(f"{args.steps}-step task, claude on a subscription, usage window shut for the first {args.window:g} s "
          f"(a 2-hour window compressed)")
    keys = ["exit", "wall_s", "steps_done", "failures", "stop_reason", "limited_calls", "calls"]
    print(f"{'':16}" + "".join(f"{name:>20}" for name in runs))
    for key in keys:
        print(f"{key:16}" + "".join(f"{str(r[key]):>20}" for r in runs.values()))


if __name__ == "__main__":
    main()
