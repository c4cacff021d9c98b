"""Every relative link of the README and docs/ (results folders included) points at a file that
exists and, for a markdown page, at a heading that exists (GitHub's anchor rules)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set:
    out, seen = set(), {}
    for line in re.sub(r"```.*?```", "", page.read_text(), flags=re.S).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen[s] = seen.get(s, -1) + 1
            out.add(s if n == 0 else f"{s}-{n}")  # a repeated heading gets -1, -2, ...
    return out


def links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", m.group(1)):  # not http:, https:, mailto:
            yield m.group(1)


def test_slug_follows_github():
    assert slug("Issue #18: the GEMV tuned in the engine (2026-12-02, second session)") == \
        "issue-18-the-gemv-tuned-in-the-engine-2026-12-02-second-session"
    assert slug("W_O's band, 1.2x") == "w_os-band-12x"


def test_every_relative_link_resolves():
    broken, cache = [], {}
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                if anchor not in cache.setdefault(dest, anchors(dest)):
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    assert sum(1 for p in PAGES for _ in links(p)) > 50  # the pages do link
