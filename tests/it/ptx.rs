//! The CUDA code generator without a GPU: the PTX of every kernel that the filetests and
//! examples lower to assembles with `ptxas` for sm_80 and sm_90, and Hopper's own kernels for
//! sm_90a (`GT_PTXAS`, else `ptxas` on PATH; under `CI` a missing ptxas fails the test), and
//! snapshots of representative kernels.

use gt::kernels::KernelRecorder;
use gt::script::{load, run_any};
use gt_frontend::script::RunOptions;
use gt_ir::kernel::{BufferStorage, Compute, Kernel, Storage};
use gt_runtime::backend::cuda::ptx;
use std::path::{Path, PathBuf};
use std::process::Command;

fn quiet() -> RunOptions {
    RunOptions { quiet: true, ..RunOptions::default() }
}

/// Every distinct kernel of the run filetests and the examples, with the storage of its
/// buffers (every dtype), and the fuse pass's kernels over `f32`.
fn all_kernels() -> Vec<(Kernel, BufferStorage)> {
    let files = gt::filetest::run_scripts(Path::new(env!("CARGO_MANIFEST_DIR")));
    let mut kernels = Vec::new();
    for path in files {
        let Ok(loaded) = load(&std::fs::read(&path).unwrap()) else { continue };
        // Scripts that fail on purpose still lowered everything before the failure.
        let (_, recorder) = run_any(&loaded, KernelRecorder::new(), &mut std::io::sink(), quiet());
        let recorder = recorder.expect("the recorder comes back");
        kernels.extend(recorder.kernels.into_iter().zip(recorder.storage));
    }
    kernels.extend(fused_kernels());
    kernels
}

/// The kernels the fuse pass makes of every run filetest and example (`GT_COMPILE=1`), as
/// lowered for a GPU (fused full reductions in two passes), over the dtypes of their buffers.
fn fused_kernels() -> Vec<(Kernel, BufferStorage)> {
    use gt_ir::kernel::lower::{lower, Step};
    use gt_passes::{Emit, Fuse, FuseConfig, StreamPass};
    let mut out = Vec::new();
    for path in gt::filetest::run_scripts(Path::new(env!("CARGO_MANIFEST_DIR"))) {
        let Ok(loaded) = load(&std::fs::read(&path).unwrap()) else { continue };
        let recorder = crate::filetests::Recorder::new(gt::runtime::Interpreter::new());
        let (_, recorder) = run_any(&loaded, recorder, &mut std::io::sink(), quiet());
        let recorder = recorder.expect("the recorder comes back");
        let mut pass = Fuse::new(FuseConfig::default());
        let mut emit = Emit::new("fuse");
        // `None` is a sync point: the region ends there.
        for i in recorder.stream.iter().cloned() {
            match i {
                Some(i) => pass.run(i, &mut emit),
                None => pass.flush(&mut emit),
            }
        }
        pass.flush(&mut emit);
        let mut types: std::collections::HashMap<gt_ir::ValueId, gt_ir::TensorType> = Default::default();
        for (i, _) in emit.into_items() {
            let known = |v| types.get(&v).cloned().ok_or(gt_ir::TypeError::UnknownValue(v));
            let results = gt_ir::verify::shape::infer(&i, &known).unwrap_or_default();
            types.extend(i.results().into_iter().zip(results));
            let gt_ir::Instr::Fused { ty, .. } = &i else { continue };
            let any = |_| ty.clone();
            let dtype_of = |v| types.get(&v).map_or(gt_ir::DType::F32, |t| t.dtype);
            for step in lower(&i, &any, std::slice::from_ref(ty)) {
                let storage = step.storage(dtype_of, std::slice::from_ref(ty));
                match step {
                    Step::Launch { kernel, .. } => out.push((kernel, storage[0].clone())),
                    Step::TwoPass { first, second, .. } => {
                        out.extend([(first, storage[0].clone()), (second, storage[1].clone())])
                    }
                    Step::Upload { .. } => {}
                }
            }
        }
    }
    // A script that fails on purpose with a result too large to index with 32 bits makes such
    // a kernel too: the generator must refuse it with an error, not assemble it.
    let (huge, fit): (Vec<_>, Vec<_>) = out
        .into_iter()
        .partition(|(k, _)| matches!(k, Kernel::Map(m) if m.shape.iter().product::<usize>() > ptx::MAX_ELEMENTS));
    for (k, s) in &huge {
        assert!(matches!(ptx::generate_stored(k, s), Err(ptx::PtxError::TooLarge { .. })), "{k}");
    }
    let out = fit;
    assert!(out.len() > 50, "the fuse pass made {} kernels of the scripts", out.len());
    let wide = out.iter().filter(|(k, _)| matches!(k, Kernel::Map(m) if m.compute != Compute::F32)).count();
    assert!(wide > 5, "the fuse pass made {wide} f64 and integer kernels of the scripts");
    out
}

