//! One training step of an MLP through the Rust Tensor API: x 64x784, w1 784x256, relu,
//! w2 256x10, mean-square loss, backward, SGD update, and `loss.item()` (a sync point, as a
//! training loop reads its loss). Measured on the reference interpreter in this thread, on
//! an embedded cluster (client -> dispatcher -> worker over inproc ZeroMQ), and on the
//! cluster with fusion (`GT_COMPILE=1`, `GT_AUTO_COMPILE=1`) and with no pass at all
//! (`GT_PASSES=none`; the worker's peak bytes then show what the `dead` pass saves); next to
//! PyTorch eager on the CPU (`bench/mlp_torch.py`) when it is installed; both also with the
//! forward pass under bf16 autocast (`gt::autocast`, `torch.autocast("cpu", torch.bfloat16)`;
//! gt eager and with `GT_COMPILE=1`, whose kernels read and write the bf16 values).
//! Then eager and the two compiling modes taken in turn, several rounds, for ratios that
//! hold on a noisy machine.
//! Run: `cargo bench --bench mlp` (`GT_BENCH_QUICK=1`: fewer steps; `GT_BENCH_SAVE=1` writes
//! `bench/results/mlp-vm.txt`).

/// gt's allocator, as its binaries and Python package run on.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

use gt::nn::{self, Optimizer};
use gt::{Runtime, Tensor};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

struct Mlp {
    x: Tensor,
    y: Tensor,
    w1: Tensor,
    w2: Tensor,
    opt: nn::Sgd,
}

impl Mlp {
    fn new() -> Mlp {
        gt::manual_seed(0).unwrap();
        let x = gt::randn(&[64, 784]).unwrap();
        let y = gt::randn(&[64, 10]).unwrap();
        let w1 = gt::randn(&[784, 256]).unwrap().mul(0.05).unwrap().requires_grad_(true).unwrap();
        let w2 = gt::randn(&[256, 10]).unwrap().mul(0.05).unwrap().requires_grad_(true).unwrap();
        let opt = nn::Sgd::new(vec![w1.clone(), w2.clone()], 0.01);
        Mlp { x, y, w1, w2, opt }
    }

    fn step(&mut self, bf16: bool) -> f32 {
        let loss = {
            let _mixed = bf16.then(|| gt::autocast(gt::DType::BF16).unwrap());
            let h = self.x.matmul(&self.w1).unwrap().relu().unwrap();
            nn::mse_loss(&h.matmul(&self.w2).unwrap(), &self.y).unwrap()
        };
        self.opt.zero_grad();
        loss.backward().unwrap();
        self.opt.step().unwrap();
        loss.item().unwrap()
    }
}

