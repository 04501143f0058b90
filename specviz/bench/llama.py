"""llama.cpp beside the bench: find its build in the cache, run it on the pair's own GGUF files, read its figures."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specviz.models.cache import cache_folder
from specviz.models.catalogue import GgufSource, pair_sources
from specviz.models.locate import _verified_gguf, cache_dir

SDIST_VERSION = "0.3.36"  # llama-cpp-python's sdist whose vendor/llama.cpp benchmarks/llama_cpp.py builds
BINARIES = ("llama-bench", "llama-completion", "llama-speculative-simple")
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx")
RUN_TIMEOUT_S = 600  # one llama.cpp run of a few dozen tokens takes seconds; a hung one must not hang the bench


class LlamaError(RuntimeError):
    """A llama.cpp run that failed or printed what we could not read (one line, with the command)."""


def cpu_info() -> dict[str, Any]:
    """The CPU's model name, the flags that pick ggml's kernels, and a hash of all its flags (the build's folder:
    GGML_NATIVE builds for this CPU, so another CPU gets a build of its own)."""
    model, flags = "unknown", set[str]()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    named = {f: f in flags for f in FLAGS if f != "amx"}
    named["amx"] = any(f.startswith("amx") for f in flags)  # amx_tile / amx_int8 / amx_bf16
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return {"model": model, "flags": named, "flags_hash": digest}


def build_root() -> Path:
    """Where benchmarks/llama_cpp.py keeps this CPU's llama.cpp: sources, build and the sdist's changelog."""
    return cache_dir() / "llama.cpp" / f"{SDIST_VERSION}-{cpu_info()['flags_hash']}"


def sdist_commit(root: Path) -> str | None:
    """The llama.cpp commit the sdist's changelog names for this version (the sdist carries no .git)."""
    log = root / "CHANGELOG.md"
    text = log.read_text() if log.is_file() else ""
    section = text.partition(f"## [{SDIST_VERSION}]")[2].split("\n## [", 1)[0]
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
    return found.group(1) if found else None


@dataclass(frozen=True)
class LlamaBuild:
    """A finished build of llama.cpp's three tools for this CPU."""

    bin_dir: Path
    commit: str | None

    @property
    def version(self) -> str:
        return f"llama.cpp@{self.commit or 'unknown'} (llama-cpp-python {SDIST_VERSION} sdist)"

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name)


def find_build() -> LlamaBuild | None:
    """This CPU's build when benchmarks/llama_cpp.py has made it, else None (the bench then leaves llama.cpp out)."""
    root = build_root()
    bin_dir = root / "build" / "bin"
    if not all((bin_dir / b).is_file() for b in BINARIES):
        return None
    return LlamaBuild(bin_dir, sdist_commit(root))


@contextlib.contextmanager
def gguf_path(src: GgufSource) -> Iterator[Path]:
    """The gguf cache's model.gguf when it was built (no 1-2 GB join), else the verified joined parts."""
    cached = cache_folder(src, "gguf") / "model.gguf"
    if cached.is_file():
        yield cached
        return
    with _verified_gguf(src, lambda _f, _msg: None) as path:
        yield path


@contextlib.contextmanager
def pair_files(pair_name: str) -> Iterator[tuple[Path, Path] | None]:
    """(draft, target) GGUF paths of a named pair made of GGUF files; None for any other pair."""
    sources = pair_sources(pair_name)
    if sources is None:
        yield None
        return
    draft_src, target_src = sources
    with gguf_path(draft_src) as draft, gguf_path(target_src) as target:
        yield draft, target


def why_no_peer(pair_name: str) -> str | None:
    """Why the bench cannot run llama.cpp beside a pair (None: it can)."""
    if pair_sources(pair_name) is None:
        return f"{pair_name} is not made of packaged GGUF files"
    if find_build() is None:
        return f"no llama.cpp build for this CPU in {build_root()} (make it: python benchmarks/llama_cpp.py, ~4 min)"
    return None


# ---------------------------------------------------------------------------------------------
# one run and what it printed


