"""Each Python thread has its own connection: threads issue ops at once, a read releases
the GIL, and a tensor used on another thread is an exception, not a crash."""

import threading

import numpy as np
import pytest

import gt


def test_threads_compute_independently():
    results, errors = {}, []

    def work(k):
        try:
            a = gt.full((16, 16), float(k))
            total = 0.0
            for _ in range(50):
                a = a + 1
            total = a.sum().item()
            results[k] = total
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    assert results == {k: 256.0 * (k + 50) for k in range(6)}


def test_a_read_releases_the_gil():
    started, done = threading.Event(), threading.Event()
    out = {}

    def reader():
        a = gt.randn(1200, 1200)
        b = a @ a @ a
        started.set()
        out["shape"] = b.numpy().shape
        done.set()

    t = threading.Thread(target=reader)
    t.start()
    started.wait()
    spins = 0
    while not done.is_set():
        spins += 1
    t.join()
    assert out["shape"] == (1200, 1200)
    # While the reader waited in Rust, this thread kept running Python.
    assert spins > 1000, spins


def test_a_tensor_from_another_thread_raises():
    made = {}
    t = threading.Thread(target=lambda: made.setdefault("t", gt.ones(2)))
    t.start()
    t.join()
    with pytest.raises(RuntimeError, match="another thread"):
        made["t"] + 1
    with pytest.raises(RuntimeError, match="another thread"):
        made["t"].shape
    del made["t"]
    np.testing.assert_array_equal(gt.ones(2).numpy(), [1, 1])
