"""The Tensor API against NumPy: creation, dtypes, operators, reductions, shapes, indexing."""

import numpy as np
import pytest

import gt


def close(t, expected, tol=1e-5):
    got = t.numpy() if isinstance(t, gt.Tensor) else np.asarray(t)
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def test_creation_and_dtypes():
    assert gt.tensor([1, 2, 3]).dtype == gt.int64
    assert gt.tensor([1.0, 2.0]).dtype == gt.float32
    assert gt.tensor([True, False]).dtype == gt.bool
    assert gt.tensor([1, 2], dtype=gt.float32).dtype == "float32"
    assert gt.tensor(np.arange(4, dtype=np.float64)).dtype == gt.float64
    assert gt.tensor(np.arange(4, dtype=np.int32)).dtype == gt.int32
    assert gt.tensor(np.arange(4, dtype=np.uint8)).dtype == gt.int32
    assert gt.tensor(np.ones(2, dtype=np.float16)).dtype == gt.float16
    assert gt.tensor([1.5, 2.5], dtype=gt.bfloat16).numpy().dtype == np.float32
    assert gt.tensor(3.5).shape == ()
    assert gt.zeros(2, 3).shape == (2, 3)
    assert gt.ones((2, 3)).numpy().sum() == 6
    assert gt.randn(4, 5).shape == (4, 5)
    assert gt.zeros(2, dtype=gt.int32).dtype == "int32"
    assert gt.full((2, 2), 7).numpy().tolist() == [[7, 7], [7, 7]]
    close(gt.arange(5), np.arange(5))
    close(gt.arange(0, 1, 0.25), np.arange(0, 1, 0.25))
    r = gt.randn(1000, dtype=gt.float32).numpy()
    assert abs(r.mean()) < 0.2 and 0.8 < r.std() < 1.2


def test_from_numpy_round_trip_every_dtype():
    for dtype in [np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_]:
        a = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
        t = gt.from_numpy(a)
        back = t.numpy()
        assert back.dtype == a.dtype
        np.testing.assert_array_equal(back, a)


def test_non_contiguous_and_foreign_arrays_are_converted():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(gt.from_numpy(a.T).numpy(), a.T)
    np.testing.assert_array_equal(gt.from_numpy(a[::2, 1::3]).numpy(), a[::2, 1::3])
    big_endian = np.arange(5, dtype=">f4")
    np.testing.assert_array_equal(gt.from_numpy(big_endian).numpy(), np.arange(5, dtype=np.float32))
    with pytest.raises(TypeError, match="complex"):
        gt.tensor(np.ones(2, dtype=np.complex64))
    with pytest.raises(TypeError, match="uint64"):
        gt.tensor(np.ones(2, dtype=np.uint64))
    with pytest.raises(TypeError):
        gt.tensor(["a", "b"])
    with pytest.raises(TypeError, match="from_numpy"):
        gt.from_numpy([1, 2])


def test_operators_match_numpy():
    a_np = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    b_np = np.random.default_rng(1).standard_normal((4,)).astype(np.float32)
    a, b = gt.tensor(a_np), gt.tensor(b_np)
    close(a + b, a_np + b_np)
    close(a - b, a_np - b_np)
    close(a * b, a_np * b_np)
    close(a / (b * b + 1), a_np / (b_np * b_np + 1))
    close(2 + a, 2 + a_np)
    close(2 - a, 2 - a_np)
    close(2 * a, 2 * a_np)
    close(1 / (a * a + 1), 1 / (a_np * a_np + 1))
    close(a**2, a_np**2)
    close(abs(a) ** 0.5, np.abs(a_np) ** 0.5)
    close(-a, -a_np)
    close(a @ gt.tensor(a_np.T), a_np @ a_np.T, 1e-4)
    close(np.ones((3, 4), dtype=np.float32) + a, 1 + a_np)
    assert (a > 0).dtype == "bool"
    np.testing.assert_array_equal((a > 0).numpy(), a_np > 0)
    np.testing.assert_array_equal((a <= b).numpy(), a_np <= b_np)
    np.testing.assert_array_equal((a == a).numpy(), np.ones((3, 4), bool))
    np.testing.assert_array_equal((a != 0).numpy(), a_np != 0)
    close(gt.where(a > 0, a, 0.0), np.where(a_np > 0, a_np, 0))


