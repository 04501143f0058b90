#!/usr/bin/env bash
# The whole test set-up and run on a fresh Debian machine; idempotent (safe to run again).
#   bash tests/run.sh                     # every test
#   bash tests/run.sh tests/test_cli.py   # one file (any pytest arguments pass through)
#   bash tests/run.sh -m "not real"       # skip the tests that load real model weights
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# 1. the virtual environment: the app's lock and the test tools' lock on top, resolved as any host
#    resolves them (see the top of requirements.txt); installed again only when a lock changes
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.specviz-requirements.sha256
want="$(cat requirements.txt tests/requirements.txt assets/torch-cpu.html | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    .venv/bin/pip install -qq -r tests/requirements.txt
    echo "$want" > "$stamp"
fi

# 2. a browser for the real-browser test: Debian's chromium (Playwright's own download is not used)
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq chromium
    else
        echo "tests/run.sh: /usr/bin/chromium is missing; install it as root: apt-get install -y chromium" >&2
        echo "tests/run.sh: (the real-browser test needs it)" >&2
    fi
fi

# 3. the tests: the whole tests/ folder unless the arguments name a file or folder themselves
targets=(tests)
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then
        targets=()
        break
    fi
done

# 4. the whole suite runs on two workers (pytest-xdist) where there are two CPUs: much of it waits on a browser,
#    a server or a child process, and one worker left a 2-core machine 30 % idle. Each worker's torch gets half the
#    CPUs, so that the two workers' thread pools together match the machine. tests/conftest.py keeps every test that
#    holds the default pair on one worker. SPECVIZ_TEST_WORKERS=1 runs it in one process; a file named runs alone.
cpus="$(nproc 2>/dev/null || echo 1)"
workers="${SPECVIZ_TEST_WORKERS:-$([ "${#targets[@]}" -gt 0 ] && [ "$cpus" -ge 2 ] && echo 2 || echo 1)}"
parallel=()
if [ "$workers" -gt 1 ]; then
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cpus / workers > 0 ? cpus / workers : 1 ))}"
    parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
fi
exec .venv/bin/python -m pytest "${targets[@]}" -q -p no:cacheprovider --timeout=1800 "${parallel[@]}" "$@"
