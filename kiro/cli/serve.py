"""`kiro serve`: the HTTP server over the workspace (SPEC §10), in the foreground."""

import socket
from pathlib import Path
from typing import Annotated

import typer

from kiro.cli import guarded


@guarded
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on. Anything but a loopback address needs "
                                                     "$KIRO_SERVE_TOKEN.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port).")] = 8765,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", metavar="<str>", help="A further name the server may be reached by (repeat for more). A request's Host "
                             "must name the --host address (any loopback name for a loopback one) or one of "
                             "these; others are refused, against DNS rebinding.", show_default=False)] = None,
    workspace: Annotated[Path | None, typer.Option("--workspace", "-w", help="The workspace folder.",
                                                   show_default=False)] = None,
) -> None:
    """Serve the workspace over HTTP: a live dashboard at /, REST routes under /api/loops, every loop's events as Server-Sent Events (/api/events) and over a WebSocket (/api/ws) with start/stop/resume/message control. Every route but /healthz needs the token ($KIRO_SERVE_TOKEN, else one generated now, printed once and kept in .state/serve/token). A request must name this server in its Host (--allow-host adds names), a WebSocket or POST from a browser must come from the server's own page, and a request must arrive whole within 10 s. Needs the serve extra: pip install 'kiro-loop\\[serve]'."""
    from kiro.errors import UserError

    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise UserError("kiro serve needs the serve extra: pip install 'kiro-loop[serve]' (in a checkout of kiro: "
                        "pip install -e '.[serve]')") from None
    from kiro.cli import launch
    from kiro.serve.app import create_app
    from kiro.serve.auth import TOKEN_ENV, allowed_hosts, keep_token, resolve_token
    from kiro.serve.protocol import BoundedH11Protocol
    from kiro.views import console

    ws = launch.workspace(workspace)
    store = launch.store_of(ws)
    token, generated = resolve_token(host)
    app = create_app(store, token, allowed_hosts(host, allow_host or []))
    sock = _listen(host, port)
    kept = keep_token(store.ws.state_dir, token) if generated else None  # only once the port is this server's
    bound = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http=BoundedH11Protocol,
                            ws="websockets-sansio", ws_max_size=1 << 20, ws_ping_interval=20,
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)

    async def run() -> None:
        import asyncio

        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            shown = f"[{host}]" if ":" in host else host
            if kept is not None:
                console.line(f"kiro serve: http://{shown}:{bound}/?token={token}")
                console.line(f"token kept in {ws.relative(kept)} (mode 0600); "
                             f"set ${TOKEN_ENV} to choose your own")
            else:
                console.line(f"kiro serve: http://{shown}:{bound}/ (token from ${TOKEN_ENV})")
            console.line(f"workspace {ws.root}; Ctrl-C stops the server (loops keep running)")
        await task

    import asyncio

    try:
        asyncio.run(run())
    finally:
        sock.close()
    if not server.started:
        raise UserError(f"kiro serve could not start on {host}:{bound}")


def _listen(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so that a taken port or a bad address is one line, not a traceback."""
    from kiro.errors import UserError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"--host {host!r}: not an address this machine can listen on ({exc.strerror})") from None
    family, kind, proto, _name, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port "
                        f"(0 picks a free one)") from None
    sock.set_inheritable(True)
    return sock
