"""What bwrap's command line costs a boxed step: bwrap alone with the options kiro gives a shell step's box,
running `true`, and the same with one kind of option left out at a time.

    python bench/box_argv_cost.py [--runs 150] [--kernel-runs 300] [--network off]

The box is kiro's own for a shell step of a loop (kiro.executors.shell.loop_box, `Box.prefix`) in a workspace
made as bench/whole_run.py makes it, so what it binds is what a step's box binds. Each variant is run `--runs`
times, the variants taking turns; the CPU of each run is bwrap's and its children's (`wait4`: every variant
keeps `--as-pid-1`, so the command is bwrap's own child and its CPU is counted). Printed: p10 and median per
run, and their difference from kiro's command line; with strace installed, the mount system calls of a run
and how often bwrap reads /proc/self/mountinfo (once for each bind: what makes a bind cost). `--kernel-runs`:
the CPU of the kernel's worker threads (kworker, ksoftirqd, rcu) a run, with and without `--unshare-net`: a
network namespace is taken down there, after bwrap has ended, where `wait4` does not see it.
Asserts only that every variant runs (exit 0).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from kiro.executors.shell import loop_box
from kiro.processes import sandbox
from kiro.store.config import Config
from kiro.store.workspace import Workspace

sys.path.insert(0, str(Path(__file__).parent))
from whole_run import make_task  # noqa: E402  (a sibling script, not a package)

STEP = ["bash", "-e", "-c", "true"]  # bench/whole_run.py's step, as the shell executor runs it
# how many words each of the options kiro gives bwrap takes after its name
ARITY = {"--die-with-parent": 0, "--unshare-pid": 0, "--as-pid-1": 0, "--unshare-net": 0, "--cap-drop": 1,
         "--dev": 1, "--remount-ro": 1, "--proc": 1, "--tmpfs": 1, "--size": 1, "--chdir": 1, "--ro-bind": 2,
         "--bind": 2, "--ro-bind-try": 2, "--bind-try": 2}

Option = list[str]  # one option with its words; `--size N` is kept with the `--tmpfs` it sizes


def options(argv: Sequence[str]) -> list[Option]:
    """The options of a bwrap command line before `--`, each with its words."""
    out: list[Option] = []
    words = list(argv[1:argv.index("--")])
    while words:
        name = words[0]
        taken, words = words[:1 + ARITY[name]], words[1 + ARITY[name]:]
        if out and out[-1][0] == "--size" and len(out[-1]) == 2:
            out[-1] += taken
        else:
            out.append(taken)
    return out


def flat(opts: Sequence[Option]) -> list[str]:
    return [word for option in opts for word in option]


def workspace(root: Path) -> Path:
    for name in ("Specs/bench", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "Specs/bench/tasks.md").write_text(make_task(2))
    return root


def step_argv(root: Path, network: str) -> tuple[list[str], sandbox.Box]:
    """kiro's bwrap command line for a shell step of a loop in `root` (its box holds the control folders it
    makes until `release`)."""
    ws = Workspace(root)
    env = dict(os.environ)
    box = loop_box(Config(sandbox_network=network), ws, root, root / "Specs/bench/tasks.md", env)
    assert box is not None, "bwrap is not usable here"
    return [*box.prefix(root, env, STEP), *STEP], box


def variants(argv: list[str], box: sandbox.Box) -> dict[str, list[str]]:
    opts = options(argv)

    def without(drop: Callable[[Option], bool]) -> list[str]:
        return flat([o for o in opts if not drop(o)])

    binds = ("--bind-try", "--ro-bind-try", "--bind", "--ro-bind")
    made = {str(p) for p in box.missing}
    dev = ("--dev", "--remount-ro")
    return {
        "kiro's command line (a shell step's box)": flat(opts),
        f"- the {len(made)} control folders kiro made, empty": without(lambda o: o[0] in binds and o[1] in made),
        "- every bind of the project, its folders, $HOME's": without(
            lambda o: o[0] in binds and o[1] not in ("/", "/dev/null")),
        "- the masks (.state/serve, credentials)": without(
            lambda o: o[:2] == ["--size", str(sandbox.MASK_BYTES)] or o[1:2] == ["/dev/null"]),
        "- --dev /dev, its /dev/shm, --remount-ro /dev": without(
            lambda o: o[0] in dev or o[-2:] == ["--tmpfs", "/dev/shm"]),
        "- --proc /proc": without(lambda o: o[0] == "--proc"),
        "- --unshare-net": without(lambda o: o[0] == "--unshare-net"),
        "the probe's: _base() alone": sandbox._base(own_network=box.own_network()),
        "bare: --unshare-pid --as-pid-1 --ro-bind / /": ["--unshare-pid", "--as-pid-1", "--ro-bind", "/", "/"],
    }


def cpu_ms(argv: Sequence[str]) -> float:
    """The CPU of a run of `argv` and of the children it waited for, in ms."""
    pid = os.posix_spawn(argv[0], list(argv), os.environ)
    _, status, usage = os.wait4(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, argv
    return (usage.ru_utime + usage.ru_stime) * 1000


def mounts(argv: Sequence[str]) -> str:
    """The mount system calls of one run and its reads of the mount table, from strace."""
    with tempfile.NamedTemporaryFile("r") as out:
        subprocess.run(["strace", "-f", "-qq", "-e", "trace=mount,umount2,openat", "-o", out.name, *argv],
                       check=True, capture_output=True)
        lines = out.read().splitlines()
    calls = sum(1 for line in lines if re.search(r"\bu?mount2?\(", line))
    tables = sum(1 for line in lines if "mountinfo" in line)
    return f"{calls} mounts, {tables} mountinfo reads"


def kernel_threads_ms() -> float:
    """The CPU the kernel's worker threads have used so far, in ms (clock ticks: read over many runs)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if name.startswith(("kworker", "ksoftirqd", "rcu")):
            total += int(fields[11]) + int(fields[12])
    return total * 1000 / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=150)
    ap.add_argument("--kernel-runs", type=int, default=300, help="0: no kernel threads' figure")
    ap.add_argument("--network", default="off", choices=("off", "host"),
                    help="the box's sandbox_network (`on` joins a namespace pasta serves: bench/box_whole_run.py)")
    args = ap.parse_args()
    tool = sandbox.bwrap_path()
    assert tool is not None and sandbox.unusable() is None, sandbox.unusable()
    with tempfile.TemporaryDirectory(prefix="kiro-argv-", dir=os.environ.get("BENCH_TMP")) as tmp:
        argv, box = step_argv(workspace(Path(tmp)), args.network)
        try:
            print("kiro's command line:", " ".join(argv))
            cases = {label: [tool, *opts, "--", "true"] for label, opts in variants(argv, box).items()}
            cases["`true` alone"] = [shutil.which("true") or "/bin/true"]
            times: dict[str, list[float]] = {label: [] for label in cases}
            for _ in range(args.runs):
                for label, case in cases.items():
                    times[label].append(cpu_ms(case))
            traced = shutil.which("strace") is not None
            print(f"load average {os.getloadavg()[0]:.2f}; {args.runs} runs each, taking turns; CPU of bwrap and "
                  f"its children a run (wait4), ms")
            first = cases[next(iter(cases))]
            base = sorted(times[next(iter(times))])
            for label, case in cases.items():
                ms = sorted(times[label])
                p10, median = ms[len(ms) // 10], statistics.median(ms)
                more = f"; {mounts(case)}" if traced and case[0] == first[0] else ""
                print(f"  {label:48} p10 {p10:5.2f}  median {median:5.2f}  (p10 {p10 - base[len(base) // 10]:+.2f}, "
                      f"median {median - statistics.median(base):+.2f}){more}")
            if args.kernel_runs:
                bare = [tool, *flat([o for o in options(argv) if o[0] != "--unshare-net"]), "--", "true"]
                for label, case in (("kiro's command line", first), ("- --unshare-net", bare)) * 2:
                    began = kernel_threads_ms()
                    for _ in range(args.kernel_runs):
                        cpu_ms(case)
                    print(f"  kernel threads' CPU a run, {label}: "
                          f"{(kernel_threads_ms() - began) / args.kernel_runs:.2f} ms ({args.kernel_runs} runs)")
        finally:
            box.release()
            sandbox.tidy()


if __name__ == "__main__":
    main()
