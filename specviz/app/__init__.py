"""Streamlit glue: shell (every page's frame), sidebar (settings <-> URL), pairs, prompt, jobs (one submit/poll/show), watch_state (the Watch page's state and tick)."""
