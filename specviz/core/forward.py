"""The one model pass behind every run: the new rows of one or many runs packed into one forward, each run attending over its own KV cache only.

Why packed: on a CPU a pass over a few more rows costs little more than one row (the weights are
read once), so runs that share a server gain by sharing each pass, as the serving engines' variable-
length batches do. What keeps it exact: every linear, norm and activation treats each row on its
own, and attention is computed per run, with the shapes, mask and cache it would have alone
(transformers' own sdpa attention, called once per run through a registered attention function).
A run alone is a batch of one through the same code, so "alone" and "shared" differ only in how
many rows the row-wise layers see at once; `serve.exact` checks at load that this changes no bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from specviz.core import lean, profile
from specviz.core.attend import attend

ATTENTION = "specviz_packed"  # the attention implementation every model here runs with (plain sdpa outside packed passes)
_PER_RUN = torch.zeros(1, 1, 1, 1)  # a 4-D mask is taken as given by every model family; the real, per-run masks travel with the feeds


@dataclass(frozen=True, eq=False)
class Feed:
    """The rows one run feeds one model in one pass, after what its own cache already holds (a value the loop hands out)."""

    model: torch.nn.Module  # the shared, read-only model to run
    cache: DynamicCache  # this run's own keys/values for that model (extended by the pass)
    ids: tuple[int, ...]  # (n,) token ids of the new rows
    positions: tuple[int, ...]  # (n,) their position ids (a tree's nodes share positions by depth)
    mask: torch.Tensor | None  # (1, 1, n, kv) mask over the cache after the pass; None = plain causal (one row, or an empty cache)
    first_logit: int  # logits are wanted for rows first_logit..n-1
    # hidden states wanted, as indices into transformers' `hidden_states` (0 = the embeddings, -1 = the last
    # layer's output after the final norm, what the LM head reads); for rows first_hidden..n-1. () = none
    # (as transformers' assistants ask for `requires_model_outputs` and vLLM's EAGLE for `target_hidden_states`)
    layers: tuple[int, ...] = ()
    first_hidden: int = 0

    @property
    def rows(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, eq=False)
class Pass:
    """What one pass answers one feed: its wanted logits, and the hidden states it asked for (a value the loop hands in)."""

    logits: torch.Tensor  # (n - first_logit, V) fp32
    hidden: tuple[torch.Tensor, ...] = ()  # one (n - first_hidden, d) fp32 tensor per asked layer, in the feed's order


def causal_mask(past: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """The additive mask of n new rows after `past` cached ones (row r sees positions <= past + r); None where sdpa's own rule is the same."""
    if n == 1 or past == 0:
        return None  # one row sees everything; an empty cache is sdpa's is_causal
    seen = torch.arange(past + n)[None, :] <= (past + torch.arange(n))[:, None]  # (n, past+n)
    mask = torch.zeros(seen.shape, dtype=dtype).masked_fill_(~seen, torch.finfo(dtype).min)
    return mask[None, None].to(device)


class _Runs:
    """Stands in for the cache during a packed pass: splits each layer's new keys/values by run into the runs' own caches."""

    def __init__(self, feeds: Sequence[Feed]) -> None:
        self.feeds = feeds
        self.spans: list[tuple[int, int]] = []
        start = 0
        for f in feeds:
            self.spans.append((start, start + f.rows))
            start += f.rows

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(1, heads, N, d) new keys/values -> each run's whole keys/values (1, heads, kv_i, d) after appending its rows."""
        keys, values = [], []
        for (a, b), f in zip(self.spans, self.feeds):
            k, v = f.cache.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx)
            keys.append(k)
            values.append(v)
        return keys, values


def _packed_attention(module: torch.nn.Module, query: torch.Tensor, key: Any, value: Any, attention_mask: Any,
                      runs: _Runs | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """sdpa for each run's rows over its own keys/values, outputs concatenated (1, N, heads, d); plain sdpa outside a packed pass."""
    if runs is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = [
        attend(module, query[:, :, a:b], k, v, f.mask, **kwargs)  # (1, n_i, heads, d)
        for (a, b), k, v, f in zip(runs.spans, key, value, runs.feeds)
    ]
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), None


AttentionInterface.register(ATTENTION, _packed_attention)
if ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS:  # plain calls (e.g. transformers' generate) build sdpa's masks
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def use_packed_attention(model: torch.nn.Module) -> None:
    """Route a model's attention through `_packed_attention` (idempotent; plain calls still get sdpa exactly)."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != ATTENTION:
        model.set_attn_implementation(ATTENTION)


@torch.inference_mode()
def forward(model: torch.nn.Module, feeds: Sequence[Feed]) -> list[Pass]:
    """One pass of `model` over every feed's new rows; each feed's wanted logits (n_i - first_logit, V) and hidden states, in order."""
    if not feeds:
        return []
    laps = profile.laps()
    laps.start(laps.role_of(model) if laps.recording else "")
    use_packed_attention(model)
    device = getattr(model, "device", torch.device("cpu"))
    ids = torch.tensor([[t for f in feeds for t in f.ids]], dtype=torch.long, device=device)  # (1, N)
    positions = torch.tensor([[p for f in feeds for p in f.positions]], dtype=torch.long, device=device)  # (1, N)
    runs = _Runs(feeds)
    keep = [a + f.first_logit + j for (a, b), f in zip(runs.spans, feeds) for j in range(b - a - f.first_logit)]
    keep_ids = torch.tensor(keep, dtype=torch.long, device=device)
    hidden = any(f.layers for f in feeds)  # the other layers' outputs are only kept when someone asked
    laps("pass set-up")
    if lean.enabled(model):  # transformers' arithmetic without its per-layer machinery (core.lean)
        raw_logits, states = lean.run(model, feeds, ids, positions, runs.spans, keep_ids, hidden)
    else:
        out = model(input_ids=ids, position_ids=positions, attention_mask=_PER_RUN, cache=runs, use_cache=True,
                    logits_to_keep=keep_ids, runs=runs, output_hidden_states=hidden)
        raw_logits, states = out.logits, out.hidden_states
        laps("transformers' forward (not split)")
    logits = raw_logits[0].float()  # (K, V)
    sizes = [f.rows - f.first_logit for f in feeds]
    answers = [Pass(part, _hidden_of(states, f, a) if hidden else ())
               for part, f, (a, _) in zip(torch.split(logits, sizes), feeds, runs.spans)]
    laps.stop()
    return answers


def _hidden_of(states: Sequence[torch.Tensor], feed: Feed, start: int) -> tuple[torch.Tensor, ...]:
    """One feed's asked layers, its rows first_hidden..n-1 only, as fp32 copies (the pass's own tensors are freed)."""
    a, b = start + feed.first_hidden, start + feed.rows
    return tuple(states[layer][0, a:b].float().clone() for layer in feed.layers)