def test_elementwise_functions():
    x_np = np.linspace(0.1, 2, 7, dtype=np.float32)
    x = gt.tensor(x_np)
    close(x.exp(), np.exp(x_np), 1e-4)
    close(x.log(), np.log(x_np), 1e-5)
    close(x.sqrt(), np.sqrt(x_np))
    close(x.relu(), np.maximum(x_np, 0))
    close(x.sigmoid(), 1 / (1 + np.exp(-x_np)), 1e-5)
    close(x.tanh(), np.tanh(x_np), 1e-5)
    close(x.maximum(1.0), np.maximum(x_np, 1))
    close(x.softmax(0), np.exp(x_np) / np.exp(x_np).sum(), 1e-5)


def test_reductions():
    a_np = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = gt.tensor(a_np)
    assert a.sum().shape == ()
    close(a.sum(), a_np.sum())
    close(a.sum(axis=1), a_np.sum(axis=1))
    close(a.sum(1, keepdims=True), a_np.sum(1, keepdims=True))
    close(a.sum(dim=-1, keepdim=True), a_np.sum(-1, keepdims=True))
    close(a.sum(axis=(0, 2)), a_np.sum(axis=(0, 2)))
    close(a.mean(axis=0), a_np.mean(axis=0))
    close(a.max(axis=2), a_np.max(axis=2))
    close(a.min(), a_np.min())
    close(a.max(keepdims=True), a_np.max(keepdims=True))
    assert gt.tensor([1, 2, 3]).sum().dtype == "int64"
    with pytest.raises(ValueError, match="mean"):
        gt.tensor([1, 2, 3]).mean()


def test_shapes():
    a_np = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = gt.tensor(a_np)
    close(a.reshape(6, 4), a_np.reshape(6, 4))
    close(a.reshape((4, -1)), a_np.reshape(4, -1))
    close(a.view(-1), a_np.reshape(-1))
    close(a.transpose(0, 2), a_np.transpose(2, 1, 0))
    close(a.transpose(), np.swapaxes(a_np, -1, -2))
    close(a.permute(2, 0, 1), a_np.transpose(2, 0, 1))
    close(a.unsqueeze(1), a_np[:, None])
    close(a.unsqueeze(-1).squeeze(-1), a_np)
    close(gt.ones(1, 3, 1).squeeze(), np.ones(3))
    close(gt.tensor([[1.0, 2.0]]).T, [[1.0], [2.0]])
    close(gt.tensor([1.0, 2.0]).expand(3, -1), np.ones((3, 1)) * [1, 2])
    pieces = a.split(2, dim=2)
    assert [p.shape for p in pieces] == [(2, 3, 2), (2, 3, 2)]
    pieces = gt.arange(7).split(3)
    assert [p.numpy().tolist() for p in pieces] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [c.shape for c in gt.arange(10).chunk(3)] == [(4,), (4,), (2,)]
    close(gt.cat([a, a], axis=1), np.concatenate([a_np, a_np], axis=1))
    close(gt.stack([a, a]), np.stack([a_np, a_np]))
    assert a.size() == (2, 3, 4) and a.size(1) == 3 and a.ndim == 3 and a.numel() == 24 and len(a) == 2


def test_indexing_like_numpy():
    a_np = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    a = gt.tensor(a_np)
    for key in [0, -1, (1, 2), slice(1, None), (slice(None), 1), (Ellipsis, 2), (None, 0), (slice(None, None, -1),),
                (slice(0, 3, 2), slice(None), slice(1, 4)), (1, None, Ellipsis, slice(None, 2))]:
        close(a[key], a_np[key])
    rows = [r.numpy() for r in gt.tensor(a_np[0])]
    np.testing.assert_array_equal(np.stack(rows), a_np[0])
    with pytest.raises(TypeError, match="basic indexing"):
        a[a > 0]
    with pytest.raises(ValueError, match="step"):
        a[::0]


