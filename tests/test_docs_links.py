"""Every relative link in the documentation leads somewhere: the README, CHANGELOG.md and
docs/*.md link to files that exist and to `#anchors` that match a heading of the target, as
GitHub makes heading anchors. No network: links with a scheme are not followed."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) and ![alt](target); the target ends at whitespace (an optional "title" follows)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers, inline code taken out."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line)))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower case, every character
    but letters, digits, spaces, hyphens and underscores dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "")
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = "".join(
        ch
        for ch in text
        if ch in " -_"
        or unicodedata.category(ch)[0] in ("L", "N")
        or unicodedata.category(ch) == "Mn"
    )
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines_with_code(path.read_text()):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    found |= set(re.findall(r'<a\s+(?:name|id)="([^"]+)"', path.read_text()))
    return found


def prose_lines_with_code(text: str) -> list[tuple[int, str]]:
    """Headings keep their inline code (GitHub keeps its text in the anchor)."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def links(path: Path) -> list[tuple[int, str]]:
    return [
        (number, match.group(1))
        for number, line in prose_lines(path.read_text())
        for match in LINK.finditer(line)
    ]


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if not target or SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: no heading makes the anchor #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path):
    assert broken_links(page) == []


def test_the_pages_are_found_and_the_readme_links_every_page_of_docs():
    # guards the test itself: with no pages, or no links found, it would pass vacuously
    assert ROOT / "README.md" in PAGES and len(PAGES) > 5
    readme_targets = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    missing = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")} - readme_targets
    assert missing == set(), "pages of docs/ the README's index does not link"


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Running with docker compose", "running-with-docker-compose"),
        (
            "An API enforcing 40 % of what it advertises (make bench-adaptive)",
            "an-api-enforcing-40--of-what-it-advertises-make-bench-adaptive",
        ),
        ("`make test` and `.ci/run`", "make-test-and-cirun"),
        ("Pace (P)", "pace-p"),
        ("Limiter batches: acquire_many", "limiter-batches-acquire_many"),
    ],
)
def test_slugs_are_made_as_github_makes_them(heading: str, slug: str):
    assert github_slug(heading) == slug
