"""Event delivery through `kiro serve`: 100 SSE clients, 10 loops run by 10 other `kiro` processes.

Each event's delay is the time it reaches a client minus its `ts` (stamped when the loop emitted it,
just before the append to Logs/<task_id>.jsonl), so it covers the append, the server noticing it
(inotify), indexing it and streaming it to every client. Prints p50/p95/max over every (client, event)
pair, whether every client got every event exactly once, and the server's resident memory.

    python bench/serve_events.py [--clients 100] [--loops 10] [--steps 6] [--separate]
"""

from __future__ import annotations

import argparse
import asyncio
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

TOKEN = "bench-token-0123456789abcdef"


def _task(steps: int, i: int) -> str:
    lines = ["---", f"title: Bench loop {i}", "executor: shell", "---", "# Plan", ""]
    for n in range(1, steps + 1):
        lines += [f"- [ ] {n}. Step {n}", "  ```sh", "  sleep 0.2", "  ```"]
    return "\n".join(lines) + "\n"


def _rss(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def _client(base: str, ready: asyncio.Event, counter: list[int], n_clients: int,
                  got: list[tuple[str, float, str]], done: asyncio.Event, expected: list[int]) -> None:
    """A minimal SSE client on a raw socket (HTTP/1.1, chunked), so that the figures measure the server,
    not a client library's parsing: 100 of these share one process."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /api/events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # status line and headers
    pending = b""
    try:
        while not (expected[0] and len(got) >= expected[0]):
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                break
            pending += await reader.readexactly(size + 2)
            pending = pending[:-2] if pending.endswith(b"\r\n") else pending
            now = time.time()
            *events, pending = pending.split(b"\n\n")
            for ev in events:
                if ev.startswith(b"retry:"):
                    counter[0] += 1
                    if counter[0] == n_clients:
                        ready.set()
                    continue
                ev_id = data = None
                for line in ev.split(b"\n"):
                    if line.startswith(b"id: "):
                        ev_id = line[4:].decode()
                    elif line.startswith(b"data: "):
                        data = line[6:].decode()
                if ev_id is not None and data is not None:
                    got.append((ev_id, now, data))
    finally:
        writer.close()


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="kiro-bench-serve-"))
    for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
        (root / name).mkdir()
    (root / "config" / "autonomous_loop.yaml").write_text("autonomous_loop:\n  backoff_base_seconds: 0.01\n")
    for i in range(args.loops):
        (root / "Specs" / f"l{i}").mkdir()
        (root / "Specs" / f"l{i}" / "tasks.md").write_text(_task(args.steps, i))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIRO_")}
    env["KIRO_SERVE_TOKEN"] = TOKEN
    out = root.parent / f"{root.name}.serve.out"
    with open(out, "w") as fh:
        server = subprocess.Popen([sys.executable, "-m", "kiro", "serve", "--port", "0", "-w", str(root)],
                                  stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        base = None
        for _ in range(600):
            m = re.search(r"kiro serve: (http://127\.0\.0\.1:\d+)/", out.read_text())
            if m:
                base = m.group(1)
                break
            time.sleep(0.05)
        assert base, out.read_text()
        rss_idle = _rss(server.pid)[0]
        ready, done = asyncio.Event(), asyncio.Event()
        counter = [0]
        expected = [0]
        got: list[list[tuple[str, float, str]]] = [[] for _ in range(args.clients)]
        tasks = [asyncio.create_task(_client(base, ready, counter, args.clients, got[i], done, expected))
                 for i in range(args.clients)]
        await asyncio.wait_for(ready.wait(), 60)
        rss_connected = _rss(server.pid)[0]
        t0 = time.monotonic()
        loop_env = {k: v for k, v in env.items() if k != "KIRO_SERVE_TOKEN"}
        if args.separate:  # one `kiro loop start` process per loop
            groups = [[i] for i in range(args.loops)]
        else:  # every loop in one other `kiro loop start` process (several --task)
            groups = [list(range(args.loops))]
        loops = []
        for group in groups:
            argv = [a for i in group for a in ("--task", f"Specs/l{i}/tasks.md")]
            if len(group) == 1:
                argv += ["--task-id", f"l{group[0]}"]
            loops.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kiro", "loop", "start", "-q", *argv, "-w", str(root), env=loop_env,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL))
        codes = [await p.wait() for p in loops]
        run_seconds = time.monotonic() - t0
        total = sum(1 for log in (root / "Logs").glob("*.jsonl") for line in log.read_text().splitlines()
                    if line.strip())
        expected[0] = total
        done.set()
        await asyncio.wait(tasks, timeout=30)
        for t in tasks:
            t.cancel()
        rss_end, rss_peak = _rss(server.pid)
    finally:
        server.terminate()
        server.wait(10)
    delays: list[float] = []
    complete = 0
    for per_client in got:
        ids = [int(e[0]) for e in per_client]
        if sorted(ids) == list(range(1, total + 1)) and len(ids) == len(set(ids)):
            complete += 1
        for _id, at, data in per_client:
            ts = datetime.fromisoformat(json.loads(data)["ts"]).timestamp()
            delays.append((at - ts) * 1000)
    delays.sort()
    p50 = statistics.median(delays)
    p95 = delays[int(len(delays) * 0.95)]
    print(f"serve_events: {args.clients} SSE clients, {args.loops} loops x {args.steps} steps in {len(loops)} other "
          f"kiro process(es) "
          f"(exit codes {sorted(set(codes))}), {total} events in {run_seconds:.1f} s, {len(delays)} deliveries")
    print(f"serve_events: every event exactly once, in order of id, to {complete}/{args.clients} clients")
    print(f"serve_events: delivery delay (emit -> client) p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {delays[-1]:.1f} ms")
    load = os.getloadavg()
    print(f"serve_events: machine load average {load[0]:.1f} on {os.cpu_count()} CPUs during the run (the loops, "
          f"the clients and the server share them)")
    print(f"serve_events: server RSS {rss_idle:.1f} MiB idle, {rss_connected:.1f} MiB with {args.clients} clients, "
          f"{rss_end:.1f} MiB after the run (peak {rss_peak:.1f} MiB)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--loops", type=int, default=10)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--separate", action="store_true", help="one `kiro loop start` process per loop")
    try:  # the clients' side as light as the server's: uvloop when it is there (the serve extra has it)
        import uvloop
    except ImportError:
        asyncio.run(main(ap.parse_args()))
    else:
        uvloop.run(main(ap.parse_args()))