def test_in_place_and_reads():
    t = gt.tensor([1.0, 2.0, 3.0])
    same = t
    t -= 1
    t += gt.tensor([1.0, 1.0, 1.0])
    t *= 2
    t /= 4
    assert t is same
    close(t, [0.5, 1.0, 1.5])
    t.zero_()
    close(t, [0, 0, 0])
    assert gt.tensor([2.5]).item() == 2.5
    assert isinstance(gt.tensor([3]).item(), int)
    assert float(gt.tensor(1.5)) == 1.5 and int(gt.tensor(7)) == 7
    assert bool(gt.tensor(True))
    with pytest.raises(ValueError, match="exactly one"):
        gt.ones(2).item()
    assert gt.tensor([[1, 2]]).tolist() == [[1, 2]]
    assert np.asarray(gt.ones(2)).tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(gt.ones(2).data.numpy(), [1, 1])


def test_repr():
    assert repr(gt.tensor([1.0, 2.0])) == "tensor([1., 2.], dtype=float32)"
    assert repr(gt.tensor([1, 2])) == "tensor([1, 2], dtype=int64)"
    assert "..." in repr(gt.arange(100))
    assert "requires_grad=True" in repr(gt.ones(1, requires_grad=True))


def test_casts():
    t = gt.tensor([1.7, -2.2])
    assert t.to(gt.int32).numpy().tolist() == [1, -2]
    assert t.to("bfloat16").dtype == "bfloat16"
    assert t.to(np.float64).dtype == "float64"
    assert t.int().dtype == "int32" and t.long().dtype == "int64" and t.bool().dtype == "bool"
    assert t.half().numpy().dtype == np.float16 and t.double().dtype == "float64"
    with pytest.raises(TypeError, match="unknown dtype"):
        t.to("float8")


def test_bad_input_raises_gt_errors():
    with pytest.raises(gt.GtValueError, match="broadcast") as e:
        gt.ones(2, 3) + gt.ones(4)
    # Both a ValueError and a RuntimeError, so either handler catches it.
    assert isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)
    with pytest.raises(ValueError, match="matmul"):
        gt.ones(2, 3) @ gt.ones(2, 3)
    with pytest.raises(ValueError):
        gt.ones(2, 3).reshape(5)
    with pytest.raises(ValueError):
        gt.ones(2).sum(axis=3)
    with pytest.raises(TypeError):
        gt.ones(2) + "x"
    with pytest.raises(TypeError):
        gt.ones(2) @ 3
    with pytest.raises(ValueError):
        gt.zeros(-1)
    with pytest.raises(ValueError, match="cat"):
        gt.cat([])
    with pytest.raises(ValueError):
        gt.cat([gt.ones(2), gt.ones(2, 2)])
    with pytest.raises(gt.GtValueError):
        gt.tensor([1, 2]) @ gt.tensor([[1.0], [2.0], [3.0]])
    with pytest.raises(IndexError, match="out of range"):
        gt.ones(2)[10**20]
    with pytest.raises(ValueError, match="out of range"):
        gt.ones(2)[5]
    with pytest.raises(ValueError, match="axis"):
        gt.ones(2).sum(axis=10**20)
    with pytest.raises(ValueError, match="floating-point"):
        gt.tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError, match="None"):
        gt.ones(2).to(None)
    with pytest.raises(RuntimeError, match="over the limit"):
        gt.randn(10**12).numpy()
    with pytest.raises(ValueError, match="too large"):
        gt.zeros(2**31, 2**31)
    with pytest.raises(ValueError, match="inhomogeneous"):
        gt.tensor([[1, 2], [3]])
    # An int beside an int64 tensor is exact beyond 2**53 (where a float64 would round it).
    big = gt.tensor([2**53], dtype=gt.int64)
    assert (big + 2**53).numpy().tolist() == [2**54]
    assert (big + (2**53 + 1)).tolist() == [2**54 + 1]
    assert (big == 2**53 + 1).tolist() == [False]
    with pytest.raises(OverflowError, match="int64"):
        big == 10**30
    with pytest.raises(TypeError):
        gt.cat([gt.ones(2), "x"])
    with pytest.raises(TypeError):
        gt.nn.SGD(5)


