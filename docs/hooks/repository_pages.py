"""MkDocs hook: the repository's READMEs as pages of the site, and links that leave ``docs/``.

The guides in ``docs/`` link to each other relatively, which GitHub and MkDocs both resolve.
The READMEs live outside ``docs/``: the top-level README is the site's home page and
``experiments/README.md`` the page of the experiment package. This hook adds them as pages and
rewrites, on every page, the relative links that GitHub resolves against the repository:

* a link to a file under ``docs/`` or to one of those READMEs points at its page;
* a link to any other file of the repository (a config, a script) becomes the path as code,
  since the site does not contain it.

A link to a path that does not exist is left alone, for ``mkdocs build --strict`` to report.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

#: Site page -> the repository file it shows.
PAGES = {"index.md": "README.md", "experiments.md": "experiments/README.md"}

_FENCE = re.compile(r"^[ \t]*(```+|~~~+).*?^[ \t]*\1[ \t]*$", re.M | re.S)
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
_EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|#|/)", re.I)


def on_files(files: Files, config: Any) -> Files:
    """Add the READMEs of :data:`PAGES` to the site.

    Args:
        files: The files MkDocs found in ``docs/``.
        config: The MkDocs configuration.

    Returns:
        ``files`` with one generated page per README.
    """
    for page, source in PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(ROOT / source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Rewrite the page's relative links that GitHub resolves against the repository.

    Args:
        markdown: The page's Markdown source.
        page: The page.
        config: The MkDocs configuration.
        files: The site's files.

    Returns:
        The Markdown with those links rewritten (fenced code blocks untouched).
    """
    uri = page.file.src_uri
    source = PAGES.get(uri, f"docs/{uri}")
    out, start = [], 0
    for block in _FENCE.finditer(markdown):
        out.append(_rewrite(markdown[start : block.start()], source, uri))
        out.append(block.group(0))
        start = block.end()
    out.append(_rewrite(markdown[start:], source, uri))
    return "".join(out)


def _rewrite(text: str, source: str, uri: str) -> str:
    """Rewrite the links of ``text``, a part of the page ``uri`` shown from ``source``."""

    def link(match: re.Match[str]) -> str:
        bang, label, target = match.groups()
        if _EXTERNAL.match(target):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        in_repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if in_repo.startswith("docs/"):
            site = in_repo[len("docs/") :]
        elif in_repo in PAGES.values():
            site = next(page for page, readme in PAGES.items() if readme == in_repo)
        elif not bang and (ROOT / in_repo).exists() and not in_repo.startswith("../"):
            return f"{label} (`{in_repo}`)" if label.strip("`") != in_repo else f"`{in_repo}`"
        else:
            return match.group(0)
        relative = posixpath.relpath(site, posixpath.dirname(uri) or ".")
        return f"{bang}[{label}]({relative}{hash_}{anchor})"

    return _LINK.sub(link, text)
