"""mkdocs hooks: the site is docs/ plus the repository's own front pages, so nothing is written twice.

README.md becomes the site's home page (index.md), RESULTS.md and BENCHMARKS.md pages of their own. Their links are
written for GitHub (relative to the repository root, docs pages relative to docs/); here each is rewritten to the
page it names on the site, and a link to a source file outside the site (bench/…, ../shared/…) becomes its path in
code, as the site does not hold the sources.
"""

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
FRONT = {"README.md": "index.md", "RESULTS.md": "RESULTS.md", "BENCHMARKS.md": "BENCHMARKS.md"}
# a fenced block or a code span (left as they are), or a link or image
PIECE = re.compile(r"(?P<fence>^```.*?^```)|(?P<code>`[^`\n]+`)"
                   r"|(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)", re.M | re.S)


def on_files(files, config):
    for source, uri in FRONT.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / source)))
    return files


def site_target(target: str, page_dir: Path) -> str | None:
    """The link's target on the site (relative to the page), or None when it names a source file the site does not
    hold. A target that exists nowhere is left as it is, for mkdocs to report (--strict fails on it)."""
    if re.match(r"^[a-z]+:|^#", target):
        return target
    path, _, anchor = target.partition("#")
    resolved = (page_dir / path).resolve()
    try:
        rel = resolved.relative_to(ROOT)
    except ValueError:  # outside the repository (../shared/...): a path, not a page
        return None
    if not resolved.exists():
        return target
    name = str(rel)
    if name in FRONT:
        uri = FRONT[name]
    elif rel.parts[0] == "docs":
        uri = str(Path(*rel.parts[1:]))
    else:
        return None
    return uri + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown, page, config, files):
    source = page.file.src_uri
    page_dir = ROOT if source in FRONT.values() else ROOT / "docs" / Path(source).parent

    def rewrite(match: re.Match) -> str:
        if match["target"] is None:  # code: as it is
            return match[0]
        bang, text, target = match["bang"], match["text"], match["target"]
        found = site_target(target, page_dir)
        if found is None:
            return text if text.startswith("`") else f"`{text}`" if text == target.rstrip("/") else text
        return f"{bang}[{text}]({found})"

    return PIECE.sub(rewrite, markdown)
