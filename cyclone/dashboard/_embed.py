"""The dashboard's stylesheet for its HTML shown inside another application's page.

:meth:`Dashboard.render_run_sections` gives the run page's sections for, say, the Django
admin; :func:`scoped_stylesheet` gives the rules they need, every one limited to an element
of the given class, so the page around keeps its own look.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

SCOPE = "cyclone-embed"
"""The class of the element that holds the dashboard's HTML in another page."""

_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_PAGE_ONLY = re.compile(r"^(header\b|main\b|html\b)")
"""Selectors of the dashboard's own page layout, left out of the scoped sheet."""


@functools.cache
def scoped_stylesheet(scope: str = SCOPE) -> str:
    """The dashboard's ``style.css`` with each selector under ``.{scope}``: ``:root`` and
    ``body`` become the scope element itself, the page's header and main are left out."""
    css = (resources.files("cyclone.dashboard") / "static" / "style.css").read_text()
    return _scoped(_COMMENT.sub("", css), f".{scope}")


def _scoped(css: str, scope: str) -> str:
    out: list[str] = []
    position = 0
    while (opening := css.find("{", position)) != -1:
        prelude = css[position:opening].strip()
        depth, end = 1, opening + 1
        while depth and end < len(css):
            depth += {"{": 1, "}": -1}.get(css[end], 0)
            end += 1
        body = css[opening + 1 : end - 1]
        position = end
        if prelude.startswith(("@media", "@supports")):
            out.append(f"{prelude} {{\n{_scoped(body, scope)}}}")
        elif prelude.startswith("@"):
            out.append(f"{prelude} {{{body}}}")
        else:
            selectors = [_under(s.strip(), scope) for s in prelude.split(",")]
            kept = [s for s in selectors if s]
            if kept:
                out.append(f"{', '.join(kept)} {{{body}}}")
    return "\n".join(out) + "\n"


def _under(selector: str, scope: str) -> str:
    if selector in (":root", "body"):
        return scope
    if selector == "*":
        return f"{scope}, {scope} *"
    if _PAGE_ONLY.match(selector):
        return ""
    return f"{scope} {selector}"
