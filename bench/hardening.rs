//! Hardening figures: a load test (many clients at once, memory before and after, sync
//! latency), a fault matrix (a worker killed mid-batch, the dispatcher killed or paused, a
//! client killed mid-stream, a worker restarted), each with the time until the survivors
//! learn of it or carry on, and the bounds on one client (an instruction past
//! `GT_OP_TIMEOUT`, a departed client's running instruction, answers a client never reads).
//!
//! `cargo bench --bench hardening`; `GT_BENCH_QUICK=1` (or running without `--bench`) uses 8
//! clients instead of 64; `GT_BENCH_SAVE=1` also writes `bench/results/hardening-<host>.txt`.
//! The fault matrix runs real `gt server` / `gt worker` processes over TCP loopback.

use anyhow::{anyhow, bail, Context as _, Result};
use gt::frontend::{Client, ClientOptions, Origin};
use gt::ir::{BinaryOp, Instr, Operand, TensorType, ValueId};
use gt::runtime::config::EnvConfig;
use gt::runtime::{Cluster, ClusterOptions};
use gt::transport::Endpoint;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The system allocator, counting the bytes allocated and not yet freed: the process's live
/// heap, which (unlike its RSS) holds no allocator high-water marks, so a leak shows as
/// growth and nothing else does. Each thread counts on a cache line of its own, so that
/// 64 client threads do not slow each other down on one counter.
struct Counting;

/// A counter on its own cache line.
#[repr(align(64))]
struct Slot(std::sync::atomic::AtomicI64);

const SLOTS: usize = 128;
static LIVE_HEAP: [Slot; SLOTS] = [const { Slot(std::sync::atomic::AtomicI64::new(0)) }; SLOTS];
static NEXT_SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    static MY_SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

fn count(bytes: i64) {
    use std::sync::atomic::Ordering::Relaxed;
    let slot = MY_SLOT
        .try_with(|s| {
            if s.get() == usize::MAX {
                s.set(NEXT_SLOT.fetch_add(1, Relaxed) % SLOTS);
            }
            s.get()
        })
        .unwrap_or(0);
    LIVE_HEAP[slot].0.fetch_add(bytes, Relaxed);
}

// SAFETY: every call goes to the system allocator unchanged; only a counter is kept beside.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as i64);
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(-(layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64);
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes of heap allocated and not freed now.
fn live_heap() -> u64 {
    LIVE_HEAP.iter().map(|s| s.0.load(std::sync::atomic::Ordering::Relaxed)).sum::<i64>().max(0) as u64
}

fn main() -> Result<()> {
    let quick = std::env::var("GT_BENCH_QUICK").is_ok_and(|v| v != "0") || !std::env::args().any(|a| a == "--bench");
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(600));
        eprintln!("hardening bench: no result after 600 s");
        std::process::exit(2);
    });
    let mut text = String::new();
    writeln!(
        text,
        "# gt hardening bench ({} mode) on {}, {} CPUs",
        if quick { "quick" } else { "full" },
        host(),
        cpus()
    )?;
    writeln!(text)?;
    load(&mut text, if quick { 8 } else { 64 }, 10_000)?;
    writeln!(text)?;
    faults(&mut text)?;
    writeln!(text)?;
    bounds(&mut text)?;
    print!("{text}");
    if std::env::var("GT_BENCH_SAVE").is_ok_and(|v| v == "1") {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("bench/results/hardening-{}.txt", host()));
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        println!("saved to {}", path.display());
    }
    Ok(())
}

fn origin() -> Origin {
    Origin { op: "bench", span: None }
}

