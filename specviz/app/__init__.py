"""Streamlit glue: the shell around every page, the sidebar (settings <-> URL), the model worker and its jobs."""
