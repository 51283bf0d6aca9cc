"""The --help formatter of the commands whose epilogs hold examples."""

from __future__ import annotations

import argparse


class ExamplesFormatter(argparse.HelpFormatter):
    """Fills paragraphs as argparse does, but keeps indented lines (the
    examples) as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            if "\n " in para or para.startswith(" "):
                out.append("\n".join(indent + line for line in para.splitlines()))
            else:
                out.append(super()._fill_text(para, width, indent))
        return "\n\n".join(out)
