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
