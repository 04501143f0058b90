"""The head's training data: prompts from text on this machine, the target's own continuations of them and its features.

Why the target's continuations: the head must guess what *this* target says next, so most of the
data is the target talking (sampled, seeded), read by a recorder drafter that drafts nothing and keeps
the last-layer features every verify pass hands it (the same rows a head reads when it drafts). The
prompts are what a machine without internet has: the standard library's sources, the app's own
sources, and openings in the presets' genres. Recording runs many prompts together through the
batched executor, a chunk at a time, and each chunk is saved, so a stopped run resumes where it was.

Beside them, where a recipe asks (`text_tokens`), the target reads code people wrote: pieces of the pair's
datastore (the standard library's sources, tokenized) in plain prefill passes, far cheaper per position than
decoding. The tokens there are not the target's, but the law the head is trained on still is: at every
position the loss compares the head with the target's own p, computed from the target's own feature.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specviz.core.drafters.eagle import LAST_LAYER
from specviz.core.engine import speculative_program
from specviz.core.rounds import Session, Draft, Kept, Steps
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.core.memory.datastore import source_files
from specviz.serve.batch import run_together
from specviz.serve.exact import Exactness
from specviz.train.store import save_tree

# openings in the presets' genres (stories, poems, lists, records): the target continues each in its own words
SUBJECTS = ("a lighthouse keeper", "a lost robot", "the moon", "a small dragon", "a rainy city", "an old clock",
            "a school trip", "the ocean floor", "a mountain village", "a library at night", "a fox and a crow",
            "a space station", "a baker", "the first snow", "a paper boat", "a desert caravan")
GENRE_TEMPLATES = (
    "Once upon a time, {s}",
    "A short story about {s}:\n\n",
    "A short poem about {s}:\n\n",
    "Five facts about {s}:\n1.",
    "Ten words that describe {s}:\n1.",
    "Q: What is {s}?\nA:",
    "# Notes on {s}\n\n## Overview\n",
    'records = [\n    {{"id": 1, "topic": "{s}", "done": false}},\n    {{"id": 2,',
)
LISTS = ("The days of the week:\n1. Monday\n2.", "The months of the year:\n1. January\n2.",
         "The planets of the solar system, in order from the Sun:\n1. Mercury\n2.",
         "The first ten prime numbers:\n1. 2\n2.", "The colours of the rainbow:\n1. Red\n2.",
         "The continents of the world:\n1.", "The steps to make tea:\n1.")


def genre_prompts() -> list[str]:
    """Every opening in the presets' genres (templates x subjects, and the fixed lists)."""
    return [t.format(s=s) for t in GENRE_TEMPLATES for s in SUBJECTS] + list(LISTS)


def code_prompts(rng: random.Random, n: int, max_lines: int = 24) -> list[str]:
    """n openings of Python from the standard library and the app's own sources: a def or class line and what follows."""
    files = source_files() + sorted(Path(__file__).resolve().parents[1].rglob("*.py"))
    out: list[str] = []
    while len(out) < n:
        path = rng.choice(files)
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            continue
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "class "))]
        if not starts:
            continue
        i = rng.choice(starts)
        text = "".join(lines[i: i + rng.randint(1, max_lines)])
        if 0 < len(text) <= 2000:
            out.append(text)
    return out


