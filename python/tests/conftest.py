"""Shared helpers: scripts run in fresh interpreters (gt starts once per process), and
`python -m gt.server` / `gt.worker` processes on a free port."""

import os
import socket
import subprocess
import sys
import time

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_python(code, cwd=None, env=None, timeout=120):
    """Runs `code` in a new interpreter; gives the completed process (stdout, stderr, code)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout
    )


class Cluster:
    """A `python -m gt.server` with `python -m gt.worker` processes."""

    def __init__(self, workers=1, server_args=(), env=None):
        self.port = free_port()
        e = dict(os.environ)
        e.update(env or {})
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "gt.server", "-p", str(self.port), *server_args],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
            )
        ]
        self._wait_for(self.procs[0], "listening")
        for i in range(workers):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gt.worker", "--host", "localhost", "-p", str(self.port), "--id", f"w{i}"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                )
            )
        time.sleep(1.0)

    @staticmethod
    def _wait_for(proc, word, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = proc.stdout.readline()
            if word in line:
                return
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
        raise RuntimeError("server did not start")

    @property
    def address(self):
        return f"localhost:{self.port}"

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def cluster():
    c = Cluster(workers=2)
    yield c
    c.stop()