def like_torch(fn, *tensors):
    """`fn(lib, *tensors)` on gt and on PyTorch (`lib` is the module) for tensors given as
    (data, dtype name) pairs: the same dtype and the same values."""
    torch = pytest.importorskip("torch")
    got = fn(gt, *[gt.tensor(d, dtype=getattr(gt, n)) for d, n in tensors])
    want = fn(torch, *[torch.tensor(d, dtype=getattr(torch, n)) for d, n in tensors])
    assert got.dtype == str(want.dtype).replace("torch.", ""), (got, want)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_python_scalars_promote_by_category_as_in_pytorch():
    i64, i32, b, f16 = ([1, 2, 3], "int64"), ([1, -2], "int32"), ([True, False], "bool"), ([1.0, 2.0], "float16")
    like_torch(lambda lib, t: t * 1.0, i64)
    like_torch(lambda lib, t: t + 1e10, i32)
    like_torch(lambda lib, t: t * 1e6, b)
    like_torch(lambda lib, t: t + 1, b)
    like_torch(lambda lib, t: t + np.int64(1), b)
    like_torch(lambda lib, t: t * np.float64(2.0), i64)
    like_torch(lambda lib, t: t * np.float32(0.5), i32)
    like_torch(lambda lib, t: t * 2, i32)
    like_torch(lambda lib, t: t + True, i32)
    like_torch(lambda lib, t: t * 1e6, f16)
    like_torch(lambda lib, t: 1.0 - t, i64)
    like_torch(lambda lib, t: 2.0**t, i64)
    like_torch(lambda lib, t: 3.0 / t, b)
    like_torch(lambda lib, t: 1.5 > t, i64)
    like_torch(lambda lib, t: t == 2.0, i32)
    like_torch(lambda lib, t: t == True, b)  # noqa: E712
    like_torch(lambda lib, t: t.add(1.0), i64)


def test_where_of_numbers_gives_pytorchs_dtype():
    c = ([True, False, True], "bool")
    i32, f16 = ([1, 2, 3], "int32"), ([1.0, 2.0, 3.0], "float16")
    like_torch(lambda lib, c: lib.where(c, 1, 0), c)
    like_torch(lambda lib, c: lib.where(c, True, False), c)
    like_torch(lambda lib, c: lib.where(c, 1.0, 0), c)
    like_torch(lambda lib, c: lib.where(c, True, 2), c)
    like_torch(lambda lib, c, t: lib.where(c, t, 1.5), c, i32)
    like_torch(lambda lib, c, t: lib.where(c, 7, t), c, i32)
    like_torch(lambda lib, c, t: lib.where(c, t, 2), c, f16)
    with pytest.raises(ValueError, match="int32"):
        gt.where(gt.tensor([True]), gt.tensor([1], dtype=gt.int32), 2**40)