def training_prompts(seed: int, n: int) -> list[str]:
    """n prompts, seeded: about two thirds code, one third the presets' genres (the default pair is a coder)."""
    rng = random.Random(seed)
    genres = genre_prompts()
    k = min(n // 3, len(genres))
    out = code_prompts(rng, n - k) + rng.sample(genres, k)
    rng.shuffle(out)
    return out


class _Recorder(Session):
    """Drafts nothing; keeps every feature row the target hands it (positions 0.. in order)."""

    features = (LAST_LAYER,)

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def hear(self, kept: Kept) -> None:
        if kept.hidden:
            del self.rows[kept.start:]
            self.rows.extend(kept.hidden[0].to(torch.float16).unbind(0))

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()
        return Draft((), torch.zeros(0, 1))


@dataclass
class _RecordingDrafter:
    """Hands out recorder sessions and keeps them, so their rows can be read when the runs end."""

    name: str = "record"
    sessions: list[_Recorder] = field(default_factory=list)

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> _Recorder:
        self.sessions.append(_Recorder())
        return self.sessions[-1]


@dataclass(frozen=True)
class RecordConfig:
    """How the target's continuations are made (recorded in the head's recipe)."""

    prompts: int = 480  # prompts in all
    new_tokens: int = 192  # tokens the target adds to each
    temperature: float = 0.7  # the target samples (seeded per prompt): varied text, still its own
    chunk: int = 40  # prompts run together and saved as one chunk
    seed: int = 0
    max_prompt_tokens: int = 384

    @property
    def chunks(self) -> int:
        """How many chunk files the recording makes (the last may hold fewer prompts)."""
        return -(-self.prompts // self.chunk)

    @property
    def held_out(self) -> int:
        """The prompts of the last chunk: the trainer holds that chunk out to score the head (run.train_stage)."""
        return self.prompts - (self.chunks - 1) * self.chunk


def _shared(model: torch.nn.Module, max_rows: int) -> Exactness:
    """Recording packs every run's rows into shared passes: training data need the target's features and laws, not
    bit-identity with a run alone (a bf16 target's rows change in their last bits with the pass size)."""
    return Exactness(True, max_rows, "recording training data: rows share passes whatever the precision")


def record_chunk(pair: Any, texts: Sequence[str], cfg: RecordConfig, first_seed: int) -> list[dict[str, torch.Tensor]]:
    """Run the texts together (target alone, sampled) and return per text its ids (T,), features (T-1, d) fp16 and
    prompt length (so a later recording can leave out prompts that another one holds out)."""
    drafter = _RecordingDrafter()
    programs = []
    for j, text in enumerate(texts):
        ids = pair.tokenizer(text, add_special_tokens=False)["input_ids"][: cfg.max_prompt_tokens]
        config = GenerationConfig(max_new_tokens=cfg.new_tokens, gamma=1,
                                  sampling=SamplingConfig("sample", cfg.temperature, seed=first_seed + j), trace_top_n=1)
        programs.append(speculative_program(pair.target, drafter, pair.tokenizer, ids, config, pair.eos_ids))
    gens, _, _ = run_together(programs, pair.target, exactness=_shared)
    out = []
    for gen, session in zip(gens, drafter.sessions):
        ids = torch.tensor(list(gen.prompt_ids) + list(gen.tokens), dtype=torch.long)
        feats = torch.stack(session.rows)
        n = min(len(ids) - 1, len(feats))  # every position but the last one has its row
        out.append({"ids": ids[: n + 1], "feats": feats[:n], "prompt": len(gen.prompt_ids)})
    return out


def save_chunks(folder: Path, prefix: str, items: Sequence[Any], size: int,
                make: Callable[[Sequence[Any], int], list[dict[str, torch.Tensor]]],
                progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Save make(items[start: start + size], start) as `<prefix>-NNNN.safetensors` for every chunk not yet on disk
    (a stopped run resumes where it was); returns the chunk files in order."""
    folder.mkdir(parents=True, exist_ok=True)
    total = -(-len(items) // size)
    paths = []
    for c, start in enumerate(range(0, len(items), size)):
        path = folder / f"{prefix}-{c:04d}.safetensors"
        if not path.exists():
            save_tree(path, make(items[start: start + size], start))  # a chunk is on disk whole or not at all
        paths.append(path)
        if progress is not None:
            progress(c + 1, total)
    return paths


def record(pair: Any, cfg: RecordConfig, folder: Path, progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Record every chunk not yet on disk (a stopped run resumes); returns the chunk files in order."""
    return save_chunks(folder, "chunk", training_prompts(cfg.seed, cfg.prompts), cfg.chunk,
                       lambda texts, start: record_chunk(pair, texts, cfg, cfg.seed * 100_000 + start), progress)


TEXT_PIECE = 512  # tokens per piece of datastore text read through the target (whole pieces only: no padding)
TEXT_BATCH = 4  # pieces per prefill pass
TEXT_CHUNK = 64  # pieces per saved file (about 100 MB of fp16 features for d = 1536)


def text_pieces(docs: Sequence[Sequence[int]], n_tokens: int, seed: int, piece: int = TEXT_PIECE) -> list[list[int]]:
    """Whole pieces of `piece` tokens cut from the documents, seeded and shuffled, enough to hold n_tokens."""
    pieces = [list(doc[a: a + piece]) for doc in docs for a in range(0, len(doc) - piece + 1, piece)]
    random.Random(seed).shuffle(pieces)
    return pieces[: -(-n_tokens // piece)]


@torch.inference_mode()
def read_pieces(target: torch.nn.Module, pieces: Sequence[Sequence[int]]) -> list[dict[str, torch.Tensor]]:
    """The target's last-layer features (after its final norm: what its head reads) for each piece, in prefill
    passes of TEXT_BATCH pieces; per piece its ids (T,) and features (T-1, d) fp16, as a recorded sequence."""
    body = target.get_decoder()
    out = []
    for b in range(0, len(pieces), TEXT_BATCH):
        x = torch.tensor([list(p) for p in pieces[b: b + TEXT_BATCH]])
        feats = body(input_ids=x).last_hidden_state
        out.extend({"ids": x[k], "feats": feats[k, :-1].to(torch.float16).clone()} for k in range(len(x)))
    return out


def read_text(target: torch.nn.Module, docs: Sequence[Sequence[int]], n_tokens: int, seed: int, folder: Path,
              progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Read every chunk of datastore pieces not yet on disk (a stopped run resumes); returns the chunk files in order."""
    return save_chunks(folder, "text", text_pieces(docs, n_tokens, seed), TEXT_CHUNK,
                       lambda pieces, _start: read_pieces(target, pieces), progress)
