"""What the engine-level disaggregation tests share next to their engines (this folder's
conftest.py: a prefill in a child process, a decode and an aggregated reference in the test's
process, real NIXL between): the timeouts they run with, `pair`, one request through both in
one room, and `assert_pools_empty`, nothing held on either side."""

import asyncio
import time

from tests.support.engine_helpers import boot, drain, wait_until

# The shared prefill gives up on a decode that never registers after 3 s; KV waits are 10 s.
TIMEOUTS = {"bootstrap_timeout": 3.0, "transfer_timeout": 10.0}


async def pair(prefill, decode, ids, params, stream=False, **kw):
    """One request in one room: the prefill's result, and the decode's (its chunks, streamed)."""
    b = boot(prefill)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=params, **b, **kw))
    d = await decode.async_generate(input_ids=ids, sampling_params=params, stream=stream, **b,
                                    **kw)
    if stream:
        d = await asyncio.wait_for(drain(d), 30)
    return await asyncio.wait_for(p_task, 30), d


async def assert_pools_empty(prefill, decode):
    await wait_until(lambda: decode.kv_pages_in_use() == 0, what="decode pool empty")
    deadline = time.monotonic() + 10
    while (pages := await prefill.pages_in_use()) != 0:
        assert time.monotonic() < deadline, f"prefill still holds {pages} pages"
        await asyncio.sleep(0.05)
