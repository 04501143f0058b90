"""Streamlit glue: shell (every page's frame), sidebar (settings <-> URL), pairs, prompt, jobs (one submit/poll/show), runner."""
