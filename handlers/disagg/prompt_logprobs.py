"""Prompt logprobs on a disaggregated model (docs/reference/orchestration.md, "Prompt logprobs").

Only the prefill worker runs the prompt's forward, so only its engine returns SGLang's
`input_token_logprobs` / `input_top_logprobs` (asked with `logprob_start_len=0`, as aggregated);
the decode engine, which adopts the prompt's KV, has none. Neither Dynamo 1.6.1's frontend
(its prefill router keeps only `disaggregated_params` and the cached-token count of a prefill's
stream) nor the KV transfer carries them, so the prefill sends them to the decode half over the
room watch, in both orchestration styles and on both engines: as soon as its engine's stream
ends (the KV is in the decode's pool then), on the connection that claimed the room. The decode
asks its own engine for no prompt logprobs, and puts the prefill's into the `meta_info` of each
final chunk it streams, where an aggregated engine has its own: `TokenStream` turns them into
`engine_data.prompt_logprobs` exactly as for an aggregated worker.
"""

import asyncio
from typing import Any, Optional

from handlers.core.base import RoomClaim, RoomWatch
from handlers.core.errors import PrefillError
from handlers.core.guard import RequestGuard
from protocol.room_watch import PromptLogprobs

# The prefill sends them when its engine's stream ends, around when the decode's first token
# comes; this bounds a prefill that dies in between without its connection dropping.
WAIT_S = 30.0
INPUT_KEYS = ("input_token_logprobs", "input_top_logprobs")


def decode_logprob_kwargs(kwargs: dict[str, Any], disaggregated: bool
                          ) -> tuple[dict[str, Any], bool]:
    """The decode engine's logprob kwargs, and whether the prompt logprobs come from the
    prefill: disaggregated, the same kwargs without prompt logprobs (the decode adopts the
    prompt's KV and computes no prompt; SGLang's PD decode has no input logprobs to return)."""
    if not disaggregated or not wants_prompt_logprobs(kwargs):
        return kwargs, False
    return {k: v for k, v in kwargs.items() if k != "logprob_start_len"}, True


def wants_prompt_logprobs(kwargs: dict[str, Any]) -> bool:
    return kwargs.get("logprob_start_len", -1) >= 0


class PrefillSide:
    """One prefill leg's prompt logprobs: the latest engine chunk that has them, delivered to
    the room's decode half once the engine's stream ends."""

    def __init__(self, rooms: Optional[RoomWatch], room: int) -> None:
        self._rooms = rooms
        self._room = room
        self._meta: dict[str, Any] = {}

    def seen(self, meta: dict[str, Any]) -> None:
        if meta.get("input_token_logprobs"):
            self._meta = meta

    def deliver(self, why_none: str = "") -> None:
        if self._rooms is None:
            return
        tokens = self._meta.get("input_token_logprobs")
        if not tokens:
            self._rooms.deliver(PromptLogprobs(self._room, error=why_none or (
                "the prefill engine returned no prompt logprobs")))
            return
        top = self._meta.get("input_top_logprobs") or []
        self._rooms.deliver(PromptLogprobs(
            self._room,
            tokens=[(None if lp is None else float(lp), int(tid)) for lp, tid, *_ in tokens],
            top=[None if pos is None else [(float(lp), int(tid)) for lp, tid, *_ in pos]
                 for pos in top]))


class DecodeSide:
    """The decode half's wait for its prefill's prompt logprobs (once; every final chunk of the
    request gets them)."""

    def __init__(self, claim: Optional[RoomClaim]) -> None:
        if claim is None:
            raise PrefillError(
                "prompt logprobs on a disaggregated model come from the prefill worker over its "
                "room watch, which this decode worker could not reach")
        self._got: "asyncio.Future[PromptLogprobs]" = claim.prompt_logprobs()
        self._timeout_s = WAIT_S

    async def merge(self, chunk: dict[str, Any], guard: RequestGuard) -> dict[str, Any]:
        """A final `chunk` with the prefill's prompt logprobs in its meta_info, as an
        aggregated engine's final chunk has its own (waiting for them, bounded); any other
        chunk as it is."""
        if not (chunk.get("meta_info") or {}).get("finish_reason"):
            return chunk
        try:
            msg = await guard.race(asyncio.shield(self._got), self._timeout_s)
        except TimeoutError:
            raise PrefillError(f"the prefill worker sent no prompt logprobs within "
                               f"{self._timeout_s:g} s") from None
        if msg.error:
            raise PrefillError(f"prompt logprobs: {msg.error}")
        meta = {**(chunk.get("meta_info") or {}),
                "input_token_logprobs": [(lp, tid, None) for lp, tid in msg.tokens],
                "input_top_logprobs": [None if pos is None else
                                       [(lp, tid, None) for lp, tid in pos] for pos in msg.top]}
        return {**chunk, "meta_info": meta}
