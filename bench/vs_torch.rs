//! gt against PyTorch eager on the CPU, side by side in one run: issue 16's list of
//! workloads (MLP training step, matmul 1000² and 4096², an SGD update of one weight, a
//! linear layer read back, MSE loss, relu/sigmoid/tanh on 10k elements with and without a
//! read, the 8-op elementwise chain on 16M f32 (and in f64, and an integer one in i32), a
//! masked softmax, `randn` alone and under a softmax, reads of 4 MB and 64 MB, tiny ops), gt
//! through the Tensor API on an embedded
//! cluster (as a Rust user runs it; `GT_COMPILE=1` for the compiled rows) and PyTorch through
//! `bench/vs_torch.py`, started once and kept running. The two sides take turns: each row
//! runs in rounds, and in each round every gt variant of the row (a fresh cluster each) and
//! PyTorch run their share of the repetitions, who goes first alternating (the gt variants
//! rotating too, with a pause after each), so that a noisy
//! machine's drift falls on both sides of a ratio alike. Both sides run on the same inputs
//! (`pattern`), and each row's result is checked against PyTorch's (a loss or the mean
//! |value| of the result). Prints per row the median over rounds of each side's time, the
//! median and range of the rounds' `gt ÷ PyTorch`, and the issue's goal where there is one
//! (met when the median ratio meets it; the rounds that met it are counted); no timing is
//! asserted.
//! Run: `cargo bench --bench vs_torch` (`GT_BENCH_QUICK=1`: fewer repetitions, same sizes;
//! `GT_BENCH_ROWS=mlp,matmul1000`: only the rows named; `GT_BENCH_SAVE=1` writes
//! `bench/results/vs-torch-vm.txt`).

/// gt's allocator, as its binaries and Python package run on.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

use anyhow::{anyhow, Context as _, Result};
use gt::nn::{self, Optimizer};
use gt::{Runtime, Tensor};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One workload as both sides run it; serialised to JSON for `vs_torch.py`.
#[derive(Clone)]
struct Spec {
    /// Key of the workload in both sides' results.
    name: &'static str,
    /// Which function runs it (`run_gt` here, `RUN` in the script).
    kind: &'static str,
    /// What the row says.
    label: &'static str,
    /// Elements or matrix side, where the kind has a size.
    n: usize,
    /// The unary op (`relu`, `sigmoid`, `tanh`) or the tiny-op mode (`issue`, `sync`, `item`).
    op: &'static str,
    /// Whether the result is read back to the host.
    read: bool,
    reps: usize,
    warmup: usize,
    /// Ops per repetition (times are per op); 1 for all but the tiny ops.
    batch: usize,
    /// The issue's goal for `gt ÷ PyTorch` of the eager row.
    goal: Option<f64>,
    /// Also run with `GT_COMPILE=1`, with this goal (`Some(None)`: a row without a goal).
    compiled: Option<Option<f64>>,
}

impl Spec {
    fn json(&self) -> String {
        format!(
            r#"{{"name":"{}","kind":"{}","n":{},"op":"{}","read":{},"reps":{},"warmup":{},"batch":{}}}"#,
            self.name, self.kind, self.n, self.op, self.read, self.reps, self.warmup, self.batch
        )
    }
}

