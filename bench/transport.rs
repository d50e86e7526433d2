//! Transport overhead: raw ZeroMQ DEALER/ROUTER round trips against gt's client -> dispatcher -> worker sync
//! round trips, and gt's async throughput of tiny ops, over inproc, ipc and tcp loopback.
//!
//! `cargo bench --bench transport`; `GT_BENCH_QUICK=1` runs in a few seconds; `GT_BENCH_SAVE=1` also writes
//! the table to `bench/results/transport-<host>.txt`. Every figure is the median of several repetitions, and
//! raw and gt repetitions alternate so that each ratio compares figures taken under the same conditions.
//!
//! Fairness of the baseline: the raw sockets get the options of `gt_transport::socket` (unbounded high-water
//! marks, ZMTP heartbeats, 1 s linger, `ROUTER_MANDATORY`), one context for inproc and one per side for ipc
//! and tcp, as a gt client that connects on its own context. gt runs one embedded cluster with one worker,
//! which listens on all three transports; its worker is always connected over inproc. Both sides wait alike:
//! gt's client, dispatcher and worker poll for `GT_SPIN_US` (default 200 µs) before they sleep, and so do
//! the raw echo thread and the raw client (`GT_SPIN_US=0`: both sleep at once).
//!
//! On a small VM a wake-up of a thread on another (idle) vCPU can cost tens of µs and then dominates every
//! round trip; `taskset -c 0 target/release/deps/transport-* --bench` puts all threads on one CPU, which
//! leaves the per-message CPU cost (the header says how many CPUs the run could use).

#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

use anyhow::{anyhow, bail, Context as _, Result};
use gt::frontend::{Client, ClientOptions, Origin};
use gt::ir::{Instr, TensorType, UnaryOp, ValueId};
use gt::runtime::{Cluster, ClusterOptions};
use gt::transport::endpoint::ipc_path;
use gt::transport::socket::{poll_spinning, HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS};
use gt::transport::{zmq, Endpoint};
use std::fmt::Write as _;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// How much to run.
struct Config {
    mode: &'static str,
    reps: usize,
    raw_iters: usize,
    gt_iters: usize,
    ops_per_client: usize,
    /// The watchdog's limit for the whole run (a hang in the runtime must not hang the bench).
    limit: Duration,
}

impl Config {
    fn from_env() -> Config {
        // Run without `--bench` (as by `cargo test --benches`): a smoke run, as quick mode.
        let quick =
            std::env::var("GT_BENCH_QUICK").is_ok_and(|v| v != "0") || !std::env::args().any(|a| a == "--bench");
        if quick {
            Config { mode: "quick", reps: 3, raw_iters: 500, gt_iters: 200, ops_per_client: 5_000, limit: secs(60) }
        } else {
            Config {
                mode: "full",
                reps: 7,
                raw_iters: 5_000,
                gt_iters: 2_000,
                ops_per_client: 50_000,
                limit: secs(300),
            }
        }
    }
}

/// How long every waiting thread of both sides polls before it sleeps (`GT_SPIN_US`), read
/// once by `main`.
static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

fn spin() -> Duration {
    *SPIN.get().expect("read at the start of main")
}

/// Whether gt's in-process client and worker talk to the dispatcher through lanes
/// (`GT_LANE`, default on), read once by `main`.
static LANE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn lane() -> bool {
    *LANE.get().expect("read at the start of main")
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Transport {
    Inproc,
    Ipc,
    Tcp,
}

impl Transport {
    const ALL: [Transport; 3] = [Transport::Inproc, Transport::Ipc, Transport::Tcp];

    fn name(self) -> &'static str {
        match self {
            Transport::Inproc => "inproc",
            Transport::Ipc => "ipc",
            Transport::Tcp => "tcp",
        }
    }
}

/// What the run is doing now, for the watchdog's message.
static PHASE: Mutex<String> = Mutex::new(String::new());

fn phase(text: impl Into<String>) {
    *PHASE.lock().unwrap_or_else(|e| e.into_inner()) = text.into();
}

