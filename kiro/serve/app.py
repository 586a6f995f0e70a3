"""The Starlette app of `kiro serve`: routes of SPEC §10.

    GET  /healthz                       no token needed
    GET  /                              the live dashboard (one self-contained HTML page)
    GET  /api/info                      workspace, version, events indexed
    GET  /api/loops                     the rows of `kiro loop status --json`
    GET  /api/loops/{id}                the state file
    GET  /api/loops/{id}/progress       `kiro loop progress --json`
    GET  /api/loops/{id}/events         that loop's events: ?after=N (the N-th event of its log), ?tail=K
    GET  /api/loops/{id}/note           the review note a paused loop waits on: {path, text}; 404 when none
    GET  /api/events                    SSE of every loop's events; `id:` is a workspace-wide cursor
    GET  /api/ws                        WebSocket: the same events, and control messages (seed 003)
    GET  /digest                        the digest (SPEC §14) as a page: ?date=YYYY-MM-DD, default today's
    GET  /api/digest                    `kiro loop digest --json`: ?date=YYYY-MM-DD
    POST /api/loops                     {task, options} -> 201 {task_id}
    POST /api/loops/{id}/stop           {force?, reason?}
    POST /api/loops/{id}/resume
    POST /api/loops/{id}/messages       {content}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from kiro import jsonl
from kiro.errors import KiroError, raise_errors
from kiro.fs import safeio
from kiro.serve.auth import TokenAuth
from kiro.serve.control import ControlError, Controller
from kiro.serve.index import EventIndex
from kiro.store.logread import read_events
from kiro.store.redact import Redactor
from kiro.store.state import effective_status, to_jsonable
from kiro.store.statestore import StateStore
from kiro.views import dashboard, loops

KEEPALIVE_SECONDS = 15.0
EVENTS_PAGE = 1000
BODY_MAX_BYTES = 1_000_000  # a control request is a few hundred bytes; a message at most MESSAGE_MAX_CHARS
DASHBOARD_CHECK_SECONDS = 2.0


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def decode(raw: str | bytes) -> dict[str, Any]:
    """A control request's JSON object, or ControlError(400): not JSON, nested deeper than the parser
    goes, not an object, or holding a lone surrogate (text no file or socket can carry)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise ControlError(400, f"not JSON: {why}") from None
    if not isinstance(body, dict):
        raise ControlError(400, "a request must be a JSON object")
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ControlError(400, "a string holds a lone surrogate (\\ud800-\\udfff): not Unicode text") from None
    except RecursionError:
        raise ControlError(400, "not JSON: nested too deep") from None
    return body