def test_integer_scalars_beyond_the_tensors_dtype_are_refused():
    with pytest.raises(OverflowError, match="100000000000000000000 is beyond the int64 range"):
        gt.tensor([1, 2]) + 10**20
    with pytest.raises(OverflowError, match="int64"):
        gt.ones(2) + 10**20  # as PyTorch, whatever the tensor's dtype
    with pytest.raises(ValueError, match="1099511627776 .*int32"):
        gt.tensor([1], dtype=gt.int32) + 2**40
    with pytest.raises(ValueError, match="int32"):
        2**40 - gt.tensor([1], dtype=gt.int32)
    assert (gt.tensor([1], dtype=gt.int32) + (2**31 - 2)).tolist() == [2**31 - 1]
    # A comparison's result is bool whatever it computes in: exact (PyTorch wraps the int here).
    i32 = gt.tensor([1, 2**31 - 1, -(2**31)], dtype=gt.int32)
    assert (i32 == 2**40).tolist() == [False, False, False]
    assert (i32 < -(2**40)).tolist() == [False, False, False]
    assert (2**40 > i32).tolist() == [True, True, True]
    assert (gt.tensor([True]) + 2**60).tolist() == [2**60 + 1]
    close(gt.ones(1) * 2**60, [2.0**60])
    t = gt.tensor([1, 2])
    with pytest.raises(ValueError, match="`x = x \\+ 1.5`"):
        t += 1.5
    with pytest.raises(ValueError, match="float32"):
        t *= 2.0  # PyTorch refuses it too: the result is a float
    t += 2**60
    assert t.tolist() == [2**60 + 1, 2**60 + 2]


def test_values_an_integer_dtype_cannot_hold_are_refused():
    with pytest.raises(ValueError, match="3000000000 is not an int32 element"):
        gt.tensor([3000000000], dtype=gt.int32)
    with pytest.raises(ValueError, match="nan is not an int64 element: not finite"):
        gt.tensor([1.0, float("nan"), float("inf")], dtype=gt.int64)
    with pytest.raises(ValueError, match="inf"):
        gt.tensor(np.array([float("-inf")], dtype=np.float16), dtype=gt.int32)
    with pytest.raises(ValueError, match="int32"):
        gt.tensor(np.array([2**40]), dtype=gt.int32)
    with pytest.raises(ValueError, match="int64"):
        gt.tensor([1e19], dtype=gt.int64)
    with pytest.raises(ValueError):
        gt.full((1,), float("nan"), dtype=gt.int64)  # as `full` refuses them
    assert gt.tensor([2**31 - 1, -(2**31)], dtype=gt.int32).tolist() == [2**31 - 1, -(2**31)]
    assert gt.tensor([1.9, -1.9], dtype=gt.int64).tolist() == [1, -1]  # truncated, as PyTorch
    assert gt.tensor([-(2**63)], dtype=gt.int64).tolist() == [-(2**63)]
    # Python ints beyond int64, as PyTorch refuses them (NumPy would make them uint64 or objects).
    with pytest.raises(OverflowError, match="9223372036854775808 is beyond the int64 range"):
        gt.tensor([2**63])
    with pytest.raises(OverflowError, match=str(2**64)):
        gt.tensor([[1], [2**64]])
    with pytest.raises(OverflowError):
        gt.tensor([2**63, -1])
    with pytest.raises(OverflowError):
        gt.tensor([2**63], dtype=gt.int64)
    assert gt.tensor([2**63], dtype=gt.float32).tolist() == [2.0**63]
    assert gt.tensor([2**64, 1.5]).tolist() == [2.0**64, 1.5]


def test_full_of_a_python_int_is_exact():
    assert gt.full((1,), 2**53 + 1).tolist() == [2**53 + 1]
    assert gt.full((2,), -(2**63), dtype=gt.int64).tolist() == [-(2**63)] * 2
    assert gt.full((2, 1), 2**62 + 3).shape == (2, 1)
    with pytest.raises(OverflowError, match="int64"):
        gt.full((1,), 2**63)
    with pytest.raises(ValueError, match="int32"):
        gt.full((1,), 2**60 + 1, dtype=gt.int32)
    torch = pytest.importorskip("torch")
    assert gt.full((1,), 2**53 + 1).tolist() == torch.full((1,), 2**53 + 1).tolist()


