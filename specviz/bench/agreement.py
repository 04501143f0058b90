"""Is our 4-bit target the file's model? Its first greedy tokens beside llama.cpp's on the same file, preset by preset;
where the two texts part, our logit gap between the two choices, beside the same gap by another valid float order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specviz.core.kv import CachedLM
from specviz.settings import encode_prompt

AGREE_TOKENS = 32  # the first 32 greedy tokens


@dataclass(frozen=True)
class Parting:
    """Where our text and llama.cpp's part: our choice there against theirs, in our target's logits."""

    token_index: int  # our new token (0-based) whose text holds the first differing character
    ours: str  # that token's text
    theirs: str  # llama.cpp's next token there, as our tokenizer reads its text
    gap: float  # our logit of ours minus our logit of theirs, by the engine's pass (≥ 0: ours was our argmax)
    theirs_rank: int  # their token's place in our logits (2 = our runner-up)
    plain_gap: float  # the same gap by transformers' plain forward over the whole prefix: another valid float order

    @property
    def order_shift(self) -> float:
        """How far the gap moved between the two float orders of our own arithmetic, at this very position."""
        return abs(self.gap - self.plain_gap)


@dataclass(frozen=True)
class Agreement:
    """One preset: both greedy texts and where (if anywhere) they part."""

    preset: str
    ours_text: str
    llama_text: str
    same_tokens: int  # our new tokens whose text llama.cpp's text repeats exactly (all of them when it never parts)
    parting: Parting | None


def greedy_with_logits(model: torch.nn.Module, prompt_ids: Sequence[int], tokens: int,
                       eos_ids: Sequence[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Our greedy run through the engine's own cached one-token passes (what autoregressive_generate calls), with the
    logits that chose each token."""
    lm, ids, new, logits = CachedLM(model), list(prompt_ids), [], []
    with torch.inference_mode():
        for _ in range(tokens):
            row = lm.logits(ids, 1)[0].float()
            token = int(row.argmax())
            new.append(token)
            logits.append(row)
            ids.append(token)
            if token in eos_ids:
                break
    return new, logits


def first_difference(a: str, b: str) -> int | None:
    """The first character where two texts differ, within the shorter one (None: one begins the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def token_at_char(tokenizer: Any, ids: Sequence[int], char: int) -> int:
    """The index of the token among ids whose decoded text holds character `char` of their joined text."""
    for i in range(len(ids)):
        if len(tokenizer.decode(ids[: i + 1])) > char:
            return i
    return len(ids) - 1


def _plain_logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """The last position's logits from transformers' plain forward over the whole prefix (no cache, one pass)."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)]), use_cache=False)
    return out.logits[0, -1].float()


def compare(pair: Any, preset: str, prompt: str, llama_text: str, tokens: int = AGREE_TOKENS) -> Agreement:
    """Our target's first `tokens` greedy tokens against llama.cpp's text for the same prompt."""
    tok = pair.tokenizer
    prompt_ids = encode_prompt(tok, prompt)
    ours, logits = greedy_with_logits(pair.target, prompt_ids, tokens, tuple(pair.eos_ids))
    ours_text = tok.decode(ours, skip_special_tokens=True)
    char = first_difference(ours_text, llama_text)
    if char is None:
        return Agreement(preset, ours_text, llama_text, len(ours), None)
    i = token_at_char(tok, ours, char)
    before = tok.decode(ours[:i], skip_special_tokens=True)
    theirs_ids = tok(llama_text[len(before):], add_special_tokens=False)["input_ids"]
    theirs = int(theirs_ids[0])
    row, mine = logits[i], ours[i]
    plain = _plain_logits(pair.target, [*prompt_ids, *ours[:i]])
    parting = Parting(
        token_index=i, ours=tok.decode([mine]), theirs=tok.decode([theirs]),
        gap=float(row[mine] - row[theirs]), theirs_rank=int((row > row[theirs]).sum()) + 1,
        plain_gap=float(plain[mine] - plain[theirs]),
    )
    return Agreement(preset, ours_text, llama_text, i, parting)


def verdict(p: Parting | None) -> str:
    """In words: agreed; a near-tie (llama.cpp took our runner-up by less than our own two float orders move the gap,
    or less than NEAR_TIE); or a gap to look into."""
    if p is None:
        return "same text"
    if p.theirs_rank == 2 and p.gap <= max(2 * p.order_shift, NEAR_TIE):
        return "near-tie: transformers' order picks llama.cpp's token too" if p.plain_gap < 0 else "near-tie"
    return "**look into it**"


NEAR_TIE = 0.5  # logits: about the largest move of one logit between our engine's pass and transformers' plain
# forward measured on this target (up to 0.55: issue 63's finding; 8-bit activations amplify float-order differences)


def markdown(rows: Sequence[Agreement], header: Sequence[str]) -> str:
    """The agreement table with its header lines (machine, versions, command)."""
    lines = [*header, "",
             "| preset | same tokens | where they part (ours / llama.cpp) | their token's place in our logits | "
             "our gap (engine) | same gap, transformers' forward | verdict |",
             "|---|---|---|---|---|---|---|"]
    for a in rows:
        p = a.parting
        if p is None:
            lines.append(f"| {a.preset} | all {a.same_tokens} | never |  |  |  | {verdict(p)} |")
            continue
        lines.append(f"| {a.preset} | {a.same_tokens} | token {p.token_index + 1}: {_cell(p.ours)} / {_cell(p.theirs)} | "
                     f"{p.theirs_rank} | {p.gap:.3f} | {p.plain_gap:.3f} | {verdict(p)} |")
    lines += ["", "The texts, ours then llama.cpp's:", ""]
    for a in rows:
        lines += [f"- **{a.preset}**: `{a.ours_text!r}`", f"  - llama.cpp: `{a.llama_text!r}`"]
    return "\n".join(lines) + "\n"


def _cell(token: str) -> str:
    """A token in a Markdown table cell: quoted with escapes, its pipes escaped."""
    return repr(token).replace("|", "\\|")
