"""The wire of frontend-orchestrated disaggregation (Dynamo 1.6.1's own style;
docs/reference/orchestration.md).

The frontend's prefill router picks a prefill and a decode worker and sends both the same
`bootstrap_info` (host and port the prefill worker registered, a room the frontend drew):
- the prefill leg gets the flat preprocessed request (its `max_tokens` already 1) and must answer
  with `disaggregated_params` in its FIRST item, then keep its stream open until its engine is
  done (the frontend holds decode's finish chunk until then);
- the decode leg gets the client's request plus `bootstrap_info`, which it cannot serve without.
"""

from typing import Any, Optional

from handlers.core.errors import RequestError
from handlers.core.sampling import tokens_sampling_params
from handlers.core.unsupported import check_tokens_request
from protocol.bootstrap import BootstrapInfo
from protocol.disagg import PrefillDone
from protocol.preprocessed import OutputOptions, PreprocessedRequest
from protocol.validation import ProtocolError, parse

BOOTSTRAP_KEY = "bootstrap_info"
PARAMS_KEY = "disaggregated_params"


def request_bootstrap(request: dict[str, Any], required: bool) -> Optional[BootstrapInfo]:
    """The `bootstrap_info` the frontend injected; a missing one is a clear 400 on decode,
    where Dynamo's own handler fails the same request with a 500."""
    raw = request.get(BOOTSTRAP_KEY)
    if raw is None:
        if required:
            raise RequestError(
                f"{BOOTSTRAP_KEY} is required for frontend-orchestrated disaggregated decode "
                "but was not provided (the Dynamo frontend's prefill router adds it; send "
                "requests through the frontend, or run the decode worker with "
                "--disagg-orchestrator decode)")
        return None
    try:
        return parse(BootstrapInfo, raw)
    except ProtocolError as exc:
        raise RequestError(f"{BOOTSTRAP_KEY}: {exc}") from None


class SentRoom:
    """The decode leg's `bootstrap_info`, parsed once as the request arrives: the room it
    claims at once (so even a request it refuses tells the prefill leg why), and the 400 a
    missing or malformed one becomes, raised only after the request's own checks, whose
    errors come first."""

    def __init__(self, request: Any) -> None:
        self.boot: Optional[BootstrapInfo] = None
        self._error: Optional[RequestError] = None
        try:
            if not isinstance(request, dict):  # the body's own check says so first
                raise RequestError("the request must be an object")
            self.boot = request_bootstrap(request, required=True)
        except RequestError as exc:
            self._error = exc

    def required(self) -> BootstrapInfo:
        if self._error is not None:
            raise self._error
        return self.boot


def prefill_leg(request: dict[str, Any]
                ) -> tuple[list[int], dict[str, Any], OutputOptions, Optional[BootstrapInfo]]:
    """The flat request's ids, its output options, its `bootstrap_info` (validated with the rest:
    parsed once per request) and the SGLang sampling params for computing
    the prompt's KV and the first token: one new token for each of the request's `n` choices
    (the engine computes the prompt once; docs/reference/orchestration.md), and the prompt
    logprobs when asked (handlers/disagg/prompt_logprobs.py). The frontend sends both legs at
    once, so prefill refuses what decode refuses: otherwise its engine would hold the prompt's
    KV for a decode that never joins the room, until the bootstrap timeout."""
    try:
        req = parse(PreprocessedRequest, request)
    except ProtocolError as exc:
        raise RequestError(str(exc)) from None
    check_tokens_request(req)
    ids = req.token_ids
    params = tokens_sampling_params(req, prompt_len=len(ids), context_length=len(ids) + 1,
                                    skip_tokenizer_init=True)
    params["max_new_tokens"] = 1
    return ids, params, req.output_options, req.bootstrap_info


def first_item(boot: BootstrapInfo) -> dict[str, Any]:
    """Prefill's first item in 1.6.1's shape: no tokens, where decode's engine meets ours."""
    return {"token_ids": [], "text": None, "finish_reason": None,
            PARAMS_KEY: boot.model_dump()}


def last_item(done: PrefillDone) -> dict[str, Any]:
    """Prefill's last item: the KV-cache hit the router may account for, no tokens."""
    hit = {"prompt_tokens": done.prompt_tokens, "reused_tokens": done.cached_tokens}
    return {"token_ids": [], "engine_data": {"kv_cache_hit": hit}}
