"""The frame around every page: app.py's shell, the stylesheet, how charts and lesson texts are shown."""

from __future__ import annotations

import runpy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import streamlit as st

from specviz.settings import Settings
from specviz.lessons import has_lesson, lesson

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
APP_SCRIPT = ROOT / "app.py"

_shell = threading.local()  # each session's script run has its own thread


@contextmanager
def shell() -> Iterator[None]:
    """Marks app.py's run of the chosen page (pages check it with run_page)."""
    _shell.active = True
    try:
        yield
    finally:
        _shell.active = False


def run_page(main: Callable[[], None]) -> None:
    """Run a page's main() inside the app's shell.

    Until st.navigation has run once, a fresh server treats pages/ as an old-style page folder and
    answers a deep link such as /why_cheap by running that file alone: no sidebar, no menu. Then
    the page runs app.py instead, which draws the shell and routes back to this page.
    """
    if getattr(_shell, "active", False):
        main()
    else:
        runpy.run_path(str(APP_SCRIPT), run_name="__main__")


@st.cache_data(show_spinner=False, max_entries=4)
def _css(presenter: bool) -> str:
    css = (ASSETS / "style.css").read_text(encoding="utf-8")
    if presenter:
        css += "\nhtml { font-size: 21px !important; } .sv-lane, .sv-text { font-size: 1.25rem; }\n"
    return f"<style>{css}</style>"


def inject_css(presenter: bool) -> None:
    """The app's stylesheet (and large type in presenter mode)."""
    st.html(_css(presenter))


def font_size(s: Settings) -> int:
    """Chart font size: bigger for a projector."""
    return 19 if s.presenter else 13


def chart(fig: Any, key: str) -> None:
    """A plotly figure the way every page shows one (no toolbar: pupils click bars, not zoom tools)."""
    st.plotly_chart(fig, key=key, config={"displayModeBar": False})


def lesson_md(level: str, key: str) -> bool:
    """Show a lesson text if the level has it; returns whether something was shown."""
    if not has_lesson(level, key):
        return False
    st.markdown(lesson(level, key))
    return True


CELL_CHARS = 40  # a longer cell may still be cut: the table would otherwise be wider than any phone


def _columns(data: Any) -> dict[str, int]:
    """Each column's name and its widest text in characters (its header or a cell, at most CELL_CHARS), for a
    DataFrame, a pandas Styler or a list of row dicts."""
    frame = getattr(data, "data", data)  # a Styler holds its frame in .data
    if hasattr(frame, "columns"):
        rows = frame.to_dict("records")
        names = [str(c) for c in frame.columns]
    elif isinstance(data, list) and data and isinstance(data[0], dict):
        rows, names = data, [str(c) for c in data[0]]
    else:
        return {}
    widest = {c: len(c) for c in names}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, str) and str(key) in widest:  # text cells: numbers are formatted short
                widest[str(key)] = max(widest[str(key)], min(len(value), CELL_CHARS))
    return widest


def header_widths(columns: dict[str, int], px_per_char: float = 7.5, padding: int = 40) -> dict[str, Any]:
    """A column_config giving each column room for its whole header and text cells: Streamlit sizes a column by its
    cells and cut headers such as "same text as target alone" to "same text as t…" at 1280 px, and a narrow column
    cut "Copying from the prompt"; a wider table scrolls instead."""
    return {c: st.column_config.Column(width=int(n * px_per_char) + padding) for c, n in columns.items()}


def table(data: Any, **kwargs: Any) -> None:
    """A lab's table: no index, every header and text cell whole (the table scrolls sideways when the page is
    narrower)."""
    st.dataframe(data, hide_index=True, column_config=header_widths(_columns(data)), **kwargs)
