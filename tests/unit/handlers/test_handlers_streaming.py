"""Engine chunks -> token deltas (Tokens mode) and chat chunks (Text mode)."""

import pytest

from handlers.text.chat_stream import ChatStream
from handlers.core.errors import EngineError, EngineUnavailable, RequestError
from handlers.core.finish import map_finish_reason
from handlers.core.token_stream import TokenStream
from tests.support.handler_fakes import ABORT, chunk

pytestmark = pytest.mark.timeout(10)


def test_token_deltas_are_disjoint_and_the_final_tokens_are_delivered():
    stream = TokenStream()
    engine = [chunk([5]), chunk([6, 7]), chunk([]), chunk([8], {"type": "length", "length": 4},
                                                          prompt=3, completion=4, cached=1)]
    out = [d for d in map(stream.convert, engine) if d is not None]
    assert out == [
        {"token_ids": [5]},
        {"token_ids": [6, 7]},
        {"token_ids": [8], "finish_reason": "length", "completion_usage": {
            "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 1}}},
    ]
    assert [t for d in out for t in d["token_ids"]] == [5, 6, 7, 8]
    assert stream.completion_tokens == 4


def test_single_token_completion_is_not_dropped():
    out = TokenStream().convert(chunk([42], {"type": "stop", "matched": 2}, completion=1))
    assert out["token_ids"] == [42] and out["finish_reason"] == "stop"


def test_token_stream_keeps_the_choice_index():
    out = TokenStream().convert(chunk([1], index=1))
    assert out == {"token_ids": [1], "index": 1}


def test_chunk_without_output_ids_is_an_engine_error():
    with pytest.raises(EngineError, match="no output_ids"):
        TokenStream().convert({"meta_info": {}})


@pytest.mark.parametrize(
    "reason, expected",
    [
        (None, None),
        ({"type": "stop", "matched": 2}, "stop"),
        ({"type": "length", "length": 3}, "length"),
        ("content_filter", "content_filter"),
        (ABORT, "cancelled"),
        ({"type": "weird"}, "stop"),
    ],
)
def test_finish_reasons(reason, expected):
    assert map_finish_reason(reason) == expected


def test_abort_with_400_is_the_clients_error():
    with pytest.raises(RequestError, match="^bad regex$"):
        map_finish_reason({"type": "abort", "message": "bad regex", "status_code": 400})


def test_abort_with_other_status_is_an_engine_error():
    with pytest.raises(EngineError, match=r"status 500\): overloaded"):
        map_finish_reason({"type": "abort", "message": "overloaded", "status_code": 500})


def test_sglangs_503_aborts_are_unavailable_not_failures():
    """SGLang's own 503s (its queue is full, a retraction without backup) stay 503s."""
    with pytest.raises(EngineUnavailable, match="The request queue is full"):
        map_finish_reason({"type": "abort", "message": "The request queue is full.",
                           "status_code": 503})


def test_chat_chunks_role_once_per_choice_and_usage_chunk():
    stream = ChatStream("chatcmpl-1", "tiny", include_usage=True)
    engine = [
        chunk([1], text="Hel", index=0, completion=1),
        chunk([2], text="Yo", index=1, completion=1),
        chunk([3], text="lo", index=0, completion=2),
        chunk([], {"type": "stop"}, text="", index=0, completion=2, prompt=5),
        chunk([4], {"type": "length"}, text="!", index=1, completion=3, prompt=5, cached=2),
    ]
    out = [c for c in map(stream.convert, engine) if c is not None]
    deltas = [(c["choices"][0]["index"], c["choices"][0]["delta"], c["choices"][0]["finish_reason"])
              for c in out]
    assert deltas == [
        (0, {"role": "assistant", "content": "Hel"}, None),
        (1, {"role": "assistant", "content": "Yo"}, None),
        (0, {"content": "lo"}, None),
        (0, {}, "stop"),
        (1, {"content": "!"}, "length"),
    ]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-1"
               and c["model"] == "tiny" for c in out)
    assert len({c["created"] for c in out}) == 1
    tail = stream.close()
    assert tail["choices"] == []
    assert tail["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 2}}


def test_chat_without_usage_request_has_no_tail_but_counts():
    stream = ChatStream("c", "m", include_usage=False)
    stream.convert(chunk([1], {"type": "stop"}, text="a", completion=1, prompt=4))
    assert stream.close() is None
    assert (stream.prompt_tokens, stream.completion_tokens) == (4, 1)


def test_chat_skips_empty_non_final_chunks():
    assert ChatStream("c", "m", include_usage=False).convert(chunk([], text="")) is None
