"""Figures and tables of the "Same answer" lab: greedy token table and the sampled-continuation histogram."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from specviz.labs.row_bits import ROW_COUNTS, BatchCase, RowBits
from specviz.labs.same_answer import GreedyComparison, HistogramRow, SampleCounts
from specviz.viz.style import ACC_COLOUR, P_COLOUR, PLAIN_COLOUR, chart_label, layout, wrap_tick
from specviz.viz.strip import VISIBLE, esc, md_escape

Names = Mapping[str, str]  # "exact", "target", "spec", "other", "x", "y": the level's words
DEFAULT_NAMES: dict[str, str] = {
    "exact": "target's exact probability", "target": "target alone (sampled)", "spec": "speculative (sampled)",
    "other": "everything else", "x": "continuation (tokens separated by ·, ␣ = space)",
    "y": "share of samples (probability)",
    "greedy_target": "target alone (greedy)", "greedy_spec": "speculative (greedy)",
}


def printable(text: str) -> str:
    """Newlines and tabs as arrows, other control characters as \\xNN (byte-level models emit them)."""
    return "".join(VISIBLE.get(ch, ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}") for ch in text)


def visible(text: str) -> str:
    """A token for a table cell: whitespace made visible (st.dataframe escapes the rest)."""
    return printable(text).replace(" ", "␣") or "∅"


def greedy_table(cmp: GreedyComparison, names: Names) -> pd.DataFrame:
    """One row per position: the target-only token, the speculative token, and whether they match."""
    n = cmp.n_compared
    cell = lambda texts, i: visible(texts[i]) if i < len(texts) else "—"  # noqa: E731 - (missing: one run stopped)
    same = [i < len(cmp.spec_tokens) and i < len(cmp.plain_tokens) and cmp.spec_tokens[i] == cmp.plain_tokens[i]
            for i in range(n)]
    return pd.DataFrame({
        "#": list(range(1, n + 1)),
        names.get("greedy_target", DEFAULT_NAMES["greedy_target"]): [cell(cmp.plain_texts, i) for i in range(n)],
        names.get("greedy_spec", DEFAULT_NAMES["greedy_spec"]): [cell(cmp.spec_texts, i) for i in range(n)],
        names.get("same", "same?"): ["✓" if ok else "✗ differs" for ok in same],
    })


def row_label(row: HistogramRow, names: Names) -> str:
    """A continuation as a chart tick (escaped: plotly reads a few HTML tags)."""
    if row.other:
        return chart_label(names.get("other", "everything else"))
    return "·".join(chart_label(printable(t)) for t in row.tokens)


def _unique(labels: Sequence[str]) -> list[str]:
    """Two token sequences can read the same (e.g. undecodable bytes): number the repeats."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def histogram_figure(rows: Sequence[HistogramRow], names: Names, font_size: int = 13,
                     title: str = "") -> go.Figure:
    """Grouped bars per continuation: the target's exact probability, then both sampled shares."""
    xs = list(range(len(rows)))
    fig = go.Figure()
    series = (
        (names.get("exact", DEFAULT_NAMES["exact"]), [r.exact for r in rows], P_COLOUR, ""),
        (names.get("target", DEFAULT_NAMES["target"]), [r.target_share for r in rows], PLAIN_COLOUR, "/"),
        (names.get("spec", DEFAULT_NAMES["spec"]), [r.spec_share for r in rows], ACC_COLOUR, "."),
    )
    for name, ys, colour, pattern in series:
        fig.add_bar(x=xs, y=ys, name=esc(name), marker_color=colour,
                    marker_pattern_shape=pattern, hovertemplate="%{y:.3f}<extra></extra>")
    ticks = [wrap_tick(t, 10) for t in _unique([row_label(r, names) for r in rows])]  # lines, not a cut slant
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks, title=names.get("x", DEFAULT_NAMES["x"]),
                     tickangle=0)
    fig.update_yaxes(title=names.get("y", DEFAULT_NAMES["y"]), rangemode="tozero", tickformat=".0%")
    kw = dict(title=dict(text=title, x=0, font=dict(size=font_size + 1))) if title else {}
    fig = layout(fig, 420, font_size, barmode="group", **kw)
    return fig.update_layout(margin=dict(t=70 if title else 40, b=10))


