import sys

from bench.vs_triton.side_by_side import main

if __name__ == "__main__":
    sys.exit(main())
