"""Many loops in one process against a zero-latency OpenAI-compatible server on loopback.

    python bench/many_loops.py [--loops 1000] [--steps 2]

A separate process serves /v1/chat/completions instantly (asyncio, keep-alive): every request gets a
`complete_step` tool call. kiro runs all the loops in one process (the engine behind `kiro loop start
--task a --task b ...` and `kiro loop watch`), each with the openai executor and its own task file.
Prints model calls per second and the peak resident memory of the kiro process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPLY = {
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "complete_step", "arguments": "{\"summary\": \"done\"}"}}]}}],
    "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
}


def serve(port_queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    body = json.dumps(REPLY).encode()
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    count = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                count += 1
                writer.write(head + body)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    q: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    server = multiprocessing.Process(target=serve, args=(q,), daemon=True)
    server.start()
    port = q.get(timeout=30)

    from kiro.runner import LoopIndex, prepare_start, run_loops
    from kiro.state import StateStore
    from kiro.workspace import Workspace

    with tempfile.TemporaryDirectory() as tmp:
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
        os.environ.pop("OPENAI_API_KEY", None)
        t0 = time.perf_counter()
        index = LoopIndex(StateStore(ws))
        runs = [prepare_start(ws, f"Specs/t{i:04d}/tasks.md", task_id=f"t{i:04d}", index=index)
                for i in range(args.loops)]
        prepared = time.perf_counter() - t0
        t1 = time.perf_counter()
        outcomes = asyncio.run(run_loops(runs))
        elapsed = time.perf_counter() - t1
        ok = sum(1 for o in outcomes if o.exit_code == 0)
        calls = args.loops * args.steps
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{args.loops} loops x {args.steps} steps in one process, openai executor, zero-latency loopback server")
        print(f"  prepared in {prepared:.1f} s; ran in {elapsed:.1f} s; {ok}/{args.loops} completed")
        print(f"  {calls / elapsed:.0f} model calls per second ({calls} calls, each followed by a checkbox edit and "
              f"state saves)")
        print(f"  peak resident memory of the kiro process: {peak:.0f} MB")
    server.terminate()
    print(f"(open-file limit raised from {soft} to {hard} for the run)", file=sys.stderr)


if __name__ == "__main__":
    main()
