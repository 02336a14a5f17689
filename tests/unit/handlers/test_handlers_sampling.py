"""Request -> SGLang sampling_params, both modes."""

import pytest

from handlers.core.errors import RequestError
from handlers.core.sampling import completion_budget, text_sampling_params, tokens_sampling_params
from protocol import ChatCompletionRequest, PreprocessedRequest, parse

pytestmark = pytest.mark.timeout(10)


def _tokens(stop=None, opts=None) -> PreprocessedRequest:
    return parse(PreprocessedRequest, {"token_ids": [1, 2, 3], "stop_conditions": stop or {},
                                       "sampling_options": opts or {}})


def test_tokens_mode_full_mapping():
    req = _tokens(
        {"max_tokens": 8, "stop": ["END"], "stop_token_ids": [7, 9],
         "stop_token_ids_hidden": [2, 7], "ignore_eos": False},
        {"temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 11,
         "presence_penalty": 0.1, "frequency_penalty": 0.2, "repetition_penalty": 1.1, "n": 1},
    )
    params = tokens_sampling_params(req, prompt_len=3, context_length=100,
                                    skip_tokenizer_init=False)
    assert params == {
        "max_new_tokens": 8, "ignore_eos": False, "stop_token_ids": [2, 7, 9], "stop": ["END"],
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "sampling_seed": 11,
        "presence_penalty": 0.1, "frequency_penalty": 0.2, "repetition_penalty": 1.1, "n": 1,
    }


def test_tokens_mode_drops_none_and_fills_max_new_tokens_from_context():
    params = tokens_sampling_params(_tokens(), prompt_len=3, context_length=64,
                                    skip_tokenizer_init=True)
    # Absent max_tokens: the rest of the context, never SGLang's silent default of 128.
    assert params == {"max_new_tokens": 61}


def test_max_tokens_past_the_context_is_a_400_naming_both_numbers():
    """SGLang's length rule (not a silent clamp): prompt + max_tokens must fit the context."""
    with pytest.raises(RequestError) as info:
        tokens_sampling_params(_tokens({"max_tokens": 500}), prompt_len=3, context_length=64,
                               skip_tokenizer_init=True)
    assert str(info.value).startswith(
        "Requested token count exceeds the model's maximum context length of 64 tokens. You "
        "requested a total of 503 tokens: 3 tokens from the input messages and 500 tokens")


def test_tokens_mode_without_tokenizer_leaves_stop_strings_to_the_frontend():
    req = _tokens({"stop": ["END"], "stop_token_ids_hidden": [2]})
    params = tokens_sampling_params(req, prompt_len=3, context_length=64, skip_tokenizer_init=True)
    assert "stop" not in params
    assert params["stop_token_ids"] == [2]


def test_tokens_mode_min_tokens_without_tokenizer_holds_the_engine_open():
    req = _tokens({"min_tokens": 4, "stop_token_ids_hidden": [2], "max_tokens": 10})
    params = tokens_sampling_params(req, prompt_len=3, context_length=64, skip_tokenizer_init=True)
    assert params == {"max_new_tokens": 10, "ignore_eos": True}
    with_tok = tokens_sampling_params(req, prompt_len=3, context_length=64,
                                      skip_tokenizer_init=False)
    assert with_tok["min_new_tokens"] == 4 and with_tok["stop_token_ids"] == [2]


def test_text_mode_mapping():
    req = parse(ChatCompletionRequest, {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
        "max_completion_tokens": 6, "min_tokens": 2, "temperature": 0, "top_p": 1, "top_k": 3,
        "stop": "##", "stop_token_ids": [9, 9, 4], "seed": 3, "ignore_eos": True,
        "skip_special_tokens": False, "frequency_penalty": 0.5, "n": 2,
    })
    params = text_sampling_params(req, prompt_len=10, context_length=100)
    assert params == {
        "max_new_tokens": 6, "min_new_tokens": 2, "temperature": 0, "top_p": 1, "top_k": 3,
        "stop": ["##"], "stop_token_ids": [4, 9], "sampling_seed": 3, "ignore_eos": True,
        "skip_special_tokens": False, "frequency_penalty": 0.5, "n": 2,
    }


def test_text_mode_default_budget():
    req = parse(ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}]})
    assert text_sampling_params(req, prompt_len=10, context_length=100) == {"max_new_tokens": 90}


@pytest.mark.parametrize("requested, expected", [(None, 7), (3, 3), (7, 7)])
def test_completion_budget(requested, expected):
    assert completion_budget(requested, prompt_len=3, context_length=10) == expected