/// Median and minimum step time over `steps` steps after `warmup` ones, and the last loss.
fn measure(steps: usize, warmup: usize, bf16: bool) -> (Duration, Duration, f32) {
    let mut mlp = Mlp::new();
    let mut loss = 0.0;
    for _ in 0..warmup {
        loss = mlp.step(bf16);
    }
    let mut times: Vec<Duration> = (0..steps)
        .map(|_| {
            let start = Instant::now();
            loss = mlp.step(bf16);
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[times.len() / 2], times[0], loss)
}

/// Runs `f` with the environment variables `vars` set (a runtime reads them as it starts),
/// then unsets them.
fn with_vars<R>(vars: &[(&str, &str)], f: impl FnOnce() -> R) -> R {
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let r = f();
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    r
}

/// The median of `xs` (not empty).
fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Eager, `GT_AUTO_COMPILE=1` and `GT_COMPILE=1` in turn, on a fresh cluster each, `rounds`
/// times: what the machine does meanwhile (other load, clock changes) falls on every mode
/// alike, so the modes' ratios hold where one run of each, minutes apart, does not.
fn interleaved(report: &mut String, rounds: usize, steps: usize, warmup: usize) {
    let modes: [(&str, &[(&str, &str)]); 3] =
        [("eager", &[]), ("GT_AUTO_COMPILE=1", &[("GT_AUTO_COMPILE", "1")]), ("GT_COMPILE=1", &[("GT_COMPILE", "1")])];
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..rounds {
        for ((_, vars), times) in modes.iter().zip(&mut medians) {
            let _gt = with_vars(vars, || Runtime::embedded(1).expect("an embedded cluster starts"));
            times.push(ms(measure(steps, warmup, false).0));
        }
    }
    let _ = writeln!(
        report,
        "\nthe modes interleaved: {rounds} rounds of eager, GT_AUTO_COMPILE=1, GT_COMPILE=1 (each a fresh cluster, \
         median of {steps} steps after {warmup})"
    );
    let _ = writeln!(
        report,
        "{:<20} {:>14} {:>16} {:>22}",
        "mode", "median ms", "÷ eager (median)", "rounds faster than eager"
    );
    for ((name, _), times) in modes.iter().zip(&medians) {
        let ratios: Vec<f64> = times.iter().zip(&medians[0]).map(|(t, e)| t / e).collect();
        let faster = ratios.iter().filter(|&&r| r < 1.0).count();
        let _ =
            writeln!(report, "{name:<20} {:>14.3} {:>16.3} {:>16}/{rounds}", median(times), median(&ratios), faster);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// PyTorch's step times in ms (f32, and with the forward under bf16 autocast), or why there
/// are none.
fn torch(steps: usize) -> Result<(f64, f64), String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/mlp_torch.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(steps.to_string())
        .output()
        .map_err(|e| format!("python3 not runnable: {e}"))?;
    if out.status.code() == Some(3) {
        return Err("torch is not installed (python3 -c 'import torch' fails)".into());
    }
    if !out.status.success() {
        return Err(format!("mlp_torch.py failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let numbers: Vec<f64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match numbers[..] {
        [t, t16] => Ok((t, t16)),
        _ => Err(format!("mlp_torch.py printed {text:?}, not two numbers")),
    }
}

fn main() {
    let quick = std::env::var("GT_BENCH_QUICK").is_ok_and(|v| v == "1") || !std::env::args().any(|a| a == "--bench");
    let (steps, warmup) = if quick { (20, 5) } else { (300, 30) };
    let mut report = String::new();
    let _ =
        writeln!(report, "gt MLP training step (64x784 @ 784x256, relu, @ 256x10, MSE, backward, SGD, loss.item())");
    let _ = writeln!(report, "median (min) of {steps} steps after {warmup} warm-up steps\n");
    let mut rows: Vec<(String, f64)> = Vec::new();
    let mut row = |report: &mut String, name: &str, (med, min, loss): (Duration, Duration, f32)| {
        let _ = writeln!(report, "{name:<44} {:>8.3} ms ({:.3} ms)  last loss {loss:.5}", ms(med), ms(min));
        rows.push((name.to_string(), ms(med)));
    };
    {
        let _gt = Runtime::reference();
        row(&mut report, "reference interpreter, this thread", measure(steps, warmup, false));
    }
    for (name, vars) in [
        ("embedded cluster, 1 worker", &[][..]),
        ("embedded, GT_PASSES=none (no pass)", &[("GT_PASSES", "none")][..]),
        ("embedded, GT_AUTO_COMPILE=1 (hot paths fused)", &[("GT_AUTO_COMPILE", "1")][..]),
        ("embedded, GT_COMPILE=1 (every region fused)", &[("GT_COMPILE", "1")][..]),
    ] {
        let gt = with_vars(vars, || Runtime::embedded(1).expect("an embedded cluster starts"));
        row(&mut report, name, measure(steps, warmup, false));
        if let Some(Ok(stats)) = gt.worker_stats() {
            let peak = stats.iter().map(|w| w.peak_bytes).max().unwrap_or(0);
            let _ = writeln!(report, "{:<44} worker peak {:.2} MiB", "", peak as f64 / (1 << 20) as f64);
        }
    }
    let mut bf16_rows: Vec<(&str, f64)> = Vec::new();
    for (name, compile) in
        [("embedded, forward under bf16 autocast", false), ("embedded, bf16 autocast, GT_COMPILE=1", true)]
    {
        let vars: &[(&str, &str)] = if compile { &[("GT_COMPILE", "1")] } else { &[] };
        let _gt = with_vars(vars, || Runtime::embedded(1).expect("an embedded cluster starts"));
        let (med, min, loss) = measure(steps, warmup, true);
        let _ = writeln!(report, "{name:<44} {:>8.3} ms ({:.3} ms)  last loss {loss:.5}", ms(med), ms(min));
        bf16_rows.push((name, ms(med)));
    }
    let (rounds, round_steps) = if quick { (2, 10) } else { (9, 200) };
    interleaved(&mut report, rounds, round_steps, warmup);
    let _ = writeln!(report);
    match torch(steps) {
        Ok((t, t16)) => {
            let _ = writeln!(report, "{:<44} {t:>8.3} ms", "PyTorch eager CPU (default threads)");
            let _ = writeln!(report, "{:<44} {t16:>8.3} ms", "PyTorch eager CPU, forward under bf16 autocast");
            for (name, ours) in &rows {
                let _ = writeln!(report, "  {name}: {:.2}x PyTorch's time", ours / t);
            }
            for (name, ours) in &bf16_rows {
                let _ = writeln!(report, "  {name}: {:.2}x PyTorch's bf16 autocast time", ours / t16);
            }
        }
        Err(why) => {
            let _ = writeln!(report, "PyTorch: skipped: {why}");
        }
    }
    print!("{report}");
    if std::env::var("GT_BENCH_SAVE").is_ok_and(|v| v == "1") {
        let path = format!("{}/bench/results/mlp-vm.txt", env!("CARGO_MANIFEST_DIR"));
        std::fs::write(&path, &report).expect("bench/results is writable");
        println!("saved to {path}");
    }
}
