"""Many loops in one process against a zero-latency OpenAI-compatible server on loopback.

    python bench/many_loops.py [--loops 1000] [--steps 10]

A separate process serves /v1/chat/completions instantly (asyncio, keep-alive). It answers each
request with a `complete_step` call for the step the request is about (the prompt's "Current step:
<id>" line), a summary that differs per step: every step really completes, and loop detection (the
same call with the same arguments three times in a row) has no reason to fire. kiro runs all the
loops in one process (the engine behind `kiro loop start --task a --task b ...`), each with the
openai executor and its own task file, and an API key in the environment as every real run has (so the
redactor looks for it in everything kiro writes; since 2026-11-23, figures before had no secret).

The bench CHECKS the work: it counts the loops that ended `completed`, the checked boxes in the task
files (in Done/ by then) and the model calls the server answered, and exits 1 when any loop did not
complete. It prints calls per second, peak RSS, the start time of all loops, the renames and
fsyncs per model call (os.rename/os.replace/os.fsync/os.fdatasync counted in this process, every
thread), kiro's CPU per model call split into the event loop's thread, the other threads (the write
queues' workers) and the kernel's part, the collector's collections and their CPU, and the TCP
connections the server accepted (one per model call means the openai client's pools kept none).

The start depends on what ran before it. This machine's ext4 is mounted without a journal, and
there a new file's inode is found by a scan that steps over every inode deleted in the last minute
(five while their inode-table block is not yet written back: `recently_deleted` in the kernel's
ext4/ialloc.c). A start of 1,000 loops right after another run of this bench (whose temporary folder
of ~10,000 files was just deleted) took 4.3-5.1 s; after a quiet minute, 2.4-2.7 s (2026-11-23).
Wait a minute or more between runs for figures that compare. So that a figure says what the file
system was like, the bench first times the creation of 1,000 empty files beside the workspace and
prints it with the start (on a fresh file system, or tmpfs, ~15-20 us a file; here, minutes after
many deletes, up to ~700 us). KIRO_BENCH_DIR puts the workspace elsewhere (tmpfs, another file system).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

STEP_LINE = re.compile(rb"# Current step: ([0-9A-Za-z_.\-]+)")


def reply(step: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "complete_step", "arguments": json.dumps({"summary": f"step {step} done"})}}]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
    }).encode()


def serve(port_queue: multiprocessing.Queue, count: Any, connections: Any = None) -> None:  # type: ignore[type-arg]
    cache: dict[bytes, bytes] = {}

    def answer(body: bytes) -> bytes:
        m = STEP_LINE.search(body)
        step = m.group(1) if m else b"?"
        out = cache.get(step)
        if out is None:
            data = reply(step.decode())
            out = cache[step] = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                                 + str(len(data)).encode() + b"\r\n\r\n" + data)
        return out

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if connections is not None:
            with connections.get_lock():
                connections.value += 1
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                with count.get_lock():
                    count.value += 1
                writer.write(answer(body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        port_queue.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class SyscallCount:
    """Counts os.rename/os.replace/os.fsync/os.fdatasync calls made by this process (every thread),
    and the syncfs calls of a batch start (kiro.fs.atomic.Staged, through the C library). Not the renames
    of a step's marker between `.state/running/` and `.state/running-aside/` (two a step since session 35,
    in place of a file made and unlinked): they replace no file and write nothing."""

    NAMES = ("rename", "replace", "fsync", "fdatasync")

    def __init__(self) -> None:
        import kiro.fs.atomic

        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._orig = {n: getattr(os, n) for n in self.NAMES}
        for name, fn in self._orig.items():
            setattr(os, name, self._wrap(name, fn))
        syncfs = kiro.fs.atomic._syncfs() if hasattr(kiro.fs.atomic, "_syncfs") else None  # (kiro before it: none)
        if syncfs is not None:
            kiro.fs.atomic._SYNCFS[:] = [self._wrap("syncfs", syncfs)]

    def _wrap(self, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.counts[name] += 1
            return fn(*args, **kwargs)

        def rename(src: Any, *args: Any, **kwargs: Any) -> Any:
            if self.MARKERS in os.fspath(src):  # the step's marker, put aside and taken back: no write
                return fn(src, *args, **kwargs)
            return counted(src, *args, **kwargs)
        return rename if name == "rename" else counted

    MARKERS = f"{os.sep}.state{os.sep}running"  # kiro.store.approval.RUNNING and ASIDE

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)


class LookCount:
    """The looks at the workspace's task files taken around the steps (SPEC §15), counted: one per loop per step
    before kiro.executors.control.shared_look, one per turn of the event loop for all loops that ask in it since
    (None on a tree without it)."""

    def __init__(self) -> None:
        from kiro.executors import control

        self.taken: int | None = None
        look = getattr(control, "Look", None)
        if look is None:
            return
        self.taken = 0
        now = look.now.__func__

        def counted(cls: Any, *args: Any, **kwargs: Any) -> Any:
            self.taken = (self.taken or 0) + 1
            return now(cls, *args, **kwargs)
        look.now = classmethod(counted)


class CollectorTime:
    """Collections of the cyclic garbage collector while on: how many of each generation, their wall time and
    their CPU time (the thread time of the thread that collected: the collector runs in whichever thread
    allocated past the threshold)."""

    def __init__(self) -> None:
        self.on = False
        self.runs = 0
        self.by_generation = [0, 0, 0]
        self.full = 0
        self.seconds = 0.0
        self.cpu = 0.0
        self._t0 = threading.local()
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0.wall, self._t0.cpu = time.perf_counter(), time.thread_time()
        elif self.on and hasattr(self._t0, "wall"):
            self.runs += 1
            self.by_generation[info["generation"]] += 1
            self.full += info["generation"] == 2
            self.seconds += time.perf_counter() - self._t0.wall
            self.cpu += time.thread_time() - self._t0.cpu


def create_cost(folder: Path, n: int = 1000) -> float:
    """Microseconds to create (and close) an empty file in a new folder under `folder`, over `n` files."""
    probe = Path(tempfile.mkdtemp(prefix="create-probe-", dir=folder))
    t = time.perf_counter()
    for i in range(n):
        os.close(os.open(probe / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    took = time.perf_counter() - t
    shutil.rmtree(probe)
    return took / n * 1e6


def checked_boxes(root: Path) -> int:
    n = 0
    for area in ("Specs", "Done", "Needs_Action"):
        for p in (root / area).rglob("tasks.md"):
            n += len(re.findall(r"^- \[x\]", p.read_text(), flags=re.M))
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile", metavar="FILE", help="write a cProfile of the run (event-loop thread) to FILE")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    q: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    answered = multiprocessing.Value("q", 0)
    connected = multiprocessing.Value("q", 0)
    server = multiprocessing.Process(target=serve, args=(q, answered, connected), daemon=True)
    server.start()
    port = q.get(timeout=30)

    from kiro.core.runner import LoopIndex, StartBatch, prepare_start, run_loops
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace

    counter = SyscallCount()
    collector = CollectorTime()
    looks = LookCount()
    with tempfile.TemporaryDirectory(dir=os.environ.get("KIRO_BENCH_DIR")) as tmp:
        root = Path(tmp)
        for name in ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks", "config"):
            (root / name).mkdir(parents=True, exist_ok=True)
        (root / "config/autonomous_loop.yaml").write_text(
            f"executor: openai\nllm:\n  base_url: http://127.0.0.1:{port}/v1\n  model: bench\n"
            f"resource_limits:\n  max_api_calls_per_minute: null\n  max_memory_mb: null\n"
            f"autonomous_loop:\n  create_progress_reports: false\n  backup_state_every_n_iterations: 0\n")
        task = "\n".join(f"- [ ] {i}. Step {i}" for i in range(1, args.steps + 1)) + "\n"
        for i in range(args.loops):
            (root / f"Specs/t{i:04d}").mkdir()
            (root / f"Specs/t{i:04d}/tasks.md").write_text(task)
        ws = Workspace(root)
        # an API key, as every real run has one: the redactor then has a secret to look for in every
        # event, transcript line and state record (without one it has no pattern and costs nothing)
        os.environ["OPENAI_API_KEY"] = "sk-bench-" + "k" * 40
        # warm the imports and the config cache outside the timed start (a real `kiro loop start`
        # pays them once at process start-up, measured by bench/status_cold_start.py)
        import kiro.executors.openai_agent  # noqa: F401

        creating = create_cost(root.parent)
        before_start = counter.snapshot()
        t0 = time.perf_counter()
        index = LoopIndex(StateStore(ws))
        with StartBatch() as batch:  # what `kiro loop start --task a --task b ...` does
            runs = [prepare_start(ws, f"Specs/t{i:04d}/tasks.md", task_id=f"t{i:04d}", index=index, batch=batch)
                    for i in range(args.loops)]
        prepared = time.perf_counter() - t0
        start_ops = counter.snapshot() - before_start
        before_run = counter.snapshot()
        prof = None
        if args.profile:
            import cProfile
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
        t1 = time.perf_counter()
        cpu0 = time.process_time()
        thread0 = time.thread_time()
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        collector.on = True
        outcomes = asyncio.run(run_loops(runs))
        collector.on = False
        elapsed = time.perf_counter() - t1
        cpu = time.process_time() - cpu0
        loop_cpu = time.thread_time() - thread0
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        sys_cpu = usage1.ru_stime - usage0.ru_stime
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.profile)
        ops = counter.snapshot() - before_run
        ok = sum(1 for o in outcomes if o.exit_code == 0)
        boxes = checked_boxes(root)
        key = os.environ["OPENAI_API_KEY"].encode()
        leaked = [p for p in root.rglob("*") if p.is_file() and key in p.read_bytes()]
        calls = answered.value
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        renames = ops["rename"] + ops["replace"]
        syncs = ops["fsync"] + ops["fdatasync"]
        per = max(calls, 1)
        print(f"{args.loops} loops x {args.steps} steps in one process, openai executor, zero-latency loopback server")
        print(f"  start of {args.loops} loops: {prepared:.2f} s ({start_ops['rename'] + start_ops['replace']} renames, "
              f"{start_ops['fsync'] + start_ops['fdatasync']} fsyncs, {start_ops['syncfs']} syncfs; creating a file "
              f"here took {creating:.0f} us just before)")
        print(f"  loops completed: {ok}/{args.loops}; steps completed (boxes checked): {boxes}/"
              f"{args.loops * args.steps}; model calls: {calls}")
        print(f"  ran in {elapsed:.1f} s: {calls / elapsed:.0f} model calls per second; kiro's CPU (user+sys, all "
              f"threads) {cpu * 1000 / per:.2f} ms per model call (the load of the machine: {os.getloadavg()[0]:.1f})")
        print(f"  of it: the event loop's thread {loop_cpu * 1000 / per:.2f} ms, the other threads "
              f"{(cpu - loop_cpu) * 1000 / per:.2f} ms; in the kernel (sys, all threads) {sys_cpu * 1000 / per:.2f} ms")
        print(f"  connections the server accepted: {connected.value} ({connected.value / per:.2f} per model call)")
        print(f"  per model call: {renames / per:.2f} renames, {syncs / per:.2f} fsyncs "
              f"({ops['fsync']} fsync, {ops['fdatasync']} fdatasync, {renames} renames in all)")
        if looks.taken is not None:
            print(f"  looks at the task files around the steps: {looks.taken} ({looks.taken / per:.2f} per model call)")
        young, middle, full = collector.by_generation
        print(f"  the garbage collector: {collector.runs} collections ({young} young, {middle} middle, {full} full), "
              f"{collector.seconds:.2f} s of the run, {collector.cpu * 1000 / per:.2f} ms of CPU per model call")
        print(f"  peak resident memory of the kiro process: {peak:.0f} MB")
        first = f" ({leaked[0]}, ...)" if leaked else ""
        print(f"  files in the workspace holding the API key: {len(leaked)}{first}")
        if ok != args.loops or boxes != args.loops * args.steps:
            reasons = Counter(f"{o.status}/{o.reason}" for o in outcomes if o.exit_code != 0)
            print(f"  NOT ALL WORK DONE: {dict(reasons)}; first: "
                  f"{next((o.message for o in outcomes if o.exit_code != 0), '')}")
    server.terminate()
    print(f"(open-file limit raised from {soft} to {hard} for the run)", file=sys.stderr)
    return 0 if ok == args.loops and boxes == args.loops * args.steps and not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
