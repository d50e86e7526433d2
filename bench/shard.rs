//! Sharding on CPU workers, in one run: an `N x N` f32 matmul split by rows (data parallel,
//! the right operand replicated) and one data-parallel training step of a `W`-wide MLP on 1,
//! 2, 4 and 8 embedded workers (never more workers than cores; each first on one core,
//! `GT_THREADS=1`, which shows how they scale, then with its share of the cores), against one
//! worker; then `all_reduce` and `all_gather` over the workers' own
//! collective sockets (`gt::runtime::collective`, ZeroMQ rings between threads) from 1 MB to
//! 256 MB over inproc and over TCP on the loopback (as between worker processes), against raw
//! ZeroMQ sockets moving the same bytes between the same threads in the same ring over the same
//! transport (PUSH/PULL, no header, no reduction: the sockets' ceiling for that traffic), and
//! beside one raw send and receive on one thread (a copy's worth, no thread woken).
//! Prints times, speed-ups over one worker (the goal: at least 0.9 x N for a compute-bound
//! matmul while N <= cores) and bandwidth ratios (goal: collectives at least 80% of the raw
//! socket); asserts nothing.
//! Run: `cargo bench --bench shard` (`GT_BENCH_QUICK=1`: fewer repetitions and smaller sizes;
//! `GT_BENCH_N`, `GT_BENCH_WIDTH`, `GT_BENCH_BATCH`: the matmul's and the MLP's sizes;
//! `GT_BENCH_PARTS=matmul,mlp,collectives`: which parts run; `GT_BENCH_DTYPE=bf16` (or `f16`):
//! the MLP's forward under autocast; `GT_BENCH_SAVE=NAME` writes
//! `bench/results/shard-NAME.txt`).

/// gt's allocator, as its binaries and Python package run on.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

use gt::nn::{self, Module, Optimizer};
use gt::runtime::collective::{Collectives, Group, ZmqCollectives};
use gt::transport::Endpoint;
use gt::Runtime;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Placements: rows split over every worker, parameters copied.
const CONFIG: &str = "rows:\n  shard:\n    axis: 0\n  backward: rows_bwd\nrows_bwd:\n  shard:\n    axis: 0\nparams:\n  shard:\n    replicated: true\n";

/// Median time of `x @ w` (x split by rows over the workers) with a sync, on `workers`.
fn matmul(workers: usize, n: usize, reps: usize) -> anyhow::Result<Duration> {
    let gt = Runtime::embedded(workers)?;
    gt::signal::set_config(gt::config::Config::parse(CONFIG, "bench.yaml")?);
    let w = {
        let _p = gt::signal::context("params")?;
        gt::randn_seeded(&[n, n], 2)?
    };
    let x = {
        let _r = gt::signal::context("rows")?;
        gt::randn_seeded(&[n, n], 1)?
    };
    gt.sync()?;
    let mut times = Vec::new();
    for rep in 0..reps + 1 {
        let t = Instant::now();
        let y = {
            let _r = gt::signal::context("rows")?;
            x.matmul(&w)?
        };
        gt.sync()?;
        if rep > 0 {
            times.push(t.elapsed());
        }
        drop(y);
    }
    gt::signal::set_config(Default::default());
    Ok(median(times))
}

