"""seqserve benchmarks: the load generator (``python -m bench``), the side-by-side run against
Triton (``bench.vs_triton``), scale-out (``bench.scaleout``), floor servers (``bench.floors``) and
in-process studies (``bench.studies``). Start at bench/README.md."""
