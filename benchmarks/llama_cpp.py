"""Build llama.cpp from llama-cpp-python's sdist and time the default pair's passes with llama-bench."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from anywhere: specviz is beside us

from specviz.models.cache import cache_folder  # noqa: E402
from specviz.models.catalogue import QWEN_05B, QWEN_15B, GgufSource  # noqa: E402
from specviz.models.locate import _verified_gguf, cache_dir  # noqa: E402

SDIST_VERSION = "0.3.36"
LOCK = Path("/tmp/specviz-heavy.lock")  # machine-wide: a test suite timing itself must not share the cores with us
TARGETS = ("llama-bench", "llama-completion", "llama-speculative-simple")
PP_ROWS = (1, 2, 4, 5, 8, 16)  # verify-pass widths: a draft of k tokens makes the target check k+1 rows
N_GEN = 32
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx")
# LLAMA_CURL is only a deprecation warning in this llama.cpp; LLAMA_OPENSSL is the switch that would link a
# TLS library (model downloads), and server/tests/app are not needed, so they stay off to shorten the build.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_APP=OFF",
)

HELP = f"""\
Steps:
  1. Build llama.cpp from the sources vendored in PyPI's llama-cpp-python=={SDIST_VERSION} sdist (fetched
     with `pip download`; nothing else is read from the network) into
     <cache>/llama.cpp/{SDIST_VERSION}-<hash of the CPU flags>/build, where <cache> is $SPECVIZ_CACHE, else
     ~/.cache/specviz. Targets: {", ".join(TARGETS)};
     Release, GGML_NATIVE=ON, static. Skipped when the binaries are already there. Needs cmake and a
     C++ compiler (exit 2 when missing).
  2. Find the default pair's GGUF files (target {QWEN_15B.title}, draft {QWEN_05B.title}): the gguf
     cache's model.gguf when built, else the PyPI part packages joined and sha256-checked (a joined
     temporary copy is deleted afterwards).
  3. Run `llama-bench -m TARGET -t N -p {",".join(map(str, PP_ROWS))} -n {N_GEN} -o json` and
     `llama-bench -m DRAFT -t N -p 0 -n {N_GEN} -o json` (5 repetitions each, llama-bench's default) and print
     the target's pass time in ms for {", ".join(map(str, PP_ROWS))} rows, its ms per generated token, the
     draft's ms per generated token, and the CPU model and its flags ({", ".join(FLAGS)}).

The build and the benchmark runs hold the machine-wide lock {LOCK} (they wait for it).
Progress goes to stderr, the table to stdout. Errors: bad arguments or no cmake/compiler exit 2.
--json PATH also writes the table, the raw llama-bench records, CPU, threads and llama.cpp version/commit.
"""


def note(message: str) -> None:
    """A progress line on stderr, so stdout carries only the table."""
    print(f"[llama_cpp] {message}", file=sys.stderr, flush=True)


class ArgParser(argparse.ArgumentParser):
    """Argument errors as one line and exit 2 (argparse's default prints the whole usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"llama_cpp.py: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: --threads and --json."""
    parser = ArgParser(description=__doc__, epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="threads for every llama-bench run (default 2)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write everything as JSON to PATH")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: folder {args.json.parent} does not exist")
    return args


@contextlib.contextmanager
def heavy_lock(what: str) -> Iterator[None]:
    """Hold the machine-wide lock for CPU-heavy work; say so when another job holds it."""
    with open(LOCK, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            note(f"waiting for {LOCK} ({what})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cpu_info() -> dict[str, Any]:
    """The CPU's model name, the flags that pick ggml's kernels, and a hash of all its flags."""
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


def find_tools() -> None:
    """Exit 2 with one line when cmake or a C++ compiler is missing."""
    missing = [name for name, alts in (("cmake", ("cmake",)), ("a C++ compiler", ("c++", "g++", "clang++")))
               if not any(shutil.which(a) for a in alts)]
    if missing:
        print(f"llama_cpp.py: {' and '.join(missing)} not found (e.g. apt-get install cmake g++)", file=sys.stderr)
        sys.exit(2)


def fetch_sources(root: Path) -> Path:
    """Download the sdist through pip and unpack its vendor/llama.cpp (and CHANGELOG) into root/src."""
    src = root / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    with tempfile.TemporaryDirectory(prefix="llama-sdist-") as tmp:
        note(f"downloading llama-cpp-python=={SDIST_VERSION} sdist with pip")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        f"llama-cpp-python=={SDIST_VERSION}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("*.tar.gz"))
        stem = sdist.name[: -len(".tar.gz")]
        note(f"unpacking {sdist.name}")
        with tarfile.open(sdist) as tar:
            keep = [m for m in tar.getmembers()
                    if m.name.startswith(f"{stem}/vendor/llama.cpp/") or m.name == f"{stem}/CHANGELOG.md"]
            tar.extractall(tmp, members=keep, filter="data")
        shutil.rmtree(src, ignore_errors=True)
        shutil.move(Path(tmp) / stem / "vendor" / "llama.cpp", src)
        shutil.copy(Path(tmp) / stem / "CHANGELOG.md", root / "CHANGELOG.md")
    return src


def sdist_commit(root: Path) -> str | None:
    """The llama.cpp commit the sdist's changelog names for this version (the sdist carries no .git)."""
    log = root / "CHANGELOG.md"
    text = log.read_text() if log.is_file() else ""
    section = text.partition(f"## [{SDIST_VERSION}]")[2].split("\n## [", 1)[0]
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
    return found.group(1) if found else None


def available_targets(src: Path) -> list[str]:
    """The wanted targets this llama.cpp defines (a later version may rename one); llama-bench is required."""
    defined = set()
    for cmake_file in src.rglob("CMakeLists.txt"):
        defined.update(re.findall(r"set\(TARGET\s+([\w-]+)\)", cmake_file.read_text(errors="ignore")))
    present = [t for t in TARGETS if t in defined]
    for t in TARGETS:
        if t not in defined:
            note(f"{t} is not a target of this llama.cpp: skipped")
    if "llama-bench" not in present:
        print("llama_cpp.py: this llama.cpp has no llama-bench target", file=sys.stderr)
        sys.exit(2)
    return present


def logged(cmd: list[str], sink: Any, log: Path) -> None:
    """Run cmd with its output in the log; on failure show the log's last lines, then raise."""
    done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sink.flush()
        print("\n".join(log.read_text(errors="replace").splitlines()[-25:]), file=sys.stderr)
        raise subprocess.CalledProcessError(done.returncode, cmd)


def build(root: Path, commit: str | None) -> tuple[Path, float | None]:
    """Configure and build the targets under the lock; (bin folder, seconds, None when it was already built)."""
    src, build_dir = root / "src", root / "build"
    targets = available_targets(src)
    bin_dir = build_dir / "bin"
    if all((bin_dir / t).is_file() for t in targets):
        note(f"already built: {bin_dir}")
        return bin_dir, None
    find_tools()
    extra = [f"-DLLAMA_BUILD_COMMIT={commit}"] if commit else []  # else llama-bench reports "unknown"
    jobs = str(len(os.sched_getaffinity(0)))  # every core we may use: the lock keeps others off
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "build.log"  # gcc's AVX-512 warnings run to 30,000 lines: kept out of the terminal
    with heavy_lock("cmake build"), open(log, "w") as sink:
        started = time.monotonic()
        note(f"configuring in {build_dir} (log: {log})")
        logged(["cmake", "-S", str(src), "-B", str(build_dir), *CMAKE_OPTIONS, *extra], sink, log)
        note(f"building {', '.join(targets)} with {jobs} jobs (minutes)")
        logged(["cmake", "--build", str(build_dir), "--config", "Release", "-j", jobs, "--target", *targets],
               sink, log)
        seconds = time.monotonic() - started
    note(f"built in {seconds:.0f} s")
    return bin_dir, seconds


@contextlib.contextmanager
def gguf_path(src: GgufSource) -> Iterator[Path]:
    """The gguf cache's model.gguf when it was built (no 1-2 GB join), else the verified joined parts."""
    cached = cache_folder(src, "gguf") / "model.gguf"
    if cached.is_file():
        yield cached
        return
    with _verified_gguf(src, lambda _f, msg: note(msg)) as path:
        yield path


def llama_bench(bench: Path, model: Path, threads: int, prompts: str) -> list[dict[str, Any]]:
    """llama-bench's JSON records for one model (its log goes to stderr, the JSON to stdout)."""
    cmd = [str(bench), "-m", str(model), "-t", str(threads), "-p", prompts, "-n", str(N_GEN), "-o", "json"]
    note("running " + " ".join(cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    return json.loads(out)


def pass_ms(record: dict[str, Any]) -> tuple[float, float]:
    """(mean, sd) ms of one pass: a pp record times one pass over n_prompt rows, a tg record n_gen 1-row passes."""
    passes = max(1, record["n_gen"])  # mean of times, not of tokens/s: an outlier must show, not be averaged away
    return round(record["avg_ns"] / 1e6 / passes, 2), round(record["stddev_ns"] / 1e6 / passes, 2)


def summarise(target: list[dict[str, Any]], draft: list[dict[str, Any]]) -> dict[str, Any]:
    """The table's numbers as [mean ms, sd ms]: target pass by rows, target and draft ms per generated token."""
    pp = {r["n_prompt"]: pass_ms(r) for r in target if r["n_gen"] == 0}
    tg = [pass_ms(r) for r in target if r["n_gen"] > 0]
    dtg = [pass_ms(r) for r in draft if r["n_gen"] > 0]
    return {"target_pass_ms": pp, "target_tg_ms": tg[0] if tg else None, "draft_tg_ms": dtg[0] if dtg else None}


def print_table(summary: dict[str, Any], cpu: dict[str, Any], threads: int, version: str) -> None:
    """The human-readable result on stdout."""
    flags = " ".join(f"{name}={'yes' if on else 'no'}" for name, on in cpu["flags"].items())
    print(f"CPU: {cpu['model']}  ({flags})")
    print(f"{version}, {threads} threads")
    rows = [(f"{QWEN_15B.title} pass", n, t) for n, t in summary["target_pass_ms"].items()]
    rows += [(f"{QWEN_15B.title} tg", 1, summary["target_tg_ms"]), (f"{QWEN_05B.title} tg", 1, summary["draft_tg_ms"])]
    print(f"{'model':<26}{'rows':>5}{'ms':>10}{'± sd':>9}")
    for name, n, timing in rows:
        if timing is not None:
            print(f"{name:<26}{n:>5}{timing[0]:>10.2f}{timing[1]:>9.2f}")
    tg, dtg = summary["target_tg_ms"], summary["draft_tg_ms"]
    if tg and dtg:
        print(f"draft/target cost ratio c = {dtg[0] / tg[0]:.3f}")


def main(argv: list[str] | None = None) -> int:
    """Build, locate, benchmark, report."""
    args = parse_args(argv)
    cpu = cpu_info()
    root = cache_dir() / "llama.cpp" / f"{SDIST_VERSION}-{cpu['flags_hash']}"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "build" / "bin" / "llama-bench").is_file():
        find_tools()  # fail before the 75 MB download when the build could not run anyway
    try:
        fetch_sources(root)
        commit = sdist_commit(root)
        bin_dir, build_s = build(root, commit)
        # the join (2 GB of disk traffic) is inside the lock too: it would slow a suite timing itself
        with heavy_lock("llama-bench runs"), gguf_path(QWEN_15B) as target, gguf_path(QWEN_05B) as draft:
            raw_target = llama_bench(bin_dir / "llama-bench", target, args.threads, ",".join(map(str, PP_ROWS)))
            raw_draft = llama_bench(bin_dir / "llama-bench", draft, args.threads, "0")  # tg only: c needs no pp
    except subprocess.CalledProcessError as e:
        print(f"llama_cpp.py: command failed ({e.returncode}): {' '.join(map(str, e.cmd))}", file=sys.stderr)
        return 1
    summary = summarise(raw_target, raw_draft)
    version = f"llama.cpp@{commit or 'unknown'} (llama-cpp-python {SDIST_VERSION} sdist)"
    print_table(summary, cpu, args.threads, version)
    if args.json:
        record = {"cpu": cpu, "threads": args.threads, "llama_cpp": {"sdist": f"llama-cpp-python=={SDIST_VERSION}",
                  "commit": commit, "bin": str(bin_dir), "build_seconds": build_s},
                  "target": QWEN_15B.title, "draft": QWEN_05B.title, **summary,
                  "raw": {"target": raw_target, "draft": raw_draft}}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        note(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