fn main() -> Result<()> {
    let config = Config::from_env();
    let env = gt::runtime::config::EnvConfig::from_env()?;
    let _ = SPIN.set(env.spin);
    let _ = LANE.set(env.lane);
    let limit = config.limit;
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let phase = PHASE.lock().unwrap_or_else(|e| e.into_inner()).clone();
        eprintln!("transport bench: no result after {} s; stuck in: {phase}", limit.as_secs());
        std::process::exit(2);
    });

    let started = Instant::now();
    let gt = GtCluster::start()?;
    let mut rtt = Vec::new();
    let mut tput = Vec::new();
    for t in Transport::ALL {
        rtt.push(round_trips(&config, &gt.connector, t)?);
        for clients in [1, 4] {
            tput.push(throughput(&config, &gt.connector, t, clients)?);
        }
    }
    phase("shutting down the cluster");
    drop(gt);

    let text = report(&config, &rtt, &tput, started.elapsed());
    print!("{text}");
    if std::env::var("GT_BENCH_SAVE").is_ok_and(|v| v == "1") {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("transport-{}.txt", host_name()));
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        println!("saved to {}", path.display());
    }
    Ok(())
}

// ---- gt side ---------------------------------------------------------------------------------------------

/// One embedded cluster (one worker) listening on inproc, ipc and tcp.
struct GtCluster {
    /// Kept for its `Drop`, which shuts the cluster down.
    _cluster: Cluster,
    connector: Connector,
}

/// How clients reach the cluster (a `Cluster` is not `Sync`, this is: client threads share it).
struct Connector {
    ctx: zmq::Context,
    inproc: Endpoint,
    ipc: Endpoint,
    tcp: Endpoint,
}

impl GtCluster {
    fn start() -> Result<GtCluster> {
        phase("starting the cluster");
        let mut last = None;
        // The port is probed free, but another process may take it before the bind: retry.
        for _ in 0..5 {
            let port = free_port(|p| !ipc_path(p).exists())?;
            let mut options = ClusterOptions::embedded(1);
            options.dispatcher.spin = spin();
            options.lane = lane();
            options.listen = Endpoint::for_server("127.0.0.1", port);
            match Cluster::start(options) {
                Ok(cluster) => {
                    let find = |want: fn(&Endpoint) -> bool| cluster.listen().iter().find(|e| want(e)).cloned();
                    let tcp = find(|e| matches!(e, Endpoint::Tcp { .. })).ok_or_else(|| anyhow!("no tcp endpoint"))?;
                    let ipc = find(|e| matches!(e, Endpoint::Ipc(_))).ok_or_else(|| anyhow!("no ipc endpoint"))?;
                    let connector =
                        Connector { ctx: cluster.context().clone(), inproc: cluster.endpoint().clone(), ipc, tcp };
                    return Ok(GtCluster { _cluster: cluster, connector });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(anyhow!("cannot start the cluster: {}", last.map(|e| e.to_string()).unwrap_or_default()))
    }
}

impl Connector {
    /// A client over `t` that holds `%0 = full f32[1] 1.0`, created and synced before any timing.
    fn client(&self, t: Transport) -> Result<Client> {
        self.client_with(t, true)
    }

    /// [`Connector::client`], offering its doorbell or not (only an `inproc://` client has one).
    fn client_with(&self, t: Transport, doorbell: bool) -> Result<Client> {
        let options = ClientOptions {
            name: format!("bench-{}", t.name()),
            spin: spin(),
            doorbell,
            lane: lane(),
            ..ClientOptions::default()
        };
        let mut client = match t {
            Transport::Inproc => Client::connect_in(&self.ctx, &self.inproc, options),
            Transport::Ipc => Client::connect(&self.ipc, options),
            Transport::Tcp => Client::connect(&self.tcp, options),
        }?;
        let full = Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![1]), value: 1.0 };
        client.submit(full, Origin { op: "full", span: None })?;
        client.sync()?;
        Ok(client)
    }
}

/// The tiny op: `%1 = neg %0`, redefining `%1` every time (the dispatcher reuses its buffer).
fn neg() -> Instr {
    Instr::Unary { op: UnaryOp::Neg, dst: ValueId(1), src: ValueId(0) }
}

const NEG: Origin = Origin { op: "neg", span: None };

/// Seconds per `submit(neg) + sync()`.
fn gt_round_trips(client: &mut Client, iters: usize) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..iters {
        client.submit(neg(), NEG)?;
        client.sync()?;
    }
    Ok(start.elapsed().as_secs_f64() / iters as f64)
}

// ---- raw ZeroMQ side -------------------------------------------------------------------------------------