@dataclass(frozen=True)
class LlamaRun:
    """One llama.cpp generation: its text and llama.cpp's own timers (model load excluded)."""

    text: str  # the generated text only (the prompt and llama.cpp's end marker removed)
    n_tokens: int  # tokens generated, as llama.cpp counts them
    prefill_ms: float  # the prompt's pass
    decode_ms: float  # everything after it (speculative: drafting, checking and sampling too)
    n_drafted: int | None = None  # speculative only
    n_accepted: int | None = None

    @property
    def ms_per_token(self) -> float:
        """(prefill + decode) / tokens: the bench's definition for every method."""
        return (self.prefill_ms + self.decode_ms) / max(1, self.n_tokens)

    @property
    def acceptance(self) -> float | None:
        """accepted ÷ drafted, as llama-speculative-simple reports it."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None


def _common_args(threads: int, tokens: int) -> list[str]:
    # greedy (temperature 0 is argmax in llama.cpp), every thread setting named
    return ["-t", str(threads), "-tb", str(threads), "-n", str(tokens), "--temp", "0", "--seed", "0"]


def completion_command(build: LlamaBuild, model: Path, prompt: str, tokens: int, threads: int,
                       ubatch: int | None = None) -> list[str]:
    """llama-completion, greedy, the prompt as raw text; `ubatch` 1 reads the prompt one token at a time."""
    # no conversation template (raw text continued), no warm-up pass (its timers start at the prompt anyway)
    cmd = [build.tool("llama-completion"), "-m", str(model), "-p", prompt, "-no-cnv", "--no-display-prompt",
           "--simple-io", "--no-warmup", *_common_args(threads, tokens)]
    return cmd + (["-ub", str(ubatch), "-b", str(max(ubatch, 1))] if ubatch else [])


def speculative_command(build: LlamaBuild, target: Path, draft: Path, prompt: str, tokens: int, gamma: int,
                        threads: int) -> list[str]:
    """llama-speculative-simple on the pair, greedy, drafting up to gamma tokens a round."""
    return [build.tool("llama-speculative-simple"), "-m", str(target), "-md", str(draft), "-p", prompt,
            "--spec-type", "draft-simple", "--spec-draft-n-max", str(gamma), "--spec-draft-n-min", "0", "-td", str(threads), "-tbd", str(threads),
            *_common_args(threads, tokens)]


_FLOAT = r"([0-9]+(?:\.[0-9]+)?)"


def _number(pattern: str, text: str, what: str) -> float:
    found = re.search(pattern, text)
    if not found:
        raise LlamaError(f"llama.cpp's output has no {what}")
    return float(found.group(1))


def parse_completion(stdout: str, stderr: str) -> LlamaRun:
    """llama-completion's text (stdout) and its perf lines (stderr): prompt eval, eval and sampling time."""
    # it prints the generation, " [end of text]\n" where it met the end token, then "\n\n"
    text = stdout.removesuffix("\n\n").removesuffix(" [end of text]\n")
    prompt_ms = _number(rf"prompt eval time =\s*{_FLOAT} ms", stderr, "prompt eval time")
    eval_ms = _number(rf"(?<!prompt )eval time =\s*{_FLOAT} ms", stderr, "eval time")
    runs = int(_number(r"(?<!prompt )eval time =\s*[0-9.]+ ms /\s*([0-9]+) runs", stderr, "eval runs"))
    sampling_ms = _number(rf"sampling time =\s*{_FLOAT} ms", stderr, "sampling time")
    n_tokens = runs + 1 if text else 0  # the first token is sampled from the prompt's pass, each further one after a run
    return LlamaRun(text=text, n_tokens=n_tokens, prefill_ms=prompt_ms, decode_ms=eval_ms + sampling_ms)