/// Issue 16's workloads; `quick` cuts repetitions, never sizes.
fn specs(quick: bool) -> Vec<Spec> {
    // Repetitions and warm-up runs, full or quick.
    let r = |full: (usize, usize), fast: (usize, usize)| if quick { fast } else { full };
    let spec = |name, kind, label, n, (reps, warmup): (usize, usize)| Spec {
        name,
        kind,
        label,
        n,
        op: "",
        read: false,
        reps,
        warmup,
        batch: 1,
        goal: None,
        compiled: None,
    };
    let mut list = vec![
        Spec {
            goal: Some(0.8),
            compiled: Some(Some(0.8)),
            ..spec("mlp", "mlp", "MLP step 64x784→256→10, loss.item()", 0, r((1001, 100), (31, 5)))
        },
        Spec {
            goal: Some(1.1),
            ..spec("matmul1000", "matmul", "matmul 1000² (sync, no read)", 1000, r((51, 5), (5, 1)))
        },
        spec("matmul4096", "matmul", "matmul 4096² (sync, no read)", 4096, r((7, 1), (1, 1))),
        Spec {
            batch: 20,
            ..spec(
                "sgd",
                "sgd",
                "SGD update of a 784x256 weight (w -= 0.01 g), 20 per sync",
                784 * 256,
                r((101, 10), (11, 2)),
            )
        },
        spec("linear", "linear", "linear 128x512→256 (x@w+b), read", 0, r((501, 50), (31, 5))),
        spec("mse", "mse", "MSE loss 10k + item()", 10_000, r((1001, 100), (51, 10))),
    ];
    for op in ["relu", "sigmoid", "tanh"] {
        for read in [true, false] {
            let (name, label) = match (op, read) {
                ("relu", true) => ("relu_read", "relu 10k, read"),
                ("relu", false) => ("relu", "relu 10k, sync only"),
                ("sigmoid", true) => ("sigmoid_read", "sigmoid 10k, read"),
                ("sigmoid", false) => ("sigmoid", "sigmoid 10k, sync only"),
                (_, true) => ("tanh_read", "tanh 10k, read"),
                (_, false) => ("tanh", "tanh 10k, sync only"),
            };
            list.push(Spec {
                op,
                read,
                goal: read.then_some(10.0),
                ..spec(name, "unary", label, 10_000, r((1001, 100), (51, 10)))
            });
        }
    }
    list.extend([
        Spec {
            compiled: Some(Some(0.3)),
            ..spec("chain", "chain", "8-op chain, 16M f32 (sync, no read)", 1 << 24, r((11, 2), (1, 1)))
        },
        // The same chain in f64, and an integer chain in i32: eager ops of those dtypes, and
        // compiled (kernels computing in f64 and i64).
        Spec {
            op: "f64",
            compiled: Some(None),
            ..spec("chain_f64", "chain", "8-op chain, 16M f64 (sync, no read)", 1 << 24, r((11, 2), (1, 1)))
        },
        Spec {
            op: "i32",
            compiled: Some(None),
            ..spec("chain_i32", "chain", "8-op int chain, 16M i32 (sync, no read)", 1 << 24, r((11, 2), (1, 1)))
        },
        // Attention's masked softmax: scores [16, 512, 512] under a mask [512, 512] of `bool`s
        // broadcast over the batch (compiled: one kernel reading the mask as 0 and 1).
        Spec {
            compiled: Some(None),
            ..spec(
                "masked_softmax",
                "masked_softmax",
                "masked softmax 16x512x512 f32 (sync)",
                1 << 22,
                r((21, 3), (3, 1)),
            )
        },
        // Standard-normal numbers: alone, and a softmax over the rows of fresh ones (compiled:
        // the row kernel reads them from a kernel of their own).
        spec("randn", "randn", "randn 4096x4096 f32 (sync)", 1 << 24, r((11, 2), (1, 1))),
        Spec {
            op: "softmax",
            compiled: Some(None),
            ..spec("randn_softmax", "randn", "softmax of randn 4096x4096 f32 (sync)", 1 << 24, r((11, 2), (1, 1)))
        },
        Spec { read: true, ..spec("read4", "read", "read 4 MB result", 1 << 20, r((51, 5), (5, 1))) },
        Spec { read: true, ..spec("read64", "read", "read 64 MB result", 1 << 24, r((11, 2), (1, 1))) },
        Spec {
            op: "issue",
            batch: if quick { 2000 } else { 20_000 },
            ..spec("tiny", "tiny", "tiny op issued (sync at the end)", 1, r((21, 2), (3, 1)))
        },
        Spec {
            op: "sync",
            batch: if quick { 200 } else { 2000 },
            ..spec("tiny_sync", "tiny", "tiny op + sync round trip", 1, r((21, 2), (3, 1)))
        },
        Spec {
            op: "item",
            batch: if quick { 200 } else { 2000 },
            ..spec("tiny_item", "tiny", "tiny op + item() round trip", 1, r((21, 2), (3, 1)))
        },
    ]);
    list
}

/// The rows `GT_BENCH_ROWS` names (comma-separated row names), all when it is unset or empty;
/// a name that is no row is an error listing the rows.
fn chosen(specs: Vec<Spec>, names: Option<&str>) -> Result<Vec<Spec>> {
    let Some(names) = names.filter(|n| !n.trim().is_empty()) else { return Ok(specs) };
    let wanted: Vec<&str> = names.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    if let Some(bad) = wanted.iter().find(|w| !specs.iter().any(|s| s.name == **w)) {
        let rows: Vec<&str> = specs.iter().map(|s| s.name).collect();
        return Err(anyhow!("GT_BENCH_ROWS: no row named {bad:?}; the rows are {}", rows.join(", ")));
    }
    Ok(specs.into_iter().filter(|s| wanted.contains(&s.name)).collect())
}

