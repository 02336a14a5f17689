"""`python -m components.model_builder --size tiny --out DIR [--seed N] [--if-missing]
[--chat-template chatml|qwen3]`."""

import argparse
import logging
from pathlib import Path

from components.model_builder.build import SIZES, build_model_dir
from components.model_builder.templates import TEMPLATES


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the project's small HF model directory.")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--out", required=True, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-template", choices=sorted(TEMPLATES), default="chatml",
                        help="qwen3: Qwen3's format (tools, <tool_call>, <think>)")
    parser.add_argument(
        "--if-missing", action="store_true", help="do nothing if DIR already holds a built model"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.if_missing and (Path(args.out) / "build_info.json").exists():
        return
    build_model_dir(args.out, args.size, args.seed, args.chat_template)


if __name__ == "__main__":
    main()
