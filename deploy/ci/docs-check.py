#!/usr/bin/env python3
"""Checks the user documentation: its links and its size.

Run from anywhere: `python3 deploy/ci/docs-check.py`. Python 3 standard library only.

Links: every relative link and image of README.md and docs/**/*.md (inline `[text](target)`,
`<target>`-style inline targets and reference definitions `[name]: target`, outside code) must
name a file or folder that exists in the repository, and every `#anchor` (on its own, or after a
Markdown file) must be a heading of that page, named as GitHub names it: the heading's text
lowercased, every character but letters, digits, spaces, `-` and `_` dropped, spaces made `-`;
the second heading of the same name gets `-1`, the third `-2`. An HTML `id="..."` or
`name="..."` counts as an anchor too. Links with a scheme (https:, mailto:) are not followed.

Limits (words are `len(text.split())`):
  README.md                 at most 800 words
  docs/architecture.md      at most 3 000 words
  docs/operations/*.md      at most 3 000 words each
  docs/performance.md       at most 350 lines
  docs/**/*.md together     at most 30 000 words

It prints the words and lines of every page, then each failure, and exits 1 when there is one.
"""

import pathlib
import re
import sys
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[2]

WORD_LIMITS = {
    "README.md": 800,
    "docs/architecture.md": 3000,
}
OPERATIONS_PAGE_WORDS = 3000
LINE_LIMITS = {"docs/performance.md": 350}
DOCS_TOTAL_WORDS = 30000

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"""\b(?:id|name)=["']([^"']+)["']""")


def pages():
    found = [ROOT / "README.md"]
    found += sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in found if p.is_file()]


def prose_lines(text):
    """The lines outside fenced code blocks, with their numbers."""
    fenced = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fenced is None:
                fenced = match.group(1)
            elif match.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        text = path.read_text(encoding="utf-8")
        seen = {}
        names = set()
        for _, line in prose_lines(text):
            match = HEADING.match(line)
            if match:
                base = slug(match.group(2))
                count = seen.get(base, 0)
                names.add(base if count == 0 else f"{base}-{count}")
                seen[base] = count + 1
            names.update(HTML_ID.findall(line))
        _anchors[path] = names
    return _anchors[path]


def links(text):
    for number, line in prose_lines(text):
        bare = INLINE_CODE.sub("", line)
        for match in INLINE_LINK.finditer(bare):
            yield number, match.group(1)
        match = REFERENCE.match(bare)
        if match:
            yield number, match.group(1)


def check_links(page, text, failures):
    checked = 0
    for number, target in links(text):
        target = target.strip("<>").strip()
        if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # empty, or https:, mailto: and the like
        checked += 1
        where = f"{page.relative_to(ROOT)}:{number}"
        path_part, _, anchor = target.partition("#")
        path_part = urllib.parse.unquote(path_part.split("?")[0])
        if path_part:
            base = ROOT if path_part.startswith("/") else page.parent
            destination = (base / path_part.lstrip("/")).resolve()
            try:
                destination.relative_to(ROOT)
            except ValueError:
                failures.append(f"{where}: link {target!r} leaves the repository")
                continue
            if not destination.exists():
                failures.append(f"{where}: link {target!r}: no such file")
                continue
        else:
            destination = page
        if anchor and destination.is_file() and destination.suffix == ".md":
            if urllib.parse.unquote(anchor) not in anchors(destination):
                failures.append(f"{where}: link {target!r}: no heading "
                                f"#{anchor} in {destination.relative_to(ROOT)}")
    return checked


def main():
    failures = []
    rows = []
    docs_words = 0
    links_checked = 0
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        text = page.read_text(encoding="utf-8")
        words, lines = len(text.split()), len(text.splitlines())
        rows.append((name, words, lines))
        if name.startswith("docs/"):
            docs_words += words
        limit = WORD_LIMITS.get(name)
        if limit is None and re.fullmatch(r"docs/operations/[^/]+\.md", name):
            limit = OPERATIONS_PAGE_WORDS
        if limit is not None and words > limit:
            failures.append(f"{name}: {words} words, more than the {limit} allowed")
        if name in LINE_LIMITS and lines > LINE_LIMITS[name]:
            failures.append(f"{name}: {lines} lines, more than the {LINE_LIMITS[name]} allowed")
        links_checked += check_links(page, text, failures)
    for name in (*WORD_LIMITS, *LINE_LIMITS):
        if not (ROOT / name).is_file():
            failures.append(f"{name}: missing")
    if docs_words > DOCS_TOTAL_WORDS:
        failures.append(f"docs/: {docs_words} words in all, more than the {DOCS_TOTAL_WORDS} allowed")

    width = max(len(name) for name, _, _ in rows)
    print(f"{'page':<{width}}  {'words':>6}  {'lines':>5}")
    for name, words, lines in rows:
        print(f"{name:<{width}}  {words:>6}  {lines:>5}")
    print(f"{'docs/ in all':<{width}}  {docs_words:>6}")
    print(f"{links_checked} relative links checked in {len(rows)} pages")

    if failures:
        for failure in failures:
            print(f"FAIL {failure}", file=sys.stderr)
        print(f"docs check FAILED: {len(failures)} problem(s)", file=sys.stderr)
        sys.exit(1)
    print("docs check OK")


if __name__ == "__main__":
    main()
