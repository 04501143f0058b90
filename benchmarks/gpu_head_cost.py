"""Step costs on a GPU for the qwen-coder shapes: the target's step and verify passes, the 0.5B draft's step, the head's step.

Issue 32's GPU figure. The real weights do not travel to the lent GPU machine (64 MiB), so both models are
built there with random weights in Qwen2.5-Coder-1.5B and -0.5B shapes: a pass's cost depends on the
shapes, not the values. Acceptance cannot be measured this way; specviz combines these costs with the
acceptance measured on real weights on a CPU (`specviz.bench.gpu`). Everything runs through the engine's own
passes (CachedLM / TreeLM and the head), as specviz would run on that GPU.

Run: PYTHONPATH=. python benchmarks/gpu_head_cost.py OUT.json   (medians of 40 timed calls after 8 warm-ups)
"""
import json
import platform
import statistics
import sys
import time

import torch
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

from specviz.core.draft_vocab import DraftVocab
from specviz.core.head import EagleHead
from specviz.core.kv import CachedLM, TreeLM

COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
              tie_word_embeddings=True, num_key_value_heads=2)
TARGET = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12)  # 1.5B
DRAFT = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14)  # 0.5B
HEAD_VOCAB, HEAD_MLP = 32768, 2048  # the shipped head's shape (assets/heads/qwen-coder.json)
CONTEXT = 256
DRY = len(sys.argv) > 2 and sys.argv[2] == "--dry"  # a check of the script on this CPU: two layers, a few calls
DEV = "cpu" if DRY else "cuda"
if DRY:
    TARGET["num_hidden_layers"] = DRAFT["num_hidden_layers"] = 2


def sync() -> None:
    if not DRY:
        torch.cuda.synchronize()
CHAIN_K = (1, 2, 3, 4, 5, 6, 8, 12, 16)
TREES = {8: (2, 4), 16: (4, 4), 24: (4, 6)}  # nodes: (branches from the root, depth of each branch)


def median_ms(fn, n: int = 40, warm: int = 8) -> float:
    n, warm = (2, 1) if DRY else (n, warm)
    for _ in range(warm):
        fn()
    sync()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync()  # wall time to the answer: launch overhead counts, as it does for a run
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def build(shape: dict, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(DEV):
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, **shape))
    return model.to(dtype).eval()


def step_ms(model: torch.nn.Module, ids: list[int]) -> float:
    lm = CachedLM(model)
    lm.logits(ids, 1)
    k = [0]

    def step():  # one new token after the same context each time (the cache is cropped back by CachedLM)
        k[0] += 1
        lm.logits(ids + [100 + k[0] % 7], 1)

    return median_ms(step)


def verify_ms(model: torch.nn.Module, ids: list[int], k: int) -> float:
    lm = CachedLM(model)
    lm.logits(ids, 1)
    j = [0]

    def verify():  # k guessed tokens checked in one pass: logits at every one of them
        j[0] += 1
        lm.logits(ids + [100 + (j[0] + i) % 7 for i in range(k)], k)

    return median_ms(verify)


def tree_ms(model: torch.nn.Module, ids: list[int], branches: int, depth: int) -> float:
    lm = TreeLM(model)
    lm.logits(ids, 1)
    parents, tokens = [], []
    for b in range(branches):
        for d in range(depth):
            parents.append(-1 if d == 0 else len(parents) - 1)
            tokens.append(200 + b * depth + d)

    def verify():  # the root row and every node, each seeing its ancestors only
        lm.drop_tree()
        lm.tree_logits(ids, tokens, parents, with_root=True)

    return median_ms(verify)


def head_ms(target: torch.nn.Module, dtype: torch.dtype, n: int) -> float:
    """One draft step of the head: n new pairs (1 for a chain, a tree level's width for a tree) -> top-8 over N ids."""
    vocab = DraftVocab(torch.arange(HEAD_VOCAB), target.config.vocab_size)
    torch.manual_seed(0)
    head = EagleHead(target, vocab, intermediate_size=HEAD_MLP).to(DEV).eval()
    head.fc.to(dtype), head.layer.to(dtype), head.lm_head.to(dtype)
    d = target.config.hidden_size
    cache = head.new_cache()
    with torch.inference_mode():
        head(torch.randn(CONTEXT - 1, d, device=DEV, dtype=dtype), torch.arange(1, CONTEXT, device=DEV),
             torch.arange(CONTEXT - 1, device=DEV), cache)
        feats = torch.randn(n, d, device=DEV, dtype=dtype)
        nxt = torch.full((n,), 5, device=DEV)
        pos = torch.full((n,), CONTEXT - 1, device=DEV)

        def step():
            f = head(feats, nxt, pos, cache)
            torch.topk(torch.softmax(head.logits(f.to(dtype)).float(), dim=-1), 8)
            cache.crop(-n)

        return median_ms(step)


def measure(dtype: torch.dtype) -> dict:
    ids = [(i * 7919) % 150000 + 10 for i in range(CONTEXT)]
    out = {}
    with torch.inference_mode():
        target = build(TARGET, dtype)
        out["target_step_ms"] = step_ms(target, ids)
        out["verify_ms"] = {str(k): verify_ms(target, ids, k) for k in CHAIN_K}
        out["tree_verify_ms"] = {str(n): tree_ms(target, ids, *shape) for n, shape in TREES.items()}
        draft = build(DRAFT, dtype)
        out["draft_step_ms"] = step_ms(draft, ids)
        del draft
    out["head_step_ms"] = {str(n): head_ms(target, dtype, n) for n in (1, 4, 8)}
    out["c_draft"] = out["draft_step_ms"] / out["target_step_ms"]
    out["c_head"] = out["head_step_ms"]["1"] / out["target_step_ms"]
    return out


def main() -> None:
    result = {
        "what": "step costs on qwen-coder shapes with random weights (cost only: no acceptance here)",
        "device": "cpu (dry run)" if DRY else torch.cuda.get_device_name(),
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "context": CONTEXT, "head": {"vocab": HEAD_VOCAB, "mlp": HEAD_MLP}, "trees": {str(k): v for k, v in TREES.items()},
        "timing": "median wall ms of 40 calls after 8 warm-ups, synchronised; sdpa attention; the engine's own passes",
    }
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        result[name] = measure(dtype)
        print(name, json.dumps(result[name]), flush=True)
        if not DRY:
            torch.cuda.empty_cache()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