/// Hand-written fused kernels, in shapes that take each code path (row in registers or
/// looped, rows along inner or outer axes, final reductions, matmul epilogues).
fn sample_kernels() -> Vec<Kernel> {
    use gt_ir::kernel::samples;
    let mut out = vec![
        samples::softmax(&[64, 784]),
        samples::softmax(&[8, 20_000]),
        samples::layer_norm(&[16, 1000], 1e-5),
        samples::gelu(&[1000]),
        samples::linear_relu(64, 784, 256),
        samples::linear_relu(2048, 512, 2048),
    ];
    out.push(transpose_kernel(&[45, 70], &[1, 45]));
    out.push(transpose_kernel(&[3, 33, 40], &[1320, 1, 33]));
    // The TF32 tensor-core matmul, with and without an epilogue, on ragged edges.
    for (m, k, n) in [(130, 70, 90), (4096, 4096, 4096)] {
        if let Kernel::MatMul(mut mm) = samples::linear_relu(m, k, n) {
            mm.precision = gt_ir::kernel::Precision::Tf32;
            out.push(Kernel::MatMul(mm.clone()));
            mm.epilogue.clear();
            mm.epilogue_inputs.clear();
            out.push(Kernel::MatMul(mm));
        }
    }
    // Softmax over the outer axes of a 3-d tensor, and a log-sum-exp's sum as a final reduction.
    if let Kernel::Map(mut k) = samples::softmax(&[6, 5, 7]) {
        k.rows = vec![0, 2];
        out.push(Kernel::Map(k.clone()));
        k.nodes.truncate(4);
        k.reduce = Some(gt_ir::ReduceOp::Sum);
        k.output.strides = vec![0, 1, 0];
        out.push(Kernel::Map(k));
    }
    out
}

/// A copy reading `strides` over the iteration space `dims` (a transpose for unit stride
/// on an axis before the last), with `exp` applied.
/// Kernels over half-precision buffers, each with its storage: every sample kernel with all
/// buffers in `f16` and in `bf16`, maps reading one half and one `f32` input, and the
/// tensor-core matmuls in the shapes that take each load path (16-byte aligned rows by
/// `cp.async`; transposed or odd operands element by element; batches; epilogues).
fn stored_kernels() -> Vec<(Kernel, BufferStorage)> {
    use gt_ir::kernel::{samples, Access};
    let all = |k: &Kernel, s: Storage| BufferStorage { output: s, inputs: vec![s; k.num_inputs()] };
    let mut out = Vec::new();
    let mut kernels = sample_kernels();
    kernels.push(samples::gelu(&[1001]));
    for k in &kernels {
        for s in [Storage::F16, Storage::Bf16] {
            out.push((k.clone(), all(k, s)));
        }
    }
    // Mixed storage: bf16 matmul operands into an f32 result and epilogue input.
    let Kernel::MatMul(mm) = samples::linear_relu(256, 512, 256) else { unreachable!() };
    let mixed = BufferStorage { output: Storage::F32, inputs: vec![Storage::Bf16, Storage::Bf16, Storage::F32] };
    out.push((Kernel::MatMul(mm.clone()), mixed));
    // A transposed rhs ([n, k] read as [k, n]), odd k, and a batch of transposed lhs.
    let mut t = mm.clone();
    t.rhs = Access { offset: 0, strides: vec![1, 512] };
    out.push((Kernel::MatMul(t.clone()), all(&Kernel::MatMul(t), Storage::Bf16)));
    let mut odd = mm.clone();
    odd.k = 509;
    odd.lhs = Access { offset: 0, strides: vec![509, 1] };
    out.push((Kernel::MatMul(odd.clone()), all(&Kernel::MatMul(odd), Storage::F16)));
    // TF32 (f32 buffers), which Hopper runs on warpgroups after transposing B.
    let mut tf32 = mm.clone();
    tf32.precision = gt_ir::kernel::Precision::Tf32;
    out.push((Kernel::MatMul(tf32), BufferStorage::f32(3)));
    let mut batched = mm;
    batched.batch = vec![3];
    batched.lhs = Access { offset: 0, strides: vec![256 * 512, 1, 256] };
    batched.rhs = Access { offset: 0, strides: vec![512 * 256, 256, 1] };
    batched.epilogue_inputs = vec![Access { offset: 0, strides: vec![0, 0, 1] }];
    out.push((Kernel::MatMul(batched.clone()), all(&Kernel::MatMul(batched), Storage::Bf16)));
    out
}