def test_numpy_float_scalars_keep_their_dtype_as_in_pytorch():
    torch = pytest.importorskip("torch")
    for data in [np.float64(1.5), [np.float64(1), np.float64(2)], [np.float64(1), 2.0], [[np.float64(1)], [2]],
                 np.float32(1.5), [np.float16(1), 2], [np.float16(1), 2.0], [1.0, 2.0], 1.5, [1, 2]]:
        assert gt.tensor(data).dtype == str(torch.tensor(data).dtype).replace("torch.", ""), data
    assert gt.tensor([np.float64(0.1)]).tolist() == [0.1]


def test_index_errors_are_index_errors_and_huge_slice_bounds_clamp():
    a = gt.ones(2)
    with pytest.raises(IndexError, match="index 5 is out of range for axis 0 of size 2"):
        a[5]
    with pytest.raises(IndexError):
        gt.ones(2, 3)[0, -4]
    with pytest.raises(IndexError):
        a[10**20]
    assert issubclass(gt.GtIndexError, IndexError) and issubclass(gt.GtIndexError, gt.GtValueError)
    x_np = np.arange(5.0, dtype=np.float32)
    x = gt.tensor(x_np)
    for key in [slice(None, 2**63), slice(-(2**70), 2**70), slice(None, None, 2**70), slice(None, None, -(2**70)),
                slice(2**64, None, -1), slice(-(2**64), 2), slice(np.uint64(2**64 - 1), None, -2)]:
        np.testing.assert_array_equal(x[key].numpy(), x_np[key])


def test_bad_sizes_and_seeds_are_named_in_errors():
    x = gt.arange(6)
    with pytest.raises(ValueError, match="split: split_size must be at least 0, got -1"):
        x.split(-1)
    with pytest.raises(ValueError, match="split_size 100000000000000000000 is too large"):
        x.split(10**20)
    with pytest.raises(ValueError, match="split: each of split_size must be at least 0, got -1"):
        x.split([3, -1, 4])
    with pytest.raises(TypeError, match="split: split_size must be an int, got float 1.5"):
        x.split(1.5)
    assert [p.tolist() for p in x.split(np.int64(4))] == [[0, 1, 2, 3], [4, 5]]
    with pytest.raises(ValueError, match="chunk: chunks must be at least 1, got -2"):
        x.chunk(-2)
    with pytest.raises(ValueError, match="Linear: in_features must be at least 0, got -1"):
        gt.nn.Linear(-1, 2)
    with pytest.raises(ValueError, match="Linear: out_features 100000000000000000000 is too large"):
        gt.nn.Linear(2, 10**20)
    with pytest.raises(ValueError, match="axis 100000000000000000000 is out of range"):
        x.sum(axis=(0, 10**20))
    with pytest.raises(TypeError, match="axis: expected an int or a tuple of ints, got float 1.5"):
        x.sum(axis=(0, 1.5))
    with pytest.raises(ValueError, match="manual_seed: seed 18446744073709551616"):
        gt.manual_seed(2**64)
    with pytest.raises(TypeError, match="seed must be an int"):
        gt.manual_seed("1")
    # A negative seed is its two's complement, as in PyTorch.
    gt.manual_seed(-1)
    first = gt.randn(3).tolist()
    gt.manual_seed(2**64 - 1)
    assert gt.randn(3).tolist() == first


def test_random_numbers_take_float_dtypes_only():
    assert gt.randn(3, dtype=gt.float64).dtype == "float64"
    for make in (gt.randn, gt.rand):
        for dtype in (gt.int64, gt.int32, gt.bool):
            with pytest.raises(gt.GtValueError, match="takes a float dtype"):
                make(4, dtype=dtype)


def test_squeeze_of_a_wider_axis_and_softmax_over_an_empty_one_are_pytorchs():
    assert gt.ones(2, 3).squeeze(0).shape == (2, 3)
    assert gt.ones(2, 1).squeeze(-1).shape == (2,)
    assert gt.zeros(3, 0).softmax(-1).shape == (3, 0)
    assert gt.nn.log_softmax(gt.zeros(0, 3), 0).shape == (0, 3)
    with pytest.raises(ValueError, match="a 0-d tensor has no axes"):
        gt.tensor(3.0).softmax(1)