/// Median time of one data-parallel SGD step of a `width`-wide 3-layer MLP on a batch of
/// `batch`, with the loss read.
fn mlp_step(
    workers: usize,
    width: usize,
    batch: usize,
    reps: usize,
    autocast: Option<gt::ir::DType>,
) -> anyhow::Result<(Duration, f32)> {
    let _gt = Runtime::embedded(workers)?;
    gt::signal::set_config(gt::config::Config::parse(CONFIG, "bench.yaml")?);
    gt::manual_seed(3)?;
    let model = {
        let _p = gt::signal::context("params")?;
        nn::Sequential::new()
            .push(nn::Linear::new(width, width)?)
            .push(nn::ReLU)
            .push(nn::Linear::new(width, width)?)
            .push(nn::ReLU)
            .push(nn::Linear::new(width, 10)?)
    };
    let labels: Vec<usize> = (0..batch).map(|i| (i * 7) % 10).collect();
    let (x, t) = {
        let _r = gt::signal::context("rows")?;
        (gt::randn_seeded(&[batch, width], 9)?, nn::one_hot(&labels, 10)?)
    };
    let mut sgd = nn::Sgd::new(model.parameters(), 0.01);
    let mut times = Vec::new();
    let mut last = 0.0;
    for rep in 0..reps + 1 {
        let start = Instant::now();
        let loss = {
            let _r = gt::signal::context("rows")?;
            let _half = autocast.map(gt::autocast).transpose()?;
            nn::cross_entropy(&model.forward(&x)?, &t)?
        };
        sgd.zero_grad();
        loss.backward()?;
        sgd.step()?;
        last = loss.item()?;
        if rep > 0 {
            times.push(start.elapsed());
        }
    }
    gt::signal::set_config(Default::default());
    Ok((median(times), last))
}

/// Median seconds of `op` run on `n` threads, each with its own collective socket.
fn collective(like: &Endpoint, n: usize, bytes: usize, reps: usize, gather: bool) -> anyhow::Result<Duration> {
    let ctx = gt::transport::zmq::Context::new();
    let mut sockets = Vec::new();
    for r in 0..n {
        sockets.push(ZmqCollectives::bind(&ctx, like, &format!("r{r}"), Duration::from_secs(60), 1 << 30, None)?);
    }
    let peers: Vec<String> = sockets.iter().map(|s| s.address().to_string()).collect();
    let bodies = sockets.into_iter().enumerate().map(|(rank, mut sock)| {
        let peers = peers.clone();
        let mut data = vec![1.0f32; bytes / 4 / if gather { n } else { 1 }];
        let mine: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        move |id: u64| {
            let g = Group { id, rank, peers: peers.clone() };
            if gather {
                sock.all_gather(&g, &mine).expect("all_gather");
            } else {
                data = sock.all_reduce(&g, gt::ir::ReduceOp::Sum, std::mem::take(&mut data)).expect("all_reduce");
            }
        }
    });
    Ok(on_threads(bodies.collect(), reps))
}

/// Runs each of `bodies` on a thread of its own, `reps + 1` times in step (the run's number
/// as argument; the first untimed), and gives the median over runs of the slowest thread's
/// time: a collective (or a raw ring) takes as long as its slowest rank.
fn on_threads<F: FnMut(u64) + Send>(bodies: Vec<F>, reps: usize) -> Duration {
    let times = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .into_iter()
            .map(|mut body| {
                scope.spawn(move || {
                    let mut times = Vec::new();
                    for run in 0..reps as u64 + 1 {
                        let t = Instant::now();
                        body(run);
                        if run > 0 {
                            times.push(t.elapsed());
                        }
                    }
                    times
                })
            })
            .collect();
        let all: Vec<Vec<Duration>> = handles.into_iter().map(|h| h.join().expect("rank")).collect();
        (0..reps).map(|i| all.iter().map(|t| t[i]).max().unwrap_or_default()).collect::<Vec<_>>()
    });
    median(times)
}

/// Median time of one raw send and receive of `bytes` on one thread over inproc ZeroMQ
/// (PUSH/PULL, one message): a copy into a fresh message, no thread woken.
fn raw_local(bytes: usize, reps: usize) -> anyhow::Result<Duration> {
    let ctx = gt::transport::zmq::Context::new();
    let pull = ctx.socket(gt::transport::zmq::PULL)?;
    pull.bind("inproc://raw")?;
    let push = ctx.socket(gt::transport::zmq::PUSH)?;
    push.connect("inproc://raw")?;
    let payload = vec![1u8; bytes];
    let mut times = Vec::new();
    for rep in 0..reps + 1 {
        let t = Instant::now();
        push.send(&payload[..], 0)?;
        let got = pull.recv_msg(0)?;
        assert_eq!(got.len(), bytes);
        if rep > 0 {
            times.push(t.elapsed());
        }
    }
    Ok(median(times))
}

