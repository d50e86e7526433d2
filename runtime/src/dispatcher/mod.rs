//! The dispatcher: one ROUTER socket for every client and worker. It gives each client its
//! own value-id namespace (a client can only name values it created), runs each client's
//! stream through the pass pipeline, types every instruction (so shape errors are reported in
//! the client's ids, before any worker sees them), renames values to worker buffers, batches
//! per worker, answers data requests, and frees on `free`, on `Bye` and when a client is gone.
//! This file is the socket loop, liveness and batching; a client's values, bytes and credit
//! are a [`namespace::Namespace`], each worker's queue and buffer ids are in `workers.rs`.
//!
//! # Invariants
//! - A worker receives one client's instructions in that client's order; a reply a client
//!   waits for is sent after the failures of that client's earlier instructions.
//! - Each client's values live on one worker (its *home*, the least loaded at its first
//!   instruction) until the shard pass places them; so any program gives the same numbers on
//!   1 worker or N.
//! - A peer that sends garbage is answered `Rejected` (or dropped, with a log line); a peer
//!   that is gone is noticed by routing (`ROUTER_MANDATORY`) within one probe interval, and
//!   everyone waiting on it gets an error.

pub mod dump;
pub mod log;
mod namespace;
mod workers;

use gt_ir::text::print::print_instr;
use gt_ir::verify::shape;
use gt_ir::{Instr, TensorType, TypeError, ValueId};
use gt_passes::{Pipeline, Typing};
use gt_transport::message::{
    Failure, FailureKind, PassStats, Reply, Request, Timing, WorkerCommand, WorkerEvent, WorkerInfo, WorkerStats,
};
use gt_transport::{codec, socket, zmq, EventKind, Inbound};
use log::EventLog;
use namespace::{Charge, Limits, Location, Namespace, Refusal, Unavailable};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workers::{Batch, Clock, ExecNote, Queued, Worker};

/// Makes the pass pipeline of each new client stream (given the client's number).
pub type PipelineFactory = Arc<dyn Fn(u64) -> Pipeline + Send + Sync>;

/// How the dispatcher runs.
#[derive(Clone)]
pub struct DispatcherConfig {
    /// Instructions per worker batch at most (`GT_WORKER_BATCH_SIZE`); a batch also leaves
    /// whenever the dispatcher has no more messages to read, or at a sync point.
    pub worker_batch_size: usize,
    /// Largest frame accepted or sent (`GT_MAX_MESSAGE_BYTES`).
    pub max_message_bytes: usize,
    /// How often workers are probed for liveness (clients: ten times less often).
    pub probe_interval: Duration,
    /// The pass pipeline of each client stream.
    pub pipeline: PipelineFactory,
    /// Workers that must be registered before a client is welcomed (until its wait runs
    /// out): an embedded cluster of N workers sets N, so every client sees all of them.
    pub min_workers: usize,
    /// The most bytes one client's values may hold (`GT_CLIENT_MEMORY`): an instruction
    /// whose results would pass it fails, so one client cannot take a shared worker's memory.
    pub client_memory: u64,
    /// Instructions one client may have in flight to workers (`GT_CLIENT_CREDIT`).
    pub client_credit: u64,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            worker_batch_size: 256,
            max_message_bytes: codec::DEFAULT_MAX_MESSAGE_BYTES,
            probe_interval: Duration::from_millis(100),
            pipeline: Arc::new(|_| Pipeline::new()),
            min_workers: 1,
            client_memory: u64::MAX,
            client_credit: CLIENT_CREDIT_INSTRUCTIONS,
        }
    }
}

impl std::fmt::Debug for DispatcherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherConfig")
            .field("worker_batch_size", &self.worker_batch_size)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("probe_interval", &self.probe_interval)
            .finish_non_exhaustive()
    }
}

/// The origin sequence number of instructions the dispatcher makes on its own behalf (their
/// failures are logged, not reported to a client).
const DISPATCHER_SEQ: u64 = u64::MAX;

/// Instructions one client may have sent to workers and not yet seen run, by default: its
/// credit (`GT_CLIENT_CREDIT`). An honest client waits long before (`GT_CLIENT_WINDOW`,
/// 65,536); one that never waits gets its instructions failed past this, so its queue cannot
/// grow without bound.
pub const CLIENT_CREDIT_INSTRUCTIONS: u64 = 1 << 20;
/// Bytes of literal data one client may have in flight to workers.
pub const CLIENT_CREDIT_BYTES: u64 = 4 << 30;

struct ClientState {
    identity: Vec<u8>,
    /// Its values (the only ones it can name), their bytes, its credit used, its home.
    namespace: Namespace,
    /// Its pass pipeline, which also types its stream and tracks its signal scopes.
    pipeline: Pipeline,
}

struct PendingGet {
    client: u64,
    seq: u64,
    worker: usize,
    /// The value's type: the answer must have it, with as many elements.
    ty: TensorType,
    /// The value, in the client's ids.
    value: ValueId,
}

struct PendingStats {
    client: u64,
    seq: u64,
    remaining: usize,
    results: Vec<WorkerStats>,
    passes: Vec<PassStats>,
}

struct PendingHello {
    identity: Vec<u8>,
    name: String,
    deadline: Instant,
    wait_ms: u64,
}

/// A running dispatcher's state; [`Dispatcher::run`] is its loop.
pub struct Dispatcher {
    router: zmq::Socket,
    /// Routing ids starting with this secret are the owner's stop requests.
    stop_key: Vec<u8>,
    stopping: bool,
    log: EventLog,
    config: DispatcherConfig,
    clients: HashMap<u64, ClientState>,
    client_ids: HashMap<Vec<u8>, u64>,
    next_client: u64,
    workers: Vec<Worker>,
    worker_ids: HashMap<Vec<u8>, usize>,
    gets: HashMap<u64, PendingGet>,
    stats: HashMap<u64, PendingStats>,
    stats_tags: HashMap<u64, (u64, usize)>,
    next_tag: u64,
    hellos: Vec<PendingHello>,
    lost_clients: Vec<(u64, &'static str)>,
    lost_workers: Vec<usize>,
    last_probe: Instant,
    last_client_probe: Instant,
}

/// What goes wrong when a dispatcher cannot run at all (bad sockets); everything a peer does
/// is handled inside the loop.
pub type DispatcherError = zmq::Error;

impl Dispatcher {
    /// A dispatcher on a bound `router`, stopped by any message from a peer whose routing id
    /// starts with `stop_key` (a secret only the owner knows; one socket is all the
    /// dispatcher polls, which keeps a round trip's system calls down).
    pub fn new(router: zmq::Socket, stop_key: Vec<u8>, log: EventLog, config: DispatcherConfig) -> Dispatcher {
        Dispatcher {
            router,
            stop_key,
            stopping: false,
            log,
            config,
            clients: HashMap::new(),
            client_ids: HashMap::new(),
            next_client: 1,
            workers: Vec::new(),
            worker_ids: HashMap::new(),
            gets: HashMap::new(),
            stats: HashMap::new(),
            stats_tags: HashMap::new(),
            next_tag: 1,
            hellos: Vec::new(),
            lost_clients: Vec::new(),
            lost_workers: Vec::new(),
            last_probe: Instant::now(),
            last_client_probe: Instant::now(),
        }
    }

