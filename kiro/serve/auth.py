"""The server's gate. The token (SPEC §10): `$KIRO_SERVE_TOKEN`, else one generated at start, printed
once and kept in `.state/serve/token` (mode 0600, in a folder of mode 0700 that every step's box hides:
kiro.processes.sandbox), written only once the server holds its port (a second `kiro serve` refused
its port leaves the running server's token as it is). Every route but `GET /healthz` needs it, as
`Authorization: Bearer <token>` or `?token=<token>` (a browser's EventSource and WebSocket cannot set
headers).

Before the token, what a browser needs: every request, /healthz too, must name in its Host the
address the server is bound to (or a name the person allowed with --allow-host), so that a page of
another site whose name was rebound to this address (DNS rebinding) is refused; and a WebSocket or a
state-changing request that a browser sends with an Origin must come from the server's own origin,
so that another site's page that knows the token cannot steer loops."""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from starlette.datastructures import Headers
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kiro.errors import UserError
from kiro.fs.atomic import atomic_write
from kiro.store.statestore import SERVE_TOKEN, SERVE_TOKEN_ENV

TOKEN_ENV = SERVE_TOKEN_ENV
LOGIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>kiro · token needed</title>
<style>body{font-family:system-ui,sans-serif;max-width:34em;margin:4em auto;padding:0 1em;color:#1f2328}
input{width:100%;padding:.5em;font:inherit}button{margin-top:.6em;padding:.4em 1em;font:inherit}
code{background:#f0f2f4;padding:0 .3em}</style></head><body>
<h1>kiro serve: token needed</h1>
<p>Open the address <code>kiro serve</code> printed when it started (it ends in <code>?token=...</code>), or paste
the token: it is in <code>.state/serve/token</code>, or in <code>$KIRO_SERVE_TOKEN</code> if you set one.</p>
<form method="get" action="/"><input name="token" type="password" autocomplete="off" placeholder="token">
<button type="submit">Open the dashboard</button></form></body></html>
"""
OPEN_PATHS = frozenset({"/healthz"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(host: str) -> tuple[str, bool]:
    """(token, generated). A non-loopback host needs the token from the environment: a generated one
    would be printed on a terminal and sit in a file while the server listens to the network. A
    generated one is kept (`keep_token`) once the server holds its port."""
    env = os.environ.get(TOKEN_ENV, "")
    if env and not env.strip():
        raise UserError(f"${TOKEN_ENV} is blank (only white space); set a long random token, or unset it "
                        f"to have one generated")
    if env:
        if len(env) < 16:
            raise UserError(f"${TOKEN_ENV} is too short ({len(env)} characters); use at least 16, e.g. "
                            f"`export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')`")
        return env, False
    if not is_loopback(host):
        raise UserError(f"--host {host} is not a loopback address: set ${TOKEN_ENV} to a long random token "
                        f"first, or serve on 127.0.0.1")
    return secrets.token_urlsafe(32), True  # kiro.store.statestore.serve_token knows this shape: 43 URL-safe characters


def keep_token(state_dir: Path, token: str) -> Path:
    """Write the generated token where people and scripts read it and no step's box can, and remove
    the file where kiro kept it before (`.state/serve.token`, which a box could read)."""
    path = state_dir / SERVE_TOKEN
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    atomic_write(path, token + "\n", fsync=False, mode=0o600)
    (state_dir / "serve.token").unlink(missing_ok=True)
    return path


def _hostname(netloc: str) -> str | None:
    """`host[:port]` -> its host in lower case, IPv6 without brackets; None when it is no host at all."""
    try:
        parts = urlsplit("//" + netloc)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        return None
    return parts.hostname or None


def allowed_hosts(host: str, extra: list[str]) -> frozenset[str]:
    """The names a request's Host may carry: the bound address, every loopback name when it is a
    loopback one, and the names the person allows (--allow-host). Bound to every interface (0.0.0.0,
    ::), any address written as an IP is the server's own: rebinding needs a name."""
    names = {_hostname(host if ":" not in host else f"[{host}]") or host.lower()}
    if is_loopback(host):
        names |= LOOPBACK_NAMES
    names |= {name.strip().lower().strip("[]") for name in extra if name.strip()}
    return frozenset(names)


def _host_allowed(name: str | None, hosts: frozenset[str]) -> bool:
    if name is None:
        return False
    if name in hosts:
        return True
    if not {"0.0.0.0", "::"} & hosts:
        return False
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _refusal(scope: Scope, status: int, body: dict[str, str], headers: dict[str, str] | None = None) -> Response:
    if scope["type"] == "http" and scope.get("path") == "/" and scope.get("method") == "GET" and status == 401:
        return HTMLResponse(LOGIN_PAGE, status_code=401, headers=headers)
    return JSONResponse(body, status_code=status, headers=headers)


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
    """ASGI middleware: a Host that is not this server's is refused (403), then a cross-origin WebSocket
    or state-changing request (403), then a missing or wrong token (401: for a WebSocket, a refused
    handshake)."""

    def __init__(self, app: ASGIApp, token: str, hosts: frozenset[str]) -> None:
        self.app = app
        self.token = token.encode()
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not _host_allowed(_hostname(host), self.hosts):
            await self._refuse(scope, receive, send, 403, {
                "error": "forbidden", "message": f"Host {host!r} is not this server's; start it with "
                                                 f"--allow-host NAME to be reached by that name"})
            return
        origin = headers.get("origin")
        if origin is not None and (scope["type"] == "websocket" or scope.get("method") not in SAFE_METHODS):
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
                await self._refuse(scope, receive, send, 403, {
                    "error": "forbidden", "message": f"Origin {origin!r} is not this server's own page"})
                return
        if scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = _presented(scope)
        if given is not None and hmac.compare_digest(given.encode(), self.token):
            await self.app(scope, receive, send)
            return
        await self._refuse(scope, receive, send, 401, {
            "error": "unauthorized", "message": "this route needs the server's token: "
                                                "`Authorization: Bearer <token>` or `?token=<token>`"})

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, body: dict[str, str]) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if scope["type"] == "http":
            await _refusal(scope, status, body, headers)(scope, receive, send)
            return
        # WebSocket: refuse the handshake with an HTTP answer where the server supports denial responses.
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await _refusal(scope, status, body, headers)(scope, receive, send)  # Starlette prefixes "websocket."
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": body["error"]})
