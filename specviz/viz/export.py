"""A run's trace as CSV (one row per token decision, via pandas) and as JSON (everything recorded)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pandas as pd

from specviz.core.trace import Generation
from specviz.core.metrics import compare

CSV_COLUMNS = (
    "round", "position", "slot", "kind", "token_id", "token_text", "p_target", "q_draft",
    "accept_prob", "uniform", "verdict", "draft_ms", "verify_ms",
)


def trace_rows(gen: Generation) -> list[dict[str, Any]]:
    """One row per drafted token (with its verdict) and one per token the target added itself."""
    rows: list[dict[str, Any]] = []
    for r in gen.rounds:
        common = {"round": r.index, "position": r.position, "draft_ms": r.draft_ms, "verify_ms": r.verify_ms}
        for i, (tid, text) in enumerate(zip(r.draft_ids, r.draft_texts)):
            verdict = "accepted" if r.accepted[i] else ("rejected" if i == r.n_accepted else "discarded")
            rows.append({**common, "slot": i, "kind": "draft", "token_id": tid, "token_text": text,
                         "p_target": r.p_draft[i], "q_draft": r.q_draft[i], "accept_prob": r.accept_probs[i],
                         "uniform": r.uniforms[i], "verdict": verdict})
        rows.append({**common, "slot": len(r.draft_ids), "kind": r.next_origin, "token_id": r.next_id,
                     "token_text": r.next_text, "p_target": None, "q_draft": None, "accept_prob": None,
                     "uniform": None, "verdict": "added"})
    return rows


def trace_frame(gen: Generation) -> pd.DataFrame:
    """The trace as a table with fixed columns (empty runs give an empty table)."""
    return pd.DataFrame(trace_rows(gen), columns=list(CSV_COLUMNS))


def trace_csv(gen: Generation) -> str:
    return trace_frame(gen).to_csv(index=False)


def generation_dict(gen: Generation) -> dict[str, Any]:
    """Every recorded field of a run as plain JSON-ready data (TopDists become dicts)."""
    out = asdict(gen)
    out["target_calls"] = gen.target_calls
    out["ms_per_token"] = gen.ms_per_token
    return out


def trace_json(gen: Generation, baseline: Generation | None = None, meta: dict[str, Any] | None = None) -> str:
    """The run, its summary figures and (when measured) the target-only baseline, as JSON."""
    doc: dict[str, Any] = {"meta": meta or {}, "summary": asdict(compare(gen, baseline)), "speculative": generation_dict(gen)}
    if baseline is not None:
        doc["baseline"] = generation_dict(baseline)
    return json.dumps(doc, ensure_ascii=False, indent=1, default=str)
