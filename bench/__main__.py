"""``python -m bench``: two command lines behind one entry point.

- ``python -m bench [options]``: the load generator (:mod:`bench.loadgen.cli`).
- ``python -m bench --vs-triton [options]``: seqserve against Triton, side by side
  (:mod:`bench.vs_triton.side_by_side`, also ``python -m bench.vs_triton``). ``--vs-triton`` may
  stand anywhere among the arguments; it is removed before the side-by-side parser sees them.

The imports are inside :func:`main`: a generator process (multiprocessing spawn) re-imports this
module as ``__mp_main__`` and must not pay for either command line.
"""

import sys

VS_TRITON = "--vs-triton"


def main(argv: list[str]) -> int:
    if VS_TRITON in argv:
        from bench.vs_triton.side_by_side import main as side_by_side

        return side_by_side([a for a in argv if a != VS_TRITON])
    from bench.loadgen.cli import main as load_generator

    return load_generator(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
