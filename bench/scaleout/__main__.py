import sys

from bench.scaleout.run import main

if __name__ == "__main__":
    sys.exit(main())
