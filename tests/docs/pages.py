"""The documentation's pages and their code blocks (README.md and docs/**/*.md), as tests/docs reads them.

A block is *runnable* when its fence says exactly `python` or `bash`; any other tag (`py`, `sh`, `json`, `yaml`,
`text`, ...) is shown and never run. Blocks are found by mktestdocs (`grab_code_blocks`), the Markdown code-block
test library the docs extra installs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNNABLE = ("bash", "python")
"""Fence tags whose blocks tests/docs/test_examples.py runs."""
SHOWN = frozenset({"py", "sh", "json", "yaml", "text", "toml", "console", "dockerfile", "ini", "jsonl"})
"""Fence tags of blocks that are only shown (a typo in a tag must not quietly turn a runnable block off)."""
FENCE = re.compile(r"^\s*```(\S*)")


def pages() -> list[Path]:
    """README.md and every Markdown page of the site (the hooks' folder holds no page)."""
    return [ROOT / "README.md", *sorted(path for path in DOCS.rglob("*.md") if "hooks" not in path.parts)]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fence_tags(text: str) -> list[str]:
    """The tag of every opening fence, in order (closing fences skipped)."""
    tags, inside = [], False
    for line in text.splitlines():
        match = FENCE.match(line)
        if match is None:
            continue
        if not inside:
            tags.append(match.group(1))
        inside = not inside
    return tags
