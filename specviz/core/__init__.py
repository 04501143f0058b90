"""The engine: the acceptance rule, KV caches, drafters, the round loop, adaptive γ and the metrics (no Streamlit)."""
