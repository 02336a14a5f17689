"""`n > 1` frontend-orchestrated: no choice's finish leaves the decode before the prefill leg
has ended (docs/reference/orchestration.md, "n > 1").

Dynamo 1.6.1's prefill router holds the first finish chunk the decode leg sends before the
prefill leg's stream has ended, and once that stream ends it sends the held chunk and ends the
whole response: the other choices' chunks are dropped (measured on `sglang.Engine`, whose
choices each take a room and a transfer of their own, so the prefill leg often ends after the
decode's first choice finished; the decode's engine still streamed every token). A finish that
comes after the prefill leg ended passes, and the stream goes on. So the decode holds its first
finish chunk until the prefill says, over the room watch, that its leg has ended
(`LegEnded`). The prefill says so only once its leg's last item is out *and* its engine request
is through (the KV moved): a word sent as the last item left raced the runtime's end of that
stream to the frontend, and with `max_tokens` 1 a decode finish released by it beat the end once
in a loaded CI run. The leg's stream ends right after its first item, long before the engine
request, which the decode's first finish needs done anyway.
"""

import asyncio
import logging
from typing import Any, Optional

from handlers.core.base import RoomClaim
from handlers.core.guard import RequestGuard

logger = logging.getLogger(__name__)

# The prefill leg ends when its engine has moved the KV of every choice, which the decode's
# first finish needs already; this only bounds a prefill that died without its connection
# dropping.
WAIT_S = 30.0


class PrefillLegEnd:
    """One `n > 1` request's wait, before its first finish chunk, for its prefill leg's end."""

    def __init__(self, claim: Optional[RoomClaim], room: Optional[int]) -> None:
        self._room = room
        self._ended: "Optional[asyncio.Future[bool]]" = None
        if claim is not None:
            self._ended = claim.leg_ended()
        else:  # no room watch reached: the choices may be cut short by the frontend
            logger.warning("room %s: n > 1 without a room watch claim; the frontend may end "
                           "the response at the first choice's finish", room)

    async def before(self, chunk: dict[str, Any], guard: RequestGuard) -> None:
        """Wait (once, bounded) if `chunk` is a finish and the prefill leg has not ended."""
        if self._ended is None or not (chunk.get("meta_info") or {}).get("finish_reason"):
            return
        ended, self._ended = self._ended, None
        try:
            said = await guard.race(asyncio.shield(ended), WAIT_S)
        except TimeoutError:
            said = False
        if not said:
            logger.warning("room %s: the prefill did not say its leg ended (within %g s); "
                           "finishing anyway", self._room, WAIT_S)
