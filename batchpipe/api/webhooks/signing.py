"""Events in OpenAI's shape, and their Standard Webhooks signatures.

An event is ``{"id", "object": "event", "type": "batch.<status>", "created_at",
"data": {"id": <batch id>}}`` — for the four ends, exactly what the ``openai`` SDK's
``client.webhooks.unwrap`` parses into ``BatchCompletedWebhookEvent`` and its siblings.
Its ``id`` and ``created_at`` are derived from the batch record (the batch id, the
status, and the time the batch reached it), so whichever replica builds the event of one
change builds the same bytes, and every attempt to deliver it carries the same
``webhook-id``: a receiver drops repeats by it.

A delivery is signed as Standard Webhooks (and OpenAI) sign: headers ``webhook-id``,
``webhook-timestamp`` (the attempt's time, Unix seconds; receivers refuse one more than
5 minutes off) and ``webhook-signature: v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>``.
The key is the secret's bytes, or for a secret ``whsec_<base64>`` the decoded base64,
as the SDK reads it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass

from batchpipe.api.records import BatchRecord


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    created_at: int
    batch_id: str
    owner: str

    @property
    def webhook_id(self) -> str:
        return "wh_" + self.id.removeprefix("evt_")

    def body(self) -> bytes:
        doc = {
            "id": self.id,
            "object": "event",
            "type": self.type,
            "created_at": self.created_at,
            "data": {"id": self.batch_id},
        }
        return json.dumps(doc, separators=(",", ":")).encode()


def event_of(batch: BatchRecord) -> Event:
    """The event of ``batch`` having reached its status."""
    digest = hashlib.sha256(f"{batch.id}\n{batch.status}".encode()).hexdigest()[:32]
    at = batch.created_at if batch.status == "validating" else getattr(batch, f"{batch.status}_at")
    return Event(f"evt_{digest}", f"batch.{batch.status}", int(at or 0), batch.id, batch.owner)


def secret_key(secret: str) -> bytes:
    """The HMAC key of a secret, as the SDK derives it; ``ValueError`` where the SDK
    could not derive one either."""
    if not secret.startswith("whsec_"):
        return secret.encode()
    try:  # exactly as the SDK (and Standard Webhooks) decode it: not validating, so
        # characters outside base64's alphabet are skipped, on both sides alike
        key = base64.b64decode(secret.removeprefix("whsec_"))
    except binascii.Error as exc:
        raise ValueError("a secret starting with whsec_ must be base64 after it") from exc
    if not key:
        raise ValueError("the secret is empty after whsec_")
    return key


def signed_headers(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> Mapping[str, str]:
    mac = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
        "content-type": "application/json",
    }
