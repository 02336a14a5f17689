"""The CPU engine's read-outs: the facts the worker registers and the gauges and counters it
reads at scrape time (`components/worker/metrics/worker_metrics.py`), apart from the request path.
Each is a read of state the engine thread keeps, taken under the engine's lock where it is a set."""

from __future__ import annotations

from typing import Any

from components.engine.api.totals import Totals


class EngineReadouts:
    """Mixed into `CpuEngine`, which provides `_info`, `_loop`, `_lock`, `_live_rids`,
    `_totals` and `server_args`."""

    _info: Any
    _loop: Any
    _lock: Any
    _live_rids: set[str]
    _totals: Any
    server_args: Any

    @property
    def max_total_num_tokens(self) -> int:
        return self._info.max_total_num_tokens

    @property
    def page_size(self) -> int:
        return self._info.page_size

    @property
    def context_length(self) -> int:
        return self._info.context_length

    @property
    def max_running_requests(self) -> int:
        return self.server_args.max_running_requests

    @property
    def vocab_size(self) -> int:
        return self._info.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._info.eos_token_ids

    def get_server_info(self) -> dict[str, Any]:
        info = {k: getattr(self.server_args, k) for k in (
            "model_path", "served_model_name", "skip_tokenizer_init", "disaggregation_mode",
            "disaggregation_bootstrap_port", "disaggregation_transfer_backend", "host", "dtype")}
        info.update(page_size=self.page_size, context_length=self.context_length,
                    max_total_num_tokens=self.max_total_num_tokens,
                    max_running_requests=self.max_running_requests)
        return info

    def kv_pages_in_use(self) -> int:
        """KV pool pages held by live requests (tests assert it returns to 0)."""
        return self._loop.pages_in_use()

    def kv_pages_total(self) -> int:
        return self._info.num_pages

    def requests_in_flight(self) -> int:
        """Requests (choices) submitted and not finished yet, as SGLang's rid_to_state counts."""
        with self._lock:
            return len(self._live_rids)

    def rid_in_flight(self, rid: str) -> bool:
        """Whether ``rid`` names a request not finished yet (a new request may not reuse it)."""
        with self._lock:
            return rid in self._live_rids

    def queue_depth(self) -> int:
        """Requests waiting for the scheduler to admit them."""
        return self._loop.queue_depth()

    def kv_transfer_totals(self) -> Any:
        """Prefill engines: completed KV WRITEs (count, bytes, seconds); otherwise None."""
        return self._loop.kv_transfer_totals()

    def kv_pages_cached(self) -> int:
        """KV pool pages the prefix cache keeps for repeated prefixes (evicted on demand)."""
        return self._loop.cached_pages()

    def prefix_hit_tokens(self) -> int:
        """Prompt tokens served from the prefix cache since start (a per-worker counter)."""
        return self._loop.prefix_hit_tokens()

    def request_totals(self) -> Totals:
        """Finished requests and their prompt, generated and cached tokens since start."""
        return self._totals.snapshot()