/// The options `gt_transport::socket` gives every socket.
fn raw_options(s: &zmq::Socket) -> zmq::Result<()> {
    s.set_sndhwm(0)?;
    s.set_rcvhwm(0)?;
    s.set_heartbeat_ivl(HEARTBEAT_IVL_MS)?;
    s.set_heartbeat_timeout(HEARTBEAT_TIMEOUT_MS)?;
    s.set_heartbeat_ttl(HEARTBEAT_TIMEOUT_MS)?;
    s.set_linger(1000)
}

/// A ROUTER echo thread and a DEALER connected to it.
struct RawPair {
    dealer: zmq::Socket,
    echo: Option<std::thread::JoinHandle<zmq::Result<()>>>,
    ipc_file: Option<std::path::PathBuf>,
    spin: Duration,
}

const STOP: &[u8] = b"stop";

impl RawPair {
    fn start(t: Transport) -> Result<RawPair> {
        let server_ctx = zmq::Context::new();
        let client_ctx = if t == Transport::Inproc { server_ctx.clone() } else { zmq::Context::new() };
        let router = server_ctx.socket(zmq::ROUTER)?;
        raw_options(&router)?;
        router.set_router_mandatory(true)?;
        let mut ipc_file = None;
        let address = match t {
            Transport::Inproc => format!("inproc://gt-bench-raw-{}", std::process::id()),
            Transport::Ipc => {
                let path = std::env::temp_dir().join(format!("gt-bench-raw-{}.ipc", std::process::id()));
                ipc_file = Some(path.clone());
                format!("ipc://{}", path.display())
            }
            Transport::Tcp => format!("tcp://127.0.0.1:{}", free_port(|_| true)?),
        };
        router.bind(&address).with_context(|| format!("binding {address}"))?;
        let spin = spin();
        let echo = std::thread::Builder::new().name("raw-echo".into()).spawn(move || -> zmq::Result<()> {
            loop {
                poll_spinning(&mut [router.as_poll_item(zmq::POLLIN)], spin, -1)?;
                let frames = router.recv_multipart(0)?;
                let stop = frames.last().is_some_and(|f| f.as_slice() == STOP);
                router.send_multipart(frames, 0)?;
                if stop {
                    return Ok(());
                }
            }
        })?;
        let dealer = client_ctx.socket(zmq::DEALER)?;
        raw_options(&dealer)?;
        dealer.connect(&address)?;
        Ok(RawPair { dealer, echo: Some(echo), ipc_file, spin })
    }

    /// Seconds per round trip of an 8-byte message.
    fn round_trips(&self, iters: usize) -> Result<f64> {
        let payload = [7u8; 8];
        let mut buf = zmq::Message::new();
        let start = Instant::now();
        for _ in 0..iters {
            self.dealer.send(&payload[..], 0)?;
            poll_spinning(&mut [self.dealer.as_poll_item(zmq::POLLIN)], self.spin, -1)?;
            self.dealer.recv(&mut buf, 0)?;
        }
        Ok(start.elapsed().as_secs_f64() / iters as f64)
    }
}

impl Drop for RawPair {
    fn drop(&mut self) {
        if self.dealer.send(STOP, 0).is_ok() && self.dealer.recv_bytes(0).is_ok() {
            if let Some(h) = self.echo.take() {
                let _ = h.join();
            }
        }
        if let Some(p) = &self.ipc_file {
            let _ = std::fs::remove_file(p);
        }
    }
}

// ---- measurements ----------------------------------------------------------------------------------------

/// Medians (µs per round trip) over one transport.
struct RoundTrip {
    t: Transport,
    raw: Stat,
    gt: Stat,
    /// Median of the per-repetition ratios gt/raw.
    ratio: f64,
    /// Over inproc, gt's round trip without the doorbell (every sync answered by the
    /// dispatcher, as over ipc and tcp), and its ratio to raw.
    unrung: Option<(Stat, f64)>,
}

