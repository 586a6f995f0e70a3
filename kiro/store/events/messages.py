"""Messages (SPEC §11, kiro.store.messages).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from pydantic import Field

from kiro.store.events import Event


class MessageReceived(Event):
    """A message for the loop's agent arrived (`kiro loop tell`, the API, another loop)."""

    event: Literal["message_received"] = "message_received"
    message_id: str
    from_: str = Field(alias="from")
    via: str | None = None
    queued_at: str | None = None
    chars: int = 0


class MessageDelivered(Event):
    """A waiting message was put in the agent's prompt."""

    event: Literal["message_delivered"] = "message_delivered"
    message_id: str
    from_: str = Field(alias="from")
    where: str | None = None


class MessageSent(Event):
    """The agent sent another loop a message (`send_message`)."""

    event: Literal["message_sent"] = "message_sent"
    message_id: str
    to: str
    chars: int = 0
