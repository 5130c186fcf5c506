import sys

from bench.cli import main

if __name__ == "__main__":  # not when a generator process (multiprocessing spawn) imports it
    sys.exit(main())
