"""Where a process's memory goes: its resident size at each step of a load and a run, and a loaded pair's parts by form.

Why: the app promises a teacher's 8 GB laptop that the default pair starts and runs within a bound. A bound alone
says *that* it grew; this says *what* grew: the target's linears, the draft's, the embeddings mapped from the
cache (only the rows a run touched are resident), Python with torch and transformers, and the peak of the child
process that builds a cache from GGUF. `generate --json` and `prepare --json` carry it; the laptop test prints it.
"""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

MIB = 1 << 20


def _status() -> dict[str, int]:
    """VmRSS and VmHWM of this process in bytes ({} off Linux)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def rss() -> int:
    return _status().get("VmRSS", 0)


def peak() -> int:
    """This process's peak resident size so far (VmHWM), in bytes."""
    return _status().get("VmHWM", 0)


def children_peak() -> int:
    """The largest peak resident size of any child process this one has waited for (a cache build), in bytes."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def mapped_resident(folder: Path) -> dict[str, int]:
    """Bytes resident now of each file under `folder` mapped into this process (the embeddings' touched rows), by
    the file's path inside the folder."""
    found: dict[str, int] = {}
    prefix, current = str(folder.resolve()), None
    try:
        with open("/proc/self/smaps") as fh:
            for line in fh:
                head = line.split()
                if not head:
                    continue
                if "-" in head[0] and len(head) >= 5:  # a mapping's first line: its path is the last field, if any
                    current = head[-1] if len(head) >= 6 and head[-1].startswith(prefix) else None
                elif current is not None and head[0] == "Rss:":
                    name = current[len(prefix):].lstrip("/")
                    found[name] = found.get(name, 0) + int(head[1]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


@dataclass(frozen=True)
class Phase:
    """The process's memory right after one step of a load or a run."""

    step: str
    rss: int  # bytes resident then
    peak: int  # the process's peak so far


@dataclass
class Recorder:
    """Records a Phase at each progress message of a load (wrap the load's progress callback) and at named steps."""

    phases: list[Phase] = field(default_factory=list)

    def mark(self, step: str) -> None:
        s = _status()
        self.phases.append(Phase(step, s.get("VmRSS", 0), s.get("VmHWM", 0)))

    def progress(self, inner: Callable[[float, str], None] | None = None) -> Callable[[float, str], None]:
        """A load progress callback that records a phase per message, then passes it on."""
        def report(fraction: float, message: str) -> None:
            self.mark(message)
            if inner is not None:
                inner(fraction, message)
        return report


def pair_parts(pair: Any) -> dict[str, int]:
    """A loaded pair's resident bytes by part: each model's linears in their form, its other tensors, and the rows
    of its embedding that are resident from the cache file it is mapped from."""
    from specviz.models.locate import cache_dir

    from specviz.models.cached import FileRows

    parts: dict[str, int] = {}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        linears, other, mapped = _model_parts(model)
        parts[f"{role} linears ({getattr(pair, f'{role}_kernel', '') or 'as loaded'})"] = linears
        parts[f"{role} norms, biases and other tensors"] = other
        emb = model.get_input_embeddings()
        if isinstance(emb, FileRows):
            size = emb.num_embeddings * emb.embedding_dim * 4
            parts[f"{role} embedding ({size / MIB:.0f} MiB in the cache file, read row by row: none resident)"] = 0
        elif mapped:
            parts[f"{role} embedding ({mapped / MIB:.0f} MiB, mapped from the cache: its touched pages below)"] = 0
    for name, size in mapped_resident(cache_dir()).items():
        parts[f"resident from {name}"] = size
    return parts


def _model_parts(model: Any) -> tuple[int, int, int]:
    """(bytes held by its linears in their kernels' forms, bytes of its other in-memory tensors, bytes of tensors
    mapped from files, of which only touched pages are resident)."""
    import torch

    from specviz.models import half, int8w, packed

    linears = half.half_bytes(model) + int8w.int8w_bytes(model) + packed.packed_bytes(model)
    linears += sum(m.in_features * m.out_features + 4 * m.out_features
                   for m in model.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear))
    seen: set[int] = set()
    other = mapped = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        size = t.numel() * t.element_size()
        if t.is_cpu and not t.untyped_storage().resizable():  # a tensor over a file mapping (models.cached)
            mapped += size
        else:
            other += size
    return linears, other, mapped


@dataclass(frozen=True)
class Footprint:
    """One process's memory: its peak, each recorded step, the pair's parts, and what a cache build's child peaked at."""

    peak: int
    phases: tuple[Phase, ...]
    parts: dict[str, int]
    base: int  # resident before the pair was loaded: Python, torch, transformers
    build_peak: int  # the largest child process's peak (a cache built from GGUF), 0 if none ran

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak, "build_peak_bytes": self.build_peak, "base_bytes": self.base,
                "parts_bytes": dict(self.parts), "phases": [asdict(p) for p in self.phases]}

    def lines(self) -> list[str]:
        """The breakdown as text: what a failing bound prints."""
        out = [f"peak {self.peak / 1e9:.3f} GB (this process), cache build's child peak {self.build_peak / 1e9:.3f} GB",
               f"  before loading (Python, torch, transformers): {self.base / MIB:.0f} MiB"]
        out += [f"  {name}: {size / MIB:.0f} MiB" for name, size in self.parts.items()]
        out += ["  steps (resident / peak so far, MiB):"]
        out += [f"    {p.rss / MIB:6.0f} / {p.peak / MIB:6.0f}  {p.step}" for p in self.phases]
        return out


def footprint(recorder: Recorder, parts: dict[str, int], base: int) -> Footprint:
    """The process's footprint now: its peak, the steps the recorder saw, a pair's parts (pair_parts), what was
    resident before it loaded, and the largest child process's peak."""
    return Footprint(peak(), tuple(recorder.phases), parts, base, children_peak())
