"""The KV path probe on `--engine sglang`: one real transfer through SGLang's own NIXL path
before a decode's requests use a prefill (docs/multi-host.md, "The KV path probe").

A side channel that works says nothing about the KV path: SGLang's NIXL connection moves the KV
and its notifications through UCX on transports of its own. A path that drops them (hosts that
share no UCX transport, UCX_NET_DEVICES naming an interface that does not reach the other host)
showed only as every request waiting out SGLang's transfer timeouts.

The first request a decode sends into a prefill's rooms waits for the probe (`KVPathProbe`): the
decode draws a room, asks the prefill over the room watch (``ProbeKV``) to run a one-token
prefill into it (`engine_prober`, on the prefill), and runs the matching one-token decode
request itself: SGLang's whole hand-off (bootstrap, KV transfer, notification, first token).
The path is good once the decode's request finished and the prefill said its half went through
(``KVProbed``). Otherwise, when either side failed or after PROBE_TIMEOUT_S, it is broken: the
request ends with a 503 naming the prefill, what failed and the UCX settings, and so does every
new request for that prefill for PROBE_RETRY_S; the next one after that probes again. A verdict
lasts as long as the room-watch connection it was made on, so a restarted prefill is probed
anew. A prefill whose room watch cannot be reached is not probed (its requests go on as before).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from components.worker.rooms.claims import Link, RoomClaims
from handlers.core.errors import EngineUnavailable, HandlerError
from handlers.core.finish import map_finish_reason
from handlers.core.live import new_rid
from handlers.prefill import new_room
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST, BootstrapInfo

logger = logging.getLogger(__name__)

# SGLang's hand-off on a busy CPU took up to ~9 s per request in the suite; a broken path
# otherwise costs SGLang's own waits (minutes).
PROBE_TIMEOUT_S = 30.0
PROBE_RETRY_S = 10.0  # a broken path fails new requests at once this long, then is probed again
PROBE_IDS = [1]  # token 1 exists in every vocabulary served; only its KV matters
PROBE_PARAMS = {"max_new_tokens": 1, "temperature": 0.0}

Endpoint = tuple[str, int]


def ucx_settings() -> str:
    given = [f"{n}={os.environ[n]}" for n in ("UCX_TLS", "UCX_NET_DEVICES") if n in os.environ]
    return ", ".join(given) or "no UCX_* set"


async def one_token(engine: Any, boot: BootstrapInfo, timeout_s: float) -> str:
    """Run a one-token request into `boot`'s room to its end: "" when it finished, else why
    not (its engine request aborted on the way out)."""
    rid = "kvprobe-" + new_rid()
    try:
        async with asyncio.timeout(timeout_s):
            stream = await engine.async_generate(
                input_ids=PROBE_IDS, sampling_params=dict(PROBE_PARAMS), stream=True, rid=rid,
                **boot.model_dump())
            reason = None
            async for chunk in stream:
                reason = map_finish_reason((chunk.get("meta_info") or {}).get("finish_reason"))
        return "" if reason not in (None, "cancelled") else "the engine aborted it"
    except TimeoutError:
        engine.tokenizer_manager.abort_request(rid)
        return f"it did not finish within {timeout_s:g} s"
    except (HandlerError, ValueError) as exc:  # an abort with a status; SGLang's refusal
        return str(exc)
    except asyncio.CancelledError:
        engine.tokenizer_manager.abort_request(rid)
        raise


def engine_prober(engine: Any, bootstrap: Endpoint, timeout_s: float = PROBE_TIMEOUT_S):
    """The prefill's half, run by its room watch for each ``ProbeKV``."""

    async def probe(room: int) -> str:
        boot = BootstrapInfo(bootstrap_host=bootstrap[0], bootstrap_port=bootstrap[1],
                             bootstrap_room=room)
        error = await one_token(engine, boot, timeout_s)
        if error:
            logger.warning("KV path probe of room %s: this prefill's half failed: %s",
                           room, error)
        return error

    return probe


@dataclass
class _Verdict:
    link: Optional[Link]  # the connection it was made on (None: not probed)
    failure: str = ""  # set when broken
    expires: float = float("inf")  # broken or not probed: probe again from then on