    /// Serves until a stop request arrives (see [`Dispatcher::new`]); then tells every worker to shut
    /// down and returns.
    pub fn run(mut self) -> Result<(), DispatcherError> {
        loop {
            let timeout = self.config.probe_interval.as_millis() as i64;
            self.log.flush();
            // Whether every waiting message was read (not cut off at the cap).
            let mut drained = true;
            if socket::retry(|| self.router.poll(zmq::POLLIN, timeout))? > 0 {
                drained = false;
                for _ in 0..4096 {
                    match socket::recv_frames(&self.router, zmq::DONTWAIT) {
                        Ok(frames) => self.on_frames(frames),
                        Err(zmq::Error::EAGAIN) => {
                            drained = true;
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                    self.reap();
                    if self.stopping {
                        break;
                    }
                }
            }
            if self.stopping {
                break;
            }
            if drained {
                self.idle_pipelines();
            }
            for w in 0..self.workers.len() {
                self.flush_worker(w, None);
            }
            self.housekeeping();
            self.reap();
        }
        self.drain_workers(Duration::from_secs(1))?;
        for w in 0..self.workers.len() {
            if self.workers[w].alive {
                self.send_worker(w, &WorkerCommand::Shutdown);
                self.log_worker(EventKind::Disconnect, w, "Shutdown", 0, || "the dispatcher stops".into());
            }
        }
        self.log.flush();
        Ok(())
    }

    /// At shutdown: sends what is queued and waits (at most `limit`) for the workers to
    /// answer every batch, so the log pairs each WORKER_SEND with its WORKER_RECV.
    fn drain_workers(&mut self, limit: Duration) -> Result<(), DispatcherError> {
        let deadline = Instant::now() + limit;
        // What arrived before the stop (a client's goodbye, say) is still handled.
        while let Ok(frames) = socket::recv_frames(&self.router, zmq::DONTWAIT) {
            self.on_frames(frames);
            self.reap();
        }
        for w in 0..self.workers.len() {
            self.flush_worker(w, None);
        }
        while self.workers.iter().any(|w| w.alive && !w.inflight.is_empty()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || socket::retry(|| self.router.poll(zmq::POLLIN, left.as_millis().max(1) as i64))? == 0 {
                break;
            }
            while let Ok(frames) = socket::recv_frames(&self.router, zmq::DONTWAIT) {
                self.on_frames(frames);
                self.reap();
            }
        }
        Ok(())
    }

    // ---- frames ------------------------------------------------------------------------

    /// One message: the peer's routing id, the message, and for a worker's `Data` its data
    /// frame (passed on to the client as it is).
    fn on_frames(&mut self, frames: Vec<zmq::Message>) {
        if frames.first().is_some_and(|id| id.starts_with(&self.stop_key)) {
            self.stopping = true;
            return;
        }
        let max = self.config.max_message_bytes;
        let mut frames = frames.into_iter();
        let identity = frames.next().map(|f| f.to_vec()).unwrap_or_default();
        let Some(payload) = frames.next() else {
            return self.bad_message(&identity, 0, "expected a message after the routing id, got none".into());
        };
        let data = frames.next();
        if frames.next().is_some() {
            return self.bad_message(&identity, payload.len(), "a message of more than two frames".into());
        }
        // Handling a message cannot panic by design; should a bug make it, the peer that sent
        // the message loses its session and everyone else carries on.
        let (len, peer) = (payload.len() + data.as_ref().map_or(0, |d| d.len()), identity.clone());
        let handled = catch_unwind(AssertUnwindSafe(|| match (codec::decode::<Inbound>(&payload, max), data) {
            (Ok(Inbound::Worker(WorkerEvent::Data { tag, ty })), Some(data)) => {
                self.on_worker_data(identity, (tag, ty), data, len)
            }
            (Ok(Inbound::Worker(WorkerEvent::Data { .. })), None) => {
                self.bad_message(&identity, len, "a Data message without its data frame".into())
            }
            (Ok(_), Some(_)) => self.bad_message(&identity, len, "a data frame after a message that has none".into()),
            (Ok(Inbound::Client(req)), None) => self.on_request(identity, req, len),
            (Ok(Inbound::Worker(event)), None) => self.on_worker_event(identity, event, len),
            (Err(e), _) => self.bad_message(&identity, len, e.to_string()),
        }));
        if let Err(panic) = handled {
            self.peer_panicked(&peer, len, panic_message(panic.as_ref()));
        }
    }

    /// A message from `identity` made the dispatcher panic: the client is told and removed
    /// (its values freed), a worker counts as lost.
    fn peer_panicked(&mut self, identity: &[u8], bytes: usize, why: String) {
        let source = self.source_of(identity);
        let why = format!("internal error while handling a message from {source}: {why}; please report it");
        tracing::error!(target: "gt::dispatcher", "{why}");
        self.log.emit(EventKind::Error, source, "Panic", bytes, why.clone());
        if let Some(&w) = self.worker_ids.get(identity) {
            self.worker_lost(w);
        } else if let Some(&c) = self.client_ids.get(identity) {
            self.send_reply(c, &Reply::Rejected { message: format!("{why}; this client's session was closed") });
            self.remove_client(c, "its message made the dispatcher fail");
        }
    }

    /// Logs a message that cannot be taken and tells its sender (unless it is a worker,
    /// which cannot act on it).
    fn bad_message(&mut self, identity: &[u8], bytes: usize, why: String) {
        let source = self.source_of(identity);
        tracing::warn!(target: "gt::dispatcher", "rejected a message from {source}: {why}");
        self.log.emit(EventKind::Error, source, "Rejected", bytes, why.clone());
        if !self.worker_ids.contains_key(identity) {
            self.send_reply_to(identity, &Reply::Rejected { message: why });
        }
    }

    fn source_of(&self, identity: &[u8]) -> String {
        if let Some(c) = self.client_ids.get(identity) {
            format!("CLIENT {c}")
        } else if let Some(w) = self.worker_ids.get(identity) {
            format!("WORKER {}", self.workers[*w].name)
        } else {
            format!("PEER {}", hex(identity))
        }
    }

    // ---- clients -----------------------------------------------------------------------

    fn on_request(&mut self, identity: Vec<u8>, req: Request, bytes: usize) {
        if let Request::Hello { name, wait_ms } = req {
            if let Some(&c) = self.client_ids.get(&identity) {
                self.welcome_again(c);
            } else if self.enough_workers() {
                self.welcome(identity, name, bytes);
            } else {
                let deadline = Instant::now() + Duration::from_millis(wait_ms);
                self.hellos.push(PendingHello { identity, name, deadline, wait_ms });
            }
            return;
        }
        let Some(&c) = self.client_ids.get(&identity) else {
            self.bad_message(&identity, bytes, "a client must send Hello before anything else".into());
            return;
        };
        match req {
            Request::Hello { .. } => unreachable!("handled above"),
            Request::Batch { first_seq, instrs } => {
                tracing::debug!(target: "gt::dispatcher", "client {c}: batch #{first_seq} of {} instructions", instrs.len());
                // Sequence numbers never wrap: a batch that would pass 2^64 is refused whole.
                if first_seq.checked_add(instrs.len() as u64).is_none() {
                    let why = format!(
                        "a batch from #{first_seq} of {} instructions runs past sequence number 2^64",
                        instrs.len()
                    );
                    return self.bad_message(&identity, bytes, why);
                }
                let share = bytes / instrs.len().max(1);
                for (k, instr) in instrs.into_iter().enumerate() {
                    self.on_instr(c, first_seq + k as u64, instr, share);
                }
            }
            Request::Get { seq, value } => {
                self.log_recv(c, "Get", bytes, || format!("seq={seq} %{}", value.0));
                self.on_get(c, seq, value);
            }
            Request::Sync { seq } => {
                self.log_recv(c, "Sync", bytes, || format!("seq={seq}"));
                self.on_sync(c, seq);
            }
            Request::Stats { seq } => {
                self.log_recv(c, "Stats", bytes, || format!("seq={seq}"));
                self.on_stats(c, seq);
            }
            Request::Bye => self.remove_client(c, "said goodbye"),
        }
    }

    fn log_recv(&mut self, c: u64, command: &str, bytes: usize, details: impl FnOnce() -> String) {
        if self.log.active() {
            self.log.emit(EventKind::Recv, format!("CLIENT {c}"), command, bytes, details());
        }
    }

    /// Logs an event of worker `w` (details built only when someone listens).
    fn log_worker(&mut self, kind: EventKind, w: usize, command: &str, bytes: usize, details: impl FnOnce() -> String) {
        if self.log.active() {
            let source = format!("WORKER {}", self.workers[w].name);
            self.log.emit(kind, source, command, bytes, details());
        }
    }

    fn welcome(&mut self, identity: Vec<u8>, name: String, bytes: usize) {
        let c = self.next_client;
        self.next_client += 1;
        let client = ClientState {
            identity: identity.clone(),
            namespace: Namespace::new(),
            pipeline: (self.config.pipeline)(c),
        };
        self.clients.insert(c, client);
        self.client_ids.insert(identity, c);
        tracing::info!(target: "gt::dispatcher", "client {c} connected: {name}");
        self.log.emit(EventKind::Connect, format!("CLIENT {c}"), "Hello", bytes, format!("name={name}"));
        self.welcome_again(c);
    }

    fn enough_workers(&self) -> bool {
        self.workers.iter().filter(|w| w.alive).count() >= self.config.min_workers.max(1)
    }

    fn welcome_again(&mut self, c: u64) {
        let workers = self.worker_infos();
        let max_message_bytes = self.config.max_message_bytes as u64;
        self.send_reply(c, &Reply::Welcome { client: c, workers, max_message_bytes });
    }

    fn worker_infos(&self) -> Vec<WorkerInfo> {
        self.workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.alive)
            .map(|(i, w)| WorkerInfo { index: i as u32, name: w.name.clone(), backend: w.backend.clone() })
            .collect()
    }

    fn on_instr(&mut self, c: u64, seq: u64, instr: Instr, bytes: usize) {
        let Some(client) = self.clients.get_mut(&c) else { return };
        if self.log.active() {
            // The pipeline keeps the scopes; this is the stack as it will be after `instr`.
            let signals = client.pipeline.signals();
            let closes = |name: &String| signals.last().is_some_and(|(open, _)| open == name);
            if let Instr::SignalEnd { name } = &instr {
                if !closes(name) {
                    // A client closing a scope it did not open: the stack stays as it is.
                    let msg = format!("client={c} #{seq} signal_end {name:?} does not close the open scope");
                    self.log.emit(EventKind::Error, format!("CLIENT {c}"), "signal_end", bytes, msg);
                }
            }
            if let Instr::SignalStart { name, .. } | Instr::SignalEnd { name } = &instr {
                let depth = match &instr {
                    Instr::SignalStart { .. } => signals.len() + 1,
                    _ if closes(name) => signals.len() - 1,
                    _ => signals.len(),
                };
                let what = if matches!(instr, Instr::SignalStart { .. }) { "enter" } else { "exit" };
                let compile = if matches!(instr, Instr::SignalStart { compile: true, .. }) { " compile" } else { "" };
                self.log.emit(
                    EventKind::Signal,
                    format!("CLIENT {c}"),
                    what,
                    bytes,
                    format!("#{seq} {name} depth={depth}{compile}"),
                );
            } else {
                let scope = signals.last().map(|(s, _)| format!(" signal={s}")).unwrap_or_default();
                self.log.emit(
                    EventKind::Recv,
                    format!("CLIENT {c}"),
                    instr.mnemonic(),
                    bytes,
                    format!("#{seq} {}{scope}", print_instr(&instr)),
                );
            }
        }
        let mut out = Vec::new();
        client.pipeline.run(instr, seq, &mut out);
        self.route_emitted(c, out);
    }

    /// Routes what a pipeline emitted, each instruction as its client's instruction of origin;
    /// instructions a pass injected are logged as INJECT.
    fn route_emitted(&mut self, c: u64, out: Vec<gt_passes::Emitted>) {
        self.pass_errors(c);
        for (i, meta) in out {
            let seq = meta.seq;
            if let (Some(pass), true) = (meta.injected_by, self.log.active()) {
                self.log.emit(
                    EventKind::Inject,
                    format!("PASS {pass}"),
                    i.mnemonic(),
                    0,
                    format!("client={c} #{seq} {}", print_instr(&i)),
                );
            }
            self.route(c, seq, i, meta.types);
        }
    }

    /// Reports what the pipeline's validation found: a pass bug, which stops debug builds
    /// (the message handler's `catch_unwind` then ends only this client's session).
    fn pass_errors(&mut self, c: u64) {
        let Some(client) = self.clients.get_mut(&c) else { return };
        for (meta, e) in client.pipeline.take_errors() {
            let msg = format!("client={c} #{}: {e}", meta.seq);
            tracing::error!(target: "gt::dispatcher", "{msg}");
            self.log.emit(EventKind::Error, format!("CLIENT {c}"), "pass", 0, msg.clone());
            debug_assert!(false, "{msg}");
        }
    }

    /// No message is waiting: passes that may release what they hold do (so workers are
    /// not kept waiting for a sync point that may come much later).
    fn idle_pipelines(&mut self) {
        let clients: Vec<u64> = self.clients.iter().filter(|(_, k)| !k.pipeline.is_empty()).map(|(c, _)| *c).collect();
        for c in clients {
            let Some(identity) = self.clients.get(&c).map(|k| k.identity.clone()) else { continue };
            let idled = catch_unwind(AssertUnwindSafe(|| {
                let Some(client) = self.clients.get_mut(&c) else { return };
                let mut out = Vec::new();
                client.pipeline.idle(&mut out);
                self.route_emitted(c, out);
            }));
            if let Err(panic) = idled {
                self.peer_panicked(&identity, 0, panic_message(panic.as_ref()));
            }
        }
    }

    /// Releases what the client's passes hold (before a sync point).
    fn flush_pipeline(&mut self, c: u64, seq: u64) {
        let Some(client) = self.clients.get_mut(&c) else { return };
        let mut out = Vec::new();
        client.pipeline.flush(seq, &mut out);
        self.route_emitted(c, out);
    }

    /// Checks, types, places and renames one instruction, and queues it for its worker.
    /// `typing`: its result types as the pipeline carried them (`None`: typed here).
    fn route(&mut self, c: u64, seq: u64, mut instr: Instr, typing: Typing) {
        let op = instr.mnemonic();
        let limits = self.limits();
        let Some(client) = self.clients.get_mut(&c) else { return };
        let ns = &mut client.namespace;
        match instr {
            Instr::GetData { .. } => {
                let why = format!("{op}: a sync point is a Get request, not an instruction");
                return self.fail(c, seq, &instr, Failure::new(FailureKind::Type, why));
            }
            // Signals are the dispatcher's business (log, passes); workers need not see them.
            Instr::SignalStart { .. } | Instr::SignalEnd { .. } => return,
            Instr::Free { src } => {
                return match ns.free(src) {
                    Ok(Some(at)) => self.push_free(at, (c, seq)),
                    Ok(None) => {}
                    Err(_) => {
                        let why = format!("free: value {src} is not defined (never created, or already freed)");
                        self.fail(c, seq, &instr, Failure::new(FailureKind::Undefined, why))
                    }
                };
            }
            _ => {}
        }
        // Every operand must be one of this client's live values.
        let operands = match ns.operands(&instr.operands()) {
            Ok(operands) => operands,
            Err(e) => return self.fail(c, seq, &instr, Failure::new(FailureKind::Undefined, format!("{op}: {e}"))),
        };
        // Typed once, at the pipeline's entry; instructions a pass made are typed here.
        let typing = typing.map(|t| t.map(|types| types.to_vec()).map_err(|e| (*e).clone()));
        let typing = typing
            .unwrap_or_else(|| shape::infer(&instr, &|v| ns.type_of(v).cloned().ok_or(TypeError::UnknownValue(v))));
        let types = match typing {
            Ok(t) => t,
            Err(e) => return self.fail(c, seq, &instr, Failure::new(e.kind(), format!("{op}: {e}"))),
        };
        let w = match place(&mut self.workers, ns, op) {
            Ok(w) => w,
            Err(failure) => return self.fail(c, seq, &instr, failure),
        };
        debug_assert!(operands.iter().all(|at| at.worker == w), "one home worker per client");
        let results = instr.results();
        let logged_types = if self.log.active() { types.clone() } else { Vec::new() };
        if let Err(refusal) = ns.admit(&results, &types, &limits) {
            let kind = match refusal {
                Refusal::Memory { .. } => FailureKind::OutOfMemory,
                Refusal::Credit { .. } => FailureKind::Limit,
            };
            return self.fail(c, seq, &instr, Failure::new(kind, format!("{op}: {refusal}")));
        }
        // Results: reuse a redefined value's buffer (repeat loops), else allocate.
        let worker = &mut self.workers[w];
        let defined = ns.define(w, seq, &results, types, &mut || worker.alloc());
        for at in defined.stale {
            self.workers[at.worker].queue_free(at.buf, (c, seq));
        }
        // Renamed for the wire: worker buffers become the instruction's value ids.
        let mut next = defined.bufs.into_iter().chain(operands.iter().map(|at| at.buf));
        instr.visit_values_mut(&mut |v| *v = next.next().expect("visit order: results, then operands").into());
        self.push(w, instr, (c, seq), logged_types);
    }

    fn limits(&self) -> Limits {
        Limits {
            memory: self.config.client_memory,
            credit: self.config.client_credit,
            credit_bytes: CLIENT_CREDIT_BYTES,
        }
    }

    /// Reports an instruction's failure to its client and marks its results as not computed.
    fn fail(&mut self, c: u64, seq: u64, instr: &Instr, failure: Failure) {
        if let Some(client) = self.clients.get_mut(&c) {
            for at in client.namespace.fail(&instr.results(), seq) {
                self.workers[at.worker].queue_free(at.buf, (c, seq));
            }
        }
        self.send_reply(c, &Reply::Failed { seq, failure });
    }

    /// Queues an instruction for worker `w`; a full batch leaves at once.
    fn push(&mut self, w: usize, instr: Instr, origin: (u64, u64), types: Vec<TensorType>) {
        self.workers[w].queue(instr, origin, types);
        self.flush_if_full(w);
    }

    /// Queues freeing a buffer; a full batch leaves at once.
    fn push_free(&mut self, at: Location, origin: (u64, u64)) {
        self.workers[at.worker].queue_free(at.buf, origin);
        self.flush_if_full(at.worker);
    }

    fn flush_if_full(&mut self, w: usize) {
        if self.workers[w].pending.instrs.len() >= self.config.worker_batch_size {
            self.flush_worker(w, None);
        }
    }

    fn on_get(&mut self, c: u64, seq: u64, value: ValueId) {
        self.flush_pipeline(c, seq);
        let Some(client) = self.clients.get(&c) else { return };
        let (w, buf, ty) = match client.namespace.lookup(value) {
            Ok((at, ty)) => (at.worker, at.buf, ty.clone()),
            Err(e) => {
                let msg = match e {
                    Unavailable::NotComputed { seq: s, .. } => {
                        format!("get: {value} was not computed because instruction #{s} failed")
                    }
                    Unavailable::Undefined { .. } => format!("get: {e}"),
                };
                let failure = Failure::new(FailureKind::Undefined, msg);
                return self.send_reply(c, &Reply::Failed { seq, failure });
            }
        };
        if !self.workers[w].alive {
            let msg = format!("get: worker `{}`, which held {value}, is gone", self.workers[w].name);
            return self.send_reply(c, &Reply::Failed { seq, failure: Failure::new(FailureKind::WorkerLost, msg) });
        }
        self.flush_worker(w, None);
        let tag = self.next_tag;
        self.next_tag += 1;
        self.gets.insert(tag, PendingGet { client: c, seq, worker: w, ty, value });
        if let Some(size) = self.send_worker(w, &WorkerCommand::Get { tag, value: buf.into() }) {
            self.log_worker(EventKind::WorkerSend, w, "Get", size, || format!("tag={tag} {buf}"));
        }
    }

    fn on_sync(&mut self, c: u64, seq: u64) {
        self.flush_pipeline(c, seq);
        let Some(client) = self.clients.get(&c) else { return };
        match client.namespace.home() {
            None => self.send_reply(c, &Reply::Synced { seq }),
            Some(w) if !self.workers[w].alive => {
                let msg = format!("sync: worker `{}`, which held this client's values, is gone", self.workers[w].name);
                self.send_reply(c, &Reply::Failed { seq, failure: Failure::new(FailureKind::WorkerLost, msg) });
            }
            Some(w) => self.flush_worker(w, Some((c, seq))),
        }
    }

    fn on_stats(&mut self, c: u64, seq: u64) {
        self.flush_pipeline(c, seq);
        // Statistics count everything sent before the request.
        for w in 0..self.workers.len() {
            self.flush_worker(w, None);
        }
        let passes = self.clients.get(&c).map_or_else(Vec::new, |client| {
            client
                .pipeline
                .stats()
                .into_iter()
                .map(|(pass, counters)| PassStats {
                    pass: pass.to_string(),
                    counters: counters.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                })
                .collect()
        });
        let alive: Vec<usize> = (0..self.workers.len()).filter(|&w| self.workers[w].alive).collect();
        if alive.is_empty() {
            return self.send_reply(c, &Reply::Stats { seq, workers: Vec::new(), passes });
        }
        let collector = self.next_tag;
        self.next_tag += 1;
        let pending = PendingStats { client: c, seq, remaining: alive.len(), results: Vec::new(), passes };
        self.stats.insert(collector, pending);
        for w in alive {
            let tag = self.next_tag;
            self.next_tag += 1;
            self.stats_tags.insert(tag, (collector, w));
            self.send_worker(w, &WorkerCommand::Stats { tag });
        }
    }

    fn stats_arrived(&mut self, collector: u64, stats: Option<WorkerStats>) {
        let Some(p) = self.stats.get_mut(&collector) else { return };
        p.remaining -= 1;
        p.results.extend(stats);
        if p.remaining == 0 {
            let p = self.stats.remove(&collector).expect("present");
            self.send_reply(p.client, &Reply::Stats { seq: p.seq, workers: p.results, passes: p.passes });
        }
    }

    /// Frees everything a client holds and forgets it.
    fn remove_client(&mut self, c: u64, why: &str) {
        let Some(client) = self.clients.remove(&c) else { return };
        self.client_ids.remove(&client.identity);
        if let Some(h) = client.namespace.home() {
            self.workers[h].clients = self.workers[h].clients.saturating_sub(1);
            // Its work still queued on the worker is skipped (what is pending here goes out
            // in later batches, which the worker skips too; the frees below still run).
            if self.workers[h].alive {
                self.flush_worker(h, None);
                self.send_worker(h, &WorkerCommand::DropClient { client: c });
            }
        }
        let freed = client.namespace.len();
        for at in client.namespace.into_buffers() {
            if self.workers[at.worker].alive {
                self.push_free(at, (c, 0));
            }
        }
        tracing::info!(target: "gt::dispatcher", "client {c} {why}; freed {freed} values");
        self.log.emit(EventKind::Disconnect, format!("CLIENT {c}"), "Bye", 0, format!("{why}; freed {freed} values"));
    }

    // ---- workers -----------------------------------------------------------------------

    fn on_worker_event(&mut self, identity: Vec<u8>, event: WorkerEvent, bytes: usize) {
        if let WorkerEvent::Register { name, backend, clock } = event {
            if self.worker_ids.contains_key(&identity) || self.client_ids.contains_key(&identity) {
                return self.bad_message(&identity, bytes, "registered twice".into());
            }
            let w = self.workers.len();
            let clock = Clock::registered(clock, self.log.now());
            self.workers.push(Worker::new(identity.clone(), name.clone(), backend.clone(), clock));
            self.worker_ids.insert(identity, w);
            tracing::info!(target: "gt::dispatcher", "worker {w} registered: {name} ({backend})");
            self.log.emit(
                EventKind::Connect,
                format!("WORKER {name}"),
                "Register",
                bytes,
                format!("worker={w} backend={backend}"),
            );
            // The welcome is also the first ping (the worker answers it with a `Pong`), so its
            // clock is known to a round trip's precision from the start.
            if self.send_worker(w, &WorkerCommand::Welcome { worker: w as u32 }).is_some() {
                let sent = self.log.now();
                self.workers[w].clock.pinged(sent);
            }
            return;
        }
        let Some(&w) = self.worker_ids.get(&identity) else {
            return self.bad_message(&identity, bytes, "a worker must register before anything else".into());
        };
        match event {
            WorkerEvent::Register { .. } => unreachable!("handled above"),
            WorkerEvent::Done { batch, failures, nanos, timings, live_bytes } => {
                self.on_done(&identity, w, bytes, (batch, nanos), failures, (timings, live_bytes))
            }
            WorkerEvent::Pong { clock } => {
                let now = self.log.now();
                self.workers[w].clock.ponged(clock, now);
            }
            // (A `Data` with its frame goes to `on_worker_data`.)
            WorkerEvent::Data { .. } => {
                self.bad_message(&identity, bytes, "a Data message without its data frame".into())
            }
            WorkerEvent::Failed { tag, failure } => {
                self.log_worker(EventKind::WorkerRecv, w, "Failed", bytes, || format!("tag={tag} {failure}"));
                if let Some(g) = self.take_get(tag, w) {
                    self.send_reply(g.client, &Reply::Failed { seq: g.seq, failure });
                }
            }
            WorkerEvent::Stats { tag, stats } => {
                if let Some((collector, _)) = self.stats_tags.remove(&tag) {
                    self.stats_arrived(collector, Some(stats));
                }
            }
        }
    }

    /// A worker ran batch `batch`: credit goes back, failures go to their clients, a sync
    /// waiting on the batch is answered.
    fn on_done(
        &mut self,
        identity: &[u8],
        w: usize,
        bytes: usize,
        (batch, nanos): (u64, u64),
        failures: Vec<(u32, Failure)>,
        (timings, live_bytes): (Vec<Timing>, u64),
    ) {
        let worker = &mut self.workers[w];
        let Some(pos) = worker.inflight.iter().position(|b| b.number == batch) else {
            return self.bad_message(identity, bytes, format!("Done for unknown batch {batch}"));
        };
        let mut record = worker.inflight.remove(pos).expect("position is valid");
        self.charge(&record.charges, false);
        // Saturating: a broken worker may report more failures than the batch had.
        let ok = record.origins.len().saturating_sub(failures.len());
        self.log_worker(EventKind::WorkerRecv, w, "Done", bytes, || {
            format!("batch={batch} ok={ok} failed={} time={:.3}ms", failures.len(), nanos as f64 / 1e6)
        });
        if let Some(notes) = record.notes.take() {
            self.log_executed(w, &record, &notes, &timings);
            let source = format!("WORKER {}", self.workers[w].name);
            self.log.emit(EventKind::Status, source, "memory", 0, format!("live={live_bytes}"));
        }
        for (i, failure) in failures {
            let Some(&(c, seq)) = record.origins.get(i as usize) else { continue };
            if seq == DISPATCHER_SEQ {
                tracing::warn!(target: "gt::dispatcher", "worker `{}`: {failure}", self.workers[w].name);
                continue;
            }
            if let Some(client) = self.clients.get_mut(&c) {
                // Its results were never made: reads say why, a free is quiet. A
                // redefinition's buffer still holds the value it was to replace.
                for at in client.namespace.computation_failed(seq) {
                    self.workers[at.worker].queue_free(at.buf, (c, DISPATCHER_SEQ));
                }
                self.send_reply(c, &Reply::Failed { seq, failure });
            }
        }
        if let Some((c, seq)) = record.sync {
            self.send_reply(c, &Reply::Synced { seq });
        }
    }

    /// One EXEC event per instruction of a timed batch that ran, on the dispatcher's clock.
    /// What the worker says is not trusted: indices outside the batch are skipped.
    fn log_executed(&mut self, w: usize, record: &Batch, notes: &[ExecNote], timings: &[Timing]) {
        let source = format!("WORKER {}", self.workers[w].name);
        let span = |t: &Timing| (t.start, t.start.saturating_add(t.nanos));
        if let (Some(first), Some(last)) =
            (timings.iter().map(span).min(), timings.iter().map(span).max_by_key(|s| s.1))
        {
            let done = self.log.now();
            self.workers[w].clock.bound((record.sent, done), (first.0, last.1));
        }
        let clock = self.workers[w].clock;
        for t in timings {
            let i = t.index as usize;
            let (Some(&(c, seq)), Some(ExecNote { op, types, text })) = (record.origins.get(i), notes.get(i)) else {
                continue;
            };
            let origin = if seq == DISPATCHER_SEQ { "dispatcher".to_string() } else { format!("client={c} #{seq}") };
            let span = (clock.to_dispatcher(t.start), Some(t.nanos));
            // The result types without spaces, so that `result=` reads as one detail.
            let result = types.iter().map(|t| t.to_string().replace(' ', "")).collect::<Vec<_>>().join(",");
            let result = if result.is_empty() { String::new() } else { format!(" result={result}") };
            let bytes = types.iter().fold(0u64, |n, t| n.saturating_add(t.size_bytes() as u64));
            self.log.emit_at(EventKind::Exec, source.clone(), op, bytes, span, format!("{origin}{result} {text}"));
        }
    }

    /// A worker answered a read: its type and data length are checked against what was asked
    /// before the client gets the data frame, untouched.
    fn on_worker_data(&mut self, identity: Vec<u8>, (tag, ty): (u64, TensorType), data: zmq::Message, bytes: usize) {
        let Some(&w) = self.worker_ids.get(&identity) else {
            return self.bad_message(&identity, bytes, "a worker must register before anything else".into());
        };
        self.log_worker(EventKind::WorkerRecv, w, "Data", bytes, || format!("tag={tag} {ty}"));
        let Some(g) = self.take_get(tag, w) else { return };
        // The read went out before the worker reported that the instruction defining
        // the value failed: its buffer holds an older value (or none), not this one.
        let failed = self.clients.get(&g.client).and_then(|k| k.namespace.failed_by(g.value));
        if let Some(s) = failed {
            let why = format!("get: {} was not computed because instruction #{s} failed", g.value);
            let failure = Failure::new(FailureKind::Undefined, why);
            return self.send_reply(g.client, &Reply::Failed { seq: g.seq, failure });
        }
        // A worker answering with another type or length than the value has is
        // broken or lying: the client is told, and the worker is not trusted again.
        if ty != g.ty || data.len() != g.ty.size_bytes() {
            let why = format!(
                "get: worker `{}` answered {ty} with {} bytes of data for a {} value; its answer was dropped and the worker disconnected",
                self.workers[w].name,
                data.len(),
                g.ty
            );
            self.log_worker(EventKind::Error, w, "Data", bytes, || why.clone());
            self.send_reply(
                g.client,
                &Reply::Failed { seq: g.seq, failure: Failure::new(FailureKind::WorkerLost, why) },
            );
            self.worker_lost(w);
            return;
        }
        self.send_data_reply(g.client, g.seq, ty, data);
    }

    /// Answers a read: the type, then the worker's data frame as it came (no copy).
    fn send_data_reply(&mut self, c: u64, seq: u64, ty: TensorType, data: zmq::Message) {
        let Some(client) = self.clients.get(&c) else { return };
        let identity = client.identity.clone();
        if data.len() > self.config.max_message_bytes {
            let why = format!(
                "get: the answer cannot be sent: {ty} is {} bytes, over the limit of {} bytes (GT_MAX_MESSAGE_BYTES)",
                data.len(),
                self.config.max_message_bytes
            );
            return self.send_reply(c, &Reply::Failed { seq, failure: Failure::new(FailureKind::Limit, why) });
        }
        let head = codec::encode(&Reply::Data { seq, ty: ty.clone() }, usize::MAX).expect("small");
        if self.log.active() {
            self.log.emit(
                EventKind::Send,
                format!("CLIENT {c}"),
                "Data",
                head.len() + data.len(),
                format!("#{seq} {ty}"),
            );
        }
        let sent = socket::send_with_data(&self.router, &[&identity, &head], data);
        if sent.is_err() {
            self.lost_clients.push((c, "is gone (its process ended or the connection broke)"));
        }
    }

    /// The read `tag`, taken only when worker `w` was asked it (another cannot answer it).
    fn take_get(&mut self, tag: u64, w: usize) -> Option<PendingGet> {
        match self.gets.get(&tag) {
            Some(g) if g.worker == w => self.gets.remove(&tag),
            _ => None,
        }
    }

    /// Takes (or, when a batch is done or lost, gives back) clients' credit.
    fn charge(&mut self, charges: &HashMap<u64, Charge>, take: bool) {
        for (c, charge) in charges {
            if let Some(client) = self.clients.get_mut(c) {
                if take {
                    client.namespace.take_credit(*charge);
                } else {
                    client.namespace.return_credit(*charge);
                }
            }
        }
    }

    /// Sends a worker its queued instructions (and, for a sync, an empty batch whose `Done`
    /// answers it).
    fn flush_worker(&mut self, w: usize, sync: Option<(u64, u64)>) {
        let worker = &mut self.workers[w];
        if worker.pending.instrs.is_empty() && sync.is_none() {
            return;
        }
        let (number, Queued { instrs, origins, types }) = worker.take_batch();
        if !worker.alive {
            return;
        }
        let timed = self.log.active();
        let details = timed.then(|| batch_details(number, &instrs));
        let notes = timed.then(|| {
            let notes = instrs.iter().zip(types);
            notes.map(|(i, types)| ExecNote { op: i.mnemonic(), types, text: print_instr(i) }).collect()
        });
        let charges = workers::charges(&instrs, &origins);
        let owners = origins.iter().map(|(c, _)| *c).collect();
        let cmd = WorkerCommand::Exec { batch: number, instrs, owners, timed };
        let bytes = match codec::encode(&cmd, self.config.max_message_bytes) {
            Ok(b) => b,
            Err(e) => {
                // Only literal data can make a batch this large: fail each client's part.
                let msg = Failure::new(FailureKind::Limit, format!("cannot send to worker: {e}"));
                let mut told = Vec::new();
                for (c, seq) in origins.into_iter().chain(sync) {
                    if !told.contains(&c) {
                        told.push(c);
                        self.send_reply(c, &Reply::Failed { seq, failure: msg.clone() });
                    }
                }
                return;
            }
        };
        let size = bytes.len();
        self.charge(&charges, true);
        // Stamped before sending: the worker may start on it before the send returns.
        let sent = self.log.now();
        self.workers[w].inflight.push_back(Batch { number, origins, charges, sync, notes, sent });
        if self.send_worker_bytes(w, bytes) {
            if let Some(details) = details {
                let source = format!("WORKER {}", self.workers[w].name);
                self.log.emit_at(EventKind::WorkerSend, source, "Exec", size as u64, (sent, None), details);
            }
        }
    }

    /// Sends a small command; returns its size if the worker took it.
    fn send_worker(&mut self, w: usize, cmd: &WorkerCommand) -> Option<usize> {
        let bytes = codec::encode(cmd, self.config.max_message_bytes).expect("commands other than Exec are small");
        let size = bytes.len();
        self.send_worker_bytes(w, bytes).then_some(size)
    }

    /// Returns whether the worker took it; a worker that cannot be routed to is gone.
    fn send_worker_bytes(&mut self, w: usize, bytes: Vec<u8>) -> bool {
        let identity = &self.workers[w].identity;
        match socket::retry(|| self.router.send_multipart([identity.as_slice(), &bytes], zmq::DONTWAIT)) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(target: "gt::dispatcher", "worker `{}` cannot be reached: {e}", self.workers[w].name);
                if !self.lost_workers.contains(&w) {
                    self.lost_workers.push(w);
                }
                false
            }
        }
    }

