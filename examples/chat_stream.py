"""Stream one chat completion from the frontend with the `openai` package.

    python examples/chat_stream.py [--base-url http://127.0.0.1:8000/v1] [--prompt "..."]
"""

import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default=None, help="default: the first served model")
    parser.add_argument("--prompt", default="Tell me a short story about a robot.")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="not-needed")
    model = args.model or client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": args.prompt}],
        max_tokens=args.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    print(f"[{model}] ", end="", flush=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n[usage] prompt={chunk.usage.prompt_tokens} "
                  f"completion={chunk.usage.completion_tokens}")


if __name__ == "__main__":
    main()
