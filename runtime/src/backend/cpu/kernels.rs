//! The kernel IR evaluated on the CPU with the interpreter's own op functions: the oracle
//! for the code generators (a kernel must compute what this computes), and
//! [`KernelBackend`], a backend that executes every instruction through its lowering
//! ([`gt_ir::kernel::lower`]), so CI checks lowering against the interpreter without a GPU.
//! Written for clarity, not speed: every node materialises a whole tensor. Kernels over
//! `f32` buffers computing in `f32` run on `f32` slices ([`run`]); any other storage or
//! [`Compute`] goes through the interpreter's typed values ([`run_values`]): loads convert
//! to what the kernel computes in, the store converts back, each as `.to(dtype)` does.

use super::interp::{binary, from_vec, matmul, reduce, select, unary, Tensor};
use super::value::{self, map_value, Value};
use crate::backend::checks;
use crate::backend::{Backend, Residency};
use crate::RuntimeError;
use foldhash::{HashMap, HashMapExt};
use gt_ir::kernel::lower::{lower, Step};
use gt_ir::kernel::{Access, Compute, Kernel, MapKernel, MatMulKernel, Node};
use gt_ir::random;
use gt_ir::{DType, HostTensor, Instr, TensorType, TypeError, ValueId};
use ndarray::{ArrayD, Dimension, IxDyn};

/// Element offset of iteration point `index` under `access`.
fn offset(access: &Access, index: &[usize]) -> usize {
    let o = access.offset + index.iter().zip(&access.strides).map(|(&i, &s)| i as i64 * s).sum::<i64>();
    o as usize
}

/// The elements `access` reads from `buffer` over the iteration space `dims`.
fn gather(access: &Access, buffer: &[f32], dims: &[usize]) -> Tensor {
    let data = ndarray::indices(IxDyn(dims)).into_iter().map(|i| buffer[offset(access, i.slice())]).collect();
    from_vec(dims, data)
}

/// A tensor over `dims` whose element `i` (row-major) is `f(i)`.
fn by_index(dims: &[usize], f: impl Fn(u64) -> f32) -> Tensor {
    let n = dims.iter().product::<usize>() as u64;
    from_vec(dims, (0..n).map(f).collect())
}

/// The row axes' reduction of `t` (over `dims`), broadcast back to `dims`.
fn row_reduce(op: gt_ir::ReduceOp, t: &Tensor, dims: &[usize], rows: &[usize]) -> Tensor {
    let (kept, keepdim) = row_shapes(dims, rows);
    let r = reduce(op, t, rows, &kept);
    let r = r.into_shape_with_order(IxDyn(&keepdim)).expect("same element count");
    r.broadcast(IxDyn(dims)).expect("keepdim shape broadcasts").to_owned()
}

/// The dims a reduction over the `rows` axes of `dims` keeps, and `dims` with those axes 1.
fn row_shapes(dims: &[usize], rows: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let kept = (0..dims.len()).filter(|a| !rows.contains(a)).map(|a| dims[a]).collect();
    let keepdim = (0..dims.len()).map(|a| if rows.contains(&a) { 1 } else { dims[a] }).collect();
    (kept, keepdim)
}

/// A reducing kernel's kept dims and its output's access over them.
fn reduced_output(k: &MapKernel) -> (Vec<usize>, Access) {
    let kept_axes: Vec<usize> = (0..k.shape.len()).filter(|a| !k.rows.contains(a)).collect();
    let kept = kept_axes.iter().map(|&a| k.shape[a]).collect();
    let strides = kept_axes.iter().map(|&a| k.output.strides[a]).collect();
    (kept, Access { offset: k.output.offset, strides })
}

