"""tiny-random: a deterministic byte-level Llama pair built in code, for tests and trying the interface."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


# ----------------------------------------------------------------------------------------------
# tiny-random: a deterministic byte-level pair built in code
# ----------------------------------------------------------------------------------------------

_TINY_SEED = 0  # target weights
_TINY_NOISE_SEED = 1  # the draft's perturbation
_TINY_INIT_STD = 0.3  # larger than HF's 0.02 so p is peaked (entropy ~3.2 nats, not uniform)
_TINY_NOISE = 0.025  # relative noise; measured greedy agreement ~0.6-0.7, sampled acceptance ~0.85


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of the ByteLevel pre-tokenizer."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def tiny_tokenizer() -> Any:
    """Byte tokenizer: id = byte value (0..255), 256 = <eos>; decode round-trips any UTF-8 text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>")


def _tiny_config() -> Any:
    """hidden 64, 2 layers, 4 heads, vocabulary 256 bytes + <eos>."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=257,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        initializer_range=_TINY_INIT_STD,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=256,
        pad_token_id=256,
    )


def _build_tiny_random() -> tuple[Any, nn.Module, nn.Module]:
    """Target from a fixed seed; draft = target + small seeded noise (agrees often, not always)."""
    from transformers import LlamaForCausalLM

    config = _tiny_config()
    with torch.random.fork_rng(devices=[]):  # seed HF's initializers without touching the caller's RNG
        torch.manual_seed(_TINY_SEED)
        target = LlamaForCausalLM(config).eval()
    return tiny_tokenizer(), target, _noisy_copy(target)


def _noisy_copy(target: nn.Module) -> nn.Module:
    """A separate model with target's weights plus noise scaled to each matrix's spread."""
    draft = copy.deepcopy(target)  # no tensor shared with the target
    gen = torch.Generator().manual_seed(_TINY_NOISE_SEED)
    with torch.no_grad():
        for _, param in sorted(draft.named_parameters()):
            if param.ndim >= 2:  # matrices only: norms stay at 1
                param.add_(torch.randn(param.shape, generator=gen) * param.std() * _TINY_NOISE)
    return draft
