"""`python -m gt.scripts visualize|top|trace ...`."""

from .._cli import scripts

if __name__ == "__main__":
    scripts()
