"""Who starts a request's prefill leg: the one value both handlers read
(docs/reference/orchestration.md). The worker derives it once from its flags
(`components/worker/role.py`, `WorkerRole.orchestration`) and hands it to the decode and prefill
handlers' configs; nothing else derives it, and no handler guesses it from a request's shape.
"""

from enum import Enum
from typing import Any

from handlers.core.errors import RequestError


class Orchestration(Enum):
    # aggregated: one engine computes the prompt and decodes; there is no prefill leg
    NONE = "none"
    # Dynamo 1.6.1's prefill router: it sends both legs at once, each with the same
    # `bootstrap_info` (the prefill gets the flat preprocessed request)
    FRONTEND = "frontend"
    # the decode handler sends `{request, sampling_params}` to a prefill worker and waits for
    # the room that worker draws
    DECODE = "decode"

    @property
    def disaggregated(self) -> bool:
        return self is not Orchestration.NONE


def takes_flat_request(orchestration: "Orchestration", request: Any) -> bool:
    """Whether a prefill leg is the frontend's flat request (True) or a decode worker's
    `{request, sampling_params}` (False), from the worker's style; a request of the other
    style's shape is the deployment's mistake, said as such, not served by a guess."""
    if not isinstance(request, dict):
        raise RequestError("the prefill request must be an object")
    frontend = orchestration is Orchestration.FRONTEND
    if ("request" in request) == frontend:
        raise RequestError(_MISMATCH[orchestration])
    return frontend


# Both legs of a deployment run the same --disagg-orchestrator (launch/disagg.sh passes one
# value to every worker).
_MISMATCH = {
    Orchestration.FRONTEND: (
        "this prefill worker is frontend-orchestrated (--disagg-orchestrator frontend) and "
        "takes the frontend's flat preprocessed request, but got a decode worker's "
        "{request, sampling_params}; run the decode worker with --disagg-orchestrator frontend "
        "too"),
    Orchestration.DECODE: (
        "this prefill worker is decode-orchestrated (--disagg-orchestrator decode) and takes a "
        "decode worker's {request, sampling_params}, but got a flat preprocessed request; run "
        "the prefill worker with --disagg-orchestrator frontend to serve the frontend's prefill "
        "router"),
}
