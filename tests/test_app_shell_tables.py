"""The labs' tables show every header whole: each column is given at least its header's width (issue 62)."""

from __future__ import annotations

import pandas as pd

from specviz.app import shell


def test_every_column_gets_room_for_its_whole_header():
    frame = pd.DataFrame([{"γ": 1, "same text as target alone": True}])
    for data in (frame, frame.style.format({"γ": "{:d}"}), frame.to_dict("records")):
        assert shell._columns(data) == ["γ", "same text as target alone"]
    widths = shell.header_widths(["γ", "same text as target alone"])
    narrow, wide = (widths[c]["width"] for c in ("γ", "same text as target alone"))
    assert wide >= len("same text as target alone") * 7 and narrow < wide
