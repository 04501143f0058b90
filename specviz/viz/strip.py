"""Escaped HTML for round lanes, the coloured text so far and the legend (every model or user text escaped)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from specviz import lessons
from specviz.core.trace import RoundTrace
from specviz.viz.playback import LaneState, Segment

Labels = Mapping[str, str]
VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}
MARKS = {"accepted": "✓", "rejected": "✗", "correction": "↻", "bonus": "★", "target": "●", "pending": "?"}


def esc(text: object) -> str:
    """HTML-escape anything (quotes too), so model and user text can never become markup."""
    return html.escape(str(text), quote=True)


def token_label(text: str) -> str:
    """A token as a box label (escaped): newlines and tabs made visible, spaces as faint dots, empty as ∅."""
    if text == "":
        return "∅"
    shown = esc("".join(VISIBLE.get(ch, ch) for ch in text))
    return shown.replace(" ", '<span class="sv-ws">·</span>')


def _label(labels: Labels, key: str, **values: object) -> str:
    """A level's wording for `key`, formatted and escaped."""
    return esc(labels.get(key, key).format(**values))


def _token_box(text: str, cls: str, mark: str = "", title: str = "") -> str:
    mark_html = f'<span class="sv-mark" aria-hidden="true">{mark}</span>' if mark else ""
    title_attr = f' title="{esc(title)}"' if title else ""
    return f'<span class="sv-tok {cls}"{title_attr}>{token_label(text)}{mark_html}</span>'


def tree_lane_verdicts(r: RoundTrace) -> tuple[str, ...]:
    """A tree round's node verdicts in lane order (its accepted branch first, then the other nodes in tree order)."""
    assert r.tree is not None
    on_path = set(r.tree.path)
    order = list(r.tree.path) + [i for i in range(len(r.tree.nodes)) if i not in on_path]
    return tuple(r.tree.nodes[i].verdict for i in order)


def _draft_box(r: RoundTrace, i: int, state: LaneState, labels: Labels) -> str:
    text = r.draft_texts[i]
    if r.tree is not None and i >= r.n_accepted and state.verdicts_shown > r.n_accepted:
        # off the accepted branch a tree node was either tried and rejected or never reached: not "the first rejection"
        if draft_verdict(r, i) == "rejected":
            return _token_box(text, "sv-rej", MARKS["rejected"], labels.get("rejected", "rejected"))
        return _token_box(text, "sv-struck", "", labels.get("unreached", "never checked"))
    if i < state.verdicts_shown:
        if r.accepted[i]:
            return _token_box(text, "sv-acc", MARKS["accepted"], labels.get("accepted", "accepted"))
        return _token_box(text, "sv-rej", MARKS["rejected"], labels.get("rejected", "rejected"))
    first_rejected = r.n_accepted
    if state.verdicts_shown > first_rejected and i > first_rejected:
        return _token_box(text, "sv-struck", "", labels.get("struck", "thrown away"))
    return _token_box(text, "sv-pend", "", labels.get("pending", "waiting to be checked"))


def lane_html(r: RoundTrace, state: LaneState, labels: Labels, current: bool = False, detail: str = "") -> str:
    """One round as a lane: the guesses, the verdict sweep, then the target's own token."""
    k = len(r.draft_ids)
    boxes = [_draft_box(r, i, state, labels) for i in range(state.drafts_shown)]
    boxes += ['<span class="sv-tok sv-slot" aria-hidden="true">&nbsp;</span>'] * (k - state.drafts_shown)
    if not k:
        boxes = [f'<span class="sv-none">{_label(labels, "no_guess")}</span>']
    if state.final_shown:
        own = _token_box(r.next_text, f"sv-{r.next_origin[:3]}", MARKS[r.next_origin], labels.get(r.next_origin, ""))
        tree = "tree_" if r.tree is not None and r.next_origin != "target" else ""
        summary = _label(labels, f"summary_{tree}{r.next_origin}", n=r.n_accepted, k=k, added=r.n_accepted + 1)
    else:
        own = '<span class="sv-tok sv-slot sv-wait" aria-hidden="true">…</span>'
        summary = _label(labels, "guessing" if state.phase == "draft" else "checking")
    extra = f'<span class="sv-detail">{esc(detail)}</span>' if detail else ""
    cls = "sv-lane sv-current" if current else "sv-lane"
    return (
        f'<div class="{cls}"><span class="sv-lane-head">{_label(labels, "round_name", n=r.index + 1)}</span>'
        f'<span class="sv-guesses">{"".join(boxes)}</span><span class="sv-arrow" aria-hidden="true">→</span>'
        f'{own}<span class="sv-summary">{summary}</span>{extra}</div>'
    )