def greedy_plan(level: str, pair: str, drafter: str, gamma: int, adaptive: bool, new_tokens: int) -> str:
    """The greedy part's plan line; at D1 in the story's words (no γ, no 'greedy')."""
    if level == "d1":
        return (f"The big model alone and the big model with its helper each write {new_tokens} words, always taking "
                f"their favourite next word; the helper guesses {'up to ' if adaptive else ''}{gamma} words at a time.")
    return (f"{pair} · drafter: {drafter} · γ = {gamma}{' (adaptive)' if adaptive else ''} · {new_tokens} new tokens · "
            "greedy (the sidebar's pair, drafter, γ and max new tokens)")


def sampling_plan(level: str, greedy_sidebar: bool, temperature: float, top_p: float, seed: int, pair: str,
                  drafter: str, gamma: int, n_tokens: int, rule: str) -> str:
    """The sampling part's plan line; at D1 in the story's words (no temperature, top-p or seed)."""
    if level == "d1":
        return ("Both roll the same loaded dice many times: the big model alone, and the big model with its helper "
                f"guessing up to {max(1, min(gamma, n_tokens - 1))} words at a time. Then we count what came up.")
    where = ("The sidebar is on greedy, so this part uses the sidebar's sampling settings anyway: "
             if greedy_sidebar else "Sampling settings from the sidebar: ")
    return (f"{where}temperature {temperature:g}, top-p {top_p:g}, seed {seed} · {pair} · drafter: {drafter} · "
            f"γ = {gamma} (fixed here; a sample drafts at most {max(1, n_tokens - 1)} of them) · rule: {rule}")


def sampling_times(target: SampleCounts, spec: SampleCounts, level: str, machine: str) -> str:
    """How long each method's samples took here, in the level's words (D1: the story's)."""
    if level == "d1":
        kept = f"; the big model kept {spec.accepted} of the helper's {spec.drafted} guesses" if spec.drafted else ""
        return (f"Timed on this computer: the big model alone took {target.seconds:.1f} s, with the helper "
                f"{spec.seconds:.1f} s, for {spec.n} tries each{kept}.")
    accepted = f"{spec.accepted} of {spec.drafted} guesses accepted" if spec.drafted else "nothing was drafted"
    return (f"Measured on this machine ({machine}): target alone {target.seconds:.1f} s, "
            f"speculative {spec.seconds:.1f} s for {spec.n} samples each; {accepted}.")


def row_bits_verdicts(bits: RowBits) -> list[tuple[str, bool, bool]]:
    """(kernel, ours, equal at every batch size) per kernel, for the prediction's answer."""
    return [(k, next(c.ours for c in bits.checks if c.kernel == k), all(c.equal for c in bits.checks if c.kernel == k))
            for k in bits.kernels()]


def row_bits_caption(bits: RowBits) -> str:
    """What was computed, in one line."""
    sizes = " and ".join(map(str, ROW_COUNTS))
    return (f"The target's {bits.matrix} on random input rows: row 3 computed alone, then inside {sizes} rows, "
            "through each kernel this machine has, on the same weight values (the file's blocks, or the same values "
            "as fp16 or fp32). torch.equal compares every bit.")


def row_bits_frame(bits: RowBits) -> pd.DataFrame:
    """One line per kernel: same bits (or the largest difference) at each batch size."""
    def cell(kernel: str, n: int) -> str:
        c = next(c for c in bits.checks if c.kernel == kernel and c.rows == n)
        return "same bits" if c.equal else f"differs (up to {c.max_abs_diff:.1e})"

    return pd.DataFrame([{"kernel": k, "whose": "specviz" if ours else "torch",
                          **{f"inside {n} rows": cell(k, n) for n in ROW_COUNTS}}
                         for k, ours, _ in row_bits_verdicts(bits)])


def batch_case_words(case: BatchCase) -> str:
    """llama.cpp's two texts and where they part, as Markdown (model text escaped)."""
    at = case.parted_at
    if at is None:
        head = (f"Here both runs wrote the same {case.tokens} tokens ({case.version}): this prompt met no near-tie "
                "that the two batch shapes tip differently. Try the code preset.")
    else:
        head = (f"The two runs part after **{at} characters** ({case.version}), with nothing else changed but how "
                "many prompt tokens one pass reads. A speculative engine's check is exactly such a wider pass: if it "
                "changes the bits, the text with a helper can leave the text without one.")
    cut = at if at is not None else min(len(case.one_batch), len(case.one_by_one))
    return "\n".join([head, "", f"- one batch: {_parted(case.one_batch, cut)}",
                      f"- one token at a time: {_parted(case.one_by_one, cut)}"])


def _parted(text: str, cut: int) -> str:
    """The shared part as is, the rest in bold (escaped model text)."""
    rest = md_escape(printable(text[cut:]))
    return md_escape(printable(text[:cut])) + (f"**{rest}**" if rest.strip() else "")
