//! Lowering checked without a GPU: every run filetest and example executed as the kernels
//! its instructions lower to (evaluated by the CPU kernel oracle) gives the interpreter's
//! output, every value read compared.

use gt::mirror::{check_scripts, Tolerance};
use gt_runtime::backend::cpu::kernels::KernelBackend;
use std::path::Path;

#[test]
fn every_script_through_its_kernels_equals_the_interpreter() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exact = Tolerance { abs: 0.0, rel: 0.0 };
    let report = check_scripts(root, &mut || Box::new(KernelBackend::new(8 << 30)), exact);
    println!("{}", report.summary());
    assert!(report.files > 20 && report.compared.0 > 200, "{}", report.summary());
    assert!(report.failures.is_empty(), "{}", report.failures.join("\n\n"));
}

#[path = "../common/dtype_program.rs"]
mod dtype_program;

/// Every dtype through its kernels (computing in f64 or i64, loading and storing each
/// dtype) gives the interpreter's values, integers exactly, f64 in f64 (the GPU runs the
/// same program, `tests/cuda`).
#[test]
fn every_dtype_through_its_kernels_equals_the_interpreter() {
    use gt::mirror::Mirror;
    use gt_ir::Executor;
    let (exact, sums) = dtype_program::dtype_program();
    for (instrs, tolerance) in [(exact.clone(), 0.0), (sums, 1e-12)] {
        let mut m = Mirror::new(Box::new(KernelBackend::new(1 << 30)), Tolerance { abs: 0.0, rel: tolerance });
        let run = if tolerance == 0.0 { instrs } else { exact.iter().cloned().chain(instrs).collect() };
        for i in &run {
            m.execute(i).unwrap_or_else(|e| panic!("{}: {e}", i.mnemonic()));
        }
        for i in &run {
            for r in i.results() {
                m.read(r).unwrap_or_else(|e| panic!("{i:?}: {e}"));
            }
        }
    }
}
