"""The openai client's own ceiling in one process: what bench/many_loops.py's calls a second could be if kiro
did nothing but call the model (issue #41's rail: >= 300 model calls a second with 1,000 loops).

    python bench/client_ceiling.py [--clients 1000] [--calls 10] [--rounds 3]

bench/many_loops.py's loopback server answers; this process runs `--clients` tasks, each with its own
`kiro.executors.openai_agent.SharedClient` (as each of kiro's loops has one: LOOPS_PER_CLIENT loops share a
client, the process's one TLS context), each making `--calls` calls one after the other with the body kiro's executor
sends (the model, a system and a user message of a step's size, the tool schemas of kiro's default toolset),
all at once on one event loop. Nothing else of kiro runs: no step, no event, no save. Prints, per round, the
calls a second and this process's CPU a call (user and system), with the load average. Each reply is
checked (a `complete_step` tool call).

Read it beside bench/many_loops.py's figures of the same minute: the client's CPU a call is the part of a
loop's call that is not kiro's own.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from many_loops import serve  # noqa: E402  (a sibling script, not a package)

from kiro.executors.openai_agent import SharedClient  # noqa: E402
from kiro.executors.tools import toolset  # noqa: E402
from kiro.store.config import Config, LLMSettings  # noqa: E402

SYSTEM = "You are an autonomous coding agent working through one step of a task file. " * 30
CONTEXT = "- [x] an earlier step of the task, with its description\n" * 40


def body(tools: list[Any], step: int) -> dict[str, Any]:
    return {"model": "bench", "tools": tools, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"# Task\n{CONTEXT}\n# Current step: {step}\nDo it, then call complete_step."}]}


async def client_calls(url: str, llm: LLMSettings, tools: list[Any], calls: int) -> None:
    client = SharedClient(url, "sk-bench-0123456789abcdef", llm)
    try:
        for step in range(1, calls + 1):
            reply = await client.chat(body(tools, step))
            assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "complete_step"
    finally:
        await client.close()


async def all_clients(url: str, llm: LLMSettings, tools: list[Any], clients: int, calls: int) -> None:
    await asyncio.wait_for(asyncio.gather(*(client_calls(url, llm, tools, calls) for _ in range(clients))), 600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    answered = multiprocessing.Value("i", 0)
    server = multiprocessing.Process(target=serve, args=(ports, answered), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    llm = LLMSettings(base_url=url, max_retries=0)
    tools = [t.schema() for t in toolset(Config()).values()]
    n = args.clients * args.calls
    print(f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}; {args.clients} clients x "
          f"{args.calls} calls, {len(tools)} tool schemas, bench/many_loops.py's server")
    try:
        for r in range(1, args.rounds + 1):
            before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            asyncio.run(all_clients(url, llm, tools, args.clients, args.calls))
            wall, after = time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF)
            user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
            print(f"  round {r}: {n / wall:.0f} calls/s, CPU {(user + system) * 1000 / n:.2f} ms a call "
                  f"(user {user * 1000 / n:.2f}, system {system * 1000 / n:.2f}), load {os.getloadavg()[0]:.2f}")
    finally:
        server.kill()
    assert answered.value == n * args.rounds, (answered.value, n * args.rounds)


if __name__ == "__main__":
    main()
