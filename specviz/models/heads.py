"""Trained draft heads shipped in assets/heads: found per pair, checked (sha256, target) and loaded.

A head is two files: `<pair>.safetensors` (the trained tensors in fp16 and the draft vocabulary's
ids) and `<pair>.json`, its manifest (sha256, the target it reads, the recipe it was trained with).
A head is only used on the target it was trained for: a head whose file does not match its sha256,
or whose target differs from the loaded one in any shape, is refused with a message saying which.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specviz.core.files import sha256_file
from specviz.models.base import PairError

HEADS_DIR = Path(__file__).resolve().parents[2] / "assets" / "heads"
FORMAT = 1
# the target's config fields a head depends on (its layer's shapes, its positions, its vocabulary)
TARGET_FIELDS = ("model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                 "rope_theta", "rms_norm_eps", "max_position_embeddings", "num_hidden_layers")


class HeadError(PairError):
    """A shipped head that is missing, damaged or made for another target."""


def target_fingerprint(target: nn.Module) -> dict[str, Any]:
    """What a head must agree with: the target's shapes (its config fields) and its class."""
    config = target.config
    return {"class": type(target).__name__, **{k: getattr(config, k, None) for k in TARGET_FIELDS}}


def paths(pair_name: str, folder: Path | None = None) -> tuple[Path, Path]:
    base = folder or HEADS_DIR
    return base / f"{pair_name}.safetensors", base / f"{pair_name}.json"


def manifest(pair_name: str, folder: Path | None = None) -> dict[str, Any] | None:
    """A pair's head manifest, or None where the pair ships no head."""
    path = paths(pair_name, folder)[1]
    return json.loads(path.read_text()) if path.exists() else None


def has_head(pair_name: str, folder: Path | None = None) -> bool:
    return paths(pair_name, folder)[1].exists()


def check(pair_name: str, target: nn.Module, folder: Path | None = None) -> dict[str, Any]:
    """The manifest of a head that may be used on this target; a HeadError saying what is wrong otherwise."""
    weights, man_path = paths(pair_name, folder)
    man = manifest(pair_name, folder)
    if man is None:
        raise HeadError(f"the pair {pair_name!r} ships no trained head ({man_path} is missing): "
                        f"train one with `python -m specviz train-head --pair {pair_name}`")
    if man.get("format") != FORMAT:
        raise HeadError(f"{man_path} is a head manifest of format {man.get('format')!r}; this specviz reads format {FORMAT}")
    if not weights.exists():
        raise HeadError(f"the head file {weights} is missing (its manifest {man_path} is there)")
    found = sha256_file(weights)
    if found != man["sha256"]:
        raise HeadError(f"the head file {weights} does not match its manifest (sha256 {found[:12]}…, expected "
                        f"{man['sha256'][:12]}…): it is damaged or was replaced; train it again or restore it")
    ours = target_fingerprint(target)
    theirs = man["target"]
    wrong = [k for k in ours if ours[k] != theirs.get(k)]
    if wrong:
        detail = ", ".join(f"{k} {theirs.get(k)!r} vs {ours[k]!r}" for k in wrong)
        raise HeadError(f"the head {weights.name} was trained for another target ({detail}): refused")
    return man


def read(pair_name: str, target: nn.Module,
         folder: Path | None = None) -> tuple[dict[str, torch.Tensor], Any, dict[str, Any]]:
    """A checked head file's trained tensors (fp32), its draft vocabulary and its manifest."""
    from safetensors.torch import load_file

    from specviz.core.draft_vocab import DraftVocab

    man = check(pair_name, target, folder)
    tensors = load_file(str(paths(pair_name, folder)[0]))
    vocab = DraftVocab(tensors.pop("vocab.ids").to(torch.long), target.config.vocab_size)
    return {k: v.float() for k, v in tensors.items()}, vocab, man


def vocabulary(pair_name: str, vocab_size: int, folder: Path | None = None) -> Any:
    """The draft vocabulary the pair's shipped head file holds (a DraftVocab over `vocab_size`), for the draft
    model's reduced output layer; None where the pair ships no head, or its file is missing, damaged or made for
    another vocabulary (the draft then keeps its whole output layer)."""
    from safetensors import safe_open

    from specviz.core.draft_vocab import DraftVocab

    weights, _ = paths(pair_name, folder)
    man = manifest(pair_name, folder)
    if man is None or not weights.exists() or sha256_file(weights) != man.get("sha256") or \
            man.get("target", {}).get("vocab_size") != vocab_size:
        return None
    with safe_open(str(weights), framework="pt") as fh:
        return DraftVocab(fh.get_tensor("vocab.ids").to(torch.long), vocab_size)


def load(pair_name: str, target: nn.Module, folder: Path | None = None) -> Any:
    """The checked head for this pair's target, fp32 arithmetic, eval mode (an EagleHead; fp16 matrices beside an fp16w target)."""
    from specviz.core.head import EagleHead
    from specviz.models.blocks import BlockLinear
    from specviz.models.half import HalfLinear, half_linears

    tensors, vocab, man = read(pair_name, target, folder)
    head = EagleHead(target, vocab, intermediate_size=man["recipe"]["mlp"])
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.startswith("lm_head.")]  # the head rows come from the target
    if missing or unexpected:
        raise HeadError(f"the head file does not fit its recipe (missing {missing[:3]}, unexpected {unexpected[:3]})")
    out = target.get_output_embeddings()
    if isinstance(out, BlockLinear):
        # a gguf target: the head's rows of its output layer as the file holds them (32,768 Q6_K rows: 41 MB where
        # fp32 held 201 MB), so that a draft step reads a fifth of the bytes; a draft never changes the output
        head.lm_head = out.subset(vocab.ids)
    if isinstance(out, (HalfLinear, BlockLinear)):
        # an fp16w (or gguf) target: hold the head's own matrices in fp16 (fp32 arithmetic, as the target's). Nothing
        # is lost: the file's tensors and the target's head rows are fp16 values already; a draft step then
        # streams half the bytes (the 32,768 head rows alone are 201 MB in fp32)
        half_linears(head)
    return head.eval()


def save(pair_name: str, head: Any, target: nn.Module, recipe: dict[str, Any], extra: dict[str, Any],
         folder: Path | None = None) -> dict[str, Any]:
    """Write the head file and its manifest (sha256, target, recipe and whatever else the run recorded)."""
    from safetensors.torch import save_file

    weights, man_path = paths(pair_name, folder)
    weights.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in head.weights().items()}
    tensors["vocab.ids"] = head.vocab.ids.to(torch.int32).contiguous()
    save_file(tensors, str(weights))  # safetensors writes a fixed order: the same tensors give the same bytes
    weights.chmod(0o644)  # a file the repository ships (safetensors creates it private)
    man = {"format": FORMAT, "pair": pair_name, "file": weights.name, "sha256": sha256_file(weights),
           "bytes": weights.stat().st_size, "target": target_fingerprint(target), "recipe": recipe, **extra}
    man_path.write_text(json.dumps(man, indent=1) + "\n")
    return man


class LazyHead:
    """A checked head file that becomes an EagleHead the first time a run asks for it (once, whichever thread asks)."""

    def __init__(self, pair_name: str, target: nn.Module, folder: Path | None = None) -> None:
        self.pair_name, self.target, self.folder = pair_name, target, folder
        self._head: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._head is None:
                self._head = load(self.pair_name, self.target, self.folder)
            return self._head