    /// A worker is gone: everyone waiting on it gets an error now.
    fn worker_lost(&mut self, w: usize) {
        if !self.workers[w].alive {
            return;
        }
        self.workers[w].alive = false;
        let name = self.workers[w].name.clone();
        let message =
            format!("worker `{name}` is gone (its process ended or the connection broke); the values it held are lost");
        tracing::error!(target: "gt::dispatcher", "{message}");
        self.log.emit(EventKind::Disconnect, format!("WORKER {name}"), "Lost", 0, message.clone());
        let failure = Failure::new(FailureKind::WorkerLost, message);
        let worker = &mut self.workers[w];
        let mut owed: Vec<(u64, u64)> = Vec::new();
        let mut syncs: Vec<(u64, u64)> = Vec::new();
        let batches: Vec<Batch> = worker.inflight.drain(..).collect();
        let pending = std::mem::take(&mut worker.pending).origins;
        for b in &batches {
            self.charge(&b.charges, false);
        }
        for b in batches {
            owed.extend(b.origins);
            syncs.extend(b.sync);
        }
        owed.extend(pending);
        // One error per client (at its earliest affected instruction) is enough.
        let mut first: HashMap<u64, u64> = HashMap::new();
        for (c, seq) in owed {
            let e = first.entry(c).or_insert(seq);
            *e = (*e).min(seq);
        }
        let tags: Vec<u64> = self.gets.iter().filter(|(_, g)| g.worker == w).map(|(t, _)| *t).collect();
        for t in tags {
            let g = self.gets.remove(&t).expect("listed");
            first.remove(&g.client);
            self.send_reply(g.client, &Reply::Failed { seq: g.seq, failure: failure.clone() });
        }
        for (c, seq) in first {
            if self.clients.contains_key(&c) {
                self.send_reply(c, &Reply::Failed { seq, failure: failure.clone() });
            }
        }
        // Each waiting sync is answered itself (after the failures it reports).
        for (c, seq) in syncs {
            self.send_reply(c, &Reply::Failed { seq, failure: failure.clone() });
        }
        let waiting: Vec<u64> = self.stats_tags.iter().filter(|(_, (_, sw))| *sw == w).map(|(t, _)| *t).collect();
        for t in waiting {
            let (collector, _) = self.stats_tags.remove(&t).expect("listed");
            self.stats_arrived(collector, None);
        }
    }