/// Resident memory of this process, bytes (`/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn host() -> String {
    std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into())
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One client's work: `n` instructions (creation, arithmetic, frees), a sync every 100, each
/// sync's latency recorded; the numbers read at the end are checked.
fn client_work(ctx: &gt::transport::zmq::Context, endpoint: &Endpoint, n: usize) -> Result<Vec<Duration>> {
    let mut c = Client::connect_in(ctx, endpoint, ClientOptions::default())?;
    let mut waits = Vec::new();
    let v = |i: u32| Operand::Value(ValueId(i));
    let mut sent = 0;
    while sent < n {
        let ty = TensorType::f32(vec![64]);
        c.submit(Instr::Full { dst: ValueId(0), ty, value: 1.5 }, origin())?;
        c.submit(Instr::Binary { op: BinaryOp::Add, dst: ValueId(1), lhs: v(0), rhs: v(0) }, origin())?;
        c.submit(Instr::Binary { op: BinaryOp::Mul, dst: ValueId(2), lhs: v(1), rhs: v(0) }, origin())?;
        c.submit(Instr::Free { src: ValueId(1) }, origin())?;
        sent += 4;
        if sent % 100 == 0 {
            let t = Instant::now();
            c.sync()?;
            waits.push(t.elapsed());
        }
    }
    let got = c.read(ValueId(2))?.to_f32();
    if got != vec![4.5; 64] {
        bail!("a client read {:?} instead of 4.5s", &got[..2]);
    }
    Ok(waits)
}

/// `clients` clients at once, `n` instructions each, on an embedded cluster with the default
/// settings; memory of the whole process before (after a warm-up round) and after.
fn load(text: &mut String, clients: usize, n: usize) -> Result<()> {
    let c = Cluster::start(ClusterOptions::from_config(&EnvConfig::default()))?;
    let (ctx, endpoint) = (c.context().clone(), c.endpoint().clone());
    let round = |n: usize| -> Result<(Vec<Duration>, Duration)> {
        let start = Instant::now();
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let (ctx, endpoint) = (ctx.clone(), endpoint.clone());
                std::thread::spawn(move || client_work(&ctx, &endpoint, n))
            })
            .collect();
        let mut waits = Vec::new();
        for h in handles {
            waits.extend(h.join().map_err(|_| anyhow!("a client thread panicked"))??);
        }
        Ok((waits, start.elapsed()))
    };
    round(1_000)?;
    let (before, heap_before) = (rss(), live_heap());
    let (mut waits, took) = round(n)?;
    // Leaving clients' values are freed by the worker; give it a moment to run the frees.
    let mut probe = Client::connect_in(&ctx, &endpoint, ClientOptions::default())?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while probe.worker_stats()?.iter().map(|w| w.live_values).sum::<u64>() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let live = probe.worker_stats()?.iter().map(|w| w.live_values).sum::<u64>();
    drop(probe);
    let (after, heap_after) = (rss(), live_heap());
    // The same load again: a leak grows again, an allocator's high-water mark does not.
    round(n)?;
    let (again, heap_again) = (rss(), live_heap());
    waits.sort();
    let pct = |p: f64| waits[((waits.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
    let total = clients * n;
    writeln!(text, "## Load: {clients} clients x {n} instructions at once (embedded, default passes)")?;
    writeln!(text)?;
    writeln!(text, "| figure | value |")?;
    writeln!(text, "|---|---|")?;
    writeln!(
        text,
        "| instructions | {total} in {:.2} s ({:.0}/s) |",
        took.as_secs_f64(),
        total as f64 / took.as_secs_f64()
    )?;
    writeln!(text, "| sync round trips | {} (p50 {:.2} ms, p99 {:.2} ms) |", waits.len(), pct(0.5), pct(0.99))?;
    writeln!(text, "| errors | 0 (every client read its right numbers) |")?;
    writeln!(text, "| values left on the worker after all left | {live} |")?;
    let growth = (after as f64 / before.max(1) as f64 - 1.0) * 100.0;
    let mb = |b: u64| b as f64 / 1e6;
    writeln!(text, "| process RSS before / after | {:.1} MB / {:.1} MB ({growth:+.1}%) |", mb(before), mb(after))?;
    let heap_growth = (heap_after as f64 / heap_before.max(1) as f64 - 1.0) * 100.0;
    writeln!(
        text,
        "| live heap before / after (allocated, not freed) | {:.2} MB / {:.2} MB ({heap_growth:+.1}%) |",
        mb(heap_before),
        mb(heap_after)
    )?;
    let again_pct = (again as f64 / after.max(1) as f64 - 1.0) * 100.0;
    writeln!(
        text,
        "| process RSS after the same load again | {:.1} MB ({again_pct:+.1}% over the first) |",
        mb(again)
    )?;
    writeln!(
        text,
        "| live heap after the same load again | {:.2} MB ({:+.1}% over the first) |",
        mb(heap_again),
        (heap_again as f64 / heap_after.max(1) as f64 - 1.0) * 100.0
    )?;
    Ok(())
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn server(port: u16) -> Result<Proc> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gt"))
        .args(["server", "-p", &port.to_string(), "--host", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    // All three lines it prints are read before the pipe closes (a closed stdout would
    // make its next print fail).
    let mut out = BufReader::new(child.stdout.take().context("stdout")?);
    let mut lines = String::new();
    for _ in 0..3 {
        out.read_line(&mut lines)?;
    }
    if !lines.starts_with("gt server listening") {
        bail!("gt server said {lines:?}");
    }
    Ok(Proc(child))
}

fn worker(port: u16) -> Result<Proc> {
    Ok(Proc(
        Command::new(env!("CARGO_BIN_EXE_gt"))
            .args(["worker", "--host", "127.0.0.1", "-p", &port.to_string()])
            .spawn()?,
    ))
}

fn tcp(port: u16) -> Endpoint {
    Endpoint::Tcp { host: "127.0.0.1".into(), port }
}

fn connect(port: u16) -> Result<Client> {
    Ok(Client::connect(&tcp(port), ClientOptions::default())?)
}

/// Work that keeps a worker busy for seconds (400 1024^2 matmuls).
fn heavy(c: &mut Client) -> Result<()> {
    c.submit(Instr::Randn { dst: ValueId(0), ty: TensorType::f32(vec![1024, 1024]), seed: 1 }, origin())?;
    for _ in 0..400 {
        c.submit(Instr::MatMul { dst: ValueId(1), lhs: ValueId(0), rhs: ValueId(0) }, origin())?;
    }
    Ok(c.flush()?)
}

fn signal(p: &Proc, sig: nix::sys::signal::Signal) -> Result<()> {
    Ok(nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.0.id() as i32), sig)?)
}

/// Whether a fresh client on `port` gets right numbers.
fn serves(port: u16) -> Result<bool> {
    let mut c = connect(port)?;
    c.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![2]), value: 3.0 }, origin())?;
    Ok(c.read(ValueId(0))?.to_f32() == vec![3.0, 3.0])
}

