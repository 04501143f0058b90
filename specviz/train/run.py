"""`train-head` from start to file: record the target's continuations, choose the draft vocabulary, train, check, ship.

Each stage survives a stop: recorded chunks and training checkpoints live in the cache (keyed by the
recipe, so a changed recipe starts afresh), and the run picks up where it was. The shipped head is one
safetensors file (the trained tensors in fp16 and the draft vocabulary's ids) plus a manifest beside
it: its sha256, the target it was trained for, the recipe, the token counts, the loss curve and what it
scored on held-out text. `specviz.models.heads` checks both before a head is used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specviz import host
from specviz.core.draft_vocab import DraftVocab, most_frequent
from specviz.core.head import EagleHead, _head_rows
from specviz.models import heads
from specviz.models.locate import cache_dir
from specviz.train.data import RecordConfig, read_text, record
from specviz.train.head import Sequences, TrainConfig, TrainState, acceptance_by_depth, train
from specviz.train.store import load_tree, save_tree

Report = Callable[[str], None]


@dataclass(frozen=True)
class HeadRecipe:
    """Everything that decides a head (its manifest's recipe; a changed recipe trains a new head)."""

    pair: str
    record: RecordConfig
    train: TrainConfig
    vocab: int = 32768  # the draft vocabulary: the N most frequent ids in the recorded text
    mlp: int = 2048  # the head's MLP width (the target's is 8960: a narrower one keeps the file under 48 MB)
    record_precision: str = "bf16"  # the target's precision while recording (bf16: 5x faster on AMX; fp16w at run time)
    init_seed: int = 0  # the head's initial weights
    text_tokens: int = 0  # tokens of datastore code read through the target beside its continuations (0: none)
    start_sha256: str = ""  # a head file to go on from (its sha256), instead of the seeded init: "" starts afresh
    # more recordings (other seeds) trained on beside the first, whose last chunk stays the held-out one: data grow
    # without recording again what is in the cache already
    also_record: tuple[RecordConfig, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def key(self, *parts: str) -> str:
        """A short hash of the recipe (or of the named parts of it), naming its folders in the cache."""
        d = self.as_dict()
        text = json.dumps({k: d[k] for k in parts} if parts else d, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def work_folder(recipe: HeadRecipe) -> Path:
    return cache_dir() / "heads" / recipe.pair


def data_folder(recipe: HeadRecipe, record: RecordConfig | None = None) -> Path:
    """Where a recording's chunks go (the recipe's first one by default): keyed by what decides them (the pair, the
    record settings, the precision), so the same recording in another recipe is found, not made again."""
    one = dataclasses.replace(recipe, record=record or recipe.record)
    return work_folder(recipe) / f"data-{one.key('pair', 'record', 'record_precision')}"


def recordings(recipe: HeadRecipe) -> tuple[RecordConfig, ...]:
    """Every recording a recipe trains on, the first (whose last chunk is held out) first."""
    return (recipe.record, *recipe.also_record)


def text_folder(recipe: HeadRecipe) -> Path:
    """Where the features of datastore text go: keyed by what decides them."""
    return work_folder(recipe) / f"text-{recipe.key('pair', 'text_tokens', 'record_precision', 'init_seed')}"


def text_stage(pair: Any, recipe: HeadRecipe, report: Report) -> list[Path]:
    """Read the recipe's datastore pieces through the target, a line per saved chunk with the time left."""
    from specviz.core.memory import datastore

    docs = datastore.ensure(pair.spec.name, pair.tokenizer, datastore.vocab_size(pair)).documents()
    progress = chunk_progress(report, "reading code", "", text_folder(recipe), "text-*.safetensors")
    return read_text(pair.target, docs, recipe.text_tokens, recipe.init_seed, text_folder(recipe), progress)


def chunk_progress(report: Report, label: str, detail: str, folder: Path, pattern: str) -> Callable[[int, int], None]:
    """A line per saved chunk with the time left, timed over the chunks this run makes (not those already on disk)."""
    t0 = time.perf_counter()
    done0 = len(list(folder.glob(pattern)))

    def progress(done: int, total: int) -> None:
        new = done - done0
        rate = (time.perf_counter() - t0) / new if new > 0 else 0.0
        report(f"{label}: chunk {done}/{total}{detail}"
               + (f", about {rate * (total - done) / 60:.0f} min left" if new > 0 and done < total else ""))

    return progress


def load_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """Every recorded sequence in the chunks, in order: its ids, features and prompt length (chunks recorded before it was kept have none)."""
    return [r for p in paths for r in load_tree(p)]


def as_sequences(rows: list[dict[str, Any]]) -> Sequences:
    """Rows as one Sequences (features kept in fp16: 3 KB a position for d = 1536)."""
    return Sequences(tuple(r["ids"] for r in rows), tuple(r["feats"] for r in rows))


def load_sequences(paths: list[Path]) -> Sequences:
    """The recorded chunks as one Sequences."""
    return as_sequences(load_rows(paths))


def leave_out_held(rows: list[dict[str, Any]], held: Sequences) -> tuple[list[dict[str, Any]], int]:
    """The rows of another recording but those whose prompt opens a held-out sequence, and how many were left out:
    recordings with other seeds repeat the genres' openings (135 of them), and the held-out score must not be
    of text the head trained on."""
    opens = [ids.tolist() for ids in held.ids]
    kept = []
    for r in rows:
        if "prompt" not in r:
            raise RuntimeError("a further recording must keep its prompts' lengths, and this one was made before "
                               "chunks kept them: delete its data-… folder in the cache and record it again")
        prompt = r["ids"][: r["prompt"]].tolist()
        if not any(seq[: len(prompt)] == prompt for seq in opens):
            kept.append(r)
    return kept, len(rows) - len(kept)


def token_counts(data: Sequences, vocab_size: int) -> torch.Tensor:
    """How often each id appears in the recorded text (prompts and continuations)."""
    return torch.bincount(torch.cat(data.ids), minlength=vocab_size)


def record_stage(pair: Any, recipe: HeadRecipe, report: Report, cfg: RecordConfig | None = None) -> list[Path]:
    """Record every missing chunk of one recording (the recipe's first by default), a line per chunk with the time left."""
    cfg = cfg or recipe.record
    folder = data_folder(recipe, cfg)
    progress = chunk_progress(report, "recording", f" ({cfg.chunk} prompts each, seed {cfg.seed})", folder,
                              "chunk-*.safetensors")
    return record(pair, cfg, folder, progress)


def is_recorded(recipe: HeadRecipe, cfg: RecordConfig) -> bool:
    return all((data_folder(recipe, cfg) / f"chunk-{c:04d}.safetensors").exists() for c in range(cfg.chunks))


def vocabulary(data: Sequences, pair: Any, n: int,
               given: DraftVocab | None = None) -> tuple[DraftVocab, dict[str, int]]:
    """The n most frequent ids in the recorded text and the pair's datastore of code (ties: the smaller id, which
    in a BPE vocabulary is the earlier, more common merge), or the `given` one; with the counts and its coverage."""
    from specviz.core.memory import datastore

    size = pair.target.config.vocab_size
    counts = token_counts(data, size)
    text = torch.zeros(0, dtype=torch.long)
    if datastore.manifest(pair.spec.name) is not None:  # `prepare` builds it; a pair without one counts its text only
        store = datastore.load(pair.spec.name, pair.tokenizer, datastore.vocab_size(pair))
        text = torch.from_numpy(store.text[store.text < size])
    counts = counts + torch.bincount(text, minlength=size)
    vocab = given if given is not None else most_frequent(counts, n)
    covered = float(counts[vocab.ids].sum() / counts.sum())
    return vocab, {"recorded_tokens": int(sum(len(t) for t in data.ids)), "datastore_tokens": int(text.numel()),
                   "coverage_permille": round(1000 * covered)}


def _checkpoint_path(recipe: HeadRecipe) -> Path:
    return work_folder(recipe) / f"checkpoint-{recipe.key()}.safetensors"


def _save_checkpoint(path: Path, state: TrainState) -> None:
    save_tree(path, dataclasses.asdict(state))  # whole or not at all


def full_p(target: torch.nn.Module, vocab: DraftVocab) -> Callable[[torch.Tensor], torch.Tensor]:
    """The target's p at the draft ids, normalised over its whole vocabulary, from its features."""
    rows = _head_rows(target, DraftVocab(torch.arange(target.config.vocab_size), target.config.vocab_size))

    def p_of(features: torch.Tensor) -> torch.Tensor:
        return torch.softmax(features @ rows.T, dim=-1)[:, vocab.ids]

    return p_of


def start_head(target: torch.nn.Module, recipe: HeadRecipe,
               folder: Path | None) -> tuple[dict[str, torch.Tensor], DraftVocab, dict[str, Any]]:
    """The trained tensors, draft vocabulary and manifest of the head a recipe goes on from, found in `folder` and
    checked (its sha256 against the recipe's, its target against this one). A run that goes on keeps its vocabulary."""
    if folder is None:
        raise RuntimeError(f"this recipe goes on from the head with sha256 {recipe.start_sha256[:12]}…: "
                           "name the folder that holds it (--start-from)")
    tensors, vocab, man = heads.read(recipe.pair, target, folder)
    if man["sha256"] != recipe.start_sha256:
        raise RuntimeError(f"the head in {folder} has sha256 {man['sha256'][:12]}…, the recipe names "
                           f"{recipe.start_sha256[:12]}…")
    return tensors, vocab, man


def train_stage(pair: Any, recipe: HeadRecipe, report: Report, bar: Callable[..., Any],
                start_from: Path | None = None) -> tuple[EagleHead, dict[str, Any]]:
    """Train (or resume) the head on the recorded chunks but the last, which is held out; returns it and its record."""
    paths = sorted(data_folder(recipe).glob("chunk-*.safetensors"))
    if len(paths) < 2:
        raise RuntimeError("training needs at least two recorded chunks (one is held out)")
    data, held = load_sequences(paths[:-1]), load_sequences(paths[-1:])
    left_out = 0
    for cfg in recipe.also_record:
        rows, n = leave_out_held(load_rows(sorted(data_folder(recipe, cfg).glob("chunk-*.safetensors"))), held)
        more, left_out = as_sequences(rows), left_out + n
        data = Sequences(data.ids + more.ids, data.feats + more.feats)
    start = start_head(pair.target, recipe, start_from) if recipe.start_sha256 else None
    # the datastore's tokens are counted there already (the code pieces below come from it)
    vocab, counts = vocabulary(data, pair, recipe.vocab, start[1] if start else None)
    if recipe.also_record:
        counts["left_out_sequences"] = left_out
        report(f"further recordings: {left_out} sequences left out (their prompts open held-out ones)")
    if recipe.text_tokens:
        text = load_sequences(sorted(text_folder(recipe).glob("text-*.safetensors")))
        counts["text_tokens"] = int(sum(len(t) for t in text.ids))
        data = Sequences(data.ids + text.ids, data.feats + text.feats)
    report(f"draft vocabulary: {vocab.n} ids cover {counts['coverage_permille'] / 10:.1f}% of "
           f"{counts['recorded_tokens'] + counts['datastore_tokens']:,} tokens")
    torch.manual_seed(recipe.init_seed)
    head = EagleHead(pair.target, vocab, intermediate_size=recipe.mlp)
    started = None
    if start is not None:
        tensors, _, man = start
        head.load_state_dict(tensors, strict=False)
        started = {"sha256": man["sha256"], "recipe": man["recipe"], "commit": man.get("trained_on", {}).get("commit"),
                   "held_out": man.get("held_out"),
                   **({"started_from": man["started_from"]} if man.get("started_from") else {})}  # every stage before
        report(f"going on from the head {man['sha256'][:12]}… in {start_from}")
    held = Sequences(held.ids[:16], held.feats[:16])  # the held-out score: 16 sequences are enough
    p_of = full_p(pair.target, vocab)
    depth = max(3, recipe.train.unroll)  # a chain's first guesses: the first reads a real feature, the rest guessed ones
    before = acceptance_by_depth(head, held, depth, p_of=p_of)
    ckpt = _checkpoint_path(recipe)
    resume = TrainState(**load_tree(ckpt)) if ckpt.exists() else None
    if resume is not None:
        report(f"resuming from step {resume.step} ({ckpt})")
    progress = bar(total=recipe.train.steps, initial=resume.step if resume else 0, desc="training", unit="step")
    t0 = time.perf_counter()
    losses = train(head, data, recipe.train,
                   lambda step, loss: (progress.update(1), progress.set_postfix(loss=f"{loss:.3f}")),
                   resume=resume, checkpoint=lambda s: _save_checkpoint(ckpt, s), every=25)
    progress.close()
    _round_as_stored(head)
    after = acceptance_by_depth(head, held, depth, p_of=p_of)
    for j, (b, a) in enumerate(zip(before, after)):
        report(f"held-out guess {j + 1} of a chain: sampled acceptance {b[0]:.3f} -> {a[0]:.3f}, "
               f"greedy agreement {b[1]:.3f} -> {a[1]:.3f}")

    def scores(k: int) -> list[list[float]]:  # per guess of a chain: [before, after]
        return [[round(b[k], 4), round(a[k], 4)] for b, a in zip(before, after)]

    return head, {"counts": counts, "train_seconds_this_run": round(time.perf_counter() - t0),
                  "loss_every_10_steps": [round(sum(losses[i:i + 10]) / len(losses[i:i + 10]), 4)
                                          for i in range(0, len(losses), 10)],
                  **({"started_from": started} if started else {}),
                  "held_out": {"sequences": len(held.ids),
                               "sampled_acceptance": [round(before[0][0], 4), round(after[0][0], 4)],
                               "greedy_agreement": [round(before[0][1], 4), round(after[0][1], 4)],
                               "by_guess": {"sampled_acceptance": scores(0), "greedy_agreement": scores(1)}}}


def _round_as_stored(head: EagleHead) -> None:
    """Round the trained tensors to fp16 in place, as the head file stores them: the held-out score then describes the
    head that is shipped, and a later run that goes on from that file scores the same head the same."""
    with torch.no_grad():
        for tensor in head.weights().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(torch.float16))


def _commit() -> str:
    """The code's commit, marked "+changes" where the working tree differs from it (the recipe names what ran)."""
    def git(*args: str) -> str:  # run at the repository root: the pathspec "specviz" below is relative to it
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    try:
        head = git("rev-parse", "HEAD") or "unknown"
        return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no", "--", "specviz") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def train_head(recipe: HeadRecipe, out: Path | None, report: Report, bar: Callable[..., Any],
               start_from: Path | None = None) -> dict[str, Any]:
    """The whole run: record with the target at `record_precision`, then train against the pair's own target; ship.

    start_from: the folder holding the head the recipe goes on from (its `start_sha256`), where it names one."""
    from specviz import models

    t0 = time.perf_counter()
    missing = [cfg for cfg in recordings(recipe) if not is_recorded(recipe, cfg)]
    for cfg in recordings(recipe):
        if cfg not in missing:
            report(f"all {cfg.chunks} recorded chunks are in {data_folder(recipe, cfg)}")
    if missing or recipe.text_tokens:
        report(f"loading {recipe.pair} (target {recipe.record_precision}) to record what it says and reads")
        pair = models.load_pair(recipe.pair, target_precision=recipe.record_precision)
        for cfg in missing:
            record_stage(pair, recipe, report, cfg)
        if recipe.text_tokens:
            text_stage(pair, recipe, report)
        del pair
    report(f"loading {recipe.pair} as the app runs it, to train against its own head rows and embedding")
    pair = models.load_pair(recipe.pair)
    head, record_ = train_stage(pair, recipe, report, bar, start_from)
    extra = {"trained_on": {"commit": _commit(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                            "machine": host.machine_words(),
                            "target_precision": pair.target_precision},
             "seconds": round(time.perf_counter() - t0), **record_}
    man = heads.save(recipe.pair, head, pair.target, recipe.as_dict(), extra, out)
    report(f"wrote {heads.paths(recipe.pair, out)[0]} ({man['bytes'] / 1e6:.1f} MB, sha256 {man['sha256'][:12]}…)")
    return man