    // ---- replies, probes ---------------------------------------------------------------

    fn send_reply(&mut self, c: u64, reply: &Reply) {
        let Some(client) = self.clients.get(&c) else { return };
        let identity = client.identity.clone();
        let bytes = match codec::encode(reply, self.config.max_message_bytes) {
            Ok(b) => b,
            Err(e) => {
                let seq = match reply {
                    Reply::Stats { seq, .. } => *seq,
                    _ => 0,
                };
                let why = format!("get: the answer cannot be sent: {e}");
                let failed = Reply::Failed { seq, failure: Failure::new(FailureKind::Limit, why) };
                codec::encode(&failed, usize::MAX).expect("small")
            }
        };
        if self.log.active() && !matches!(reply, Reply::Ping) {
            let (command, details) = reply_summary(reply);
            self.log.emit(EventKind::Send, format!("CLIENT {c}"), command, bytes.len(), details);
        }
        if socket::retry(|| self.router.send_multipart([identity.as_slice(), &bytes], zmq::DONTWAIT)).is_err() {
            self.lost_clients.push((c, "is gone (its process ended or the connection broke)"));
        }
    }

    fn send_reply_to(&mut self, identity: &[u8], reply: &Reply) {
        if let Ok(bytes) = codec::encode(reply, self.config.max_message_bytes) {
            let _ = socket::retry(|| self.router.send_multipart([identity, &bytes], zmq::DONTWAIT));
        }
    }

