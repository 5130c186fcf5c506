"""seqserve benchmarks: engine micro-benchmarks (``python -m bench.engine_bench``) and load tools."""