/// Every node's value over `dims`; `leaf` gives inputs and the matmul product.
fn evaluate(nodes: &[Node], dims: &[usize], rows: &[usize], leaf: &dyn Fn(Node) -> Tensor) -> Vec<Tensor> {
    let mut values: Vec<Tensor> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let value = match *node {
            Node::Input(_) | Node::Acc => leaf(*node),
            Node::Const(bits) => Tensor::from_elem(IxDyn(dims), f32::from_bits(bits)),
            Node::Const64(bits) => Tensor::from_elem(IxDyn(dims), f64::from_bits(bits) as f32),
            Node::Iota { start, step } => {
                let (start, step) = (f64::from_bits(start), f64::from_bits(step));
                by_index(dims, |i| (start + i as f64 * step) as f32)
            }
            Node::Rand { seed } => by_index(dims, |i| random::uniform(seed, i)),
            Node::Randn { seed } => by_index(dims, |i| random::normal(seed, i)),
            Node::Unary(op, a) => unary(op, &values[a as usize]),
            Node::Binary(op, a, b) => binary(op, &values[a as usize].view(), &values[b as usize].view(), dims),
            Node::Select(c, t, f) => {
                let v = |i: u32| values[i as usize].view();
                select(&v(c), &v(t), &v(f), dims)
            }
            Node::Reduce(op, a) => row_reduce(op, &values[a as usize], dims, rows),
            Node::Round(s, a) => match Value::F32(values[a as usize].clone()).cast(s.dtype()).cast(DType::F32) {
                Value::F32(t) => t,
                _ => unreachable!("a cast to f32 gives f32"),
            },
        };
        values.push(value);
    }
    values
}

fn map(k: &MapKernel, inputs: &[&[f32]], out: &mut [f32]) {
    let dims = &k.shape[..];
    let leaf = |node: Node| match node {
        Node::Input(i) => gather(&k.inputs[i as usize], inputs[i as usize], dims),
        _ => Tensor::zeros(IxDyn(dims)),
    };
    let Some(result) = evaluate(&k.nodes, dims, &k.rows, &leaf).pop() else { return };
    match k.reduce {
        None => {
            for (i, x) in ndarray::indices(IxDyn(dims)).into_iter().zip(result.iter()) {
                out[offset(&k.output, i.slice())] = *x;
            }
        }
        Some(op) => {
            let (kept, access) = reduced_output(k);
            let reduced = reduce(op, &result, &k.rows, &kept);
            for (i, x) in ndarray::indices(IxDyn(&kept)).into_iter().zip(reduced.iter()) {
                out[offset(&access, i.slice())] = *x;
            }
        }
    }
}

fn matmul_kernel(k: &MatMulKernel, inputs: &[&[f32]], out: &mut [f32]) -> Result<(), TypeError> {
    let with = |rows: usize, cols: usize| k.batch.iter().copied().chain([rows, cols]).collect::<Vec<_>>();
    let a = gather(&k.lhs, inputs[0], &with(k.m, k.k));
    let b = gather(&k.rhs, inputs[1], &with(k.k, k.n));
    let dims = with(k.m, k.n);
    let mut c = matmul(a.view(), b.view(), &dims)?;
    if !k.epilogue.is_empty() {
        let leaf = |node: Node| match node {
            Node::Input(i) => gather(&k.epilogue_inputs[i as usize], inputs[2 + i as usize], &dims),
            _ => c.clone(),
        };
        c = evaluate(&k.epilogue, &dims, &[], &leaf).pop().unwrap_or(c.clone());
    }
    out.iter_mut().zip(c.iter()).for_each(|(o, x)| *o = *x);
    Ok(())
}

/// Runs `kernel` reading `inputs` (one buffer per kernel input) and writing into `out`.
/// A malformed kernel, or one reaching outside its buffers, is an error
/// ([`TypeError::Kernel`]), not a panic.
pub fn run(kernel: &Kernel, inputs: &[&[f32]], out: &mut [f32]) -> Result<(), TypeError> {
    let lens: Vec<usize> = inputs.iter().map(|b| b.len()).collect();
    kernel.check_bounds(&lens, out.len())?;
    match kernel {
        Kernel::Map(k) => map(k, inputs, out),
        Kernel::MatMul(k) => matmul_kernel(k, inputs, out)?,
    }
    Ok(())
}

