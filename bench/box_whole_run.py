"""What the step box adds per step, as a person waits for it (issue #41's rail: <= 8 ms): the wall time of
`kiro loop start` on N steps of `true` boxed (`sandbox: bwrap`) minus the same run unboxed (`sandbox: off`),
divided by N. kiro's whole spawn path counts: the box worked out, its folders, bwrap and (network `on`) pasta.

    python bench/box_whole_run.py [--steps 200] [--rounds 3] [--networks on,off] [--previous-tree ../kiro-previous]

Runs bench/whole_run.py's `one_run` (a fresh `python -m kiro` each, checked: exit 0, every box checked, in
Done/), unboxed and once per `sandbox_network` boxed, the settings (and with --previous-tree the trees)
taking turns round by round; medians printed side by side with the load average. CPU: kiro's and its
children's (bwrap, pasta, the step), the figure to trust on a loaded machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from whole_run import HERE, one_run  # noqa: E402  (a sibling script, not a package)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--networks", default="on,off", help="the sandbox_network settings boxed runs use")
    ap.add_argument("--previous-tree", type=Path, action="append", default=[],
                    help="another tree to run in turn with this one (repeat it for more)")
    args = ap.parse_args()
    trees = [HERE, *args.previous_tree]
    settings = {"off": "sandbox: off\n"}
    for network in args.networks.split(","):
        settings[f"bwrap, network {network}"] = f"sandbox: bwrap\nsandbox_network: {network}\n"
    walls: dict[tuple[str, Path], list[float]] = {}
    cpus: dict[tuple[str, Path], list[float]] = {}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for tree in trees:
            for label, config in settings.items():
                wall, spent = one_run(tree, args.steps, 0, config)
                walls.setdefault((label, tree), []).append(wall)
                cpus.setdefault((label, tree), []).append(spent)
                loads.append(os.getloadavg()[0])
    print(f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
          f"{min(loads):.2f}-{max(loads):.2f}; {args.steps} steps of `true`, medians of {args.rounds} rounds taking "
          f"turns; the box adds = (boxed - unboxed) / steps")
    for tree in trees:
        bare, bare_cpu = statistics.median(walls[("off", tree)]), statistics.median(cpus[("off", tree)])
        print(f"{tree}: unboxed {bare / args.steps * 1000:.2f} ms a step (CPU {bare_cpu / args.steps * 1000:.2f} ms)")
        for label in settings:
            if label == "off":
                continue
            wall, spent = statistics.median(walls[(label, tree)]), statistics.median(cpus[(label, tree)])
            print(f"  {label}: {wall / args.steps * 1000:.2f} ms a step; the box adds "
                  f"{(wall - bare) / args.steps * 1000:.2f} ms (CPU {(spent - bare_cpu) / args.steps * 1000:.2f} ms; "
                  f"rounds {', '.join(f'{(w - bare) / args.steps * 1000:.2f}' for w in walls[(label, tree)])})")


if __name__ == "__main__":
    main()
