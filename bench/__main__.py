import sys

if __name__ == "__main__":  # not when a generator process (multiprocessing spawn) imports it
    if "--vs-triton" in sys.argv[1:]:  # the side-by-side mode: python -m bench --vs-triton [its options]
        from bench.side_by_side import main as side_by_side

        sys.exit(side_by_side([a for a in sys.argv[1:] if a != "--vs-triton"]))
    from bench.cli import main

    sys.exit(main())
