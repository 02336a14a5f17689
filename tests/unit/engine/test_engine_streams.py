"""engine_streams: chunks that queued up while the consumer was busy are read as one, in order,
with the latest meta_info; nothing waits for a merge (the first chunk goes out alone)."""

import asyncio

import pytest

from components.engine.api.streams import stream_chunks


def chunk(ids, finish=None, text=None, logprobs=None):
    meta = {"id": "r", "finish_reason": finish, "completion_tokens": ids[-1] if ids else 0}
    if logprobs is not None:
        meta["output_token_logprobs"] = logprobs
    out = {"output_ids": list(ids), "meta_info": meta}
    if text is not None:
        out["text"] = text
    return out


def starter(queue):
    async def start():
        return queue

    return start


async def read_all(queue, aborts):
    return [c async for c in stream_chunks(starter(queue), lambda: aborts.append(1))]


def test_queued_chunks_merge_in_order_with_the_latest_meta():
    async def go():
        queue: asyncio.Queue = asyncio.Queue()
        for i in (1, 2, 3):
            queue.put_nowait(chunk([i], text=f"t{i}", logprobs=[(-float(i), i, None)]))
        queue.put_nowait(chunk([4], finish={"type": "length", "length": 4}, text="t4"))
        aborts: list = []
        return await read_all(queue, aborts), aborts

    chunks, aborts = asyncio.run(go())
    assert len(chunks) == 1 and not aborts
    (only,) = chunks
    assert only["output_ids"] == [1, 2, 3, 4]
    assert only["text"] == "t1t2t3t4"
    assert only["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert only["meta_info"]["completion_tokens"] == 4
    assert only["meta_info"]["output_token_logprobs"] == [(-1.0, 1, None), (-2.0, 2, None),
                                                          (-3.0, 3, None)]


def test_a_chunk_is_never_held_back_waiting_for_more():
    async def go():
        queue: asyncio.Queue = asyncio.Queue()
        aborts: list = []
        stream = stream_chunks(starter(queue), lambda: aborts.append(1))
        queue.put_nowait(chunk([7]))
        first = await asyncio.wait_for(anext(stream), 1.0)  # alone in the queue: sent alone
        queue.put_nowait(chunk([8]))
        queue.put_nowait(chunk([9], finish={"type": "stop", "matched": 9}))
        rest = [c async for c in stream]
        return first, rest

    first, rest = asyncio.run(go())
    assert first["output_ids"] == [7]
    assert [c["output_ids"] for c in rest] == [[8, 9]]
    assert rest[0]["meta_info"]["finish_reason"]["type"] == "stop"


def test_a_refusal_still_raises_on_the_first_read():
    async def go():
        queue: asyncio.Queue = asyncio.Queue()
        queue.put_nowait(chunk([], finish={"type": "abort", "status_code": 400,
                                           "message": "bad temperature"}))
        return await read_all(queue, [])

    with pytest.raises(ValueError, match="bad temperature"):
        asyncio.run(go())
