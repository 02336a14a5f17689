"""The side channel's optional shared secret: an HMAC on each Hello, and on the Welcome back.

The decode signs every Hello (one per connection) with a fresh nonce and the time; the prefill
checks the MAC, the time (within ``MAX_SKEW_S``) and that the nonce is new, so a captured Hello
cannot be replayed. The Welcome's MAC covers the Hello's nonce and the prefill's agent name: a
bootstrap server without the secret cannot make a decode accept its KV notifications. The
secret authenticates; it does not encrypt (KV and metadata still cross the network in clear).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time

import msgspec

from protocol.kv_side_channel import Hello, Welcome, encode

# Clocks of two hosts in one cluster agree far better than this; a replay older than it is
# refused by the timestamp, a younger one by the nonce cache.
MAX_SKEW_S = 120.0
MAX_NONCES = 4096


def _mac(secret: bytes, data: bytes) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).digest()


def sign_hello(secret: bytes | None, hello: Hello) -> Hello:
    if not secret:
        return hello
    fresh = msgspec.structs.replace(hello, nonce=os.urandom(16), sent_at=time.time(), mac=b"")
    return msgspec.structs.replace(fresh, mac=_mac(secret, b"hello" + encode(fresh)))


def sign_welcome(secret: bytes | None, nonce: bytes, agent_name: str) -> Welcome:
    if not secret:
        return Welcome(agent_name=agent_name)
    return Welcome(agent_name=agent_name,
                   mac=_mac(secret, b"welcome" + nonce + agent_name.encode()))


def welcome_ok(secret: bytes | None, nonce: bytes, welcome: Welcome) -> bool:
    return hmac.compare_digest(sign_welcome(secret, nonce, welcome.agent_name).mac, welcome.mac)


class HelloChecker:
    """Prefill side: is this Hello signed with our secret, recent and not seen before?"""

    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret
        self._nonces: dict[bytes, float] = {}  # nonce -> when it stops mattering

    @property
    def enabled(self) -> bool:
        return bool(self._secret)

    def __len__(self) -> int:
        return len(self._nonces)

    def check(self, hello: Hello, now: float) -> str | None:
        """None if acceptable, else why not."""
        if not self._secret:
            return None
        want = _mac(self._secret, b"hello" + encode(msgspec.structs.replace(hello, mac=b"")))
        if not hmac.compare_digest(want, hello.mac):
            return "side-channel authentication failed (missing or wrong shared secret)"
        if abs(now - hello.sent_at) > MAX_SKEW_S or len(hello.nonce) < 16:
            return "side-channel authentication failed (stale hello; are the clocks in sync?)"
        for nonce in [n for n, until in self._nonces.items() if until < now]:
            del self._nonces[nonce]
        if hello.nonce in self._nonces:
            return "side-channel authentication failed (replayed hello)"
        if len(self._nonces) >= MAX_NONCES:
            return "too many hellos in the last minutes; try again later"
        self._nonces[hello.nonce] = now + 2 * MAX_SKEW_S
        return None
