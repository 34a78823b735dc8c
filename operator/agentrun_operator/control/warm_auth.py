"""The signatures of the warm channel (docs/design.md#warm-channel), used by both of its ends: the
supervisor in the pod (control/warm.py) and the operator's client (shell/warm_client.py). Pure,
standard library only (the supervisor is the reporter, which imports no more).

Every request and every answer is signed with the run's key, so the supervisor takes orders from the
operator only, and the operator takes no answer that another run's pod or a stranger could have
made. A request's nonce is used once: the supervisor remembers the last `REMEMBERED_NONCES` and
refuses a replay; the answer is signed over the request's nonce, so an old answer cannot be replayed
to the operator either.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from collections import OrderedDict
from typing import Final

PROTOCOL: Final = "agentrun-warm-v1"
SCHEME: Final = "AgentRun-HMAC"
ANSWER_HEADER: Final = "X-AgentRun-Signature"
NONCE_BYTES: Final = 16
"""A nonce is 32 hex digits: 128 random bits, never guessed, never drawn twice."""
REMEMBERED_NONCES: Final = 4096
_AUTHORIZATION: Final = re.compile(
    rf'^{SCHEME} nonce="(?P<nonce>[0-9a-f]{{{2 * NONCE_BYTES}}})", signature="(?P<signature>[0-9a-f]{{64}})"$'
)


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def request_signature(key: bytes, method: str, target: str, nonce: str, body: bytes) -> str:
    """HMAC-SHA256 over the request's method, its path with the query as sent, its nonce and its body."""
    return _mac(key, f"{PROTOCOL} request\n{method}\n{target}\n{nonce}\n{body_digest(body)}")


def answer_signature(key: bytes, nonce: str, status: int, body: bytes) -> str:
    """HMAC-SHA256 over the request's nonce, the answer's status code and its body."""
    return _mac(key, f"{PROTOCOL} response\n{nonce}\n{status}\n{body_digest(body)}")


def authorization(key: bytes, method: str, target: str, nonce: str, body: bytes) -> str:
    """The request's `Authorization` header."""
    signature = request_signature(key, method, target, nonce, body)
    return f'{SCHEME} nonce="{nonce}", signature="{signature}"'


def parse_authorization(value: str | None) -> tuple[str, str] | None:
    """(nonce, signature) of an `Authorization` header in exactly the form `authorization` writes;
    None for anything else."""
    if not value:
        return None
    match = _AUTHORIZATION.match(value.strip())
    return (match["nonce"], match["signature"]) if match else None


def request_is_signed(key: bytes, method: str, target: str, nonce: str, signature: str, body: bytes) -> bool:
    return hmac.compare_digest(request_signature(key, method, target, nonce, body), signature)


def answer_is_signed(key: bytes, nonce: str, status: int, body: bytes, signature: str | None) -> bool:
    if not signature:
        return False
    return hmac.compare_digest(answer_signature(key, nonce, status, body), signature.strip())


class NonceMemory:
    """The last `limit` nonces of signed requests: a nonce seen among them is a replay. Thread-safe
    (the supervisor answers each connection in a thread of its own)."""

    def __init__(self, limit: int = REMEMBERED_NONCES) -> None:
        self._limit = limit
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def first_use(self, nonce: str) -> bool:
        """Remember `nonce`; False when it is remembered already (a replay)."""
        with self._lock:
            if nonce in self._seen:
                return False
            self._seen[nonce] = None
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)
            return True