// ---- inputs and helpers --------------------------------------------------------------------

/// `n` values in `[-scale, scale)`: murmur3's 32-bit finaliser of `i + seed * 0x9E3779B9`
/// (mod 2^32) over 2^32, times 2, minus 1, times `scale`, in f64 rounded to f32; `pattern` in
/// vs_torch.py gives the same bits.
fn pattern(n: usize, seed: u64, scale: f64) -> Vec<f32> {
    const M: u64 = 0xFFFF_FFFF;
    (0..n as u64)
        .map(|i| {
            let mut h = (i + seed * 0x9E37_79B9) & M;
            h ^= h >> 16;
            h = (h * 0x85EB_CA6B) & M;
            h ^= h >> 13;
            h = (h * 0xC2B2_AE35) & M;
            h ^= h >> 16;
            ((h as f64 / 4_294_967_296.0 * 2.0 - 1.0) * scale) as f32
        })
        .collect()
}

fn upload(shape: &[usize], seed: u64, scale: f64) -> Result<Tensor> {
    Ok(gt::from_vec(pattern(shape.iter().product(), seed, scale), shape)?)
}

fn mean_abs(v: &[f32]) -> f64 {
    v.iter().map(|x| x.abs() as f64).sum::<f64>() / v.len().max(1) as f64
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

/// Median ms per op of `reps` timed calls of `f` (each doing `batch` ops) after `warmup`
/// untimed calls; as `timed` in vs_torch.py.
fn timed(s: &Spec, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..s.warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(s.reps);
    for _ in 0..s.reps {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64() * 1e3 / s.batch as f64);
    }
    Ok(median(&mut times))
}

/// Keeps a result from being optimised away (a read's vector, a loss).
fn keep<T>(x: T) -> Result<()> {
    black_box(x);
    Ok(())
}

/// What the run is doing, for the watchdog's message.
static PHASE: Mutex<String> = Mutex::new(String::new());

fn phase(text: impl Into<String>) {
    *PHASE.lock().unwrap_or_else(|e| e.into_inner()) = text.into();
}

// ---- gt's side -----------------------------------------------------------------------------

/// The MLP of bench/mlp.rs on the shared inputs.
struct Mlp {
    x: Tensor,
    y: Tensor,
    w1: Tensor,
    w2: Tensor,
    opt: nn::Sgd,
}

impl Mlp {
    fn new() -> Result<Mlp> {
        let x = upload(&[64, 784], 1, 1.0)?;
        let y = upload(&[64, 10], 2, 1.0)?;
        let w1 = upload(&[784, 256], 3, 0.05)?.requires_grad_(true)?;
        let w2 = upload(&[256, 10], 4, 0.05)?.requires_grad_(true)?;
        let opt = nn::Sgd::new(vec![w1.clone(), w2.clone()], 0.01);
        Ok(Mlp { x, y, w1, w2, opt })
    }

    fn step(&mut self) -> Result<f32> {
        let h = self.x.matmul(&self.w1)?.relu()?;
        let loss = nn::mse_loss(&h.matmul(&self.w2)?, &self.y)?;
        self.opt.zero_grad();
        loss.backward()?;
        self.opt.step()?;
        Ok(loss.item()?)
    }
}

/// The chain of bench/fusion.rs: `relu(exp(tanh(x * 0.5 + 1) * y) - x) + y`, 8 ops.
fn chain(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    Ok(x.mul(0.5)?.add(1.0)?.tanh()?.mul(y)?.exp()?.sub(x)?.relu()?.add(y)?)
}

/// An integer chain of 8 ops: `maximum(relu((x * 3 + 1) * y - x) + y, x) * 2`.
fn int_chain(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    Ok(x.mul(3.0)?.add(1.0)?.mul(y)?.sub(x)?.relu()?.add(y)?.maximum(x)?.mul(2.0)?)
}