/// The elements `access` reads from `buffer` (a stored value, row-major) over `dims`.
fn gather_value(access: &Access, buffer: &Value, dims: &[usize]) -> Value {
    map_value!(buffer, a => {
        let flat = a.as_slice().expect("stored values are row-major");
        let data = ndarray::indices(IxDyn(dims)).into_iter().map(|i| flat[offset(access, i.slice())]).collect();
        ArrayD::from_shape_vec(IxDyn(dims), data).expect("one element per index")
    })
}

/// Writes `result` (its elements in row-major order over `dims`) through `access` into
/// `out`, converted to `out`'s dtype.
fn scatter_value(out: &mut Value, result: &Value, access: &Access, dims: &[usize]) {
    let result = result.cast(out.dtype());
    macro_rules! put {
        ($($v:ident),*) => {
            match (out, &result) {
                $((Value::$v(o), Value::$v(r)) => {
                    let o = o.as_slice_mut().expect("stored values are row-major");
                    for (i, x) in ndarray::indices(IxDyn(dims)).into_iter().zip(r.iter()) {
                        o[offset(access, i.slice())] = *x;
                    }
                })*
                _ => unreachable!("cast to the output's dtype"),
            }
        };
    }
    put!(F64, F32, F16, BF16, I64, I32, Bool)
}

/// A value over `dims` whose element `i` (row-major) is `f(i)`, as `f64`s converted to `dtype`.
fn by_index_as(dims: &[usize], dtype: DType, f: impl Fn(u64) -> f64) -> Value {
    let n = dims.iter().product::<usize>() as u64;
    let data = ArrayD::from_shape_vec(IxDyn(dims), (0..n).map(f).collect()).expect("one element per index");
    Value::F64(data).into_dtype(dtype)
}

/// Every node's value over `dims`, computed in `compute` with the interpreter's typed ops.
fn evaluate_values(k: &MapKernel, inputs: &[&Value]) -> Vec<Value> {
    let (dims, rows) = (&k.shape[..], &k.rows[..]);
    let c = k.compute.dtype();
    let mut values: Vec<Value> = Vec::with_capacity(k.nodes.len());
    for node in &k.nodes {
        let value = match *node {
            Node::Input(i) => gather_value(&k.inputs[i as usize], inputs[i as usize], dims).into_dtype(c),
            Node::Acc => Value::full(c, dims, 0.0),
            Node::Const(bits) => Value::full(c, dims, f64::from(f32::from_bits(bits))),
            Node::Const64(bits) => Value::full(c, dims, f64::from_bits(bits)),
            Node::Iota { start, step } => {
                let (start, step) = (f64::from_bits(start), f64::from_bits(step));
                by_index_as(dims, c, |i| start + i as f64 * step)
            }
            // The f32 generator's values, converted.
            Node::Rand { seed } => by_index_as(dims, c, |i| f64::from(random::uniform(seed, i))),
            Node::Randn { seed } => by_index_as(dims, c, |i| f64::from(random::normal(seed, i))),
            Node::Unary(op, a) => value::unary(op, &values[a as usize], c),
            Node::Round(s, a) => values[a as usize].cast(s.dtype()).into_dtype(c),
            Node::Binary(op, a, b) => value::binary(op, &values[a as usize], &values[b as usize], dims, c, c),
            Node::Select(cond, t, f) => {
                value::select(&values[cond as usize], &values[t as usize], &values[f as usize], dims, c)
            }
            Node::Reduce(op, a) => {
                let (kept, keepdim) = row_shapes(dims, rows);
                value::reduce(op, &values[a as usize], rows, &kept, c).reshaped(&keepdim).broadcast_to(dims)
            }
        };
        values.push(value);
    }
    values
}

