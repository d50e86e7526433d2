"""`python -m gt.scripts.visualize`: `gt visualize`'s code, with its flags."""

import sys

from .._cli import run

if __name__ == "__main__":
    run(["visualize", *sys.argv[1:]])
