"""`python -m gt.scripts.trace`: `gt trace`'s code, with its flags."""

import sys

from .._cli import run

if __name__ == "__main__":
    run(["trace", *sys.argv[1:]])
