use gt::ir::{Instr, TensorType, UnaryOp, ValueId};
use gt::passes::{pipeline::Pipeline, registry};
use std::time::Instant;
fn main() {
    let n = 2_000_000u32;
    let x = ValueId(1);
    let mut input = vec![Instr::Randn { dst: x, ty: TensorType::new(gt::ir::DType::F32, vec![1]), seed: 1 }];
    for k in 0..n / 2 {
        let dst = ValueId(10 + k);
        input.push(Instr::Unary { dst, op: UnaryOp::Neg, src: x });
        input.push(Instr::Free { src: dst });
    }
    let opts = registry::default_options();
    let which = std::env::var("ZZ_PASSES").unwrap_or_default();
    let names: Vec<&str> = which.split(',').filter(|s| !s.is_empty()).collect();
    let reps: usize = std::env::var("ZZ_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    for _ in 0..reps {
        let mut p = if names.is_empty() { Pipeline::new() } else { registry::pipeline(&names, &opts).unwrap() };
        let mut out = Vec::with_capacity(1024);
        let data = input.clone();
        let t = Instant::now();
        for (k, i) in (0u64..).zip(data) {
            p.run(i, k, &mut out);
            out.clear();
        }
        println!("{:.1} ns/instr", t.elapsed().as_nanos() as f64 / input.len() as f64);
    }
}