fn round_trips(config: &Config, gt: &Connector, t: Transport) -> Result<RoundTrip> {
    phase(format!("{} round trips: set-up", t.name()));
    let raw = RawPair::start(t)?;
    let mut client = gt.client(t)?;
    let mut unrung = if t == Transport::Inproc { Some(gt.client_with(t, false)?) } else { None };
    // Warm up both (connections, allocator, caches).
    raw.round_trips(config.raw_iters / 10 + 1)?;
    gt_round_trips(&mut client, config.gt_iters / 10 + 1)?;
    if let Some(c) = &mut unrung {
        gt_round_trips(c, config.gt_iters / 10 + 1)?;
    }
    let (mut raws, mut gts, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut unrungs, mut unrung_ratios) = (Vec::new(), Vec::new());
    for rep in 0..config.reps {
        phase(format!("{} round trips: repetition {rep} (raw)", t.name()));
        let r = raw.round_trips(config.raw_iters)? * 1e6;
        phase(format!("{} round trips: repetition {rep} (gt)", t.name()));
        let g = gt_round_trips(&mut client, config.gt_iters)? * 1e6;
        raws.push(r);
        gts.push(g);
        ratios.push(g / r);
        if let Some(c) = &mut unrung {
            phase(format!("{} round trips: repetition {rep} (gt, no doorbell)", t.name()));
            let u = gt_round_trips(c, config.gt_iters)? * 1e6;
            unrungs.push(u);
            unrung_ratios.push(u / r);
        }
    }
    let unrung = unrung.map(|_| (Stat::of(&unrungs), median(&unrung_ratios)));
    Ok(RoundTrip { t, raw: Stat::of(&raws), gt: Stat::of(&gts), ratio: median(&ratios), unrung })
}

/// Async throughput of tiny ops over one transport with `clients` clients.
struct Throughput {
    t: Transport,
    clients: usize,
    /// Instructions per second, all clients together.
    rate: Stat,
    /// Client-side cost of `submit` (encoding and sending batches included), µs per instruction.
    issue_us: f64,
}