    fn housekeeping(&mut self) {
        let now = Instant::now();
        self.log.poll_subscriptions();
        if !self.hellos.is_empty() {
            let enough = self.enough_workers();
            let any = self.workers.iter().any(|w| w.alive);
            for h in std::mem::take(&mut self.hellos) {
                if enough || (any && now >= h.deadline) {
                    self.welcome(h.identity, h.name, 0);
                } else if now >= h.deadline {
                    let message = format!(
                        "no worker registered with the dispatcher within {} ms (start one with `gt worker`)",
                        h.wait_ms
                    );
                    self.send_reply_to(&h.identity, &Reply::Rejected { message });
                } else {
                    self.hellos.push(h);
                }
            }
        }
        if now.duration_since(self.last_probe) >= self.config.probe_interval {
            self.last_probe = now;
            for w in 0..self.workers.len() {
                if self.workers[w].alive && self.send_worker(w, &WorkerCommand::Ping).is_some() {
                    let sent = self.log.now();
                    self.workers[w].clock.pinged(sent);
                }
            }
            self.log_queues();
        }
        if now.duration_since(self.last_client_probe) >= self.config.probe_interval * 10 {
            self.last_client_probe = now;
            let ids: Vec<u64> = self.clients.keys().copied().collect();
            let ping = codec::encode(&Reply::Ping, usize::MAX).expect("small");
            for c in ids {
                let identity = self.clients[&c].identity.clone();
                if socket::retry(|| self.router.send_multipart([identity.as_slice(), &ping], zmq::DONTWAIT)).is_err() {
                    self.lost_clients.push((c, "is gone (its process ended or the connection broke)"));
                }
            }
        }
    }