/// A client on `port` waits on seconds of work while `kill` runs: what its wait reports, and
/// how long after the kill.
fn killed_under_a_wait(port: u16, kill: impl FnOnce()) -> Result<(String, Duration)> {
    let mut c = connect(port)?;
    heavy(&mut c)?;
    let waiter = std::thread::spawn(move || (c.sync().map_err(|e| e.to_string()), Instant::now()));
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    kill();
    let (r, at) = waiter.join().map_err(|_| anyhow!("waiter panicked"))?;
    Ok((r.err().unwrap_or_else(|| "no error".into()), at - killed))
}

fn faults(text: &mut String) -> Result<()> {
    use nix::sys::signal::Signal;
    writeln!(text, "## Fault matrix (gt server and gt worker processes, TCP loopback)")?;
    writeln!(text)?;
    writeln!(text, "| fault | what the survivors saw | time |")?;
    writeln!(text, "|---|---|---|")?;

    // A worker killed while its client waits on a long batch.
    let port = free_port()?;
    let _server = server(port)?;
    let w = worker(port)?;
    let (e, took) = killed_under_a_wait(port, || drop(w))?;
    writeln!(text, "| worker killed mid-batch | waiting client: `{}` | {:.0} ms |", short(&e), ms(took))?;
    // The worker restarted: new clients are served.
    let started = Instant::now();
    let _w2 = worker(port)?;
    let ok = serves(port)?;
    writeln!(
        text,
        "| worker restarted | a new client served: {ok} | {:.0} ms to the first answer |",
        ms(started.elapsed())
    )?;

    // A client killed mid-stream: its values are freed.
    let mut watcher = connect(port)?;
    let base = watcher.worker_stats()?.iter().map(|w| w.live_values).sum::<u64>();
    let mut victim = Command::new(env!("CARGO_BIN_EXE_gt-run"))
        .args(["--connect", &format!("127.0.0.1:{port}"), "-q", "examples/train_mlp.gtir"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    // Killed once it holds values on the worker (it is training).
    let deadline = Instant::now() + Duration::from_secs(10);
    while watcher.worker_stats()?.iter().map(|w| w.live_values).sum::<u64>() <= base + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let held = watcher.worker_stats()?.iter().map(|w| w.live_values).sum::<u64>() - base;
    let killed = Instant::now();
    victim.kill()?;
    victim.wait()?;
    let mut freed = None;
    while killed.elapsed() < Duration::from_secs(10) {
        if watcher.worker_stats()?.iter().map(|w| w.live_values).sum::<u64>() <= base {
            freed = Some(killed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let what = match freed {
        Some(_) => format!("its {held} values freed on the worker"),
        None => "its values still held after 10 s".to_string(),
    };
    writeln!(
        text,
        "| client killed mid-stream | {what}; others served: {} | {} |",
        serves(port)?,
        freed.map_or("-".into(), |d| format!("{:.0} ms", ms(d)))
    )?;
    drop(watcher);

    // The dispatcher paused for 6 s (longer than the 5 s heartbeat timeout), then resumed.
    let port = free_port()?;
    let s = server(port)?;
    let _w = worker(port)?;
    serves(port)?;
    signal(&s, Signal::SIGSTOP)?;
    std::thread::sleep(Duration::from_secs(6));
    signal(&s, Signal::SIGCONT)?;
    std::thread::sleep(Duration::from_secs(1));
    let after = Instant::now();
    let outcome = match serves(port) {
        Ok(true) => "served again".to_string(),
        Ok(false) => "wrong numbers".to_string(),
        Err(e) => format!("not served: `{}`", short(&e.to_string())),
    };
    writeln!(text, "| dispatcher paused 6 s, resumed | a new client: {outcome} | {:.0} ms |", ms(after.elapsed()))?;

    // The dispatcher killed under a waiting client.
    let (e, took) = killed_under_a_wait(port, || drop(s))?;
    writeln!(text, "| dispatcher killed under a waiting client | `{}` | {:.0} ms |", short(&e), ms(took))?;
    Ok(())
}

/// An embedded cluster with these settings.
fn cluster(settings: &[(&str, &str)]) -> Result<Cluster> {
    let env = EnvConfig::from_lookup(|k| settings.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))?;
    Ok(Cluster::start(ClusterOptions::from_config(&env))?)
}

/// Parses `.gtir` text into its instructions.
fn instrs(text: &str) -> Result<Vec<Instr>> {
    let program = gt::ir::text::parse(text).map_err(|e| anyhow!("{e:?}"))?;
    Ok(program
        .body
        .into_iter()
        .filter_map(|s| match s.kind {
            gt::ir::StmtKind::Instr(i) => Some(i),
            _ => None,
        })
        .collect())
}

fn bounds(text: &mut String) -> Result<()> {
    writeln!(text, "## Bounds on one client (embedded)")?;
    writeln!(text)?;
    writeln!(text, "| case | outcome | time |")?;
    writeln!(text, "|---|---|---|")?;
    // Instructions that would run for minutes, with a 1 s op timeout: from the read to its error.
    for (name, settings, program) in [
        (
            "6144^3 matmul, interpreted",
            &[("GT_OP_TIMEOUT", "1"), ("GT_PASSES", "none")][..],
            "%a = zeros f32[6144, 6144]\n%c = matmul %a, %a",
        ),
        (
            "compiled sum of a 2^40-long row",
            &[("GT_OP_TIMEOUT", "1"), ("GT_COMPILE", "1")][..],
            "%x = ones f32[1]\n%y = broadcast_to %x shape=[1099511627776]\n%c = sum %y\nfree %y",
        ),
    ] {
        let c = cluster(settings)?;
        let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default())?;
        let started = Instant::now();
        let program = instrs(program)?;
        let long = program.iter().rev().flat_map(|i| i.results()).next().ok_or_else(|| anyhow!("no result"))?;
        for i in program {
            a.submit(i, origin())?;
        }
        let e = a.read(long).err().map_or("no error".into(), |e| e.to_string());
        writeln!(text, "| {name}, GT_OP_TIMEOUT=1 | `{}` | {:.0} ms |", short(&e), ms(started.elapsed()))?;
    }
    // A client leaves while its matmul runs: how long the next client waits for the worker.
    let c = cluster(&[("GT_PASSES", "none")])?;
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default())?;
    for i in instrs("%a = zeros f32[6144, 6144]\n%c = matmul %a, %a")? {
        a.submit(i, origin())?;
    }
    a.flush()?;
    std::thread::sleep(Duration::from_millis(500));
    let left = Instant::now();
    drop(a);
    let mut b = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default())?;
    b.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![2]), value: 1.0 }, origin())?;
    b.read(ValueId(0))?;
    let waited = left.elapsed();
    let cancelled = b.worker_stats()?.iter().map(|w| w.cancelled).sum::<u64>();
    writeln!(
        text,
        "| client leaves during a 6144^3 matmul | {cancelled} instruction cancelled; the next client served | {:.0} ms |",
        ms(waited)
    )?;
    drop(b);
    drop(c);
    // The reproducer: 30 reads of a 64 MiB value, none read, beside a client that syncs.
    for limit in [gt::runtime::dispatcher::CLIENT_UNREAD_BYTES, u64::MAX >> 1] {
        let c = cluster(&[("GT_CLIENT_UNREAD_BYTES", &limit.to_string())])?;
        let (data, refused, grew, stall) = unread(&c)?;
        let setting =
            if limit == u64::MAX >> 1 { "no limit (as before)".to_string() } else { format!("{} MiB", limit >> 20) };
        writeln!(
            text,
            "| 30 unread reads of 64 MiB, GT_CLIENT_UNREAD_BYTES {setting} | {data} answered, {refused} refused; process RSS +{:.0} MB | another client's sync {:.0} ms |",
            grew as f64 / 1e6,
            ms(stall)
        )?;
    }
    Ok(())
}

