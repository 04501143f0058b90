"""Whether a loaded model gives each run's rows the same bits whatever else shares its pass: measured once per model, up to the largest pass the executor forms.

The executor only packs runs into one forward where this holds for the target (the draft may
differ in its last bits: that changes which guesses are accepted, never the output). Two checks,
both on the model itself: every distinct linear shape at pass sizes from 1 to `max_rows`, row by
row against the same rows scored alone, and whole passes of several runs' rows against each run
alone. A model that fails either is served one run per forward, and says why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz.core.forward import forward
from specviz.core.kv import CachedLM

MAX_ROWS = 128  # the most rows one target forward packs: 8 runs' verify passes of 16 tokens
# pass sizes checked per linear shape: small ones (a step, a chain, a tree) densely, then up to MAX_ROWS
_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 24, 25, 32, 33, 48, 64, 65, 96, 127, 128)


@dataclass(frozen=True)
class Exactness:
    """What the check found for one model."""

    exact: bool  # every row's result independent of what shares its pass, up to max_rows
    max_rows: int  # the largest pass checked (the executor never packs more)
    reason: str  # one line: what was checked, or what failed


_lock = threading.Lock()
_found: weakref.WeakKeyDictionary[torch.nn.Module, Exactness] = weakref.WeakKeyDictionary()


def batch_exactness(model: torch.nn.Module, max_rows: int = MAX_ROWS, remember: str | None = None) -> Exactness:
    """The check's verdict for this model, measured on first use (9 s for the Qwen 1.5B target on rowgemm here, 29 s
    on fbgemm on an AVX2 EPYC) and then remembered in this process; with `remember` (a `verdict_key`), also in the
    cache folder, so that a later start of the same model, code and machine reads it instead of measuring again."""
    with _lock:
        found = _found.get(model)
        if found is None or found.max_rows < max_rows:
            found = _read_verdict(remember, max_rows) if remember else None
            if found is None:
                found = _check(model, max_rows)
                if remember:
                    _write_verdict(remember, found)
            _found[model] = found
        return found


# what decides the verdict besides the weights: the code of the pass and of the kernels, read as text
_CODE = ("core/forward.py", "core/lean.py", "serve/exact.py", "models/half.py", "models/rowgemm.py", "models/rowgemm.c",
         "models/packed.py")


def verdict_key(*parts: str) -> str:
    """A key for a remembered verdict: the given parts (the pair, its precision and kernels), this machine's CPU, torch
    and transformers' versions, and the source of every file that decides a row's bits."""
    import platform

    import transformers

    root = Path(__file__).resolve().parents[1]
    code = hashlib.sha256(b"".join((root / f).read_bytes() for f in _CODE)).hexdigest()
    try:
        cpu = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        cpu = platform.processor()
    text = "\n".join([*parts, cpu, platform.machine(), torch.__version__, transformers.__version__, code])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _verdict_path(key: str) -> Path:
    from specviz.models.locate import cache_dir

    return cache_dir() / "exactness" / f"{key}.json"


def _read_verdict(key: str, max_rows: int) -> Exactness | None:
    try:
        d = json.loads(_verdict_path(key).read_text())
        found = Exactness(bool(d["exact"]), int(d["max_rows"]), str(d["reason"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if found.max_rows < max_rows:
        return None
    return Exactness(found.exact, found.max_rows, found.reason + " (the verdict this machine found for the same model "
                     "and code at an earlier start)")


def _write_verdict(key: str, found: Exactness) -> None:
    path = _verdict_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(f".{os.getpid()}.part")
        part.write_text(json.dumps(dataclasses.asdict(found)))
        os.replace(part, path)
    except OSError:  # a read-only cache: measured again at the next start
        pass


def _linear_shapes(model: torch.nn.Module) -> dict[tuple[int, int], torch.nn.Module]:
    """One layer of each distinct (in, out) linear shape (plain, packed or fp16-weight: anything with in/out_features)."""
    found: dict[tuple[int, int], torch.nn.Module] = {}
    for m in model.modules():
        shape = (getattr(m, "in_features", None), getattr(m, "out_features", None))
        if None not in shape and not any(True for _ in m.children()):
            found.setdefault(shape, m)  # type: ignore[arg-type]
    return found


def _layer_rows_agree(layer: torch.nn.Module, counts: tuple[int, ...], gen: torch.Generator, device: torch.device) -> bool:
    """Each row of passes of every size in `counts` equals the same row scored alone, bit for bit."""
    weight = getattr(layer, "weight", None)
    dtype = getattr(layer, "dtype", None) or (weight.dtype if isinstance(weight, torch.Tensor) else torch.float32)
    rows = torch.randn(1, max(counts), layer.in_features, generator=gen).to(device=device, dtype=dtype)
    alone = torch.cat([layer(rows[:, i : i + 1]) for i in range(max(counts))], dim=1)  # (1, max, out)
    return all(torch.equal(layer(rows[:, s : s + n]), alone[:, s : s + n]) for n in counts for s in (0, max(counts) - n))


def _passes_agree(model: torch.nn.Module, gen: torch.Generator) -> bool:
    """Four runs' passes (a step, verify passes of a chain and a tree's size, a prompt with no cache yet) packed in one forward equal each run alone:
    their logits, and the hidden states two of them ask for.

    Besides the linears this catches row-wise layers whose result depends on where a row sits in the
    pass (an activation whose rows do not start on a vector boundary computes some of them another way).
    """
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (9, 23, 40, 11)]
    wanted = (1, 5, 17, 11)

    layers = (0, model.config.num_hidden_layers // 2, -1)  # what a drafter may read: embeddings, a middle layer, the last

    def feeds() -> list:
        lms = [CachedLM(model) for _ in prompts]
        for lm, p, k in zip(lms[:3], prompts, wanted):
            lm.prefill(p[: len(p) - k - 2])  # the first three have a cache, the last starts empty
        # runs that ask for hidden states share passes with runs that do not (the second and the last ask)
        return [lm.feed(p, k, layers if i % 2 else ()) for i, (lm, p, k) in enumerate(zip(lms, prompts, wanted))]

    alone = [forward(model, [f])[0] for f in feeds()]
    packed = forward(model, feeds())
    return all(torch.equal(a.logits, b.logits) and len(a.hidden) == len(b.hidden)
               and all(torch.equal(x, y) for x, y in zip(a.hidden, b.hidden)) for a, b in zip(alone, packed))


@torch.inference_mode()
def _check(model: torch.nn.Module, max_rows: int) -> Exactness:
    device = getattr(model, "device", torch.device("cpu"))
    counts = tuple(n for n in _COUNTS if n <= max_rows) + ((max_rows,) if max_rows not in _COUNTS else ())
    gen = torch.Generator().manual_seed(0)
    for shape, layer in _linear_shapes(model).items():
        if not _layer_rows_agree(layer, counts, gen, device):
            return Exactness(False, max_rows, f"its {shape[0]}->{shape[1]} linears give a row other bits in passes of "
                                              f"other sizes here, so runs are served one per forward")
    if not _passes_agree(model, gen):
        return Exactness(False, max_rows, "a pass shared by several runs gave one of them other bits than its own pass, "
                                          "so runs are served one per forward")
    return Exactness(True, max_rows, f"every linear shape checked at passes of 1-{max_rows} rows and a whole pass of four "
                                     "runs against each alone (logits and hidden states): the same bits")