/// Median time of a raw ring on `n` threads over inproc ZeroMQ: each thread sends `n - 1`
/// messages of `bytes / n` to the next (PUSH) and receives as many from the previous (PULL),
/// one step after another, as an all-gather's ring does, with nothing else: what the sockets
/// carry between the same threads in the same pattern.
fn raw_ring(like: &Endpoint, n: usize, bytes: usize, reps: usize) -> anyhow::Result<Duration> {
    let ctx = gt::transport::zmq::Context::new();
    let mut pulls = Vec::new();
    let mut addresses = Vec::new();
    for r in 0..n {
        let pull = ctx.socket(gt::transport::zmq::PULL)?;
        pull.set_rcvhwm(0)?;
        match like {
            Endpoint::Tcp { .. } => pull.bind("tcp://127.0.0.1:*")?,
            _ => pull.bind(&format!("inproc://ring-{r}"))?,
        }
        addresses.push(pull.get_last_endpoint()?.map_err(|_| anyhow::anyhow!("no endpoint"))?);
        pulls.push(pull);
    }
    let mut pushes = Vec::new();
    for r in 0..n {
        let push = ctx.socket(gt::transport::zmq::PUSH)?;
        push.set_sndhwm(0)?;
        push.connect(&addresses[(r + 1) % n])?;
        pushes.push(push);
    }
    let bodies = pulls.into_iter().zip(pushes).map(|(pull, push)| {
        let piece = vec![1u8; bytes / n];
        move |_: u64| {
            for _ in 0..n - 1 {
                push.send(&piece[..], 0).expect("raw send");
                let got = pull.recv_msg(0).expect("raw receive");
                assert_eq!(got.len(), piece.len());
            }
        }
    });
    Ok(on_threads(bodies.collect(), reps))
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::var_os("GT_BENCH_QUICK").is_some();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let counts: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|&w| w <= cores.max(2)).collect();
    let (n, width, batch, reps) = if quick { (1024, 512, 256, 3) } else { (2048, 1024, 512, 5) };
    let n = env_usize("GT_BENCH_N").unwrap_or(n);
    let width = env_usize("GT_BENCH_WIDTH").unwrap_or(width);
    let batch = env_usize("GT_BENCH_BATCH").unwrap_or(batch);
    let parts = std::env::var("GT_BENCH_PARTS").unwrap_or_else(|_| "matmul,mlp,collectives".into());
    let part = |name: &str| parts.split(',').any(|p| p.trim() == name);
    let mut report = String::new();
    let _ = writeln!(report, "gt sharding, {cores} cores; embedded workers share them; median of {reps}");
    if part("matmul") {
        matmul_part(&mut report, &counts, n, reps)?;
    }
    if part("mlp") {
        mlp_part(&mut report, &counts, width, batch, reps)?;
    }
    if part("collectives") {
        collectives_part(&mut report, &counts, quick, reps)?;
    }
    print!("{report}");
    if let Ok(name) = std::env::var("GT_BENCH_SAVE") {
        std::fs::write(format!("bench/results/shard-{name}.txt"), &report)?;
    }
    Ok(())
}

fn matmul_part(report: &mut String, counts: &[usize], n: usize, reps: usize) -> anyhow::Result<()> {
    let _ = writeln!(report, "\nmatmul {n}x{n} f32, x split by rows, w replicated (sync after each)");
    by_threads(report, counts, |w, one_core| {
        let t = matmul(w, n, reps)?;
        let goal = if one_core { format!(" (goal >= {:.1}x)", 0.9 * w as f64) } else { String::new() };
        Ok((t, goal))
    })
}