/// Runs `kernel` reading `inputs` (stored values, one per kernel input, of any dtype) and
/// writing into `out` (a stored value of the output's dtype). A malformed kernel, or one
/// reaching outside its buffers, is an error, not a panic.
pub(crate) fn run_values(kernel: &Kernel, inputs: &[&Value], out: &mut Value) -> Result<(), TypeError> {
    let f32s: Option<Vec<&[f32]>> = inputs.iter().map(|v| v.as_f32().and_then(|a| a.as_slice())).collect();
    let plain = match kernel {
        Kernel::Map(k) => k.compute == Compute::F32,
        Kernel::MatMul(_) => true,
    };
    if let (true, Some(f32s), Value::F32(o)) = (plain, &f32s, &mut *out) {
        let o = o.as_slice_mut().expect("stored values are row-major");
        return run(kernel, f32s, o);
    }
    let lens: Vec<usize> = inputs.iter().map(|v| v.shape().iter().product()).collect();
    kernel.check_bounds(&lens, out.shape().iter().product())?;
    match kernel {
        Kernel::Map(k) => {
            let Some(result) = evaluate_values(k, inputs).pop() else { return Ok(()) };
            match k.reduce {
                None => scatter_value(out, &result, &k.output, &k.shape),
                Some(op) => {
                    let (kept, access) = reduced_output(k);
                    let reduced = value::reduce(op, &result, &k.rows, &kept, k.compute.dtype());
                    scatter_value(out, &reduced, &access, &kept);
                }
            }
        }
        Kernel::MatMul(_) => {
            // Products of f32 and halves (what a GPU multiplies): in f32, rounded as stored.
            let widened: Vec<Value> = inputs.iter().map(|v| v.cast(DType::F32)).collect();
            let slices: Vec<&[f32]> =
                widened.iter().map(|v| v.as_f32().and_then(|a| a.as_slice()).unwrap_or(&[])).collect();
            let mut product = Value::full(DType::F32, out.shape(), 0.0);
            if let Value::F32(p) = &mut product {
                run(kernel, &slices, p.as_slice_mut().expect("row-major"))?;
            }
            *out = product.into_dtype(out.dtype());
        }
    }
    Ok(())
}

/// The failure of [`run`] for `op`: a kernel failure, or the type error of its matmul.
pub(crate) fn failed(op: &'static str, e: TypeError) -> RuntimeError {
    match e {
        TypeError::Kernel { source } => RuntimeError::Kernel { op, source },
        source => RuntimeError::Type { op, source },
    }
}

/// A backend that runs every instruction as the kernels it lowers to, on host buffers of
/// every dtype (stored as the interpreter stores them).
#[derive(Debug)]
pub struct KernelBackend {
    values: HashMap<ValueId, (TensorType, Value)>,
    bytes: Residency,
    max_tensor_bytes: usize,
}

impl KernelBackend {
    /// An empty backend refusing results over `max_tensor_bytes`.
    pub fn new(max_tensor_bytes: usize) -> KernelBackend {
        KernelBackend { values: HashMap::new(), bytes: Residency::default(), max_tensor_bytes }
    }

    fn type_of(&self, v: ValueId) -> Result<TensorType, TypeError> {
        self.values.get(&v).map(|(t, _)| t.clone()).ok_or(TypeError::UnknownValue(v))
    }
}

