"""Autograd and `gt.nn` against hand-computed gradients and NumPy; an MLP that learns."""

import numpy as np
import pytest

import gt
from gt.nn import SGD, Adam, Linear, Module


def test_gradients_match_hand_computation():
    a_np = np.array([[1.0, -2.0], [3.0, 0.5]], dtype=np.float32)
    b_np = np.array([[0.5, 1.0], [-1.0, 2.0]], dtype=np.float32)
    a = gt.tensor(a_np, requires_grad=True)
    b = gt.from_numpy(b_np, requires_grad=True)
    loss = ((a @ b).relu() * 2).sum() + (a * a).mean()
    loss.backward()
    mask = (a_np @ b_np) > 0
    ga = (2 * mask) @ b_np.T + 2 * a_np / a_np.size
    gb = a_np.T @ (2 * mask)
    np.testing.assert_allclose(a.grad.numpy(), ga, rtol=1e-5)
    np.testing.assert_allclose(b.grad.data.numpy(), gb, rtol=1e-5)


def test_grads_accumulate_like_pytorch_and_reset():
    x = gt.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6, 6])
    x.grad = None
    assert x.grad is None


def test_slices_and_splits_carry_gradients():
    x = gt.tensor(np.arange(6, dtype=np.float32), requires_grad=True)
    first, second = x.split(3)
    (first.sum() * 2 + x[4] * 5 + second[-1]).backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 2, 2, 0, 5, 1])


def test_no_grad_and_requires_grad():
    x = gt.ones(2, requires_grad=True)
    with gt.no_grad():
        y = x * 2
        assert not gt.is_grad_enabled()
    assert gt.is_grad_enabled()
    assert not y.requires_grad

    @gt.no_grad()
    def f(t):
        return t * 3

    assert not f(x).requires_grad
    z = gt.ones(2).requires_grad_()
    assert z.requires_grad and z.is_leaf
    with pytest.raises(ValueError, match="requires"):
        gt.ones(2).sum().backward()


def test_tape():
    a = gt.randn(3, 3, requires_grad=True)
    b = gt.randn(3, 3, requires_grad=True)
    loss = (a + b).sum()
    tape = gt.debug.get_tape()
    assert [e["grad_fn"] for e in tape][-2:] == ["add", "sum"]
    assert tape[-1]["input_ids"] == [tape[-2]["output_id"]]
    assert tape[-2]["output_shape"] == [3, 3]
    del loss


def test_print_tape(capsys):
    a = gt.randn(2, 2, requires_grad=True)
    loss = (a * 2).sum()
    gt.debug.print_tape()
    out = capsys.readouterr().out
    assert out.startswith("Autograd Tape (") and "mul" in out
    del loss


class MLP(Module):
    def __init__(self):
        super().__init__()
        self.fc1 = Linear(8, 32)
        self.fc2 = Linear(32, 1)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


