"""A report document as one self-contained HTML file: inline CSS and inline SVG plots, no
script and no URL. The page is the template ``templates/report.html``, rendered with the
web UI's settings (``worldctl.ui.templating``): autoescape on, an undefined name an error."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2
import markupsafe

from eval import plots
from eval.report.document import Document, numeric_columns

__all__ = ["render_html"]

TEMPLATES = Path(__file__).parent / "templates"


def _inline_svg(svg: str) -> markupsafe.Markup:
    # The one string that reaches the page as markup: a chart of eval.plots, which
    # XML-escapes every text it draws.
    return markupsafe.Markup(plots.for_html(svg))


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["inline_svg"] = _inline_svg
    env.globals["numeric_columns"] = numeric_columns
    return env


def render_html(doc: Document) -> str:
    # Jinja drops the template's final newline; a text file ends with one.
    return _environment().get_template("report.html").render(doc=doc) + "\n"
