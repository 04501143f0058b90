"""A run's trace as CSV (one row per token decision, via pandas) and as JSON (everything recorded)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from specviz.core.trace import Generation, RoundTrace, TreeTrace
from specviz.core.metrics import compare

if TYPE_CHECKING:
    import pandas as pd

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
    import pandas as pd  # here, not at the top: `specviz generate --json` reads this module and needs no pandas

    return pd.DataFrame(trace_rows(gen), columns=list(CSV_COLUMNS))


def trace_csv(gen: Generation) -> str:
    return trace_frame(gen).to_csv(index=False)


def json_float(x: float | None, digits: int | None = None) -> float | None:
    """A float for JSON (rounded when `digits` is given); None for missing or non-finite values."""
    if x is None or not math.isfinite(x):
        return None
    return float(x) if digits is None else round(float(x), digits)


def tree_dict(tree: TreeTrace) -> dict[str, Any]:
    """A drafted token tree as JSON-ready data: the accepted path and every node with its verdict."""
    return {
        "path": list(tree.path),
        "nodes": [{"token": n.token, "text": n.text, "parent": n.parent, "depth": n.depth, "p": json_float(n.p),
                   "q": json_float(n.q), "sampled": n.sampled, "accept_prob": json_float(n.accept_prob),
                   "uniform": json_float(n.uniform), "verdict": n.verdict} for n in tree.nodes],
    }


def round_dict(r: RoundTrace, *, dists: bool = False) -> dict[str, Any]:
    """One round as JSON-ready data: the record of `specviz generate --json` and of the app's trace download.

    dists: also the top-n distributions at the decision position (p_top, q_top, residual_top; the app's trace has
    them, the command line leaves them out).
    """
    out: dict[str, Any] = {
        "index": r.index,
        "position": r.position,
        "draft_tokens": list(r.draft_ids),
        "draft_texts": list(r.draft_texts),
        "accepted": list(r.accepted),
        "n_accepted": r.n_accepted,
        "accept_probs": [json_float(x) for x in r.accept_probs],
        "uniforms": [json_float(x) for x in r.uniforms],
        "p_draft": [json_float(x) for x in r.p_draft],
        "q_draft": [json_float(x) for x in r.q_draft],
        "next_token": r.next_id,
        "next_text": r.next_text,
        "next_origin": r.next_origin,
        "draft_ms": json_float(r.draft_ms, 3),
        "verify_ms": json_float(r.verify_ms, 3),
        "tree": None if r.tree is None else tree_dict(r.tree),
    }
    if dists:
        for name in ("p_top", "q_top", "residual_top"):
            top = getattr(r, name)
            out[name] = None if top is None else asdict(top)
    return out


def generation_dict(gen: Generation) -> dict[str, Any]:
    """Every recorded field of a run as plain JSON-ready data (rounds as round_dict records, with their TopDists)."""
    out = asdict(replace(gen, rounds=()))
    out["rounds"] = [round_dict(r, dists=True) for r in gen.rounds]
    out["target_calls"] = gen.target_calls
    out["ms_per_token"] = gen.ms_per_token
    return out


def trace_json(gen: Generation, baseline: Generation | None = None, meta: dict[str, Any] | None = None) -> str:
    """The run, its summary figures and (when measured) the target-only baseline, as JSON."""
    doc: dict[str, Any] = {"meta": meta or {}, "summary": asdict(compare(gen, baseline)), "speculative": generation_dict(gen)}
    if baseline is not None:
        doc["baseline"] = generation_dict(baseline)
    return json.dumps(doc, ensure_ascii=False, indent=1, default=str)