def test_module_parameters_are_recursive():
    m = MLP()
    assert len(m.parameters()) == 4
    assert [n for n, _ in m.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert m.fc1.weight.shape == (8, 32)
    x = gt.randn(4, 8)
    m(x).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    # A reassigned attribute stops being a parameter or a submodule.
    extra = MLP()
    extra.fc2 = None
    assert len(extra.parameters()) == 2 and len(extra.children()) == 1
    state = m.state_dict()
    m2 = MLP()
    m2.load_state_dict(state)
    np.testing.assert_allclose(m2(x).numpy(), m(x).numpy(), rtol=1e-5)


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_mlp_learns_a_regression(opt):
    rng = np.random.default_rng(0)
    X_np = rng.standard_normal((64, 8)).astype(np.float32)
    y_np = (X_np @ rng.standard_normal((8, 1))).astype(np.float32)
    X, y = gt.tensor(X_np), gt.tensor(y_np)
    gt.manual_seed(1)
    model = MLP()
    optimizer = SGD(model.parameters(), lr=0.05) if opt == "sgd" else Adam(model.parameters(), lr=0.01)
    first = None
    for _ in range(150):
        loss = ((model(X) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        first = first if first is not None else loss.item()
    final = gt.nn.mse_loss(model(X), y).item()
    # The stated bar: the MSE falls below 5% of where it started.
    assert final < 0.05 * first, (first, final)


def test_classifier_with_cross_entropy():
    rng = np.random.default_rng(2)
    X_np = rng.standard_normal((90, 4)).astype(np.float32)
    labels = (X_np[:, 0] > 0).astype(np.int64) + (X_np[:, 1] > 0)
    X = gt.tensor(X_np)
    model = gt.nn.Sequential(Linear(4, 16), gt.nn.ReLU(), Linear(16, 3))
    opt = Adam(model.parameters(), lr=0.05)
    for _ in range(100):
        loss = gt.nn.cross_entropy(model(X), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    accuracy = (model(X).numpy().argmax(1) == labels).mean()
    assert accuracy > 0.9
    assert gt.nn.cross_entropy(model(X), gt.tensor(labels)).item() == pytest.approx(loss.item(), rel=0.2)


def test_python_gt_style_update_of_a_parameter():
    w = gt.tensor([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    w -= 0.5 * w.grad
    np.testing.assert_allclose(w.numpy(), [0.0, 0.0])
    assert w.requires_grad and w.is_leaf


def test_bf16_autocast_via_signal_config():
    gt.register_config("half_layer", gt.SignalConfig(dtype=gt.bfloat16))
    a = gt.randn(4, 4)
    with gt.signal.context("half_layer"):
        y = a @ a
    assert y.dtype == "bfloat16"
    np.testing.assert_allclose(y.numpy(), a.numpy() @ a.numpy(), rtol=0.05, atol=0.1)


def test_autocast_runs_products_in_half_precision_with_float32_master_weights():
    a = gt.randn(8, 16)
    w = gt.randn(16, 4, requires_grad=True)
    with gt.autocast(gt.bfloat16):
        y = a @ w
        assert y.dtype == gt.bfloat16
        # Reductions run in float32; an inner block turns autocast off.
        assert y.sum().dtype == gt.float32
        with gt.autocast(enabled=False):
            assert (a @ w).dtype == gt.float32
        loss = (y * y).mean()
    assert (a @ w).dtype == gt.float32
    loss.backward()
    # The parameter and its gradient stay float32 (the cast carries the gradient back).
    assert w.dtype == gt.float32 and w.grad.dtype == gt.float32
    want = 2 * a.numpy().T @ (a.numpy() @ w.numpy()) / (8 * 4)
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=0.05, atol=0.05)
    np.testing.assert_allclose(y.numpy(), a.numpy() @ w.numpy(), rtol=0.02, atol=0.1)


def test_autocast_spellings_and_refusals():
    a = gt.randn(4, 4)
    # PyTorch's form: a device type picks PyTorch's default dtype.
    with gt.autocast("cuda"):
        assert (a @ a).dtype == gt.float16
    with gt.autocast("cpu", dtype=gt.float16):
        assert (a @ a).dtype == gt.float16
    with gt.autocast():
        assert (a + a).dtype == gt.bfloat16

    @gt.autocast(gt.float16)
    def product(x):
        return x @ x

    assert product(a).dtype == gt.float16
    assert (a @ a).dtype == gt.float32
    # A dtype autocast cannot take is refused where the block is made.
    for bad in [gt.int32, gt.float64]:
        with pytest.raises(gt.GtValueError, match="autocast: takes bfloat16, float16 or float32"):
            gt.autocast(bad)
    with pytest.raises(gt.GtValueError, match="not int64"):
        gt.autocast("cuda", dtype=gt.int64)
    with pytest.raises(ValueError, match="device_type 'tpu'"):
        gt.autocast("tpu")


def test_an_mlp_trained_under_autocast_reaches_the_float32_loss():
    def train(dtype):
        gt.manual_seed(3)
        x = gt.randn(64, 32)
        t = (x[:, :4] > 0).to(gt.float32)
        model = gt.nn.Sequential(gt.nn.Linear(32, 64), gt.nn.ReLU(), gt.nn.Linear(64, 4))
        opt = gt.nn.SGD(model.parameters(), lr=0.1)
        for _ in range(30):
            with gt.autocast(dtype):
                loss = gt.nn.mse_loss(model(x).to(gt.float32), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert all(p.dtype == gt.float32 for p in model.parameters())
        return loss.item()

    full, half = train(gt.float32), train(gt.bfloat16)
    assert abs(half - full) <= 0.05 * full + 1e-3, (half, full)


def test_tensor_of_a_tensor_is_a_copy_outside_the_graph():
    a = gt.tensor([2.0], requires_grad=True)
    b = gt.tensor(a)
    assert not b.requires_grad and b.is_leaf
    (b * 3).sum()  # records nothing
    c = gt.tensor(a, requires_grad=True)
    assert c.is_leaf and c.requires_grad
    (c * 3).sum().backward()
    assert a.grad is None and c.grad.tolist() == [3.0]
    d = gt.tensor(a * 2, dtype=gt.float64)
    assert d.dtype == gt.float64 and not d.requires_grad and d.tolist() == [4.0]


def test_no_grad_decorates_generators_and_works_without_parentheses():
    x = gt.ones(2, requires_grad=True)

    @gt.no_grad
    def bare(t):
        return t * 3

    assert not bare(x).requires_grad and bare.__name__ == "bare"

    @gt.no_grad()
    def steps(t):
        got = yield t * 2, gt.is_grad_enabled()
        yield t * got, gt.is_grad_enabled()
        return "done"

    g = steps(x)
    y, enabled = next(g)
    assert not y.requires_grad and not enabled
    assert gt.is_grad_enabled()  # not between resumes
    z = x * 2
    assert z.requires_grad
    y, enabled = g.send(5)
    assert not y.requires_grad and not enabled and y.tolist() == [5.0, 5.0]
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done"
    assert gt.is_grad_enabled()

    @gt.no_grad
    def forever():
        while True:
            yield gt.is_grad_enabled()

    g = forever()
    assert next(g) is False
    g.close()
    assert gt.is_grad_enabled()


def test_misuse_messages_speak_python():
    x = gt.ones(2, requires_grad=True)
    y = x * 2
    t = gt.ones(2)
    with pytest.raises(ValueError) as e:
        t += y
    assert "`x = x + y`" in str(e.value) and "`with gt.no_grad():`" in str(e.value)
    assert "&" not in str(e.value) and "::" not in str(e.value)
    with pytest.raises(ValueError) as e:
        y += 1
    assert "`with gt.no_grad():`" in str(e.value) and "::" not in str(e.value)
    with pytest.raises(ValueError) as e:
        y.backward()
    assert "backward(gradient)" in str(e.value) and "backward_with" not in str(e.value)


def test_gelu_is_exact_by_default_and_layer_norm_takes_a_shape():
    # PyTorch's values: F.gelu(x) and F.gelu(x, approximate="tanh").
    x = gt.tensor([-2.0, -0.5, 0.0, 1.0, 3.0])
    exact = [-0.04550027847290039, -0.1542687714099884, 0.0, 0.8413447141647339, 2.9959497451782227]
    tanh = [-0.04540228843688965, -0.1542859971523285, 0.0, 0.8411920070648193, 2.9963626861572266]
    assert np.allclose(gt.nn.GELU()(x).numpy(), exact, atol=1e-6)
    assert np.allclose(gt.nn.gelu(x, "tanh").numpy(), tanh, atol=1e-6)
    with pytest.raises(ValueError, match="approximate"):
        gt.nn.gelu(x, "fast")
    # PyTorch's LayerNorm((2, 3)) normalizes over both axes.
    y = gt.nn.LayerNorm((2, 3))(gt.tensor([[[1.0, 2.0, 4.0], [0.0, 0.0, 1.0]]]))
    want = [-0.24253494, 0.48507005, 1.94027996, -0.97013992, -0.97013992, -0.24253494]
    assert np.allclose(y.numpy().ravel(), want, atol=1e-5)
    with pytest.raises(ValueError, match=r"LayerNorm: .*\[4\].*\[1, 2, 3\]"):
        gt.nn.LayerNorm(4)(gt.ones(1, 2, 3))


def test_assigning_data_updates_the_tensor_outside_the_graph():
    w = gt.tensor([1.0, 2.0], requires_grad=True)
    w.data -= 0.5
    assert w.tolist() == [0.5, 1.5] and w.requires_grad and w.is_leaf
    w.data = gt.tensor([3.0, 4.0])
    assert w.tolist() == [3.0, 4.0]
    with pytest.raises(ValueError):
        w.data = gt.tensor([1, 2, 3])
