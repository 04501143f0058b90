"""Serving many runs at once: the batched executor (passes of many runs in one forward, exact per run) and its load-time check."""
