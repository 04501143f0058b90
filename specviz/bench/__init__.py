"""The side-by-side benchmark (ours vs transformers vs plain decoding) and the classroom load test."""
