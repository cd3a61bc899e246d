"""A report document as Markdown (text), its plots linked as SVG files."""

from __future__ import annotations

from collections.abc import Mapping

from eval.report.document import Document, numeric_columns

__all__ = ["render_md"]


def _md_cell(text: str) -> str:
    text = " ".join(text.split())
    for char in ("\\", "|", "<", ">", "*", "_", "`", "["):
        text = text.replace(char, "\\" + char)
    return text or " "


def render_md(doc: Document, plot_links: Mapping[str, str]) -> str:
    out = [f"# {_md_cell(doc.title)}", ""]
    out += [line for note in doc.intro for line in (_md_cell(note), "")]
    for section in doc.sections:
        linked = [plot for plot in section.plots if plot.name in plot_links]
        if not (section.notes or section.tables or linked):
            continue  # a section of plots only, with no plot files to link
        out += [f"## {_md_cell(section.title)}", ""]
        out += [line for note in section.notes for line in (_md_cell(note), "")]
        for table in section.tables:
            if table.caption:
                out += [f"**{_md_cell(table.caption)}**", ""]
            out.append("| " + " | ".join(_md_cell(h) for h in table.headers) + " |")
            out.append("|" + "|".join("--:" if num else "---"
                                      for num in numeric_columns(table)) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
            out.append("")
        for plot in linked:
            out += [f"![{_md_cell(plot.title)}]({plot_links[plot.name]})", ""]
    return "\n".join(out).rstrip("\n") + "\n"