def _cursor(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return max(0, value)


class Server:
    def __init__(self, store: StateStore, token: str) -> None:
        self.store = store
        self.ws = store.ws
        self.control = Controller(self.ws, store, token)
        # every secret kiro knows of (the environment's, the config's, the token) is cut from what is sent:
        # the files served are kiro's, but an agent or a step may write into Logs/ or a task file
        self.redact = store.redact | Redactor.from_environment(None) | self.control.token
        self.index = EventIndex(self.ws.logs, self.ws.state_dir, self.redact.text)
        self._chunk: tuple[tuple[int, int], bytes] | None = None

    # -- reads -------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        """Whether the server is up, and the number of events it has indexed (no token needed)."""
        return JSONResponse({"ok": True, "events": self.index.last})

    async def info(self, request: Request) -> Response:
        """The workspace served: its path, name, kiro's version, the events indexed and a watcher error."""
        from kiro import __version__

        return JSONResponse({"workspace": str(self.ws.root), "name": self.ws.root.name, "version": __version__,
                             "events": self.index.last, "watcher_error": self.index.watch_error})

    async def page(self, request: Request) -> Response:
        """The live dashboard (HTML), with the loops' cards rendered in it (kiro.serve.pages.loop_cards): a
        browser shows them before its script has run; the script then keeps them up to date."""
        from kiro.serve import pages

        html = resources.files("kiro.serve").joinpath("dashboard.html").read_text(encoding="utf-8")
        rows = await asyncio.to_thread(self._rows)
        html = html.replace("<!--loops-->", pages.loop_cards(rows), 1)
        return HTMLResponse(html, headers={"Cache-Control": "no-store",
                                           "Content-Security-Policy": "default-src 'self'; "
                                           "style-src 'self' 'unsafe-inline'; script-src 'self' 'unsafe-inline'; "
                                           "img-src 'self' data:; connect-src 'self'"})

    async def _digest(self, request: Request) -> dict[str, Any]:
        from kiro.core import api

        day = request.query_params.get("date")
        return await asyncio.to_thread(api.digest, self.ws, day)

    async def digest_data(self, request: Request) -> Response:
        try:
            found = await self._digest(request)
        except KiroError as exc:
            return _error(400, str(exc))
        return JSONResponse(self.redact.data(found))

    async def digest_page(self, request: Request) -> Response:
        from kiro.serve import pages

        try:
            found = await self._digest(request)
        except KiroError as exc:
            return _error(400, str(exc))
        return HTMLResponse(pages.digest(found, self.redact.text), headers={
            "Cache-Control": "no-store", "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                                                    "script-src 'unsafe-inline'"})

    def _rows(self, warnings: list[str] | None = None) -> list[dict[str, Any]]:
        """Every loop's row as `kiro loop status --json` shows it, with `review_note`: the workspace path of
        the review note the loop waits on (`note`), or None. Secrets cut."""
        rows = loops.all_rows(self.store, warnings)
        for row in rows:
            found = self._note(str(row.get("task_id", "")))
            row["review_note"] = self.ws.relative(found) if found is not None else None
        return self.redact.data(rows)  # type: ignore[no-any-return]

    def _note(self, task_id: str) -> Path | None:
        """The review note of a loop paused at a review point, or of its review helper (SPEC §13)."""
        for path in (self.ws.review_note(task_id), self.ws.review_changes_note(task_id)):
            if path.is_file():
                return path
        return None

    async def loops(self, request: Request) -> Response:
        """Every loop's row, as `kiro loop status --json` shows it (and `review_note`, `_rows`)."""
        warnings: list[str] = []
        rows = await asyncio.to_thread(self._rows, warnings)
        return JSONResponse(rows, headers={"X-Kiro-Warnings": str(len(warnings))})

    async def note(self, request: Request) -> Response:
        """The text of the review note the loop waits on (Needs_Action/review_<id>.md, or the review helper's
        review_changes_<id>.md), secrets cut; the page shows it as text (never as HTML)."""
        try:
            tid = self._tid(request)
        except ControlError as exc:
            return _error(exc.status, exc.message)
        found = self._note(tid)
        if found is None:
            return _error(404, f"loop {tid} has no review note in {self.ws.relative_name(self.ws.needs_action)}/")
        try:
            raw = safeio.read_bytes(found, limit=safeio.SMALL_MAX_BYTES, follow_symlinks=False)  # kiro's own file
        except (OSError, KiroError) as exc:
            return _error(404, f"{self.ws.relative(found)}: {exc}")
        text = self.redact.text(raw.decode("utf-8", errors="replace"))
        return JSONResponse({"path": self.ws.relative(found), "text": text})

    def _tid(self, request: Request) -> str:
        return self.control.task_id(request.path_params["task_id"])

    async def loop(self, request: Request) -> Response:
        """One loop's state, with the status it shows (`effective_status`)."""
        try:
            loaded = self.store.load(self._tid(request))
        except ControlError as exc:
            return _error(exc.status, exc.message)
        except KiroError as exc:
            return _error(404, str(exc))
        body = to_jsonable(loaded.state)
        body["effective_status"] = loops.loop_row(self.store, loaded.state)["status"]
        return JSONResponse(self.redact.data(body))

    async def progress(self, request: Request) -> Response:
        """One loop's steps with status, attempts, durations and checkpoints, as `kiro loop progress --json`."""
        try:
            loaded = self.store.load(self._tid(request))
        except ControlError as exc:
            return _error(exc.status, exc.message)
        except KiroError as exc:
            return _error(404, str(exc))
        return JSONResponse(self.redact.data(loops.progress(self.ws, loaded.state)))  # the task file, as it is

    async def loop_events(self, request: Request) -> Response:
        """A loop's events, each with `n` (its position in the log, from 1): `?after=N` those after the
        N-th, `?tail=K` only the last K, at most EVENTS_PAGE per answer (`next` continues)."""
        try:
            tid = self._tid(request)
        except ControlError as exc:
            return _error(exc.status, exc.message)
        after = _cursor(request.query_params.get("after")) or 0
        tail = _cursor(request.query_params.get("tail"))
        out: list[dict[str, Any]] = []
        for n, record in enumerate(read_events(self.ws.event_log(tid)), start=1):
            if n > after:
                record["n"] = n
                out.append(record)
        if tail is not None:
            out = out[-tail:] if tail else []
        more = len(out) > EVENTS_PAGE
        out = out[:EVENTS_PAGE]
        nxt = out[-1]["n"] if out else after
        return JSONResponse(self.redact.data({"task_id": tid, "events": out, "next": nxt, "more": more}))

    # -- the event stream --------------------------------------------------------------------

    def _sse_chunk(self, after: int, last: int) -> bytes:
        """The SSE text of events after..last. Clients at the same cursor (the usual case: all of them
        were woken by the same append) share one copy."""
        key = (after, last)
        if self._chunk is not None and self._chunk[0] == key:
            return self._chunk[1]
        data = b"".join(b"id: %d\ndata: %s\n\n" % (seq, self.index.line(seq)) for seq in range(after + 1, last + 1))
        self._chunk = (key, data)
        return data

    def _resume_point(self, given: int | None) -> int:
        """Where a client's stream starts: after the cursor it names, else at the present."""
        if given is None:
            return self.index.last
        return min(given, self.index.last)

    async def sse(self, request: Request) -> Response:
        """Every loop's events as Server-Sent Events (`?task_id=` one loop's; `Last-Event-ID` or `?after=N` resumes)."""
        given = _cursor(request.headers.get("last-event-id") or request.query_params.get("last_event_id")
                        or request.query_params.get("after"))
        only = request.query_params.get("task_id")
        start = self._resume_point(given)

        async def stream() -> AsyncIterator[bytes]:
            cursor = start
            yield f"retry: 1000\nevent: hello\ndata: {json.dumps({'cursor': cursor})}\n\n".encode()
            while True:
                if not await self.index.wait_beyond(cursor, KEEPALIVE_SECONDS):
                    yield b": keepalive\n\n"
                    continue
                last = min(self.index.last, cursor + EVENTS_PAGE)  # a client far behind catches up in pages
                if not only:
                    yield self._sse_chunk(cursor, last)
                    cursor = last
                    continue
                chunks: list[bytes] = []
                for seq in range(cursor + 1, last + 1):
                    if self.index.entries[seq - 1].task_id == only:
                        chunks.append(b"id: %d\ndata: %s\n\n" % (seq, self.index.line(seq)))
                cursor = last
                # filtered out: still move the client's Last-Event-ID on
                yield b"".join(chunks) if chunks else b"id: %d\n\n" % cursor

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # -- the WebSocket -----------------------------------------------------------------------

    async def websocket(self, sock: WebSocket) -> None:
        """Events as they happen, and control messages (start, stop, resume, message) answered on the socket."""
        await sock.accept()
        lock = asyncio.Lock()

        async def send(message: dict[str, Any]) -> None:
            async with lock:
                await sock.send_text(json.dumps(message, ensure_ascii=False, default=str))

        start = self._resume_point(_cursor(sock.query_params.get("last_event_id")))
        await send({"type": "hello", "cursor": start})
        pusher = asyncio.create_task(self._push(send, start))
        try:
            while True:
                message = await sock.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:  # a binary frame: JSON in UTF-8 is fine too
                    try:
                        text = bytes(message.get("bytes") or b"").decode("utf-8")
                    except UnicodeDecodeError:
                        await send({"type": "error", "message": "a binary frame that is not UTF-8 text"})
                        continue
                try:
                    answer = await self._handle(text)
                except Exception as exc:  # a bug must not cost the client its connection (tests: it must fail)
                    if raise_errors():
                        raise
                    answer = {"type": "error", "message": f"internal error: {type(exc).__name__}: {exc}"}
                await send(answer)
        except WebSocketDisconnect:
            pass
        finally:
            pusher.cancel()
            with contextlib.suppress(BaseException):
                await pusher

    async def _push(self, send: Any, cursor: int) -> None:
        while True:
            if not await self.index.wait_beyond(cursor, KEEPALIVE_SECONDS):
                continue
            last = self.index.last
            for seq in range(cursor + 1, last + 1):
                record = jsonl.record(self.index.line(seq))
                if record is None:  # the line changed since it was indexed (a log moved away and rewritten)
                    continue
                await send({"type": "loop_event", "id": seq, "task_id": record.get("task_id"), "event": record})
                if record.get("event") == "state_changed":  # seed 003's state broadcast, for clients that only draw
                    await send({"type": "loop_state_update", "id": seq, "task_id": record.get("task_id"),
                                "state": record.get("to"), "previous": record.get("from"),
                                "reason": record.get("reason")})
            cursor = last

    async def _handle(self, text: str) -> dict[str, Any]:
        """One control message in, one answer out; a bad message answers `error`, the socket stays."""
        try:
            msg = decode(text)
        except ControlError as exc:
            return {"type": "error", "status": exc.status, "message": exc.message}
        if not isinstance(msg.get("type"), str):
            return {"type": "error", "message": "a message is a JSON object with a string \"type\""}
        kind = msg["type"]
        rid = {"request_id": msg["request_id"]} if "request_id" in msg else {}
        try:
            if kind == "loop_start_request":
                body = await self.control.start(msg.get("task"), msg.get("options"))
                return {"type": "loop_started", **rid, **body}
            if kind == "loop_stop_request":
                opts = {k: msg[k] for k in ("force", "reason") if k in msg}
                body = await self.control.stop(msg.get("task_id"), opts)
                return {"type": "loop_stop_requested", **rid, **body}
            if kind == "loop_resume_request":
                body = await self.control.resume(msg.get("task_id"))
                return {"type": "loop_resumed", **rid, **body}
            if kind == "loop_message":
                body = self.control.message(msg.get("task_id"), msg.get("content"))
                return {"type": "loop_message_queued", **rid, **body}
            if kind == "get_loop_state":
                tid = self.control.task_id(msg.get("task_id"))
                loaded = self.store.load(tid)
                row = loops.loop_row(self.store, loaded.state)
                return {"type": "loop_state", **rid, "task_id": tid, "status": row["status"], "row": row,
                        "state": to_jsonable(loaded.state)}
            if kind == "list_loops":
                return {"type": "loops", **rid, "loops": loops.all_rows(self.store)}
        except ControlError as exc:
            return {"type": "error", **rid, "status": exc.status, "message": exc.message}
        except KiroError as exc:
            return {"type": "error", **rid, "message": str(exc)}
        known = "loop_start_request, loop_stop_request, loop_resume_request, loop_message, get_loop_state, list_loops"
        return {"type": "error", **rid, "message": f"unknown message type {kind!r}; known: {known}"}

    # -- control over REST -------------------------------------------------------------------

    @staticmethod
    async def _body(request: Request) -> dict[str, Any]:
        raw = bytearray()
        try:
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > BODY_MAX_BYTES:
                    raise ControlError(413, f"the body is larger than {BODY_MAX_BYTES} bytes")
        except ClientDisconnect:
            raise ControlError(400, "the client went away before its body was sent") from None
        if not raw.strip():
            return {}
        return decode(bytes(raw))

    async def post_loop(self, request: Request) -> Response:
        """Start a loop: `{"task": PATH, "options": {...}}`; 201 with its task id."""
        try:
            body = await self._body(request)
            unknown = set(body) - {"task", "options"}
            if unknown:
                raise ControlError(400, f"unknown field(s) {', '.join(sorted(unknown))}; expected task, options")
            return JSONResponse(await self.control.start(body.get("task"), body.get("options")), status_code=201)
        except ControlError as exc:
            return _error(exc.status, exc.message)

    async def post_stop(self, request: Request) -> Response:
        """Stop a loop at its next safe point (`{"force": true}`: now); 202."""
        try:
            body = await self._body(request)
            return JSONResponse(await self.control.stop(request.path_params["task_id"], body), status_code=202)
        except ControlError as exc:
            return _error(exc.status, exc.message)

    async def post_resume(self, request: Request) -> Response:
        """Resume a paused or stopped loop; 202."""
        try:
            await self._body(request)
            return JSONResponse(await self.control.resume(request.path_params["task_id"]), status_code=202)
        except ControlError as exc:
            return _error(exc.status, exc.message)

    async def post_message(self, request: Request) -> Response:
        """Send a running loop a message for its agent (`{"content": TEXT}`), as `kiro loop tell`; 202."""
        try:
            body = await self._body(request)
            return JSONResponse(self.control.message(request.path_params["task_id"], body.get("content")),
                                status_code=202)
        except ControlError as exc:
            return _error(exc.status, exc.message)

    # -- lifecycle ---------------------------------------------------------------------------

    # -- Dashboard.md -------------------------------------------------------------------------

    def _statuses(self) -> frozenset[tuple[str, str]]:
        out = set()
        for _path, st in self.store.all_states():
            if st is not None:
                alive = self.store.is_locked(st.task_id) if st.status.may_be_alive else False
                out.add((st.task_id, effective_status(st, alive)))
        return frozenset(out)

    async def _keep_dashboard(self) -> None:
        """Loops rewrite Dashboard.md as they change state, but a loop whose process died cannot say so:
        while the server runs, it rewrites the file whenever a loop's status (as `status` shows it,
        running vs interrupted included) changes, and once at start."""
        last: frozenset[tuple[str, str]] | None = None
        while True:
            try:
                now = await asyncio.to_thread(self._statuses)
                if now != last:
                    await asyncio.to_thread(dashboard.write_now, self.ws, self.store)
                    last = now
            except OSError:
                pass  # a disk problem now is a disk problem at the next check too; the API still answers
            await asyncio.sleep(DASHBOARD_CHECK_SECONDS)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.index.start()
        keeper = asyncio.create_task(self._keep_dashboard(), name="kiro-serve-dashboard")
        try:
            yield
        finally:
            keeper.cancel()
            with contextlib.suppress(BaseException):
                await keeper
            await self.index.aclose()


def create_app(store: StateStore, token: str, hosts: frozenset[str]) -> TokenAuth:
    """The app behind its gate: `hosts` are the names a request's Host may carry (auth.allowed_hosts)."""
    s = Server(store, token)
    routes = [
        Route("/healthz", s.healthz),
        Route("/", s.page),
        Route("/api/info", s.info),
        Route("/digest", s.digest_page),
        Route("/api/digest", s.digest_data),
        Route("/api/loops", s.loops, methods=["GET"]),
        Route("/api/loops", s.post_loop, methods=["POST"]),
        Route("/api/loops/{task_id}", s.loop),
        Route("/api/loops/{task_id}/progress", s.progress),
        Route("/api/loops/{task_id}/events", s.loop_events),
        Route("/api/loops/{task_id}/note", s.note),
        Route("/api/loops/{task_id}/stop", s.post_stop, methods=["POST"]),
        Route("/api/loops/{task_id}/resume", s.post_resume, methods=["POST"]),
        Route("/api/loops/{task_id}/messages", s.post_message, methods=["POST"]),
        Route("/api/events", s.sse),
        WebSocketRoute("/api/ws", s.websocket),
    ]
    app = Starlette(routes=routes, lifespan=s.lifespan)
    return TokenAuth(app, token, hosts)