/// Softmax over the last axis of `x` where `mask` (broadcast) holds, -1e30 elsewhere.
fn masked_softmax(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let w = gt::where_(mask, x, -1e30)?;
    let e = w.sub(&w.max_dims(&[-1], true)?)?.exp()?;
    Ok(e.div(&e.sum_dims(&[-1], true)?)?)
}

/// A chain of elementwise ops over two tensors.
type Chain = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// The chain row's inputs in its dtype (`op`: "" f32, "f64", "i32": values in ±1000, cut
/// toward zero) and its chain.
fn chain_of(s: &Spec) -> Result<(Tensor, Tensor, Chain)> {
    let (x, y) = (upload(&[s.n], 13, 1.0)?, upload(&[s.n], 14, 1.0)?);
    Ok(match s.op {
        "f64" => (x.to(gt::ir::DType::F64)?, y.to(gt::ir::DType::F64)?, chain),
        "i32" => (x.mul(1000.0)?.to(gt::ir::DType::I32)?, y.mul(1000.0)?.to(gt::ir::DType::I32)?, int_chain),
        _ => (x, y, chain),
    })
}

fn unary(x: &Tensor, op: &str) -> Result<Tensor> {
    Ok(match op {
        "relu" => x.relu()?,
        "sigmoid" => x.sigmoid()?,
        "tanh" => x.tanh()?,
        _ => return Err(anyhow!("unknown unary op {op}")),
    })
}

/// One workload on gt: (median ms per op, check value).
fn run_gt(gt: &Runtime, s: &Spec) -> Result<(f64, f64)> {
    match s.kind {
        "mlp" => {
            // The check: the loss of the third step of a fresh model.
            let mut check = Mlp::new()?;
            let mut loss = 0.0;
            for _ in 0..3 {
                loss = check.step()?;
            }
            drop(check);
            let mut m = Mlp::new()?;
            Ok((timed(s, || m.step().map(drop))?, loss as f64))
        }
        "matmul" => {
            let (a, b) = (upload(&[s.n, s.n], 5, 1.0)?, upload(&[s.n, s.n], 6, 1.0)?);
            let ms = timed(s, || {
                let _c = a.matmul(&b)?;
                Ok(gt.sync()?)
            })?;
            Ok((ms, mean_abs(&a.matmul(&b)?.to_vec()?)))
        }
        "sgd" => {
            // gt's `Sgd` update (`p.sub_assign(&g.mul(lr)?)`); PyTorch's is `add_(g, alpha=-lr)`.
            let (w, g) = (upload(&[784, 256], 16, 1.0)?, upload(&[784, 256], 17, 1.0)?);
            let ms = timed(s, || {
                for _ in 0..s.batch {
                    w.sub_assign(&g.mul(0.01)?)?;
                }
                Ok(gt.sync()?)
            })?;
            let once = upload(&[784, 256], 16, 1.0)?;
            once.sub_assign(&g.mul(0.01)?)?;
            Ok((ms, mean_abs(&once.to_vec()?)))
        }
        "linear" => {
            let (x, w, b) = (upload(&[128, 512], 7, 1.0)?, upload(&[512, 256], 8, 0.05)?, upload(&[256], 9, 1.0)?);
            let ms = timed(s, || keep(x.matmul(&w)?.add(&b)?.to_vec()?))?;
            Ok((ms, mean_abs(&x.matmul(&w)?.add(&b)?.to_vec()?)))
        }
        "mse" => {
            let (p, t) = (upload(&[s.n], 10, 1.0)?, upload(&[s.n], 11, 1.0)?);
            let ms = timed(s, || keep(nn::mse_loss(&p, &t)?.item()?))?;
            Ok((ms, nn::mse_loss(&p, &t)?.item()? as f64))
        }
        "unary" => {
            let x = upload(&[s.n], 12, 4.0)?;
            let ms = if s.read {
                timed(s, || keep(unary(&x, s.op)?.to_vec()?))?
            } else {
                timed(s, || {
                    let _r = unary(&x, s.op)?;
                    Ok(gt.sync()?)
                })?
            };
            Ok((ms, mean_abs(&unary(&x, s.op)?.to_vec()?)))
        }
        "chain" => {
            let (x, y, chain) = chain_of(s)?;
            gt.sync()?;
            let ms = timed(s, || {
                let _r = chain(&x, &y)?;
                Ok(gt.sync()?)
            })?;
            Ok((ms, mean_abs(&chain(&x, &y)?.to_vec()?)))
        }
        "randn" => {
            let side = (s.n as f64).sqrt() as usize;
            let draw = || -> Result<Tensor> {
                let x = gt::randn(&[side, side])?;
                Ok(if s.op == "softmax" { nn::softmax(&x, -1)? } else { x })
            };
            gt.sync()?;
            let ms = timed(s, || {
                let _r = draw()?;
                Ok(gt.sync()?)
            })?;
            Ok((ms, mean_abs(&draw()?.to_vec()?)))
        }
        "masked_softmax" => {
            let t = 512;
            let x = upload(&[s.n / (t * t), t, t], 18, 4.0)?;
            let mask = upload(&[t, t], 19, 1.0)?.gt(0.0)?;
            gt.sync()?;
            let ms = timed(s, || {
                let _r = masked_softmax(&x, &mask)?;
                Ok(gt.sync()?)
            })?;
            Ok((ms, mean_abs(&masked_softmax(&x, &mask)?.to_vec()?)))
        }
        "read" => {
            let t = upload(&[s.n], 15, 1.0)?;
            gt.sync()?;
            let ms = timed(s, || keep(t.to_vec()?))?;
            Ok((ms, mean_abs(&t.to_vec()?)))
        }
        "tiny" => {
            let t = gt::ones(&[1])?;
            gt.sync()?;
            let ms = match s.op {
                "issue" => timed(s, || {
                    for _ in 0..s.batch {
                        let _r = t.neg()?;
                    }
                    Ok(gt.sync()?)
                })?,
                "sync" => timed(s, || {
                    for _ in 0..s.batch {
                        let _r = t.neg()?;
                        gt.sync()?;
                    }
                    Ok(())
                })?,
                _ => timed(s, || {
                    for _ in 0..s.batch {
                        black_box(t.neg()?.item()?);
                    }
                    Ok(())
                })?,
            };
            Ok((ms, t.neg()?.item()? as f64))
        }
        other => Err(anyhow!("unknown workload kind {other}")),
    }
}