    /// STATUS events for each client's queue: what it sent to its worker that has not run.
    fn log_queues(&mut self) {
        if !self.log.active() {
            return;
        }
        let mut queues: Vec<(u64, Charge)> = self.clients.iter().map(|(c, k)| (*c, k.namespace.inflight())).collect();
        queues.sort_by_key(|(c, _)| *c);
        for (c, q) in queues {
            let details = format!("instrs={} bytes={}", q.instrs, q.bytes);
            self.log.emit(EventKind::Status, format!("CLIENT {c}"), "queue", 0, details);
        }
    }

    /// Handles the peers found gone while sending.
    fn reap(&mut self) {
        while let Some(w) = self.lost_workers.pop() {
            self.worker_lost(w);
        }
        while let Some((c, why)) = self.lost_clients.pop() {
            self.remove_client(c, why);
        }
    }
}

/// The worker a client's instruction `op` goes to: its home, chosen (the least loaded) at
/// its first instruction.
fn place(workers: &mut [Worker], ns: &mut Namespace, op: &str) -> Result<usize, Failure> {
    match ns.home() {
        Some(w) if workers[w].alive => Ok(w),
        Some(w) => {
            let msg = format!(
                "{op}: worker `{}`, which held this client's values, is gone; reconnect to start over",
                workers[w].name
            );
            Err(Failure::new(FailureKind::WorkerLost, msg))
        }
        None => {
            let Some(w) = workers::least_loaded(workers) else {
                let why = format!("{op}: no worker is connected to the dispatcher");
                return Err(Failure::new(FailureKind::WorkerLost, why));
            };
            ns.set_home(w);
            workers[w].clients += 1;
            Ok(w)
        }
    }
}

