"""Wall time per step of the real agent CLIs under kiro, against the scripted API servers of the
tests (tests/fakes), and kiro's own share of it.

    python bench/agent_clis.py [--steps 3] [--runs 2] [--cli claude --cli codex]

For each installed CLI: `kiro loop start --agent NAME` on a task of N steps, in a fresh workspace,
`--runs` times. Each step is one CLI run in which the fake model checks the task file's box (model
calls per step: claude 3, codex 2, aider 1, gemini 2, opencode 3; the -acp agents, kiro speaking ACP
to the same CLIs, as their CLIs). Prints, per CLI: the wall time per
step (from `kiro loop start` to its exit, divided by N), the agent process's own time per step (from
the attempt logs), and the rest, kiro's share, split into what it spends in the loop per step
(state saves, box edits, the control-file snapshot, the attempt log; from the event log) and its
start-up and finish per run (Python imports, config, reports). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.agent_clis import CLIS, CODEX_PRICE, task_text  # noqa: E402
from tests.agent_clis_acp import ACP_CLIS  # noqa: E402
from tests.agent_clis_aider_gemini_opencode import GEMINI_PRICE, MORE_CLIS  # noqa: E402
from tests.agent_clis_codex_opencode_acp import ACP_MORE_CLIS  # noqa: E402

ALL = {**CLIS, **MORE_CLIS, **ACP_CLIS, **ACP_MORE_CLIS}
PRICES = {"codex": CODEX_PRICE, "gemini": GEMINI_PRICE, "codex-acp": CODEX_PRICE, "gemini-acp": GEMINI_PRICE}

RESULT = re.compile(r"^# result: exit 0 after ([0-9.]+) s$", re.M)


def one_run(name: str, steps: int) -> tuple[float, float, float]:
    """(wall seconds of `kiro loop start`, seconds inside the agent processes, seconds from the first
    `step_started` to the last `step_completed` in the event log: the loop itself, without kiro's
    start-up and finish)."""
    with tempfile.TemporaryDirectory(prefix=f"kiro-bench-{name}-") as tmp:
        root = Path(tmp) / "ws"
        for folder in ("Specs/feature", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / folder).mkdir(parents=True)
        (root / "Specs/feature/tasks.md").write_text(task_text(steps))
        (root / "config/autonomous_loop.yaml").write_text(f"agent: {name}\n" + PRICES.get(name, ""))
        if name == "aider":  # aider needs a git repository
            for git in (["init", "-q"], ["add", "-A"],
                        ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "b"]):
                subprocess.run(["git", *git], cwd=root, check=True, capture_output=True)
        cli = ALL[name](Path(tmp))
        cli.start()
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("KIRO_", "OPENAI_", "ANTHROPIC_"))}
            env.update(cli.env())
            env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/feature/tasks.md",
                                   "--quiet"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
            wall = time.perf_counter() - started
        finally:
            cli.close()
        if done.returncode != 0:
            raise SystemExit(f"{name}: kiro exited {done.returncode}: {done.stdout}{done.stderr}")
        agent = sum(float(m) for log in (root / "Logs").glob("*/*.log") for m in RESULT.findall(log.read_text()))
        events = [json.loads(line) for log in (root / "Logs").glob("*.jsonl") for line in log.read_text().splitlines()]
        stamps = [(e["event"], datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()) for e in events]
        first = min(t for kind, t in stamps if kind == "step_started")
        last = max(t for kind, t in stamps if kind == "step_completed")
        return wall, agent, last - first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cli", action="append", choices=sorted(ALL))
    args = parser.parse_args()
    for name in args.cli or sorted(ALL):
        probe = ALL[name](Path(tempfile.gettempdir()))
        if not probe.installed:
            print(f"{name}: not installed ({probe.skip_reason()})")
            continue
        program = getattr(probe, "path", None) or probe.program  # aider: wherever its venv is
        version = subprocess.run([program, "--version"], capture_output=True, text=True).stdout.strip()
        walls, agents, loops = [], [], []
        for _ in range(args.runs):
            wall, agent, loop = one_run(name, args.steps)
            walls.append(wall / args.steps)
            agents.append(agent / args.steps)
            loops.append(loop / args.steps)
        wall, agent, loop = statistics.median(walls), statistics.median(agents), statistics.median(loops)
        kiro = wall - agent
        in_loop = loop - agent  # per step, between the agent's runs: state saves, box edits, snapshot, log
        print(f"{name} ({version}): {args.steps} steps x {args.runs} runs; per step: wall {wall:.2f} s, "
              f"agent CLI {agent:.2f} s, kiro {kiro:.2f} s ({kiro / wall:.0%} of the wall time): "
              f"{in_loop * 1000:.0f} ms in the loop, the rest kiro's start-up and finish "
              f"({(kiro - in_loop) * args.steps:.2f} s per run)")


if __name__ == "__main__":
    main()
