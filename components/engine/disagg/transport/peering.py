"""What a KV transport tells its peers and demands of them: its KV layout, the shared secret and
the UCX error handling mode (both sides must use the same one).

``engine_peering`` builds it from the engine's settings: the layout fingerprint names the model
by its directory name and a hash of its config.json (less the keys that vary between copies of
one model), so two engines move KV only between identical layouts of one model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field

from components.engine.disagg.transport.nixl_endpoint import CMA_SEG_SIZE
from protocol.kv_side_channel import KVLayout

logger = logging.getLogger(__name__)

# config.json keys that differ between copies of one model without changing its KV.
_VOLATILE_KEYS = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}


@dataclass(frozen=True)
class Peering:
    layout: KVLayout | None = None  # None: no layout check (tests, benchmarks)
    secret: bytes | None = field(default=None, repr=False)  # None: no authentication
    ucx_error_handling: str = "none"  # NIXL's ucx_error_handling_mode (nixl_endpoint.py)
    # Local only (peers need not agree): UCX's cma segment, None for UCX's 512k (nixl_endpoint.py)
    ucx_cma_seg_size: str | None = CMA_SEG_SIZE


def model_id(model_path: str) -> str:
    """``<directory name>@<12 hex digits of the canonical config.json hash>``."""
    name = os.path.basename(os.path.normpath(model_path))
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        logger.warning("KV layout: cannot read %s/config.json (%s); the model is named by its "
                       "path only", model_path, exc)
        return name
    if isinstance(config, dict):
        config = {k: v for k, v in config.items() if k not in _VOLATILE_KEYS}
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    return f"{name}@{hashlib.sha256(canonical).hexdigest()[:12]}"


def engine_peering(cfg, pool) -> Peering:
    """From an ``EngineConfig`` and its ``KVPool``."""
    layout = KVLayout(dtype=str(pool.tensor.dtype).removeprefix("torch."),
                      num_layers=pool.num_layers, num_kv_heads=pool.num_kv_heads,
                      head_dim=pool.head_dim, page_size=pool.page_size,
                      model_id=model_id(cfg.model_path), order=pool.layout)
    secret = cfg.kv_side_channel_secret
    return Peering(layout, secret.encode() if secret else None, cfg.kv_ucx_error_handling)
