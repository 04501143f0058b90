"""The bench's tables: its workloads (the presets), its methods (ours and transformers'), its modes and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specviz.core.limits import DEFAULT_GAMMA
from specviz.core.drafters.hybrid import MIN_MATCH as HYBRID_MIN_MATCH, THRESHOLD as HYBRID_THRESHOLD
from specviz.core.drafters.tree import TreeConfig
from specviz.presets import PRESETS

Mode = Literal["greedy", "sample"]

SAMPLE_TEMPERATURE = 0.7  # the sampling mode's temperature (top-k off, top-p 1: the plain tempered p)
WARMUP_TOKENS = 8  # untimed warm-up run per method before the repeats of each (pair, workload, mode)
LOOKUP_TOKENS = 10  # hf-lookup's prompt_lookup_num_tokens (transformers' example value); ngram uses it as γ
MIN_REPEATS = 3  # a median of fewer runs is not a median worth printing


class BenchError(ValueError):
    """A bad benchmark setting, or a run that could not be made fair (one line, for the CLI)."""


# ---------------------------------------------------------------------------------------------
# the tables: workloads and methods


@dataclass(frozen=True)
class Workload:
    """One prompt of the benchmark: an app preset under the benchmark's names (raw text, no chat template)."""

    name: str  # the preset id: the CSV's workload column, read back by the Where it helps lab
    kind: Literal["predictable", "creative"]  # the preset's group: what we expect of draft/target agreement
    prompt: str
    copying: bool  # the answer copies text from the prompt: prompt lookup (hf-lookup, ngram) applies


WORKLOADS: tuple[Workload, ...] = tuple(Workload(p.id, p.group, p.prompt, p.copies_prompt) for p in PRESETS)
WORKLOADS_BY_NAME = {w.name: w for w in WORKLOADS}


@dataclass(frozen=True)
class Method:
    """One way of generating: ours (specviz.core.engine), transformers' generate, or llama.cpp's own tools on the
    pair's GGUF files (specviz.bench.llama; greedy only, and only where its build is in the cache)."""

    name: str
    family: Literal["ours", "hf", "llama"]
    description: str
    drafter: str | None = None  # ours: a name in the drafter registry (core.drafters); None = target only
    gamma: int = DEFAULT_GAMMA  # ours: draft length (the ceiling when adaptive)
    adaptive: bool = False  # ours: AdaptiveGamma + the drafter's confidence stop
    assistant: bool = False  # hf: assistant_model=pair.draft (transformers' default schedule)
    lookup: bool = False  # hf: prompt_lookup_num_tokens=LOOKUP_TOKENS
    copying_only: bool = False  # run on copying workloads only
    peer_draft: bool = False  # llama: llama-speculative-simple with the pair's draft file (else llama-completion)


METHODS: tuple[Method, ...] = (
    Method("target", "ours", "target alone, one forward per token (autoregressive_generate): the baseline"),
    Method("spec-g2", "ours", "speculative, model drafter, γ=2", "model", 2),
    Method("spec-g4", "ours", "speculative, model drafter, γ=4", "model", 4),
    Method("spec-g8", "ours", "speculative, model drafter, γ=8", "model", 8),
    Method("spec-adaptive", "ours", "speculative, model drafter, adaptive γ ≤ 16 (confidence stop + throughput switch)",
           "model", 16, adaptive=True),
    Method("spec-tree", "ours", "speculative, model drafter, token tree (TreeConfig defaults: budget {t.budget}, "
           "branching {t.branching}, depth {t.depth}, min score {t.min_score}), one target pass per tree".format(t=TreeConfig()),
           "tree"),
    Method("hf-plain", "hf", "transformers generate, target alone"),
    Method("hf-assisted", "hf", "transformers assisted generation, assistant_model = the draft (default schedule)",
           assistant=True),
    Method("hf-lookup", "hf", f"transformers prompt lookup, prompt_lookup_num_tokens={LOOKUP_TOKENS}",
           lookup=True, copying_only=True),
    Method("ngram", "ours", f"speculative, n-gram (prompt lookup) drafter, γ={LOOKUP_TOKENS}", "ngram", LOOKUP_TOKENS),
    Method("suffix", "ours", "speculative, memory drafter (suffix match over the text and the datastore; no earlier "
           "run: every run starts cold)", "suffix"),
    Method("hybrid", "ours", f"speculative, memory when its match is ≥ {HYBRID_MIN_MATCH} tokens and it expects ≥ "
           f"{HYBRID_THRESHOLD:g} accepted tokens, else the model drafter (γ={DEFAULT_GAMMA}); starts cold", "hybrid", DEFAULT_GAMMA),
    Method("eagle", "ours", "speculative, the pair's trained EAGLE-style head (one layer on the target's features), "
           f"chain γ={DEFAULT_GAMMA}", "eagle", DEFAULT_GAMMA),
    Method("eagle-adaptive", "ours", "speculative, the pair's trained EAGLE-style head, adaptive γ ≤ 16 (the head's "
           "confidence stop + throughput switch)", "eagle", 16, adaptive=True),
    Method("eagle-tree", "ours", "speculative, the pair's trained EAGLE-style head, token tree (TreeConfig defaults), "
           "one target pass per tree (EAGLE-2)", "eagle-tree"),
    Method("llama.cpp", "llama", "llama.cpp's plain greedy run (`llama-completion --temp 0`) on the target's GGUF file, "
           "the same threads as ours"),
    Method("llama.cpp-spec-g4", "llama", "llama.cpp's speculative decoding (`llama-speculative-simple`, greedy) on the "
           "pair's GGUF files, drafting up to 4 tokens a round", gamma=4, peer_draft=True),
    Method("llama.cpp-spec-g16", "llama", "llama.cpp's speculative decoding (`llama-speculative-simple`, greedy) on the "
           "pair's GGUF files, drafting up to 16 tokens a round", gamma=16, peer_draft=True),
)
METHODS_BY_NAME = {m.name: m for m in METHODS}
BASELINE = "target"
LLAMA_PLAIN = "llama.cpp"  # llama.cpp's own plain run: its speculative rows' text is compared with it
MODES: tuple[Mode, ...] = ("greedy", "sample")

FULL_PAIRS = ("qwen-coder", "smollm2-135m")
QUICK_PAIRS = ("qwen-coder",)
QUICK_WORKLOADS = ("code", "list", "story")
# --quick: 3 workloads, greedy, 32 tokens, qwen-coder: about 15 minutes on the 2-core CPU
QUICK_METHODS = ("target", "spec-g4", "spec-adaptive", "spec-tree", "hf-plain", "hf-assisted", "ngram", "suffix", "hybrid",
                 "eagle", "eagle-adaptive", "eagle-tree", "llama.cpp", "llama.cpp-spec-g4", "llama.cpp-spec-g16")
QUICK_TOKENS, FULL_TOKENS = 32, 64