impl Backend for KernelBackend {
    fn name(&self) -> &'static str {
        "kernels"
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        let op = instr.mnemonic();
        let (instr, types) = checks::prepare(instr, &|v| self.type_of(v), self.max_tensor_bytes)?;
        // Products take f32 and halves, as on the GPU.
        checks::products_of_floats(&instr, "kernels", &|v| self.type_of(v))?;
        let steps = lower(&instr, &|v| self.values[&v].0.clone(), &types);
        let mut outputs: Vec<Value> = types.iter().map(|t| Value::full(t.dtype, t.shape.dims(), 0.0)).collect();
        for step in &steps {
            match step {
                Step::Launch { kernel, inputs, output } => {
                    let buffers: Vec<&Value> = inputs.iter().map(|v| &self.values[v].1).collect();
                    run_values(kernel, &buffers, &mut outputs[*output]).map_err(|e| failed(op, e))?;
                }
                Step::Upload { output } => {
                    if let Instr::Literal { data, .. } = &*instr {
                        outputs[*output] = Value::from_elements(types[*output].shape.dims(), data.clone());
                    }
                }
                Step::TwoPass { first, inputs, partials, second, output } => {
                    let buffers: Vec<&Value> = inputs.iter().map(|v| &self.values[v].1).collect();
                    let mut temp = Value::full(Step::partial_storage(first).dtype(), &[*partials], 0.0);
                    run_values(first, &buffers, &mut temp).map_err(|e| failed(op, e))?;
                    run_values(second, &[&temp], &mut outputs[*output]).map_err(|e| failed(op, e))?;
                }
            }
        }
        if let Instr::Free { src } = &*instr {
            if let Some((gone, _)) = self.values.remove(src) {
                self.bytes.remove(gone.size_bytes());
            }
        }
        for ((dst, ty), data) in instr.results().into_iter().zip(types).zip(outputs) {
            self.bytes.add(ty.size_bytes());
            if let Some((old, _)) = self.values.insert(dst, (ty, data)) {
                self.bytes.remove(old.size_bytes());
            }
        }
        Ok(())
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        let (ty, data) = self.values.get(&value).ok_or(RuntimeError::Undefined { op: "get", value })?;
        Ok(HostTensor::new(ty.clone(), data.to_elements()))
    }

    fn live_values(&self) -> usize {
        self.values.len()
    }

    fn live_bytes(&self) -> usize {
        self.bytes.live()
    }

    fn peak_bytes(&self) -> usize {
        self.bytes.peak()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Interpreter;
    use gt_ir::kernel::{samples, Buffer, KernelError};
    use gt_ir::{BinaryOp, Operand, ReduceOp, UnaryOp};

    fn v(i: u32) -> ValueId {
        ValueId(i)
    }

    /// Runs `instrs` on the interpreter (value 0 is randn of `dims`); returns value 0's data
    /// and the last instruction's result.
    fn interpreted(dims: &[usize], extra: &[Instr]) -> (Vec<f32>, Vec<f32>) {
        let mut it = Interpreter::new();
        it.execute(&Instr::Randn { dst: v(0), ty: TensorType::f32(dims.to_vec()), seed: 5 }).unwrap();
        for i in extra {
            it.execute(i).unwrap();
        }
        let last = extra.last().unwrap().results()[0];
        (it.read(v(0)).unwrap().to_f32(), it.read(last).unwrap().to_f32())
    }

    fn bin(dst: u32, op: BinaryOp, a: u32, b: Operand) -> Instr {
        Instr::Binary { dst: v(dst), op, lhs: Operand::Value(v(a)), rhs: b }
    }

    fn red(dst: u32, op: ReduceOp, src: u32) -> Instr {
        Instr::Reduce { dst: v(dst), op, src: v(src), axes: Some(vec![-1]), keepdim: true }
    }

    fn kernel_result(kernel: &Kernel, inputs: &[&[f32]], len: usize) -> Vec<f32> {
        let mut out = vec![0.0; len];
        run(kernel, inputs, &mut out).unwrap();
        out
    }

    #[test]
    fn softmax_and_layer_norm_kernels_equal_their_instructions() {
        let dims = [4, 33];
        let val = |i: u32| Operand::Value(v(i));
        let (x, want) = interpreted(
            &dims,
            &[
                red(1, ReduceOp::Max, 0),
                bin(2, BinaryOp::Sub, 0, val(1)),
                Instr::Unary { dst: v(3), op: UnaryOp::Exp, src: v(2) },
                red(4, ReduceOp::Sum, 3),
                bin(5, BinaryOp::Div, 3, val(4)),
            ],
        );
        assert_eq!(kernel_result(&samples::softmax(&dims), &[&x], x.len()), want);
        let (x, want) = interpreted(
            &dims,
            &[
                red(1, ReduceOp::Mean, 0),
                bin(2, BinaryOp::Sub, 0, val(1)),
                bin(3, BinaryOp::Mul, 2, val(2)),
                red(4, ReduceOp::Mean, 3),
                bin(5, BinaryOp::Add, 4, Operand::Scalar(1e-5)),
                Instr::Unary { dst: v(6), op: UnaryOp::Rsqrt, src: v(5) },
                bin(7, BinaryOp::Mul, 2, val(6)),
            ],
        );
        assert_eq!(kernel_result(&samples::layer_norm(&dims, 1e-5), &[&x], x.len()), want);
    }

    #[test]
    fn two_pass_reductions_match_the_interpreter() {
        use crate::backend::Backend;
        for op in ReduceOp::ALL {
            let instrs = [
                Instr::Randn { dst: v(0), ty: TensorType::f32(vec![3, 1 << 17]), seed: 9 },
                Instr::Reduce { dst: v(1), op: *op, src: v(0), axes: Some(vec![1]), keepdim: true },
                Instr::Reduce { dst: v(2), op: *op, src: v(0), axes: None, keepdim: false },
            ];
            let (mut it, mut kb) = (Interpreter::new(), KernelBackend::new(1 << 30));
            for i in &instrs {
                it.execute(i).unwrap();
                kb.execute(i).unwrap();
            }
            for r in [v(1), v(2)] {
                let (want, got) = (it.read(r).unwrap(), kb.read(r).unwrap());
                assert_eq!(want.ty, got.ty);
                for (w, g) in want.to_f32().iter().zip(&got.to_f32()) {
                    // Partial sums are rounded to f32 before they are added.
                    assert!((w - g).abs() <= 1e-3 + 1e-5 * w.abs(), "{op:?}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn malformed_or_out_of_bounds_kernels_are_errors() {
        let k = samples::softmax(&[4, 8]);
        let mut out = vec![0.0; 32];
        let e = run(&k, &[&[0.0; 31]], &mut out).unwrap_err();
        let input = |e: &TypeError, buffer| matches!(e, TypeError::Kernel { source: KernelError::OutOfBounds { buffer: b, .. } } if *b == buffer);
        assert!(input(&e, Buffer::Input(0)), "{e}");
        assert!(e.to_string().contains("input 0"), "{e}");
        let Kernel::Map(mut bad) = k else { unreachable!() };
        bad.nodes.push(Node::Input(3));
        let e = run(&Kernel::Map(bad), &[&[0.0; 32]], &mut out).unwrap_err();
        assert!(matches!(e, TypeError::Kernel { source: KernelError::InputOutOfRange { input: 3, .. } }), "{e}");
        assert!(e.to_string().contains("reads input 3"), "{e}");
        assert!(matches!(failed("fused", e), RuntimeError::Kernel { op: "fused", .. }));
    }

    #[test]
    fn matmul_epilogue_equals_its_instructions() {
        let (m, k, n) = (5, 7, 3);
        let mut it = Interpreter::new();
        let randn =
            |dst: u32, dims: Vec<usize>| Instr::Randn { dst: v(dst), ty: TensorType::f32(dims), seed: dst.into() };
        for i in [randn(0, vec![m, k]), randn(1, vec![k, n]), randn(2, vec![n])] {
            it.execute(&i).unwrap();
        }
        it.execute(&Instr::MatMul { dst: v(3), lhs: v(0), rhs: v(1) }).unwrap();
        it.execute(&bin(4, BinaryOp::Add, 3, Operand::Value(v(2)))).unwrap();
        it.execute(&Instr::Unary { dst: v(5), op: UnaryOp::Relu, src: v(4) }).unwrap();
        let data = |i: u32| it.read(v(i)).unwrap().to_f32();
        let (x, w, b) = (data(0), data(1), data(2));
        assert_eq!(kernel_result(&samples::linear_relu(m, k, n), &[&x, &w, &b], m * n), data(5));
    }
}
