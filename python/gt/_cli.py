"""The Python GT's command lines on gt's own: each maps its flags onto the `gt` binary's
subcommand, run by the same library code (`gt::cli`) inside this interpreter."""

import argparse
import os
import sys

from . import _gt


def run(argv):
    """Runs `gt ARGV...`; exits with its code."""
    sys.exit(_gt._cli(["gt", *argv]))


def server(argv=None):
    """`python -m gt.server -p PORT [-H HOST] [--spawn_gpu_workers N] [--log-file F]`."""
    p = argparse.ArgumentParser(
        prog="python -m gt.server",
        description="Run a gt dispatcher (clients and `python -m gt.worker` workers join it). "
        "Other flags are passed to `gt server` (see `gt server --help`).",
    )
    p.add_argument("-p", "--port", type=int, default=9000)
    p.add_argument("-H", "--host", default="127.0.0.1", help="127.0.0.1: this machine; 0.0.0.0 needs --key or --insecure")
    p.add_argument("--spawn_gpu_workers", "--spawn-gpu-workers", type=int, default=0, help="worker threads to start inside")
    p.add_argument("--log-file", help="the instruction log (as GT_INSTRUCTION_LOG)")
    p.add_argument("--no-console-log", action="store_true", help="accepted for the Python GT's scripts (gt never logs to the console)")
    args, rest = p.parse_known_args(argv)
    if args.log_file:
        os.environ["GT_INSTRUCTION_LOG"] = args.log_file
    run(["server", "-p", str(args.port), "--host", args.host, "--workers", str(args.spawn_gpu_workers), *rest])


def worker(argv=None):
    """`python -m gt.worker [--host HOST] -p PORT [--id ID] [--backend numpy|pytorch|cpu|cuda]`."""
    p = argparse.ArgumentParser(
        prog="python -m gt.worker",
        description="Run a gt worker for the dispatcher at HOST:PORT. Other flags are passed to "
        "`gt worker` (see `gt worker --help`).",
    )
    p.add_argument("--host", default="localhost")
    p.add_argument("-p", "--port", type=int, default=9000)
    p.add_argument("--id", help="the worker's name in logs and statistics")
    p.add_argument("--backend", default="cpu", help="cpu (also: numpy, pytorch, the Python GT's CPU engines) or cuda")
    args, rest = p.parse_known_args(argv)
    backends = {"cpu": "cpu", "numpy": "cpu", "pytorch": "cpu", "cuda": "cuda"}
    if args.backend not in backends:
        p.error(f"--backend {args.backend}: gt's workers run cpu (numpy and pytorch name it too) or cuda")
    cmd = ["worker", "--host", args.host, "-p", str(args.port), "--backend", backends[args.backend]]
    if args.id:
        cmd += ["--name", args.id]
    run(cmd + rest)


def scripts(argv=None):
    """`python -m gt.scripts visualize|top|trace|perfetto ...` (a `*.log` path: visualize)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].endswith(".log"):
        argv = ["visualize", *argv]
    if not argv or argv[0] not in ("visualize", "top", "trace", "perfetto", "prof"):
        print("usage: python -m gt.scripts {visualize,top,trace,perfetto,prof} ...  (or: python -m gt.scripts FILE.log)", file=sys.stderr)
        sys.exit(2)
    run(argv)
