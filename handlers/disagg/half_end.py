"""The decode half's side of the room watch (docs/reference/room-watch.md): claim
the room (the frontend's, before anything else; or the one the prefill names, as soon as it
does), and say how the half ended when it does, so the prefill computing the other half stops at
once instead of holding KV for nobody."""

from typing import Optional

from handlers.core.base import RoomClaim, RoomClaims
from handlers.core.outcome import Outcome
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST, BootstrapInfo


async def claim_boot(rooms: Optional[RoomClaims], boot: Optional[BootstrapInfo]
                     ) -> Optional[RoomClaim]:
    """The room's claim, or None (no watch, no room, a canary, or the watch unreachable)."""
    if rooms is None or boot is None or boot.bootstrap_host == FAKE_BOOTSTRAP_HOST:
        return None
    return await rooms.claim(boot.bootstrap_host, boot.bootstrap_port, boot.bootstrap_room)


class HalfEnd:
    """How this decode half ended (handlers/core/outcome.py), told to the prefill over the claim
    in the room watch's words; `message` is the 400's for an invalid request."""

    def __init__(self, claim: Optional[RoomClaim]) -> None:
        self.claim = claim
        self.outcome = Outcome.ERROR
        self.message = ""

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release(self.outcome.released_as, self.message)