/// Per worker count, the time `run(workers, one_core)` gives and its speed-up over one
/// worker, first with every worker on one core (`GT_THREADS=1`: N workers have N cores, so
/// it shows how the work scales), then with the machine's cores divided among the workers
/// (what a user gets); `run` adds its own note to each line.
fn by_threads(
    report: &mut String,
    counts: &[usize],
    mut run: impl FnMut(usize, bool) -> anyhow::Result<(Duration, String)>,
) -> anyhow::Result<()> {
    for (label, one_core) in [("one core per worker", true), ("the machine's cores divided among them", false)] {
        if one_core {
            std::env::set_var("GT_THREADS", "1");
        } else {
            std::env::remove_var("GT_THREADS");
        }
        let _ = writeln!(report, "  {label}:");
        let mut one = None;
        for &w in counts {
            let (t, note) = run(w, one_core)?;
            let base = *one.get_or_insert(t);
            let speedup = base.as_secs_f64() / t.as_secs_f64();
            let _ = writeln!(report, "    {w} worker(s): {:>9.1} ms  speed-up {speedup:.2}x{note}", ms(t));
        }
    }
    std::env::remove_var("GT_THREADS");
    Ok(())
}

fn mlp_part(report: &mut String, counts: &[usize], width: usize, batch: usize, reps: usize) -> anyhow::Result<()> {
    let autocast = match std::env::var("GT_BENCH_DTYPE") {
        Ok(name) => Some(gt::ir::DType::from_name(&name).ok_or_else(|| anyhow::anyhow!("GT_BENCH_DTYPE={name}"))?),
        Err(_) => None,
    };
    let under = autocast.map_or(String::new(), |d| format!(", forward under {d} autocast"));
    let _ =
        writeln!(report, "\nMLP {width}-{width}-{width}-10 data-parallel SGD step, batch {batch}, loss read{under}");
    by_threads(report, counts, |w, _| {
        let (t, loss) = mlp_step(w, width, batch, reps, autocast)?;
        Ok((t, format!("  (loss {loss:.4})")))
    })
}

fn collectives_part(report: &mut String, counts: &[usize], quick: bool, reps: usize) -> anyhow::Result<()> {
    let _ = writeln!(
        report,
        "\ncollectives between threads, bus bandwidth (what each link carries per second), against a raw\n\
         ZeroMQ ring moving the same bytes between the same threads over the same transport (and one raw\n\
         send + receive on one thread, a copy with no thread woken, for scale)"
    );
    let sizes: &[usize] = if quick { &[1, 16, 64] } else { &[1, 16, 64, 256] };
    let transports = [
        ("inproc", Endpoint::Inproc("bench".into())),
        ("tcp 127.0.0.1", Endpoint::Tcp { host: "127.0.0.1".into(), port: 1 }),
    ];
    for (label, like) in &transports {
        let _ = writeln!(report, "  {label}:");
        for &mb in sizes {
            let bytes = mb << 20;
            // Small transfers take tens of microseconds: more of them make a steady median.
            let reps = if mb <= 16 { 10 * reps } else { reps };
            let local = raw_local(bytes, reps)?;
            let local_rate = bytes as f64 / local.as_secs_f64() / 1e9;
            for &ranks in counts.iter().filter(|&&r| r > 1) {
                let ring = raw_ring(like, ranks, bytes, reps)?;
                let reduce = collective(like, ranks, bytes, reps, false)?;
                let gather = collective(like, ranks, bytes, reps, true)?;
                // What each link carries: 2(n-1)/n of the data for a ring all_reduce, (n-1)/n
                // for an all_gather of n pieces (and for the raw ring).
                let f = (ranks - 1) as f64 / ranks as f64;
                let ring_rate = f * bytes as f64 / ring.as_secs_f64() / 1e9;
                let reduce_rate = 2.0 * f * bytes as f64 / reduce.as_secs_f64() / 1e9;
                let gather_rate = f * bytes as f64 / gather.as_secs_f64() / 1e9;
                let _ = writeln!(
                    report,
                    "  {mb:>3} MB, {ranks} ranks: all_reduce {:>8.2} ms {reduce_rate:>5.2} GB/s ({:>3.0}% of raw)  all_gather {:>8.2} ms {gather_rate:>5.2} GB/s ({:>3.0}%)  raw ring {:>7.2} ms {ring_rate:.2} GB/s  (one thread: {local_rate:.2} GB/s)",
                    ms(reduce),
                    100.0 * reduce_rate / ring_rate,
                    ms(gather),
                    100.0 * gather_rate / ring_rate,
                    ms(ring)
                );
            }
        }
    }
    Ok(())
}
