"""A run as data: the trace as CSV (one row per token decision, via pandas) and JSON, and the CLI's run document."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from specviz.core.trace import Generation, RoundTrace, TreeTrace
from specviz.core.metrics import Comparison, compare

if TYPE_CHECKING:
    import pandas as pd

    from specviz.core.divergence import Divergence

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
        "helper": r.helper or None,
        "memory_source": r.memory_source or None,
        "match_length": r.match_length if r.memory_source else None,
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


def record_json(record: Any) -> str:
    """A lab's whole measurement record (a dataclass) as JSON: the page offers it for download, and every figure the
    page states is in it."""
    return json.dumps(asdict(record), ensure_ascii=False, indent=1, default=str)


def trace_json(gen: Generation, baseline: Generation | None = None, meta: dict[str, Any] | None = None) -> str:
    """The run, its summary figures and (when measured) the target-only baseline, as JSON."""
    doc: dict[str, Any] = {"meta": meta or {}, "summary": asdict(compare(gen, baseline)), "speculative": generation_dict(gen)}
    if baseline is not None:
        doc["baseline"] = generation_dict(baseline)
    return json.dumps(doc, ensure_ascii=False, indent=1, default=str)


# ---------------------------------------------------------------------------------------------
# The CLI's document of a run (`specviz generate --json`): flat keys, its rounds as round_dict records


def run_document(asked: Mapping[str, Any], spec: Generation, summary: Comparison) -> dict[str, Any]:
    """What the run was asked, its text and tokens, its rounds and its totals: every key `generate --json` prints."""
    return {
        **asked,
        "text": spec.text,
        "tokens": list(spec.tokens),
        "stop_reason": spec.stop_reason,
        "rounds": [round_dict(r) for r in spec.rounds],
        "target_calls": spec.target_calls,
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "acceptance_rate": json_float(summary.acceptance_drafted, 6),  # accepted ÷ drafted (the key predates the record)
        "alpha_checked": json_float(summary.alpha_checked, 6),  # Leviathan's α: accepted ÷ checked
        # vLLM's per-position counters: share of drafting rounds that accepted their k-th token, k = 1…
        "acceptance_by_position": [json_float(x, 6) for x in summary.acceptance_by_position],
        "tokens_per_target_call": json_float(summary.tokens_per_target_call, 6),
        "ms_per_token": json_float(summary.ms_per_token, 3),
        "prefill_ms": json_float(spec.prefill_ms, 3),
        "decode_ms": json_float(spec.decode_ms, 3),
    }


def baseline_document(base: Generation, summary: Comparison, divergence: Divergence | None,
                      decode: Callable[[int], str]) -> dict[str, Any]:
    """The keys a baseline adds: the target alone, the speed-up, and whether (and where) the two runs part."""
    return {
        "baseline": {
            "tokens": list(base.tokens),
            "text": base.text,
            "ms_per_token": json_float(base.ms_per_token, 3),
            "prefill_ms": json_float(base.prefill_ms, 3),
            "decode_ms": json_float(base.decode_ms, 3),
        },
        "speedup": json_float(summary.speedup, 4),
        "measured_c": json_float(summary.c, 4),
        "expected_speedup": json_float(summary.expected_speedup, 4),
        "verify_steps": json_float(summary.verify_steps, 4),
        "expected_speedup_measured_verify": json_float(summary.expected_speedup_measured_verify, 4),
        # greedy speculative decoding must reproduce the target's own tokens exactly; sampled runs
        # follow the same distribution but not the same draws, so there is nothing to compare (None)
        "identical_to_baseline": summary.identical,
        "first_divergence": asdict(summary.divergence) if summary.divergence else None,
        # where a not-bit-exact target left its own text: the target's top-2 gap there (why it could)
        "divergence": None if divergence is None else divergence_dict(divergence, decode),
    }


def divergence_dict(d: Divergence, decode: Callable[[int], str]) -> dict[str, Any]:
    """The first position where a greedy speculative run left the target's own text, with the target's top-2 gap."""

    def token(i: int | None) -> dict[str, Any]:
        return {"id": i, "text": "(ended)" if i is None else decode(i)}

    return {  # the gaps are None where one run had ended there (no pair of tokens to weigh)
        "position": d.position,
        "speculative": token(d.speculative_id),
        "baseline": token(d.baseline_id),
        "top_ids": None if d.top_ids is None else list(d.top_ids),
        "top2_gap": json_float(d.top2_gap, 6),
        "pair_gap": json_float(d.pair_gap, 6),
    }
