"""uvicorn's h11 protocol with a deadline on reading a request.

uvicorn bounds a connection that idles between requests (timeout_keep_alive) and the size of a
request's head (h11_max_incomplete_event_size), but not the time a client takes to send its request:
one that opens a connection and sends half a request line, or a byte of its body now and then, is
held until it goes away, and a few hundred of them tie the server up. Here every request must have
arrived whole, head and body, within REQUEST_SECONDS of its first byte (or of the connection, for one
that sends nothing); else the client gets 408 and the connection is closed. The time an answer takes
(an event stream, a WebSocket after its handshake) is not bounded: only the request's arrival is.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_SECONDS = 10.0
_RECEIVING = (h11.IDLE, h11.SEND_BODY)  # the client's side of h11: its request has not all arrived
_BODY = json.dumps({"error": "request timeout",
                    "message": f"the request did not arrive whole within {REQUEST_SECONDS:.0f} s"}).encode()
_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(_BODY), _BODY))


class BoundedH11Protocol(H11Protocol):
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._arm()
        super().data_received(data)
        if self.conn.their_state not in _RECEIVING:  # whole (or the connection is over): no deadline
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()  # the WebSocket protocol takes the connection over
        super().handle_websocket_upgrade(event)

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(REQUEST_SECONDS, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.conn.our_state is h11.IDLE:  # no answer begun: say why before closing
            self.transport.write(_TIMEOUT)
        self.transport.close()