/// A workload's (median ms per op, check value), or why gt failed it.
type Outcome = Result<(f64, f64), String>;

/// Runs `s` on a fresh embedded cluster with `vars` set while it starts; the workload's
/// error is its result (the cluster failing to start is the bench's).
fn gt_side(s: &Spec, workers: usize, vars: Vars) -> Result<Outcome> {
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let gt = Runtime::embedded(workers);
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    let gt = gt.context("an embedded cluster starts")?;
    let result = run_gt(&gt, s).map_err(|e| format!("{e:#}"));
    if let Err(e) = &result {
        eprintln!("gt {} {vars:?}: {e}", s.name);
    }
    Ok(result)
}

// ---- PyTorch's side ------------------------------------------------------------------------

/// The fields of one flat JSON object of strings, numbers and booleans (what vs_torch.py
/// prints), values as their text (strings without quotes).
fn parse_line(line: &str) -> Option<HashMap<String, String>> {
    let body = line.trim().strip_prefix('{')?.strip_suffix('}')?;
    let mut fields = HashMap::new();
    let mut chars = body.chars().peekable();
    let string = |chars: &mut std::iter::Peekable<std::str::Chars>| -> Option<String> {
        let mut s = String::new();
        loop {
            match chars.next()? {
                '"' => return Some(s),
                '\\' => s.push(chars.next()?),
                c => s.push(c),
            }
        }
    };
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        match chars.next() {
            None => return Some(fields),
            Some('"') => {}
            Some(_) => return None,
        }
        let key = string(&mut chars)?;
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ':') {
            chars.next();
        }
        let value = if chars.peek() == Some(&'"') {
            chars.next();
            string(&mut chars)?
        } else {
            let mut v = String::new();
            while let Some(c) = chars.next_if(|c| *c != ',') {
                v.push(c);
            }
            v.trim().to_string()
        };
        fields.insert(key, value);
    }
}

/// `vs_torch.py`, running: workloads go in one JSON line each, answers come back one line
/// each.
struct Torch {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::BufReader<std::process::ChildStdout>,
    /// `_info`'s fields (versions, threads).
    info: HashMap<String, String>,
}

