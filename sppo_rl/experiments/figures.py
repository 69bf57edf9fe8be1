"""Helpers shared by the figures of ``sppo-rl report`` and the tail-effect diagnostic."""

from __future__ import annotations


def fit_title(fig, text: str, fontsize: float = 9) -> None:
    """``fig.suptitle(text)`` with each line wrapped at the words to fit the figure's width (at most
    ``width * 72 / (0.6 * fontsize)`` characters a line: a character of DejaVu Sans is about 0.55 em)."""
    import textwrap

    width = max(20, int(fig.get_figwidth() * 72 * 0.95 / (0.6 * fontsize)))
    lines = [textwrap.fill(line, width) for line in text.split("\n")]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


PRINT_WIDTH = 6.5
"""Width of every report figure in inches: a page's text width, so a figure prints at its own size."""
DPI = 200
"""Resolution of the saved PNGs: print quality at :data:`PRINT_WIDTH` (1300 pixels wide)."""


def save_figure(fig, path, title: str) -> None:
    """Give ``fig`` its short ``title`` (what it shows, a few words; the method goes in the caption beside
    it) and write it to ``path`` at :data:`DPI`."""
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=DPI)