class KVPathProbe:
    """The decode's half: `check` before a request uses a prefill's room."""

    def __init__(self, engine: Any, claims: RoomClaims,
                 timeout_s: float = PROBE_TIMEOUT_S, retry_s: float = PROBE_RETRY_S) -> None:
        self._engine = engine
        self._claims = claims
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._verdicts: dict[Endpoint, _Verdict] = {}
        self._probing: dict[Endpoint, asyncio.Future[_Verdict]] = {}

    def check(self, boot: BootstrapInfo) -> "Optional[asyncio.Future[None]]":
        """None when the path to `boot`'s prefill is known good (no wait on the hot path);
        EngineUnavailable (a 503) at once while it is known broken; else the probe to wait for,
        which raises EngineUnavailable if the path fails. A canary's fake host moves no KV."""
        if boot.bootstrap_host == FAKE_BOOTSTRAP_HOST:
            return None
        endpoint = (boot.bootstrap_host, boot.bootstrap_port)
        verdict = self._verdicts.get(endpoint)
        if verdict is not None and self._current(verdict):
            if verdict.failure:
                raise EngineUnavailable(verdict.failure)
            return None
        probing = self._probing.get(endpoint)
        if probing is None:
            probing = self._probing[endpoint] = asyncio.ensure_future(self._probe(endpoint))
            probing.add_done_callback(lambda _: self._probing.pop(endpoint, None))
        return asyncio.shield(probing)  # a waiter that leaves stops no probe

    def _current(self, verdict: _Verdict) -> bool:
        """Whether a verdict still stands: not once its connection dropped (a restarted
        prefill), nor after it expired."""
        if verdict.link is not None and not verdict.link.open:
            return False
        return time.monotonic() < verdict.expires

    async def _probe(self, endpoint: Endpoint) -> None:
        link = await self._claims.link(*endpoint)
        if link is None:  # the claims logged why; the room watch's guarantee is gone too
            logger.warning("KV path to prefill %s:%d not probed: its room watch is unreachable",
                           *endpoint)
            self._verdicts[endpoint] = _Verdict(None, expires=time.monotonic() + self._retry_s)
            return
        room = new_room()
        started = time.monotonic()
        prefill = link.probe(room)
        boot = BootstrapInfo(bootstrap_host=endpoint[0], bootstrap_port=endpoint[1],
                             bootstrap_room=room)
        decode = await one_token(self._engine, boot, self._timeout_s)
        try:
            prefill_error = await asyncio.wait_for(
                asyncio.shield(prefill), max(0.0, started + self._timeout_s - time.monotonic()))
        except TimeoutError:
            prefill_error = f"no answer within {self._timeout_s:g} s"
        what = "; ".join(f"{side}: {error}" for side, error in
                         (("its decode request", decode), ("the prefill's half", prefill_error))
                         if error)
        verdict = self._verdicts[endpoint] = _Verdict(link)
        if not what:
            logger.info("KV path from prefill %s:%d checked in %.2f s", *endpoint,
                        time.monotonic() - started)
            return
        verdict.failure = broken_message(endpoint, what, self._retry_s)
        verdict.expires = time.monotonic() + self._retry_s
        logger.warning("%s", verdict.failure)
        raise EngineUnavailable(verdict.failure)


def broken_message(endpoint: Endpoint, what: str, retry_s: float) -> str:
    return (f"the KV path from prefill {endpoint[0]}:{endpoint[1]} to this decode failed its "
            f"check (a one-token transfer through SGLang's NIXL connection): {what}. KV moves "
            f"by NIXL over UCX ({ucx_settings()}): between hosts both workers need a transport "
            "they share (UCX_TLS unset or naming tcp or an RDMA device both have, "
            "UCX_NET_DEVICES an interface that reaches the other host); UCX_PROTO_INFO=y prints "
            "the transport taken. A prefill whose log says 'bootstrap_thread died' serves no "
            "decode any more (SGLang ends that thread on a decode it cannot reach): restart it. "
            f"Requests for this prefill fail at once for {retry_s:g} s, then it is probed again")