impl Torch {
    /// Starts the script; why not, when it cannot run (torch missing: exit code 3).
    fn start() -> Result<Torch, String> {
        use std::process::{Command, Stdio};
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/vs_torch.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("python3 not runnable: {e}"))?;
        let input = child.stdin.take().ok_or("no stdin for vs_torch.py")?;
        let output = std::io::BufReader::new(child.stdout.take().ok_or("no stdout for vs_torch.py")?);
        let mut torch = Torch { child, input, output, info: HashMap::new() };
        match torch.answer() {
            Some(info) if info.get("name").map(String::as_str) == Some("_info") => {
                torch.info = info;
                Ok(torch)
            }
            _ => Err(match torch.child.wait().map(|s| s.code()) {
                Ok(Some(3)) => "torch is not installed (python3 -c 'import torch' fails)".into(),
                status => format!("vs_torch.py did not start: {status:?}"),
            }),
        }
    }

    /// The next line the script printed, parsed; `None` once it is gone.
    fn answer(&mut self) -> Option<HashMap<String, String>> {
        use std::io::BufRead;
        let mut line = String::new();
        loop {
            line.clear();
            if self.output.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(fields) = parse_line(&line) {
                return Some(fields);
            }
        }
    }

    /// One workload's (median ms per op, check value), or why there is none.
    fn run(&mut self, s: &Spec) -> Outcome {
        use std::io::Write;
        writeln!(self.input, "{}", s.json())
            .and_then(|()| self.input.flush())
            .map_err(|e| format!("vs_torch.py: {e}"))?;
        let fields = self.answer().ok_or("vs_torch.py exited")?;
        if let Some(error) = fields.get("error") {
            return Err(error.clone());
        }
        let number = |k: &str| fields.get(k).and_then(|v| v.parse::<f64>().ok()).ok_or(format!("no {k} in its answer"));
        Ok((number("ms")?, number("check")?))
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        // Every answer wanted has been read; the script waits on its stdin.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Settings a gt cluster starts with.
type Vars = &'static [(&'static str, &'static str)];

/// The ways gt runs a row: a label suffix, the settings its cluster starts with, the goal.
fn variants(s: &Spec) -> Vec<(String, Vars, Option<f64>)> {
    let mut list = vec![(String::new(), &[][..], s.goal)];
    if let Some(goal) = s.compiled {
        list.push((", GT_COMPILE=1".into(), &[("GT_COMPILE", "1")][..], goal));
    }
    // The rows auto-compile can change also run with it (it is not the default yet).
    if s.compiled.is_some() || s.kind == "tiny" {
        list.push((", GT_AUTO_COMPILE=1".into(), &[("GT_AUTO_COMPILE", "1")][..], None));
    }
    // The rows that wait on little work also run with every wait answered by the dispatcher
    // (no doorbell), as before doorbells, and with the embedded client and worker on inproc
    // ZeroMQ instead of lanes.
    if ["mlp", "mse", "unary", "linear", "read", "tiny"].contains(&s.kind) && s.name != "tiny" {
        list.push((", GT_DOORBELL=0".into(), &[("GT_DOORBELL", "0")][..], None));
        list.push((", GT_LANE=0".into(), &[("GT_LANE", "0")][..], None));
    }
    list
}

/// The median of the rounds' results, their first error if one failed.
fn over_rounds(results: &[Outcome]) -> Result<(f64, f64), String> {
    let mut times = Vec::with_capacity(results.len());
    let mut check = 0.0;
    for r in results {
        let (ms, c) = r.clone()?;
        times.push(ms);
        check = c;
    }
    if times.is_empty() {
        return Err("no round ran".into());
    }
    Ok((median(&mut times), check))
}

// ---- report --------------------------------------------------------------------------------

/// A time in the unit that suits it.
fn time(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.2} µs", ms * 1e3)
    } else if ms < 1000.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{:.3} s", ms / 1e3)
    }
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{cores} cores, {model}")
}

/// Relative difference of the checks; within 1e-3 counts as the same result.
fn check_text(gt: f64, torch: f64) -> String {
    let rel = (gt - torch).abs() / torch.abs().max(1e-12);
    format!("{} (rel {rel:.1e})", if rel <= 1e-3 { "same" } else { "DIFFERS" })
}

