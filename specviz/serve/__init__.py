"""Serving many runs at once: the batched executor (passes of many runs in one forward, exact per run), its load-time check, and the server's worker."""
