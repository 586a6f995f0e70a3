"""The server's token (SPEC §10): `$KIRO_SERVE_TOKEN`, else one generated at start, printed once and
kept in `.state/serve.token` (mode 0600). Every route but `GET /healthz` needs it, as
`Authorization: Bearer <token>` or `?token=<token>` (a browser's EventSource and WebSocket cannot set
headers)."""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from pathlib import Path
from urllib.parse import parse_qs

from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kiro.errors import UserError
from kiro.fs.atomic import atomic_write

TOKEN_ENV = "KIRO_SERVE_TOKEN"
LOGIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>kiro · token needed</title>
<style>body{font-family:system-ui,sans-serif;max-width:34em;margin:4em auto;padding:0 1em;color:#1f2328}
input{width:100%;padding:.5em;font:inherit}button{margin-top:.6em;padding:.4em 1em;font:inherit}
code{background:#f0f2f4;padding:0 .3em}</style></head><body>
<h1>kiro serve: token needed</h1>
<p>Open the address <code>kiro serve</code> printed when it started (it ends in <code>?token=...</code>), or paste
the token: it is in <code>.state/serve.token</code>, or in <code>$KIRO_SERVE_TOKEN</code> if you set one.</p>
<form method="get" action="/"><input name="token" type="password" autocomplete="off" placeholder="token">
<button type="submit">Open the dashboard</button></form></body></html>
"""
OPEN_PATHS = frozenset({"/healthz"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, state_dir: Path) -> tuple[str, bool]:
    """(token, generated). A non-loopback host needs the token from the environment: a generated one
    would be printed on a terminal and sit in a file while the server listens to the network."""
    env = os.environ.get(TOKEN_ENV, "")
    if env:
        if len(env) < 16:
            raise UserError(f"${TOKEN_ENV} is too short ({len(env)} characters); use at least 16, e.g. "
                            f"`export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')`")
        return env, False
    if not is_loopback(host):
        raise UserError(f"--host {host} is not a loopback address: set ${TOKEN_ENV} to a long random token "
                        f"first, or serve on 127.0.0.1")
    token = secrets.token_urlsafe(32)
    atomic_write(state_dir / "serve.token", token + "\n", fsync=False, mode=0o600)
    return token, True


def _presented(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = bytes(value).decode("latin-1")
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("token")
    return str(values[0]) if values else None


class TokenAuth:
    """ASGI middleware: 401 for HTTP, a 401 handshake denial for WebSockets, unless the token matches."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = _presented(scope)
        if given is not None and hmac.compare_digest(given.encode(), self.token):
            await self.app(scope, receive, send)
            return
        body = {"error": "unauthorized", "message": "this route needs the server's token: "
                                                    "`Authorization: Bearer <token>` or `?token=<token>`"}
        if scope["type"] == "http" and scope.get("path") == "/" and scope.get("method") == "GET":
            response: Response = HTMLResponse(LOGIN_PAGE, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        if scope["type"] == "http":
            response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        # WebSocket: refuse the handshake with an HTTP 401 where the server supports denial responses.
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)  # Starlette prefixes the messages with "websocket."
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
