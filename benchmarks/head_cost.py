"""What an EAGLE-style head step costs beside a target step on the qwen-coder pair (issue 32; an untrained head: cost only).

Run: PYTHONPATH=. python benchmarks/head_cost.py (medians in one process; c = head step / target step).
"""
import statistics, time, torch
from specviz.models import load_pair
from specviz.core.draft_vocab import DraftVocab
from specviz.core.head import EagleHead
from specviz.core.kv import CachedLM
pair = load_pair("qwen-coder")
target, draft = pair.target, pair.draft
print("target precision", pair.target_precision, "threads", torch.get_num_threads())
ids = pair.tokenizer("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 6)["input_ids"][:96]
L = len(ids); print("context", L)
def med(f, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)
lm = CachedLM(target); lm.logits(ids, 1)
k = [0]
def tstep():
    k[0] += 1; lm.logits(ids + [100 + k[0] % 7], 1)
t_ms = med(tstep, 15)
dl = CachedLM(draft); dl.logits(ids, 1)
def dstep():
    k[0] += 1; dl.logits(ids + [100 + k[0] % 7], 1)
d_ms = med(dstep, 15)
print(f"target step {t_ms:.1f} ms, draft-model step {d_ms:.1f} ms (c {d_ms / t_ms:.3f})")
V = target.config.vocab_size
for n_vocab, inter in ((32768, None), (32768, 2048), (V, None)):
    vocab = DraftVocab(torch.arange(n_vocab), V)
    torch.manual_seed(0)
    head = EagleHead(target, vocab, intermediate_size=inter).eval()
    size = sum(t.numel() for t in head.weights().values())
    cache = head.new_cache()
    d = target.config.hidden_size
    with torch.inference_mode():
        head(torch.randn(L - 1, d), torch.tensor(ids[1:L]), torch.arange(L - 1), cache)
        pos = [L - 1]
        def hstep():
            f = head(torch.randn(1, d), torch.tensor([5]), torch.tensor([pos[0]]), cache)
            head.logits(f)
            cache.crop(-1)
        h_ms = med(hstep, 30)
    print(f"head N={n_vocab} mlp={inter or target.config.intermediate_size}: {h_ms:.2f} ms/step, c {h_ms / t_ms:.3f}, trained tensors {size/1e6:.1f}M ({size*2/1e6:.0f} MB fp16)")