def computing_lane_html(index: int, labels: Labels) -> str:
    """A placeholder lane while the next round is still being computed."""
    return (
        f'<div class="sv-lane sv-computing"><span class="sv-lane-head">{_label(labels, "round_name", n=index + 1)}</span>'
        f'<span class="sv-summary">{_label(labels, "thinking")}</span></div>'
    )


PROMPT_TAIL_LINES = 3  # a long prompt shows only its last lines, so the generated text stays in view
PROMPT_TAIL_CHARS = 240


def fold_prompt(prompt: str, lines: int = PROMPT_TAIL_LINES, chars: int = PROMPT_TAIL_CHARS) -> tuple[str, str]:
    """Split a prompt into (folded head, shown tail): the tail is its last `lines` lines, at most `chars` characters."""
    tail = "\n".join(prompt.split("\n")[-lines:])
    if len(tail) > chars:
        cut = tail[-chars:]
        space = cut.find(" ")  # start the tail at a word boundary when one is near
        tail = cut[space + 1:] if 0 <= space < 40 else cut
    return prompt[: len(prompt) - len(tail)], tail


def text_html(prompt: str, segments: Sequence[Segment], labels: Labels, code: bool = False) -> str:
    """The prompt (grey, a long one folded to its last lines) and the text so far, coloured by origin.

    The box scrolls from its end (CSS column-reverse), so the newest token is always in view.
    """
    kind_class = {"accepted": "sv-t-acc", "correction": "sv-t-cor", "bonus": "sv-t-bon", "target": "sv-t-tgt", "pending": "sv-t-pend"}
    spans = [
        f'<span class="{kind_class[s.kind]}" title="{esc(labels.get(s.kind, s.kind))}">{esc(s.text)}</span>'
        for s in segments
    ]
    head, tail = fold_prompt(prompt)
    fold = ""
    if head:
        fold = (f'<details class="sv-fold"><summary>prompt start: {len(head):,} characters folded (click to show)'
                f'</summary><span class="sv-prompt">{esc(head)}</span></details>')
    font = " sv-code" if code else ""
    return (f'<div class="sv-text{font}"><div class="sv-text-inner">{fold}<span class="sv-prompt">{esc(tail)}</span>'
            f'{"".join(spans)}<span class="sv-caret">▌</span></div></div>')


def legend_html(labels: Labels, kinds: Sequence[str] = ("accepted", "rejected", "correction", "bonus", "pending")) -> str:
    """A legend that pairs every colour with a symbol and a pattern (colour-blind safe)."""
    cls = {"accepted": "sv-acc", "rejected": "sv-rej", "correction": "sv-cor", "bonus": "sv-bon", "pending": "sv-pend", "target": "sv-tar"}
    items = [
        f'<span class="sv-legend-item"><span class="sv-tok {cls[k]}">{MARKS[k]}</span>{esc(labels.get(k, k))}</span>'
        for k in kinds
    ]
    return f'<div class="sv-legend">{"".join(items)}</div>'


def steps_html(steps: Sequence[str], active: Sequence[int]) -> str:
    """The four steps of a round with the current ones highlighted (1-based numbers in `active`)."""
    items = [
        f'<li class="{"sv-step-on" if i + 1 in active else "sv-step"}">{esc(text)}</li>'
        for i, text in enumerate(steps)
    ]
    return f'<ol class="sv-steps">{"".join(items)}</ol>'


