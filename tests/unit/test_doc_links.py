"""Every relative link in the project's Markdown (README.md, docs/, launch/, deploy/) names a
file that exists and, with `#anchor`, a heading of that file, by GitHub's anchor rules:
lowercase, punctuation dropped, spaces to '-', a repeated heading suffixed -1, -2, ..."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted({ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("launch/**/*.md"),
                *ROOT.glob("deploy/**/*.md")})

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) or [text](target "title"); images too. The text may hold `code` and brackets.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)", re.M)


def _prose(text: str) -> str:
    """The page without fenced code blocks (links there are not links)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def _targets(text: str) -> list[str]:
    # A link inside a code span is text; a code span inside a link's text stays a link.
    prose = INLINE_CODE.sub("`code`", _prose(text))
    return LINK.findall(prose) + REFERENCE_DEF.findall(prose)


def _slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text)  # GitHub keeps letters, digits, '_', '-' and spaces
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for line in _prose(page.read_text()).splitlines():
        m = re.match(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    # explicit HTML anchors
    anchors.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", page.read_text()))
    return anchors


def _broken(page: Path) -> list[str]:
    broken = []
    for target in _targets(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        rel = page.relative_to(ROOT).as_posix()
        if not dest.exists():
            broken.append(f"{rel}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and unquote(anchor).lower() not in _anchors(dest):
            broken.append(f"{rel}: {target} (no such heading)")
    return broken


def test_the_pages_are_found():
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "architecture.md" in PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    assert _broken(page) == []


def test_slugs_follow_github():
    assert _slug("Tokenizer worker processes (`--tokenizer-worker-num N`)") == \
        "tokenizer-worker-processes---tokenizer-worker-num-n"
    assert _slug("KV events and load for Dynamo's KV router") == \
        "kv-events-and-load-for-dynamos-kv-router"
    assert _slug("Launch line: `python -m dynamo.sglang` -> `python -m components`") == \
        "launch-line-python--m-dynamosglang---python--m-components"
