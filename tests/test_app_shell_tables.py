"""The labs' tables show every header and text cell whole: each column is as wide as its widest text (issue 62)."""

from __future__ import annotations

import pandas as pd

from specviz.app import shell


def test_every_column_gets_room_for_its_whole_header_and_text():
    frame = pd.DataFrame([{"γ": 1, "workload": "Copying from the prompt", "same text as target alone": True}])
    for data in (frame, frame.style.format({"γ": "{:d}"}), frame.to_dict("records")):
        assert shell._columns(data) == {"γ": 1, "workload": len("Copying from the prompt"),
                                        "same text as target alone": len("same text as target alone")}
    widths = {c: w["width"] for c, w in shell.header_widths(shell._columns(frame)).items()}
    assert widths["same text as target alone"] >= len("same text as target alone") * 7
    assert widths["workload"] >= len("Copying from the prompt") * 7 and widths["γ"] < widths["workload"]
    long = pd.DataFrame([{"text": "x" * 500}])
    assert shell._columns(long)["text"] == shell.CELL_CHARS  # never wider than a phone's worth of text
