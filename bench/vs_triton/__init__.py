"""seqserve against Triton, side by side (``python -m bench.vs_triton``, ``python -m bench --vs-triton``)."""
