"""Every Python code block of the Python GT's README (`data/gt_readme.md`, copied from the
project's seeds) runs unmodified, each in a fresh interpreter. A block that uses names the
README leaves to the reader (`w`, `model`, `X_train`, `input_size`, ...) gets them from a
prelude; the README's YAML block is its `config.yaml`; the "Distributed Setup" block runs
against the server and worker its bash blocks start."""

import pathlib
import re
import subprocess
import sys
import time

import pytest

from conftest import run_python

README = (pathlib.Path(__file__).parent / "data" / "gt_readme.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
YAML = re.findall(r"```yaml\n(.*?)```", README, re.S)[0]

# What each block leaves to the reader, by a phrase of the block.
PRELUDES = {
    "x = gt.randn(100, 64)  # Sharded": """
import os
os.environ['GT_CONFIG'] = 'config.yaml'
import gt
gt.gpu_workers(4)
w = gt.randn(64, 32)
def model(x):
    return (x @ w).relu().mean()
input = gt.randn(100, 64, requires_grad=True)
""",
    "for epoch in range(100)": """
import gt
X_train = gt.randn(64, 784)
y_train = gt.randn(64, 10)
""",
    "class MyModel(Module)": """
import gt
input_size, hidden_size, output_size = 8, 16, 4
model = gt.nn.Linear(input_size, output_size)
""",
    "gt.from_numpy(np.array(...)": """
import gt
import numpy
class _Numpy:
    # The README's `np.array(...)` stands for the reader's data.
    def __getattr__(self, name):
        return getattr(numpy, name)
    def array(self, data, *args, **kwargs):
        return numpy.ones((3, 4), numpy.float32) if data is Ellipsis else numpy.array(data, *args, **kwargs)
np = _Numpy()
""",
    "gt.load_config('sharding.yaml')": """
import gt
gt.gpu_workers(2)
open('sharding.yaml', 'w').write('layer1:\\n  shard:\\n    axis: 0\\n    workers: [0, 1]\\n')
""",
}


def test_the_readme_has_the_blocks_this_test_knows():
    assert len(BLOCKS) == 10
    for phrase in PRELUDES:
        assert any(phrase in b for b in BLOCKS), phrase


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path):
    block = BLOCKS[index]
    (tmp_path / "config.yaml").write_text(YAML)
    prelude = "".join(p for phrase, p in PRELUDES.items() if phrase in block)
    server = []
    if "gt.connect('localhost:12345')" in block:
        # The README's bash blocks: `python -m gt.server -p 12345`, then a worker.
        server.append(subprocess.Popen([sys.executable, "-m", "gt.server", "-p", "12345"], stdout=subprocess.DEVNULL))
        time.sleep(1.0)
        server.append(subprocess.Popen([sys.executable, "-m", "gt.worker", "--host", "localhost", "-p", "12345"], stdout=subprocess.DEVNULL))
        time.sleep(1.0)
    try:
        r = run_python(prelude + block, cwd=tmp_path, timeout=300)
    finally:
        for p in reversed(server):
            p.terminate()
            p.wait(timeout=30)
    assert r.returncode == 0, f"block {index}:\n{block}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def test_our_readme_python_blocks_run(tmp_path):
    ours = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", ours, re.S)
    assert blocks
    for block in blocks:
        r = run_python(block, cwd=tmp_path, timeout=300)
        assert r.returncode == 0, f"{block}\nstderr:\n{r.stderr}"
