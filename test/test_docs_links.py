"""Every relative Markdown link of the repository's .md files resolves: the file exists and its
#anchor is a heading there (GitHub's anchor rules). The README's reference moved into docs/; this
keeps a link that still points at an old place, or a heading renamed under a link, from rotting."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files():
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        for name in files:
            if name.endswith(".md"):
                yield os.path.relpath(os.path.join(directory, name), ROOT)


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks, inline code blanked out."""
    fence = None
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.lstrip()
            marker = re.match(r"(`{3,}|~{3,})", stripped)
            if marker:
                if fence is None:
                    fence = marker.group(1)[0]
                elif marker.group(1)[0] == fence:
                    fence = None
                continue
            if fence is None:
                yield number, re.sub(r"`[^`]*`", lambda m: "`" + "x" * (len(m.group(0)) - 2) + "`", line)


def github_slug(heading):
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, _cache={}):
    if path not in _cache:
        found, seen, fence = set(), {}, None
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for line in f:
                marker = re.match(r"\s*(`{3,}|~{3,})", line)
                if marker:
                    fence = marker.group(1)[0] if fence is None else (None if marker.group(1)[0] == fence else fence)
                    continue
                heading = HEADING.match(line) if fence is None else None
                if heading:
                    slug = github_slug(heading.group(2))
                    n = seen.get(slug, 0)
                    seen[slug] = n + 1
                    found.add(slug if n == 0 else f"{slug}-{n}")
        _cache[path] = found
    return _cache[path]


def broken_links(path):
    broken = []
    source_lines = dict(prose_lines(path))
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        raw = f.read().split("\n")
    for number, line in source_lines.items():
        # Inline code is blanked in `line`; read the targets from the raw line at the same spots.
        for match in LINK.finditer(line):
            target = raw[number - 1][match.start(1):match.end(1)]
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(os.path.join(ROOT, resolved)):
                broken.append(f"{path}:{number}: {target}: no file {resolved}")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                broken.append(f"{path}:{number}: {target}: no heading #{anchor} in {resolved}")
    return broken


def test_the_checker_sees_a_broken_file_and_a_broken_anchor(tmp_path, monkeypatch):
    # The check itself can fail: a missing file and a missing anchor are both reported.
    (tmp_path / "a.md").write_text("# Title\n\n[ok](#title) [gone](b.md) [nowhere](#no-such)\n"
                                   "`[code](not-a-link.md)`\n```\n[fenced](not-a-link.md)\n```\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    assert broken_links("a.md") == ["a.md:3: b.md: no file b.md", "a.md:3: #no-such: no heading #no-such in a.md"]


def test_github_anchor_rules():
    assert github_slug("Security: TLS, SASL and where the secrets live") == \
        "security-tls-sasl-and-where-the-secrets-live"
    assert github_slug("`outbox.retry(event_id uuid) RETURNS bigint`") == "outboxretryevent_id-uuid-returns-bigint"


@pytest.mark.parametrize("path", sorted(markdown_files()))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []
