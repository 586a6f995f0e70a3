"""Run many `kiro` command lines fast: one Python process imports kiro once, then forks a fresh
child per command line, which chdirs into its workspace and runs the real CLI (`kiro.cli.main`)
with its own stdout/stderr files. A child that runs longer than its timeout is killed (a hang).

Used by the generated bad-input suite, which runs hundreds of cases: a cold `python -m kiro`
costs ~0.5-1 s of interpreter start and imports per case; a fork costs milliseconds.

Protocol: one JSON object per line on stdin {"cwd", "args", "timeout", "env"}; one JSON object per
line on stdout {"code", "stdout", "stderr", "hung", "seconds"}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def _child(cwd: str, args: list[str], env: dict[str, str], out: str, err: str) -> None:
    os.setsid()  # its own process group: a hang is killed with everything it started
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    fd_out = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    fd_err = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd_out, 1)
    os.dup2(fd_err, 2)
    sys.argv = ["kiro", *args]
    code = 0
    try:
        from kiro.cli import main

        main()  # what `python -m kiro` runs
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - report like the interpreter would, then exit 1
        import traceback

        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    from kiro.cli import app  # noqa: F401 - every command imported and registered once, before any fork

    scratch = os.environ.get("TMPDIR", "/tmp")
    for raw in sys.stdin:
        job = json.loads(raw)
        out = os.path.join(scratch, f"kiro-fork-{os.getpid()}.out")
        err = os.path.join(scratch, f"kiro-fork-{os.getpid()}.err")
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(job["cwd"], job["args"], job["env"], out, err)
        hung = False
        deadline = started + float(job["timeout"])
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                hung = True
                os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        code = os.waitstatus_to_exitcode(status)
        with open(out, errors="replace") as fh_out, open(err, errors="replace") as fh_err:
            result = {"code": code, "stdout": fh_out.read(), "stderr": fh_err.read(), "hung": hung,
                      "seconds": round(time.monotonic() - started, 3)}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