def race_html(title: str, text: str, tokens: int, total: int, done: bool, cls: str) -> str:
    """One side of the race: a title, a progress bar and the text so far (escaped)."""
    pct = 100.0 * tokens / total if total else 0.0
    flag = ' <span class="sv-flag">✓ finished</span>' if done else ""
    return (
        f'<div class="sv-race {cls}"><div class="sv-race-title">{esc(title)}{flag}</div>'
        f'<div class="sv-bar"><div class="sv-bar-fill" style="width:{pct:.1f}%"></div></div>'
        f'<div class="sv-race-text"><div>{esc(text)}<span class="sv-caret">▌</span></div></div></div>'
    )


MD_SPECIAL = set("\\`*_{}[]()#+-.!|<>$~&")


def md_escape(text: str) -> str:
    """Backslash-escape Markdown (and LaTeX $) so a token in a widget label shows as typed."""
    return "".join("\\" + ch if ch in MD_SPECIAL else ch for ch in text)


def pill_label(r: RoundTrace, i: int, verdict_shown: bool) -> str:
    """A drafted token as a pill option: its place, its text (visible whitespace) and its mark."""
    text = r.draft_texts[i].replace(" ", "␣")
    text = "".join(VISIBLE.get(ch, ch) for ch in text) or "∅"
    mark = ""
    if verdict_shown:
        mark = " " + {"accepted": MARKS["accepted"], "rejected": MARKS["rejected"]}.get(draft_verdict(r, i), "—")
    return f"{i + 1}: {md_escape(text)}{mark}"


def draft_verdict(r: RoundTrace, i: int) -> str:
    """What became of drafted token i: accepted, rejected, or unreached (a chain: after the rejection; a tree:
    on another branch)."""
    if r.accepted[i]:
        return "accepted"
    if r.tree is not None:
        return tree_lane_verdicts(r)[i]
    return "rejected" if i == r.n_accepted else "unreached"


def rule_table_html(r: RoundTrace, i: int, level: str, verdict_shown: bool) -> str:
    """p(x), q(x), min(1, p/q) and the uniform drawn for drafted token i, with the verdict in words."""
    p, q, a, u = r.p_draft[i], r.q_draft[i], r.accept_probs[i], r.uniforms[i]
    names = {
        "d2": ("target's probability p(x)", "draft's probability q(x)", "chance of keeping it, min(1, p/q)", "random number drawn u"),
        "d5": ("p(x)", "q(x)", "min(1, p(x)/q(x))", "u ~ U(0, 1)"),
    }.get(level, ("big model", "helper", "keep chance", "dice"))
    # before the verdict only the draft's q is known: p, the keep chance and the dice would give the answer away
    shown = (p, q, a, u) if verdict_shown else (None, q, None, None)
    outcome = draft_verdict(r, i)
    if verdict_shown and outcome == "unreached" and r.tree is not None:
        shown = (p, q, None, None)  # a tree node off the decided branch was never tried: no keep chance, no dice
    empty = "after the check" if not verdict_shown else "— (never tried)"
    rows = "".join(f"<tr><th>{esc(n)}</th><td>{empty if v is None else f'{v:.4f}'}</td></tr>"
                   for n, v in zip(names, shown))
    if not verdict_shown:
        verdict = "not checked yet"
    elif outcome == "accepted":
        verdict = f"u = {u:.3f} < {a:.3f} → accepted ✓"
    elif outcome == "rejected":
        verdict = f"u = {u:.3f} ≥ {a:.3f} → rejected ✗"
    elif r.tree is not None:
        verdict = "never checked: it hangs on another branch of the tree"
    else:
        verdict = "never checked: an earlier token was rejected"
    token = token_label(r.draft_texts[i])
    return (
        f'<table class="sv-rule"><caption>Drafted token {i + 1}: <span class="sv-tok">{token}</span></caption>'
        f'{rows}<tr><th>verdict</th><td>{esc(verdict)}</td></tr></table>'
    )


def speed_words(speedup: float | None) -> str:
    """A speed-up in words, for the level without numbers (lessons.SPEED_WORDS, said of this run)."""
    if speedup is None:
        return "still measuring…"
    words = lessons.speed_words(speedup)
    return words + " this time — checking the guesses cost more time than they saved" if words == "slower" else words