fn throughput(config: &Config, gt: &Connector, t: Transport, clients: usize) -> Result<Throughput> {
    let n = config.ops_per_client;
    let (mut rates, mut issues) = (Vec::new(), Vec::new());
    // Counts the instructions the worker ran, so that a fast figure cannot come from lost ones.
    let mut observer = gt.client(Transport::Inproc)?;
    let executed =
        |observer: &mut Client| -> Result<u64> { Ok(observer.worker_stats()?.iter().map(|w| w.instructions).sum()) };
    // One untimed repetition first, as a warm-up.
    for rep in 0..=config.reps {
        let before = executed(&mut observer)?;
        phase(format!("{} throughput, {clients} clients: repetition {rep}", t.name()));
        let barrier = Barrier::new(clients + 1);
        let (start, results) = std::thread::scope(|s| {
            let handles: Vec<_> = (0..clients)
                .map(|_| {
                    s.spawn(|| -> Result<(Instant, f64)> {
                        // Connect before the barrier, so that set-up is not timed; always reach it.
                        let client = gt.client(t);
                        barrier.wait();
                        let mut client = client?;
                        let start = Instant::now();
                        for _ in 0..n {
                            client.submit(neg(), NEG)?;
                        }
                        let issued = start.elapsed();
                        client.sync()?;
                        Ok((Instant::now(), issued.as_secs_f64()))
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            let results: Vec<_> =
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a client panicked")))).collect();
            (start, results)
        });
        let results = results.into_iter().collect::<Result<Vec<_>>>()?;
        let end = results.iter().map(|r| r.0).max().ok_or_else(|| anyhow!("no clients"))?;
        let issued = results.iter().map(|r| r.1).sum::<f64>() / clients as f64;
        let ran = executed(&mut observer)? - before;
        if ran < (clients * n) as u64 {
            bail!("{} clients submitted {} instructions but the worker ran {ran}", clients, clients * n);
        }
        if rep > 0 {
            rates.push((clients * n) as f64 / end.duration_since(start).as_secs_f64());
            issues.push(issued / n as f64 * 1e6);
        }
    }
    if rates.is_empty() {
        bail!("no repetitions");
    }
    Ok(Throughput { t, clients, rate: Stat::of(&rates), issue_us: median(&issues) })
}

// ---- statistics and report -------------------------------------------------------------------------------

/// Median and spread of the repetitions.
struct Stat {
    median: f64,
    /// (max - min) / median, in percent: how noisy the figure is.
    spread: f64,
}

impl Stat {
    fn of(xs: &[f64]) -> Stat {
        let (lo, hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let median = median(xs);
        Stat { median, spread: (hi - lo) / median * 100.0 }
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

fn report(config: &Config, rtt: &[RoundTrip], tput: &[Throughput], took: Duration) -> String {
    let mut s = String::new();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        s,
        "gt transport benchmark: host {}, {cpus} CPUs, {} mode, median of {} repetitions ({:.0} s)",
        host_name(),
        config.mode,
        config.reps,
        took.as_secs_f64()
    );
    let _ = writeln!(s, "cluster: embedded dispatcher + 1 worker (worker over inproc); spread = (max-min)/median");
    let _ = writeln!(s, "waits (both sides): poll for {} µs before sleeping (GT_SPIN_US)", spin().as_micros());
    let lanes = if lane() { "through lanes (in-process queues)" } else { "over inproc ZeroMQ (GT_LANE=0)" };
    let _ = writeln!(s, "gt's in-process client and worker talk to the dispatcher {lanes}");
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "1-2. round trip, µs (raw: DEALER->ROUTER echo of 8 bytes, {} per rep; gt: submit(neg) + sync(), {} per rep)",
        config.raw_iters, config.gt_iters
    );
    let _ = writeln!(
        s,
        "{:<10}{:>10}{:>9}{:>10}{:>9}{:>9}{:>12}{:>9}{:>9}",
        "transport", "raw", "spread", "gt sync", "spread", "gt/raw", "no doorbell", "spread", "/raw"
    );
    for r in rtt {
        let unrung = match &r.unrung {
            Some((u, ratio)) => format!("{:>12.1}{:>8.0}%{:>8.2}x", u.median, u.spread, ratio),
            None => format!("{:>12}{:>9}{:>9}", "-", "-", "-"),
        };
        let _ = writeln!(
            s,
            "{:<10}{:>10.1}{:>8.0}%{:>10.1}{:>8.0}%{:>8.2}x{unrung}",
            r.t.name(),
            r.raw.median,
            r.raw.spread,
            r.gt.median,
            r.gt.spread,
            r.ratio
        );
    }
    let _ = writeln!(
        s,
        "(gt sync: an inproc client's syncs are answered by its worker through its doorbell; \"no doorbell\": by the dispatcher, as over ipc and tcp)"
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "3. async throughput: each client submits {} x neg(f32[1]) then one sync (batch 256)",
        config.ops_per_client
    );
    let _ = writeln!(
        s,
        "{:<10}{:>8}{:>12}{:>9}{:>12}{:>12}",
        "transport", "clients", "instr/s", "spread", "µs/op e2e", "µs/op issue"
    );
    for r in tput {
        let _ = writeln!(
            s,
            "{:<10}{:>8}{:>12.0}{:>8.0}%{:>12.2}{:>12.2}",
            r.t.name(),
            r.clients,
            r.rate.median,
            r.rate.spread,
            1e6 / r.rate.median * r.clients as f64,
            r.issue_us
        );
    }
    let _ = writeln!(s, "(µs/op e2e: wall time per instruction per client; issue: time inside submit() only)");
    let _ = writeln!(s);
    let _ = writeln!(s, "goals");
    let check = |ok: bool| if ok { "ok" } else { "MISSED" };
    for r in rtt {
        let _ = writeln!(
            s,
            "  {:<6} gt sync / raw round trip <= 1.5x (issue 16): {:.2}x {}",
            r.t.name(),
            r.ratio,
            check(r.ratio <= 1.5)
        );
    }
    for r in tput.iter().filter(|r| r.t == Transport::Ipc) {
        let rate = r.rate.median;
        let _ = writeln!(s, "  ipc {} client(s) >= 200000 instr/s: {rate:.0} {}", r.clients, check(rate >= 200_000.0));
    }
    if let Some(r) = tput.iter().find(|r| r.t == Transport::Inproc && r.clients == 1) {
        let us = 1e6 / r.rate.median;
        let _ = writeln!(s, "  inproc 1 client <= 5 µs per issued op (e2e): {us:.2} {}", check(us <= 5.0));
    }
    s
}

// ---- helpers ---------------------------------------------------------------------------------------------

/// A TCP port that is free now (and for which `also` holds), as the OS hands it out.
fn free_port(also: impl Fn(u16) -> bool) -> Result<u16> {
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if also(port) {
            return Ok(port);
        }
    }
    bail!("no free port found")
}

fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String =
        name.trim().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    if name.is_empty() {
        "local".into()
    } else {
        name
    }
}