fn main() -> Result<()> {
    let quick = std::env::var("GT_BENCH_QUICK").is_ok_and(|v| v == "1") || !std::env::args().any(|a| a == "--bench");
    let limit = Duration::from_secs(if quick { 300 } else { 1200 });
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let phase = PHASE.lock().unwrap_or_else(|e| e.into_inner()).clone();
        eprintln!("vs_torch bench: no result after {} s; stuck in: {phase}", limit.as_secs());
        std::process::exit(2);
    });
    let started = Instant::now();
    let specs = chosen(specs(quick), std::env::var("GT_BENCH_ROWS").ok().as_deref())?;
    let workers: usize = std::env::var("GT_WORKERS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(1);
    let rounds: usize = if quick { 2 } else { 5 };

    phase("PyTorch starting (vs_torch.py)");
    let mut torch = Torch::start();
    // Per row: each variant's results by round, and PyTorch's.
    let mut gt_results: Vec<Vec<Vec<Outcome>>> = Vec::new();
    let mut torch_results: Vec<Vec<Outcome>> = Vec::new();
    let (mut gt_s, mut torch_s) = (0.0, 0.0);
    for s in &specs {
        // A round runs its share of the repetitions (the warm-up each time: a fresh cluster).
        let share = Spec { reps: s.reps.div_ceil(rounds), ..s.clone() };
        let variants = variants(s);
        let mut row = vec![Vec::new(); variants.len()];
        let mut row_torch = Vec::new();
        for round in 0..rounds {
            // Who goes first alternates, so that neither side always follows the other.
            for gt_turn in if round % 2 == 0 { [true, false] } else { [false, true] } {
                let t = Instant::now();
                if gt_turn {
                    // The variants take turns going first too, each after a quiet pause: the
                    // one right after another would pay for its teardown (spinning threads).
                    for k in 0..variants.len() {
                        let v = (k + round) % variants.len();
                        let (suffix, vars, _) = &variants[v];
                        phase(format!("gt {}{suffix}, round {round}", s.name));
                        row[v].push(gt_side(&share, workers, vars)?);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    gt_s += t.elapsed().as_secs_f64();
                } else if let Ok(py) = &mut torch {
                    phase(format!("PyTorch {}, round {round}", s.name));
                    let r = py.run(&share);
                    if let Err(e) = &r {
                        eprintln!("PyTorch {}: {e}", s.name);
                    }
                    row_torch.push(r);
                    torch_s += t.elapsed().as_secs_f64();
                }
                // Let the side that ran last go quiet (spinning waiters, OpenMP's team).
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        gt_results.push(row);
        torch_results.push(row_torch);
    }

    let mut report = String::new();
    let _ = writeln!(
        report,
        "gt vs PyTorch eager, CPU, one run ({} mode, {rounds} rounds; gt's side {gt_s:.0} s, PyTorch's {torch_s:.0} s, \
         {:.0} s in all)",
        if quick { "quick" } else { "full" },
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(report, "machine: {}", machine());
    let gt_vars: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("GT_") && !k.starts_with("GT_BENCH_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(
        report,
        "gt: Tensor API on an embedded cluster, {workers} worker(s), GT_THREADS {}; environment: {}; compiled rows add GT_COMPILE=1, \
         auto-compiled rows GT_AUTO_COMPILE=1, rows without the doorbell GT_DOORBELL=0, rows without lanes GT_LANE=0",
        std::env::var("GT_THREADS").unwrap_or_else(|_| "unset".into()),
        if gt_vars.is_empty() { "no GT_* set".to_string() } else { gt_vars.join(" ") }
    );
    match &torch {
        Ok(py) => {
            let field = |k: &str| py.info.get(k).cloned().unwrap_or_else(|| "?".into());
            let _ = writeln!(
                report,
                "PyTorch {}, {} threads (torch.get_num_threads()), eager; numpy {}",
                field("torch"),
                field("threads"),
                field("numpy")
            );
        }
        Err(why) => {
            let _ = writeln!(report, "PyTorch: skipped: {why}");
        }
    }
    let _ = writeln!(
        report,
        "rounds: each row runs {rounds} rounds; in each, every gt variant (a fresh cluster) and PyTorch run their share of \
         the repetitions after the warm-up, who goes first alternating (the gt variants in turn too, a 20 ms pause after each)"
    );
    let _ = writeln!(
        report,
        "times: per side, the median over rounds of each round's median (per op for tiny ops); gt÷PyTorch: the median of \
         the rounds' ratios, and their range; a goal is met when that median meets it (rounds meeting it counted)"
    );
    let _ =
        writeln!(report, "read: gt Tensor::to_vec / item() (an owned host copy); PyTorch .numpy().copy() / .item()");
    let _ = writeln!(
        report,
        "sync: gt issues the op(s) and waits with Runtime::sync; PyTorch runs the op (an eager CPU op has run when it returns)"
    );
    let _ = writeln!(report, "tiny op: neg of a 1-element tensor; gt drops each result, so its free is issued too");
    let _ = writeln!(report, "check: gt's result against PyTorch's on the same inputs (a loss, or the mean |value|)\n");
    let _ = writeln!(
        report,
        "{:<58} {:>11} {:>11} {:>11} {:>11}  {:<17} {:>14}  check",
        "workload", "gt", "PyTorch", "gt÷PyTorch", "range", "goal", "reps+warm-up"
    );
    let mut checks = String::new();
    let mut goals = String::new();
    for ((s, row), row_torch) in specs.iter().zip(&gt_results).zip(&torch_results) {
        let t = over_rounds(row_torch).ok();
        for ((suffix, _, goal), rounds_gt) in variants(s).iter().zip(row) {
            let label = format!("{}{suffix}", s.label);
            let gt = over_rounds(rounds_gt);
            // Each round's ratio, where both sides ran it.
            let mut ratios: Vec<f64> = rounds_gt
                .iter()
                .zip(row_torch)
                .filter_map(|(g, p)| Some(g.as_ref().ok()?.0 / p.as_ref().ok()?.0))
                .collect();
            // `median` sorts them: the range is their ends.
            let ratio = (!ratios.is_empty() && gt.is_ok()).then(|| median(&mut ratios));
            let range = match (ratios.first(), ratios.last()) {
                (Some(lo), Some(hi)) if ratio.is_some() => format!("{lo:.2}-{hi:.2}"),
                _ => "-".into(),
            };
            let goal_text = match (goal, ratio) {
                (Some(g), Some(r)) => {
                    let met = ratios.iter().filter(|&&x| x <= *g).count();
                    let verdict = if r <= *g { "met" } else { "not met" };
                    let _ = writeln!(
                        goals,
                        "  {label}: gt÷PyTorch {r:.2} ≤ {g}: {verdict} ({met}/{} rounds)",
                        ratios.len()
                    );
                    format!("≤ {g} {verdict} {met}/{}", ratios.len())
                }
                (Some(g), None) => format!("≤ {g}"),
                (None, _) => String::new(),
            };
            let reps = if s.batch > 1 {
                format!("{}x{}x{}+{}", rounds, s.reps.div_ceil(rounds), s.batch, s.warmup)
            } else {
                format!("{}x{}+{}", rounds, s.reps.div_ceil(rounds), s.warmup)
            };
            let check_cell = match (&gt, t) {
                (Ok((_, g)), Some((_, p))) => check_text(*g, p),
                _ => "-".into(),
            };
            let _ = writeln!(
                report,
                "{label:<58} {:>11} {:>11} {:>11} {range:>11}  {goal_text:<17} {reps:>14}  {check_cell}",
                gt.as_ref().map(|(ms, _)| time(*ms)).unwrap_or_else(|_| "error".into()),
                t.map(|(ms, _)| time(ms)).unwrap_or_else(|| "-".into()),
                ratio.map(|r| format!("{r:.2}")).unwrap_or_else(|| "-".into()),
            );
            let _ = match (&gt, t) {
                (Ok((_, g)), Some((_, p))) => writeln!(checks, "  {label}: gt {g:.7} PyTorch {p:.7}"),
                (Ok((_, g)), None) => writeln!(checks, "  {label}: gt {g:.7} (no PyTorch value)"),
                (Err(e), _) => writeln!(checks, "  {label}: gt failed: {e}"),
            };
        }
    }
    if !goals.is_empty() {
        let _ = writeln!(report, "\ngoals (issue 16, gt÷PyTorch in the same run):\n{goals}");
    }
    let _ = writeln!(report, "checks (gt vs PyTorch, same inputs):\n{checks}");
    print!("{report}");
    if std::env::var("GT_BENCH_SAVE").is_ok_and(|v| v == "1") {
        let path = format!("{}/bench/results/vs-torch-vm.txt", env!("CARGO_MANIFEST_DIR"));
        std::fs::write(&path, &report).with_context(|| format!("writing {path}"))?;
        println!("saved to {path}");
    }
    Ok(())
}
