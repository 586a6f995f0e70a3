"""The `verify` command after a step, run where the step's work is: by the engine on the loop's host, and by a
`kiro worker` in its clone on the temporal backend (kiro.temporal.attempt), which sends the typed record back
with the attempt's result. One function runs it, one turns a failed run into the attempt's failure.

- `run_verify`     runs `verify` in the step's box and environment; with `verify_report`, reads the report's test
                   counts there (kiro.store.receipts.report_counts): a `VerifyRun`
- `verify_failed`  the `verify_failed` event and the failed `StepResult` of an attempt whose verify failed
"""

from __future__ import annotations

import asyncio
import time

from kiro.executors.base import StepContext, StepResult
from kiro.processes.spawn import run_process, shell_argv, tail
from kiro.store import events, receipts
from kiro.store.receipts import VerifyRun

__all__ = ["VerifyRun", "run_verify", "verify_error", "verify_failed"]


async def run_verify(command: str, ctx: StepContext) -> VerifyRun:
    """Run `command` (the loop's `verify`) in the step's project folder, box and environment."""
    from kiro.executors.shell import step_box, step_env

    cfg = ctx.config
    env = step_env(ctx)
    began, clock = time.time(), time.monotonic()
    result = await run_process(shell_argv(command), cwd=ctx.project_dir, env=env,
                               timeout=cfg.step_timeout_seconds, cancel=ctx.cancel,
                               box=step_box(ctx, env, project=ctx.project_dir))
    text = ctx.redact.text(tail(result.output, 4000))
    code = None if result.cancelled or result.timed_out else result.returncode
    if result.timed_out:
        text = f"(timed out after {cfg.step_timeout_seconds:g} s)\n{text}"
    run = VerifyRun(command=command, exit_code=code, output=text, started=began,
                    seconds=time.monotonic() - clock, report=cfg.verify_report)
    if cfg.verify_report:
        run.tests, run.report_problem = await asyncio.to_thread(receipts.report_counts, ctx.project_dir,
                                                                str(cfg.verify_report), began)
    return run


def verify_error(run: VerifyRun) -> str:
    """A failed verify, as the attempt's error (and the reason a box found checked after a kill reopens)."""
    return f"verify `{run.command}` failed:\n{tail(run.output, 2000)}"


def verify_failed(ctx: StepContext, run: VerifyRun, result: StepResult) -> StepResult:
    """The attempt's executor said done (`result`), verify said no: the `verify_failed` event, and the failed
    result (with the attempt's summary and usage)."""
    ctx.emit(events.VerifyFailed(step_id=ctx.step.id, command=run.command, output=tail(run.output, 1000)))
    return StepResult("failed", summary=result.summary, usage=result.usage, error=verify_error(run), verify=run)
