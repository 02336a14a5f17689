"""/v1/completions against a Tokens-mode deployment (workers started with
--skip-tokenizer-init): a text prompt, then the same call with a prompt of token ids.

    python examples/completions.py [--base-url http://127.0.0.1:8000/v1]
"""

import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default=None, help="default: the first served model")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="not-needed")
    model = args.model or client.models.list().data[0].id
    for prompt in ("The capital of France is", [1, 2, 3, 4, 5]):
        result = client.completions.create(
            model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0.0)
        choice = result.choices[0]
        print(f"prompt={prompt!r}\n  -> {choice.text!r} (finish={choice.finish_reason}, "
              f"usage={result.usage.prompt_tokens}+{result.usage.completion_tokens})")


if __name__ == "__main__":
    main()
