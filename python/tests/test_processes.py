"""gt across processes: `gt.connect` to `python -m gt.server` with `python -m gt.worker`
processes, the tools (`python -m gt.scripts`), auto-start settings, and failures (a dead
dispatcher, interpreter exit with live tensors and threads)."""

import os
import signal
import subprocess
import sys
import time

from conftest import Cluster, run_python


def test_connect_to_a_server_with_worker_processes(cluster):
    r = run_python(f"""
import gt, numpy as np
gt.connect({cluster.address!r})
a = gt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
print((a @ a.T).numpy().tolist())
stats = gt.debug.get_worker_stats()
print(sorted(stats))
try:
    gt.connect({cluster.address!r})
except RuntimeError as e:
    print("again:", e)
""")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[[5.0, 14.0], [14.0, 50.0]]"
    assert lines[1] == "['w0', 'w1']"
    assert lines[2].startswith("again: connect: gt already started")


def test_signals_shard_over_worker_processes(cluster, tmp_path):
    (tmp_path / "config.yaml").write_text("split:\n  shard:\n    axis: 0\n    workers: [0, 1]\n")
    r = run_python(f"""
import gt, numpy as np
gt.connect({cluster.address!r})
w = gt.tensor(np.eye(4, dtype=np.float32) * 2)
with gt.signal.context('split'):
    x = gt.tensor(np.arange(32, dtype=np.float32).reshape(8, 4))
    y = x @ w
print(np.array_equal(y.numpy(), np.arange(32, dtype=np.float32).reshape(8, 4) * 2))
ops = {{name: s['ops'] for name, s in gt.debug.get_worker_stats().items()}}
print(all('matmul' in o for o in ops.values()))
""", env={"GT_CONFIG": str(tmp_path / "config.yaml")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"], r.stdout


def test_a_dead_dispatcher_is_an_error_not_a_hang():
    c = Cluster(workers=1)
    try:
        code = f"""
import gt, os, signal
gt.connect({c.address!r})
a = gt.ones(3)
print(a.sum().item(), flush=True)
os.kill({c.procs[0].pid}, signal.SIGKILL)
try:
    b = a * 2
    b.numpy()
except RuntimeError as e:
    print("error:", type(e).__name__, e)
"""
        r = run_python(code, env={"GT_CONNECT_TIMEOUT": "2"}, timeout=90)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == "3.0"
        assert r.stdout.splitlines()[1].startswith("error: GtError"), r.stdout
    finally:
        c.stop()


def test_exit_with_live_tensors_and_threads_is_clean():
    r = run_python("""
import threading, gt
keep = [gt.randn(64, 64) for _ in range(5)]
def work():
    mine = [gt.randn(32, 32) @ gt.randn(32, 32) for _ in range(20)]
    mine[-1].numpy()
    hold.append(mine)
hold = []
ts = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
stray = threading.Thread(target=lambda: [gt.ones(2) for _ in range(1000)], daemon=True)
stray.start()
print("done", flush=True)
""", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"
    assert "panicked" not in r.stderr and "Segmentation" not in r.stderr


def test_settings_reach_the_auto_started_cluster(tmp_path):
    log = tmp_path / "ops.log"
    r = run_python("""
import gt
gt.gpu_workers(3)
a = gt.randn(4, 4)
print(len(gt.debug.get_worker_stats()))
try:
    gt.gpu_workers(2)
except RuntimeError as e:
    print("late:", e)
""", env={"GT_INSTRUCTION_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "3"
    assert r.stdout.splitlines()[1].startswith("late: gpu_workers: gt already started")
    assert "randn" in log.read_text()
    # The tools read the log the Python way.
    out = tmp_path / "timeline.png"
    v = subprocess.run([sys.executable, "-m", "gt.scripts", "visualize", str(log), "-o", str(out)], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    v = subprocess.run([sys.executable, "-m", "gt.scripts", str(log), "--output", str(tmp_path / "t2.png")], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr


def test_bad_settings_and_configs_raise_with_gt_messages(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("layer1:\n  shard:\n    axis: x\n")
    r = run_python("""
import gt
try:
    gt.ones(2)
except RuntimeError as e:
    print(type(e).__name__, e)
""", env={"GT_CONFIG": str(bad)})
    assert r.returncode == 0, r.stderr
    assert "GtError" in r.stdout and "bad.yaml:3" in r.stdout and "layer1.shard.axis" in r.stdout
    r = run_python(f"""
import gt
try:
    gt.load_config({str(bad)!r})
except ValueError as e:
    print("value:", e)
try:
    gt.load_config('missing.yaml')
except FileNotFoundError as e:
    print("missing:", e)
try:
    gt.gpu_workers(0)
except ValueError as e:
    print("zero:", e)
""")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("value:") and "layer1.shard.axis" in out[0]
    assert out[1].startswith("missing:") and out[2].startswith("zero:")
    r = run_python("import gt; gt.ones(2)", env={"GT_WORKERS": "many"})
    assert r.returncode != 0 and "GT_WORKERS" in r.stderr and "Traceback" in r.stderr


def test_the_commands_take_the_python_gt_flags():
    for module in ["gt.server", "gt.worker"]:
        r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "-p PORT" in r.stdout
    r = subprocess.run([sys.executable, "-m", "gt.worker", "--backend", "jax"], capture_output=True, text=True)
    assert r.returncode == 2 and "jax" in r.stderr
    r = subprocess.run([sys.executable, "-m", "gt.scripts", "trace", "-s", "0.2", "--port", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "no dispatcher on port 1" in r.stderr
    r = subprocess.run([sys.executable, "-m", "gt", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("gt ")


def test_connect_to_the_gt_binarys_server_and_workers():
    """`gt server` and `gt worker` (the binary, when built) serve a Python client too."""
    import pathlib

    import pytest

    gt_bin = pathlib.Path(__file__).parents[2] / "target" / "release" / "gt"
    if not gt_bin.exists():
        pytest.skip(f"{gt_bin} is not built (cargo build --release --bin gt)")
    from conftest import free_port

    port = free_port()
    server = subprocess.Popen([str(gt_bin), "server", "-p", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in server.stdout.readline()
        worker = subprocess.Popen([str(gt_bin), "worker", "-p", str(port)], stdout=subprocess.DEVNULL)
        time.sleep(1.0)
        r = run_python(f"import gt; gt.connect('localhost:{port}'); print(gt.arange(4).sum().item())")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "6"
        worker.terminate()
        worker.wait(timeout=10)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_tensors_after_shutdown_raise():
    r = run_python("""
import gt
a = gt.ones(2)
gt._shutdown()
for f in (lambda: a.numpy(), lambda: a + 1, lambda: gt.ones(2)):
    try:
        f()
        print("no error")
    except RuntimeError as e:
        print(type(e).__name__, e)
""")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all(l.startswith("GtError") for l in lines), r.stdout
    assert "shut down" in lines[0] and "shut down" in lines[2]
