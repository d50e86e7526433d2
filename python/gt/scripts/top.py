"""`python -m gt.scripts.top`: `gt top`'s code, with its flags."""

import sys

from .._cli import run

if __name__ == "__main__":
    run(["top", *sys.argv[1:]])