/// The message of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic".to_string(),
    }
}

fn batch_details(number: u64, instrs: &[Instr]) -> String {
    const SHOWN: usize = 5;
    let names: Vec<&str> = instrs.iter().take(SHOWN).map(|i| i.mnemonic()).collect();
    let more = instrs.len().saturating_sub(SHOWN);
    if instrs.is_empty() {
        return format!("batch={number} [sync]");
    }
    let tail = if more > 0 { format!(", ... (+{more} more)") } else { String::new() };
    format!("batch={number} [{} ops: {}{tail}]", instrs.len(), names.join(", "))
}

fn reply_summary(reply: &Reply) -> (&'static str, String) {
    match reply {
        Reply::Welcome { client, workers, .. } => ("Welcome", format!("client={client} workers={}", workers.len())),
        Reply::Failed { seq, failure } => ("Failed", format!("#{seq} {failure}")),
        Reply::Data { seq, ty } => ("Data", format!("#{seq} {ty}")),
        Reply::Synced { seq } => ("Synced", format!("#{seq}")),
        Reply::Stats { seq, workers, .. } => ("Stats", format!("#{seq} workers={}", workers.len())),
        Reply::Rejected { message } => ("Rejected", message.clone()),
        Reply::Ping => ("Ping", String::new()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
