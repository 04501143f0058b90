"""Build llama.cpp from llama-cpp-python's sdist and time the default pair's passes with llama-bench."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
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

from specviz.bench.llama import (  # noqa: E402  (the bench finds and runs the same build)
    BINARIES as TARGETS, FLAGS, SDIST_VERSION, LlamaBuild, LlamaError, bench_records, build_root, cpu_info, gguf_path, pass_ms,
    sdist_commit,
)
from specviz.models.catalogue import QWEN_05B, QWEN_15B  # noqa: E402

LOCK = Path("/tmp/specviz-heavy.lock")  # machine-wide: a test suite timing itself must not share the cores with us
PP_ROWS = (1, 2, 4, 5, 8, 16)  # verify-pass widths: a draft of k tokens makes the target check k+1 rows
N_GEN = 32
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
    root = build_root()
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "build" / "bin" / "llama-bench").is_file():
        find_tools()  # fail before the 75 MB download when the build could not run anyway
    try:
        fetch_sources(root)
        commit = sdist_commit(root)
        bin_dir, build_s = build(root, commit)
        # the join (2 GB of disk traffic) is inside the lock too: it would slow a suite timing itself
        with heavy_lock("llama-bench runs"), gguf_path(QWEN_15B) as target, gguf_path(QWEN_05B) as draft:
            build_ = LlamaBuild(bin_dir, commit)
            note(f"running llama-bench on {target} and {draft}")
            raw_target = bench_records(build_, target, args.threads, PP_ROWS, N_GEN)
            raw_draft = bench_records(build_, draft, args.threads, (0,), N_GEN)  # tg only: c needs no pp
    except subprocess.CalledProcessError as e:
        print(f"llama_cpp.py: command failed ({e.returncode}): {' '.join(map(str, e.cmd))}", file=sys.stderr)
        return 1
    except LlamaError as e:
        print(f"llama_cpp.py: {e}", file=sys.stderr)
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
