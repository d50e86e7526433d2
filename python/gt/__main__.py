"""`python -m gt server|worker ...` (the Python GT's entry), and any other `gt` subcommand."""

import sys

from ._cli import run, server, worker

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["server"]:
        server(args[1:])
    elif args[:1] == ["worker"]:
        worker(args[1:])
    else:
        run(args)
