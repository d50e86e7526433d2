"""`python -m gt.worker`: a gt worker, with the Python GT's flags (`gt worker`'s code)."""

from ._cli import worker as main

if __name__ == "__main__":
    main()
