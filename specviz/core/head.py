"""The EAGLE-style draft head: one decoder layer that reads the target's own features and guesses over a reduced vocabulary.

EAGLE-1's shape, on the target's last-layer features (EAGLE-3's low/middle/high mix would need three
feature rows per position from every verify pass; one is what the round seam hands a drafter today):
    pair i = [embedding of token i+1 ; the target's feature at position i]     (2d,)
    -> a projection to d -> one decoder layer of the target's own kind, with its own small KV cache
    -> the target's final norm (a trainable copy): f̂(i+1), the guess of the target's next feature
    -> the target's output head, only the rows of the draft vocabulary: logits over N ids for token i+2.
The features the target hands a drafter are the last layer's output after its final norm (what its head
reads), so f̂ is compared with them directly, and a chain feeds f̂ back as the next pair's feature.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import DynamicCache

from specviz.core.draft_vocab import DraftVocab
from specviz.core.forward import causal_mask


class EagleHead(nn.Module):
    """fc (2d -> d), one decoder layer, a norm and an output head over the draft vocabulary's N rows."""

    def __init__(self, target: nn.Module, vocab: DraftVocab, intermediate_size: int | None = None) -> None:
        super().__init__()
        body = target.get_decoder() if hasattr(target, "get_decoder") else target.model
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        if intermediate_size is not None:  # a narrower MLP keeps the shipped file small (the one knob off the target's config)
            config.intermediate_size = intermediate_size
        config._attn_implementation = "sdpa"  # its own plain attention: it never joins the target's packed passes
        d = config.hidden_size
        self.config = config
        self.vocab = vocab
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layer = type(body.layers[0])(config, layer_idx=0)
        self.rotary = type(body.rotary_emb)(config)
        self.norm = copy.deepcopy(body.norm).float()  # starts as the target's final norm (held in fp32 whatever the target's form)
        self.lm_head = nn.Linear(d, vocab.n, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(_head_rows(target, vocab))
        self.lm_head.weight.requires_grad_(False)  # as EAGLE: the target's head, frozen
        # the target's own embedding, read and never trained; kept out of the module's registry so that the head's
        # parameters, state and copies never include (or move) a tensor of the shared, read-only target
        object.__setattr__(self, "embed", target.get_input_embeddings())

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                cache: DynamicCache | None = None, sees: torch.Tensor | None = None) -> torch.Tensor:
        """Pairs (feature at i, token i+1) -> f̂(i+1) (n, d), attending over `cache` (extended) or over the pairs alone.

        sees: which cached-or-new entries each new pair attends to (n, past+n) bool, for a tree's branches; default
        causal. Training passes a batch of equal windows instead: features (B, n, d), ids and positions (B, n), no cache.
        """
        one = features.ndim == 2
        if one:
            features, next_ids, positions = features[None], next_ids[None], positions[None]
        with torch.no_grad():  # the target's embedding is read, never trained (no gradient for its 151,936 rows)
            embedded = self.embed(next_ids).to(features.dtype)
        x = self.fc(torch.cat([embedded, features], dim=-1))  # (B, n, 2d) -> (B, n, d)
        past = cache.get_seq_length() if cache is not None else 0
        if sees is None:
            mask = causal_mask(past, x.shape[1], x.dtype, x.device)  # (1, 1, n, past+n) or None (sdpa's own causal rule)
        else:
            mask = torch.zeros(sees.shape, dtype=x.dtype, device=x.device).masked_fill_(
                ~sees.to(x.device), torch.finfo(x.dtype).min)[None, None]
        h = self.layer(x, attention_mask=mask, position_ids=positions, cache=cache, use_cache=cache is not None,
                       position_embeddings=self.rotary(x, positions))
        out = self.norm(h)
        return out[0] if one else out  # (n, d) or (B, n, d)

    def logits(self, guessed: torch.Tensor) -> torch.Tensor:
        """f̂ (n, d) -> logits over the draft vocabulary (n, N)."""
        return self.lm_head(guessed)

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def weights(self) -> dict[str, torch.Tensor]:
        """What a head file stores: the trained tensors (the head rows come from the target)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("lm_head.")}


def _head_rows(target: nn.Module, vocab: DraftVocab) -> torch.Tensor:
    """The target's output head, only the draft vocabulary's rows (N, d) in fp32, whatever form the head is held in."""
    module = target.get_output_embeddings()
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.detach()[vocab.ids].float()
    if hasattr(module, "rows"):  # fp16w: the rows, a block at a time (the whole head in fp32 would be 0.9 GB)
        return module.rows(vocab.ids)
    return module.unpacked_weight()[vocab.ids].float()  # a packed fp32 layer keeps its matrix in its own layout
