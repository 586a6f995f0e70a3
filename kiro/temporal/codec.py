"""What kiro sends to Temporal is sealed: every payload (a step's input, with the task text and the config,
a `base_url` with its password included; an outcome; a heartbeat) and every failure's message and stack
trace are encrypted with AES-GCM before they leave the process, so the server's history (and anyone who
reads it: `temporal workflow show`, the web UI, a backup of its database) holds none of them in clear.

The key is 32 random bytes in `~/.config/kiro/temporal.key` (KEY_FILE, mode 0600, made on first use),
outside every project: kiro's step box hides $HOME behind an empty tmpfs, so no step can read it (the
box shows `.state/` read-only, which would not do). Every kiro process of the person that talks to the
server (`kiro loop`, the workspace worker, each `kiro worker`) uses it; a worker on another machine
needs a copy of the same file. A payload sealed with another key fails to open with one line that
says so (its key id, the first bytes of the key's SHA-256, is in the payload's metadata).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import temporalio.converter
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload

from kiro.errors import UserError

ENCODING = b"binary/kiro-aes256gcm"
KEY_BYTES = 32
NONCE_BYTES = 12


def key_file() -> Path:
    """Where the person's key is: under $HOME, which kiro's box hides (not $XDG_CONFIG_HOME, which may lie
    outside it)."""
    return Path.home() / ".config" / "kiro" / "temporal.key"


def load_key(path: Path | None = None) -> bytes:
    """The key, made (random, 0600, first writer wins) when there is none yet."""
    path = path or key_file()
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, os.urandom(KEY_BYTES).hex().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # a second process making one at the same time: the first one's is the key
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return _read(path)


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_mode & 0o077:
            raise UserError(f"{path}: kiro's Temporal key is readable by others; chmod 600 {path}")
        text = os.read(fd, 200).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise UserError(f"{path}: not a kiro Temporal key ({KEY_BYTES * 2} hex digits); remove it and kiro makes "
                        f"a new one (workflows sealed with the old one cannot be read then)")
    return key


class SealedPayloads(temporalio.converter.PayloadCodec):
    """AES-256-GCM over each whole payload (its metadata and data); a fresh nonce each, the key id as
    associated data."""

    def __init__(self, key: bytes) -> None:
        self.aead = AESGCM(key)
        self.key_id = hashlib.sha256(key).hexdigest()[:16].encode()

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        sealed = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            data = nonce + self.aead.encrypt(nonce, payload.SerializeToString(), self.key_id)
            sealed.append(Payload(metadata={"encoding": ENCODING, "kiro-key": self.key_id}, data=data))
        return sealed

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        opened = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                opened.append(payload)  # not kiro's: the server's own, or from before kiro sealed them
                continue
            key_id = payload.metadata.get("kiro-key", b"")
            if key_id != self.key_id:
                raise ValueError(f"a payload sealed with another kiro key (id {key_id.decode(errors='replace')}, "
                                 f"this one's {self.key_id.decode()}): copy the same {key_file()} to every "
                                 f"machine that runs kiro against this server")
            nonce, box = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
            plain = Payload()
            plain.ParseFromString(self.aead.decrypt(nonce, box, self.key_id))
            opened.append(plain)
        return opened


def data_converter(key: bytes | None = None) -> temporalio.converter.DataConverter:
    """Temporal's default converter, with every payload sealed and failures' messages and stack traces
    moved into (sealed) encoded attributes."""
    codec = SealedPayloads(key if key is not None else load_key())
    failures = temporalio.converter.DefaultFailureConverterWithEncodedAttributes
    return dataclasses.replace(temporalio.converter.default(), payload_codec=codec, failure_converter_class=failures)
