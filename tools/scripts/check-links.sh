#!/usr/bin/env bash
# Checks that the repository's documentation links resolve:
#
# * every relative link in the Markdown files (tracked, and new ones git
#   does not ignore) names a file or directory that exists: inline links
#   and images, [text](target), and reference definitions, [id]: target.
#   Targets are relative to the linking file (a leading / means the
#   repository root); a #fragment into a Markdown file must name one of its
#   headings (GitHub's anchors). URLs with a scheme (https:, mailto:) and
#   links inside code are not checked.
# * every docs page a source comment names (a docs/NAME.md path in a
#   .h, .cc, .proto, .cmake, .in, .sh or .py file, or a CMakeLists.txt)
#   exists.
#
#   tools/scripts/check-links.sh    exit 0 when all resolve; otherwise print
#                                   FILE:LINE: TARGET (why) for each and exit 1
#
# tools/scripts/test.sh runs it in its format stage. Runs with Debian's
# /usr/bin/python3 and the standard library only.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

python=/usr/bin/python3
if [[ ! -x $python ]]; then
  echo "check-links.sh: $python not found (Debian's python3)" >&2
  exit 2
fi

exec "$python" - "$@" <<'PYTHON'
import os
import re
import subprocess
import sys
import unicodedata
from urllib.parse import unquote


def git_files(*pathspecs):
    """Tracked files, and new ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", *pathspecs],
                         check=True, capture_output=True).stdout
    return sorted(set(p for p in out.decode().split("\0") if p))


FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def strip_code_spans(line):
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def markdown_lines(text):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            yield number, line
        elif m and m.group(1).startswith(fence):
            fence = None


def slug(heading):
    """GitHub's anchor for a heading: lowercase, markup and punctuation
    dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


anchor_cache = {}


def anchors(path):
    if path not in anchor_cache:
        found = set()
        counts = {}
        with open(path, encoding="utf-8") as f:
            for _, line in markdown_lines(f.read()):
                m = HEADING.match(line)
                if not m:
                    continue
                base = slug(m.group(2))
                n = counts.get(base, 0)
                counts[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        anchor_cache[path] = found
    return anchor_cache[path]


problems = []


def check_target(md, number, target):
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target or SCHEME.match(target) or target.startswith("//"):
        return
    path_part, _, fragment = target.partition("#")
    path_part = unquote(path_part.split("?", 1)[0])
    if path_part == "":
        resolved = md
    elif path_part.startswith("/"):
        resolved = os.path.normpath(path_part.lstrip("/"))
    else:
        resolved = os.path.normpath(os.path.join(os.path.dirname(md), path_part))
    if resolved.startswith(".."):
        problems.append(f"{md}:{number}: {target} (points outside the repository)")
        return
    if not os.path.exists(resolved):
        problems.append(f"{md}:{number}: {target} (no such file: {resolved})")
        return
    if fragment and resolved.endswith(".md") and os.path.isfile(resolved):
        if unquote(fragment).lower() not in anchors(resolved):
            problems.append(f"{md}:{number}: {target} (no heading #{fragment} in {resolved})")


markdown = git_files("*.md")
for md in markdown:
    if not os.path.isfile(md):
        continue  # deleted in the work tree
    with open(md, encoding="utf-8") as f:
        text = f.read()
    for number, line in markdown_lines(text):
        m = REF_DEF.match(line)
        if m:
            check_target(md, number, m.group(1))
            continue
        for link in INLINE_LINK.finditer(strip_code_spans(line)):
            check_target(md, number, link.group(1))

# Source comments that name a docs page: docs/NAME.md from the repository root.
DOC_PATH = re.compile(r"docs/[a-z0-9_-]*\.md")
sources = git_files("*.h", "*.cc", "*.proto", "*.cmake", "*.in", "*.sh", "*.py",
                    "CMakeLists.txt", "*/CMakeLists.txt")
for source in sources:
    if not os.path.isfile(source):
        continue
    with open(source, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            for m in DOC_PATH.finditer(line):
                start = m.start()
                # A longer path that ends in docs/... (bench/docs/x.md) is not ours.
                if start > 0 and (line[start - 1].isalnum() or line[start - 1] in "_-./"):
                    continue
                if not os.path.isfile(m.group(0)):
                    problems.append(f"{source}:{number}: {m.group(0)} (no such file)")

if problems:
    for p in problems:
        print(p, file=sys.stderr)
    print(f"check-links.sh: {len(problems)} broken link(s) in {len(markdown)} Markdown files "
          f"and {len(sources)} source files", file=sys.stderr)
    sys.exit(1)
print(f"check-links.sh: links resolve in {len(markdown)} Markdown files and "
      f"{len(sources)} source files")
PYTHON
