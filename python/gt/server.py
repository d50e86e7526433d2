"""`python -m gt.server`: a gt dispatcher, with the Python GT's flags (`gt server`'s code)."""

from ._cli import server as main

if __name__ == "__main__":
    main()