fn transpose_kernel(dims: &[usize], strides: &[i64]) -> Kernel {
    use gt_ir::kernel::{Access, MapKernel, Node};
    Kernel::Map(MapKernel {
        shape: dims.to_vec(),
        inputs: vec![Access { offset: 0, strides: strides.to_vec() }],
        nodes: vec![Node::Input(0), Node::Unary(gt_ir::UnaryOp::Exp, 0)],
        output: Access::contiguous(dims),
        rows: vec![],
        reduce: None,
        compute: Compute::F32,
    })
}

fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GT_PTXAS").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    Command::new("ptxas").arg("--version").output().ok().filter(|o| o.status.success()).map(|_| PathBuf::from("ptxas"))
}

#[test]
fn every_kernel_of_the_filetests_assembles_for_sm80_and_sm90() {
    let Some(ptxas) = ptxas() else {
        assert!(std::env::var_os("CI").is_none(), "CI must assemble the PTX: set GT_PTXAS or put ptxas on PATH");
        eprintln!("skipped: no ptxas (set GT_PTXAS, or `pip install nvidia-cuda-nvcc`)");
        return;
    };
    let mut stored = all_kernels();
    stored.extend(sample_kernels().into_iter().map(|k| (k.clone(), BufferStorage::f32(k.num_inputs()))));
    let kinds = |k: &str| stored.iter().filter(|(x, _)| x.kind() == k).count();
    assert!(kinds("map") > 20 && kinds("reduce") > 5 && kinds("matmul") > 3 && kinds("rows") > 3, "too few kernels");
    // The dtype filetests give kernels computing in f64 and i64 and buffers of every dtype.
    let computing = |c: Compute| stored.iter().filter(|(k, _)| matches!(k, Kernel::Map(m) if m.compute == c)).count();
    assert!(computing(Compute::F64) > 5 && computing(Compute::I64) > 10, "too few f64 or i64 kernels");
    for s in [Storage::F64, Storage::I64, Storage::I32, Storage::Bool] {
        let n = stored.iter().filter(|(_, b)| b.output == s || b.inputs.contains(&s)).count();
        assert!(n > 3, "only {n} kernels store {s:?}");
    }
    stored.extend(stored_kernels());
    // What the GPU refuses by name (transcendental f64 ops, integer products) is refused by
    // the generator, never assembled wrong.
    let mut refused = 0;
    stored.retain(|(k, s)| match ptx::generate_stored(k, s) {
        Err(e) if e.refuses_dtype() => {
            refused += 1;
            false
        }
        _ => true,
    });
    assert!(refused > 0, "the f64 exp and the integer products of the filetests are refused by name");
    eprintln!("{} kernels to assemble, {refused} refused by name", stored.len());
    let dir = std::env::temp_dir().join(format!("gt-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Each kernel for every GPU (sm_80 code, assembled for sm_80 and sm_90), and again where
    // Hopper gets other code (warpgroup matmuls, assembled for sm_90a).
    let mut files: Vec<(PathBuf, String, &[&str])> = Vec::new();
    for (i, (k, s)) in stored.iter().enumerate() {
        let path = dir.join(format!("k{i}.ptx"));
        let text = ptx::generate_stored(k, s).unwrap().text;
        let hopper = ptx::generate_for(k, s, ptx::Target::Sm90a).unwrap().text;
        std::fs::write(&path, &text).unwrap();
        files.push((path, format!("{k}\nstorage {s:?}"), &["sm_80", "sm_90"]));
        if hopper != text {
            let path = dir.join(format!("k{i}_sm90a.ptx"));
            std::fs::write(&path, hopper).unwrap();
            files.push((path, format!("{k}\nstorage {s:?}, for sm_90a"), &["sm_90a"]));
        }
        if let Some(t) = ptx::transposed_rhs(k, s, ptx::Target::Sm90a) {
            let path = dir.join(format!("k{i}_sm90a_transposed.ptx"));
            std::fs::write(&path, ptx::generate_for(&t.matmul, s, ptx::Target::Sm90a).unwrap().text).unwrap();
            files.push((path, format!("{}\nstorage {s:?}, for sm_90a", t.matmul), &["sm_90a"]));
        }
    }
    let wgmma = files.iter().filter(|f| f.2 == ["sm_90a"]).count();
    assert!(wgmma >= 6, "only {wgmma} kernels take wgmma on sm_90a");
    let failures: Vec<String> = std::thread::scope(|s| {
        let chunks: Vec<_> = files
            .chunks(files.len().div_ceil(4))
            .map(|chunk| {
                let ptxas = &ptxas;
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for (path, kernel, archs) in chunk {
                        for arch in archs.iter() {
                            let out = Command::new(ptxas)
                                .args(["--gpu-name", arch, "-o", "/dev/null"])
                                .arg(path)
                                .output()
                                .expect("ptxas runs");
                            if !out.status.success() {
                                bad.push(format!(
                                    "{arch}: {}\n{kernel}\n{}",
                                    path.display(),
                                    String::from_utf8_lossy(&out.stderr)
                                ));
                            }
                        }
                    }
                    bad
                })
            })
            .collect();
        chunks.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed to assemble:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_kernel_prints_and_parses_back() {
    let mut kernels: Vec<Kernel> = all_kernels().into_iter().map(|(k, _)| k).collect();
    kernels.extend(sample_kernels());
    for k in &kernels {
        assert_eq!(gt_ir::kernel::text::parse(&k.to_string()).as_ref(), Ok(k), "{k}");
    }
}

/// The last kernel of `source` (a script) whose kind is `kind`: the op of interest comes last.
fn kernel_of(source: &str, kind: &str) -> Kernel {
    let loaded = load(source.as_bytes()).unwrap();
    let (result, recorder) = run_any(&loaded, KernelRecorder::new(), &mut std::io::sink(), quiet());
    result.unwrap();
    recorder.expect("the recorder comes back").kernels.into_iter().rev().find(|k| k.kind() == kind).unwrap()
}

/// [`kernel_of`] with the storage of its buffers.
fn stored_kernel_of(source: &str, kind: &str) -> (Kernel, BufferStorage) {
    let loaded = load(source.as_bytes()).unwrap();
    let (result, recorder) = run_any(&loaded, KernelRecorder::new(), &mut std::io::sink(), quiet());
    result.unwrap();
    let r = recorder.expect("the recorder comes back");
    r.kernels.into_iter().zip(r.storage).rev().find(|(k, _)| k.kind() == kind).unwrap()
}

fn snapshot(name: &str, kernel: &Kernel) {
    snapshot_stored(name, kernel, &BufferStorage::f32(kernel.num_inputs()));
}

fn snapshot_stored(name: &str, kernel: &Kernel, storage: &BufferStorage) {
    let p = ptx::generate_stored(kernel, storage).unwrap();
    let stored = if storage.is_f32() { String::new() } else { format!("storage {storage:?}\n") };
    let text = format!("{kernel}\n{stored}\ngrid {:?} block {:?}\n\n{}", p.grid, p.block, p.text);
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(format!("ptx__{name}"), text));
}

#[test]
fn ptx_of_representative_kernels() {
    let x = "%x = randn f32[64, 32] seed=1\n";
    snapshot("map_vectorised_exp", &kernel_of(&format!("{x}%y = exp %x\n"), "map"));
    let bias = "%b = ones f32[32]\n";
    let k = kernel_of(&format!("{x}{bias}%y = add %x, %b\n"), "map");
    snapshot("map_broadcast_add", &k);
    let t = kernel_of("%x = ones f32[3, 5]\n%y = transpose %x\n", "map");
    snapshot("map_strided_transpose", &t);
    snapshot("randn", &kernel_of(x, "map"));
    snapshot("reduce_rows_max", &kernel_of(&format!("{x}%m = max %x axes=[1]\n"), "reduce"));
    let mm = "%a = ones f32[64, 784]\n%w = ones f32[784, 256]\n%y = matmul %a, %w\n";
    snapshot("matmul_64x256x784", &kernel_of(mm, "matmul"));
    snapshot("softmax_row_kernel", &gt_ir::kernel::samples::softmax(&[64, 784]));
    snapshot("linear_relu_epilogue", &gt_ir::kernel::samples::linear_relu(64, 784, 256));
    snapshot("transpose_tiled", &transpose_kernel(&[45, 70], &[1, 45]));
    // Half storage: a vectorised map over bf16 and the tensor-core matmul (f16 operands,
    // bf16 result through the epilogue).
    let exp = kernel_of(&format!("{x}%y = exp %x\n"), "map");
    let bf16 = BufferStorage { output: Storage::Bf16, inputs: vec![Storage::Bf16] };
    snapshot_stored("map_vectorised_exp_bf16", &exp, &bf16);
    let linear = gt_ir::kernel::samples::linear_relu(64, 784, 256);
    let mixed = BufferStorage { output: Storage::Bf16, inputs: vec![Storage::F16, Storage::F16, Storage::F32] };
    snapshot_stored("linear_relu_f16_tensor_cores", &linear, &mixed);
    // Other dtypes: i64 kernels over i32 and bool (64-bit shuffles in the reduction), f64
    // comparisons stored as bool, an f64 rounded once into bf16.
    let (k, s) = stored_kernel_of("%x = ones i32[8, 300]\n%s = sum %x axes=[1]\n", "reduce");
    snapshot_stored("reduce_rows_sum_i32_in_i64", &k, &s);
    let (k, s) = stored_kernel_of("%a = ones f64[64]\n%b = zeros f64[64]\n%c = lt %a, %b\n", "map");
    snapshot_stored("map_compare_f64_to_bool", &k, &s);
    let (k, s) = stored_kernel_of("%a = ones f64[16]\n%c = cast %a bf16\n", "map");
    snapshot_stored("map_cast_f64_to_bf16", &k, &s);
    let src = "%c = tensor bool[3] [1, 0, 1]\n%a = full i64[3] 5\n%w = where %c, %a, -2\n";
    let (k, s) = stored_kernel_of(src, "map");
    snapshot_stored("map_where_bool_i64", &k, &s);
}

#[test]
fn malformed_kernels_are_errors_not_bad_ptx() {
    use gt_ir::kernel::{Access, MapKernel, Node};
    let bad = |nodes: Vec<Node>, rows: Vec<usize>| {
        let k = MapKernel {
            shape: vec![4],
            inputs: vec![Access::contiguous(&[4])],
            nodes,
            output: Access::contiguous(&[4]),
            rows,
            reduce: None,
            compute: Compute::F32,
        };
        ptx::generate(&Kernel::Map(k)).unwrap_err().to_string()
    };
    assert!(bad(vec![], vec![]).contains("at least one node"));
    assert!(bad(vec![Node::Input(1)], vec![]).contains("reads input 1 of 1"));
    assert!(bad(vec![Node::Input(0), Node::Unary(gt_ir::UnaryOp::Exp, 1)], vec![]).contains("not before it"));
    assert!(bad(vec![Node::Acc], vec![]).contains("outside a matmul epilogue"));
    assert!(bad(vec![Node::Input(0), Node::Reduce(gt_ir::ReduceOp::Sum, 0)], vec![]).contains("without row axes"));
    assert!(bad(vec![Node::Input(0)], vec![1]).contains("row axes"));
    // More matrices than CUDA's grid allows: an error naming the limit, not a failed launch.
    let Kernel::MatMul(mut mm) = gt_ir::kernel::samples::linear_relu(4, 4, 4) else { unreachable!() };
    mm.batch = vec![70_000];
    mm.lhs = Access { offset: 0, strides: vec![16, 4, 1] };
    mm.rhs = Access { offset: 0, strides: vec![16, 4, 1] };
    mm.epilogue_inputs = vec![Access { offset: 0, strides: vec![0, 0, 1] }];
    let e = ptx::generate(&Kernel::MatMul(mm)).unwrap_err().to_string();
    assert!(e.contains("70000 matrices") && e.contains("65535"), "{e}");
}