def parse_speculative(stdout: str, stderr: str, prompt: str) -> LlamaRun:
    """llama-speculative-simple's text (stdout: the prompt's pieces, then the generation) and its summary lines."""
    # it prints "\n\n", the prompt's pieces, the generation, then "\n\n" twice (its summary goes to stderr)
    body = stdout.removeprefix("\n\n").removesuffix("\n\n\n\n")
    if not body.startswith(prompt):
        raise LlamaError("llama-speculative-simple did not echo the prompt first; cannot separate its text")
    enc_s = _number(rf"encoded\s+[0-9]+ tokens in\s*{_FLOAT} seconds", stderr, "encode time")
    dec_s = _number(rf"decoded\s+[0-9]+ tokens in\s*{_FLOAT} seconds", stderr, "decode time")
    return LlamaRun(
        text=body[len(prompt):],
        n_tokens=int(_number(r"decoded\s+([0-9]+) tokens", stderr, "decoded tokens")),
        prefill_ms=enc_s * 1000.0, decode_ms=dec_s * 1000.0,
        n_drafted=int(_number(r"n_drafted\s*=\s*([0-9]+)", stderr, "n_drafted")),
        n_accepted=int(_number(r"n_accept\s*=\s*([0-9]+)", stderr, "n_accept")),
    )


def _run(cmd: Sequence[str]) -> tuple[str, str]:
    done = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise LlamaError(f"{Path(cmd[0]).name} exited {done.returncode}: {tail}")
    return done.stdout, done.stderr


def run_plain(build: LlamaBuild, model: Path, prompt: str, tokens: int, threads: int,
              ubatch: int | None = None) -> LlamaRun:
    """One greedy llama-completion run."""
    return parse_completion(*_run(completion_command(build, model, prompt, tokens, threads, ubatch)))


def run_speculative(build: LlamaBuild, target: Path, draft: Path, prompt: str, tokens: int, gamma: int,
                    threads: int) -> LlamaRun:
    """One greedy llama-speculative-simple run (it may make a few tokens past `tokens`: its last round's)."""
    stdout, stderr = _run(speculative_command(build, target, draft, prompt, tokens, gamma, threads))
    return parse_speculative(stdout, stderr, prompt)


def bench_records(build: LlamaBuild, model: Path, threads: int, rows: Sequence[int], tokens: int, depth: int = 0,
                  repetitions: int = 5) -> list[dict]:
    """llama-bench's JSON records: one pass over each number of rows (pp) and `tokens` one-row steps (tg), each on a
    cache already holding `depth` tokens, `repetitions` times."""
    cmd = [build.tool("llama-bench"), "-m", str(model), "-t", str(threads), "-p", ",".join(map(str, rows)),
           "-n", str(tokens), "-d", str(depth), "-r", str(repetitions), "-o", "json"]
    return json.loads(_run(cmd)[0])


def pass_ms(record: dict[str, Any]) -> tuple[float, float]:
    """(mean, sd) ms of one pass: a pp record times one pass over n_prompt rows, a tg record n_gen 1-row passes."""
    passes = max(1, record["n_gen"])  # mean of times, not of tokens/s: an outlier must show, not be averaged away
    return round(record["avg_ns"] / 1e6 / passes, 2), round(record["stddev_ns"] / 1e6 / passes, 2)


def pass_costs(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"pass_ms": {rows: (mean, sd)}, "tg_ms": (mean, sd) | None} from llama-bench's records."""
    pp = {r["n_prompt"]: pass_ms(r) for r in records if r["n_gen"] == 0}
    tg = [pass_ms(r) for r in records if r["n_gen"] > 0]
    return {"pass_ms": pp, "tg_ms": tg[0] if tg else None}


@dataclass(frozen=True)
class LlamaPeer:
    """llama.cpp ready to run beside a pair: its build, the pair's two files, our thread count."""

    build: LlamaBuild
    draft: Path
    target: Path
    threads: int

    def generate(self, prompt: str, tokens: int, gamma: int | None = None) -> LlamaRun:
        """A plain greedy run, or with gamma a speculative one drafting up to gamma tokens a round."""
        if gamma is None:
            return run_plain(self.build, self.target, prompt, tokens, self.threads)
        return run_speculative(self.build, self.target, self.draft, prompt, tokens, gamma, self.threads)


@contextlib.contextmanager
def peer_for(pair_name: str, threads: int) -> Iterator[LlamaPeer | None]:
    """llama.cpp beside a named GGUF pair for the block's duration (None when why_no_peer says it cannot be)."""
    build = find_build()
    if build is None or pair_sources(pair_name) is None:
        yield None
        return
    with pair_files(pair_name) as files:
        assert files is not None
        yield LlamaPeer(build, files[0], files[1], threads)