/// A raw client asks for a 64 MiB value 30 times and reads nothing: the answers given and
/// refused, the process's growth, and how long another client's sync took meanwhile.
fn unread(c: &Cluster) -> Result<(usize, usize, u64, Duration)> {
    use gt::transport::message::{Reply, Request};
    use gt::transport::{codec, socket, zmq, Inbound};
    let raw = c.context().socket(zmq::DEALER)?;
    raw.connect(&c.endpoint().zmq_address())?;
    let send = |req: Request| -> Result<()> { Ok(raw.send(codec::encode(&Inbound::Client(req), 1 << 20)?, 0)?) };
    send(Request::Hello { name: "unread".into(), wait_ms: 1000, doorbell: None, lane: None, shared_reads: false })?;
    raw.poll(zmq::POLLIN, 5000)?;
    socket::recv_frames(&raw, 0)?;
    send(Request::Batch { first_seq: 0, instrs: instrs("%a = ones f32[16777216]")?, lines: Vec::new(), then: None })?;
    let before = rss();
    for seq in 1..=30 {
        send(Request::Get { seq, value: ValueId(0), read: 0 })?;
    }
    let mut other = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default())?;
    other.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![2]), value: 1.0 }, origin())?;
    let t = Instant::now();
    other.sync()?;
    let stall = t.elapsed();
    // Every answer is out once the refusals are in (they come last).
    std::thread::sleep(Duration::from_secs(2));
    let grew = rss().saturating_sub(before);
    let (mut data, mut refused) = (0, 0);
    while raw.poll(zmq::POLLIN, 1000)? > 0 {
        match codec::decode::<Reply>(&socket::recv_frames(&raw, 0)?[0], 1 << 20)? {
            Reply::Data { .. } => data += 1,
            Reply::Failed { .. } => refused += 1,
            _ => {}
        }
    }
    Ok((data, refused, grew, stall))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn short(s: &str) -> String {
    let s = s.replace('|', "/");
    if s.chars().count() > 90 {
        format!("{}...", s.chars().take(90).collect::<String>())
    } else {
        s
    }
}
