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
//!   waits for is sent after the failures of that client's earlier instructions on every
//!   worker it has sent work to (a sync waits for all of them; a read holds its data until
//!   they are done).
//! - A client's values live on its *home* (the least loaded worker at its first instruction)
//!   unless a pass places them (`Meta::place`); an instruction runs on the worker its results
//!   go to, where all its operands must be; so any program gives the same numbers on 1
//!   worker or N.
//! - Collectives across workers: the parts of each are appended to every participant's queue
//!   and sent at once, by this one thread, so every worker meets them in one global order and
//!   none waits for a part still held here.
//! - A peer that sends garbage is answered `Rejected` (or dropped, with a log line); a peer
//!   that is gone is noticed by routing (`ROUTER_MANDATORY`) within one probe interval, and
//!   everyone waiting on it gets an error.

pub mod dump;
pub mod log;
mod namespace;
pub mod profile;
mod workers;

use foldhash::{HashMap, HashMapExt};
use gt_ir::data::Elements;
use gt_ir::text::print::print_instr;
use gt_ir::verify::shape;
use gt_ir::{CollectiveOp, Instr, TensorType, TypeError, ValueId};
use gt_passes::pipeline::FIRST_PASS_ID;
use gt_passes::{Pipeline, Typing};
use gt_transport::lane::{self, LaneKey};
use gt_transport::message::{
    DoorbellKey, Exchange, Failure, FailureKind, PassStats, Reply, Request, SyncBell, Timing, WorkerCommand,
    WorkerEvent, WorkerInfo, WorkerStats,
};
use gt_transport::{codec, shared, socket, zmq, ClusterKey, CodecError, EventKind, Inbound};
use log::EventLog;
use namespace::{Charge, Limits, Location, Namespace, Refusal, Unavailable};
use profile::{Facts, Profiler};
use std::collections::VecDeque;
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
    /// Bytes of read answers one client may leave unread (`GT_CLIENT_UNREAD_BYTES`): they sit
    /// in the dispatcher's socket buffers until the client takes them.
    pub client_unread_bytes: u64,
    /// How long the dispatcher polls for the next message before it sleeps (`GT_SPIN_US`,
    /// [`socket::poll_spinning`]).
    pub spin: Duration,
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
            client_unread_bytes: CLIENT_UNREAD_BYTES,
            spin: socket::DEFAULT_SPIN,
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
/// Bytes of answers one client may leave unread, by default (`GT_CLIENT_UNREAD_BYTES`).
pub const CLIENT_UNREAD_BYTES: u64 = 512 << 20;

struct ClientState {
    identity: Vec<u8>,
    /// Its values (the only ones it can name), their bytes, its credit used, its home.
    namespace: Namespace,
    /// Its pass pipeline, which also types its stream and tracks its signal scopes.
    pipeline: Pipeline,
    /// Its reads taken and not yet acknowledged read, oldest first (answered or not).
    unread: VecDeque<Unread>,
    /// Their bytes.
    unread_bytes: u64,
    /// Its doorbell, when it runs in this process: a worker there may answer its syncs.
    doorbell: Option<DoorbellKey>,
    /// A `Failed` or `Rejected` went to it since the last answer it waited for, so it may
    /// not have read it yet: its next sync is answered from here, after it (never by a bell).
    unread_failures: bool,
    /// It runs on this host and takes large answers from a file in shared memory
    /// ([`gt_transport::shared`]): `Some` once asked, holding the file once made (`None`
    /// inside when it cannot be: answers then go by the socket).
    shared_reads: Option<Option<shared::AnswerFile>>,
}

/// What an answer of `data` bytes counts against `GT_CLIENT_UNREAD_BYTES`: at least 1 KiB,
/// for the message around it and its entry here, so that answers of empty values are
/// bounded in number too.
fn answer_bytes(data: usize) -> u64 {
    (data as u64).max(1024)
}

/// A read of a client's whose answer it has not yet acknowledged: its seq, the receipt its
/// data answer carries, and the bytes of the value.
struct Unread {
    seq: u64,
    receipt: u64,
    bytes: u64,
    /// Its answer went through the client's shared file, which is not written again until
    /// this is acknowledged.
    shared: bool,
}

struct PendingGet {
    client: u64,
    seq: u64,
    worker: usize,
    /// When it was asked of the worker (the log's clock), for profiles.
    sent: u64,
    /// The value's type: the answer must have it, with as many elements.
    ty: TensorType,
    /// The value, in the client's ids.
    value: ValueId,
    /// The wait for the client's other workers to run what it sent them before the read
    /// (their failures come first); `None` once done, or when there was nothing to wait for.
    barrier: Option<u64>,
    /// The answer, held until the barrier is done.
    held: Option<Held>,
    /// The client's doorbell, when its worker was given it for this read
    /// (`WorkerCommand::Get`'s): it may answer [`WorkerEvent::Rung`].
    bell: Option<SyncBell>,
    /// The client's shared answer file, when the worker was told to write the answer there
    /// (`WorkerCommand::Get`'s `file`): it may answer `Data` with `file` set.
    file: Option<String>,
}

/// A read's answer waiting for its barrier.
enum Held {
    /// Its type and data frame (`None`: the worker wrote the data into the read's file).
    Data(TensorType, Option<zmq::Message>),
    Failed(Failure),
}

/// Batches on several workers that a reply waits for.
struct Wait {
    client: u64,
    seq: u64,
    /// Batches not yet done.
    left: usize,
    what: WaitFor,
    /// The client's doorbell, when the worker was given it for this sync.
    bell: Option<SyncBell>,
}

enum WaitFor {
    /// Answer `Synced`.
    Sync,
    /// Release the read with this tag.
    Get(u64),
}

/// A collective across workers in flight: its parts' outcome, reported once.
struct ExchangeState {
    client: u64,
    seq: u64,
    op: &'static str,
    /// The worker of each rank.
    ranks: Vec<usize>,
    /// Parts not yet done (or lost).
    left: usize,
    /// The failure to report when every part is done: a part's own failure is preferred to
    /// a peer's giving up, which only echoes it.
    failure: Option<Failure>,
    /// The client was told already (its worker was lost).
    reported: bool,
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
    doorbell: Option<DoorbellKey>,
    lane: Option<LaneKey>,
    shared_reads: bool,
    deadline: Instant,
    wait_ms: u64,
}

/// The lanes of peers in the dispatcher's process ([`gt_transport::lane`]).
struct Lanes {
    /// Where every peer with a lane sends, as a ROUTER receives (its routing id first).
    inbox: lane::Inbox,
    /// The way into it, given to each peer that offers a lane.
    to_me: lane::Outbox,
    /// Each such peer's inbox, by its routing id: everything to it goes there.
    peers: HashMap<Vec<u8>, lane::Outbox>,
    /// Which of inbox and socket a drain looks at first (in turn, so neither starves).
    socket_first: bool,
    /// The last peers whose lane closed: a wake they sent just before is still one.
    closed: VecDeque<Vec<u8>>,
}

impl Lanes {
    /// Takes the lane `key` that the peer `identity` offers, if this process holds it: done
    /// before the peer's welcome leaves by the socket, and [`Lanes::open`] after it.
    fn accept(&self, key: Option<LaneKey>, identity: &[u8]) -> Option<lane::Outbox> {
        key.and_then(|key| lane::accept(key, &self.to_me, identity))
    }

    /// From now on everything to `identity` goes by `out`.
    fn open(&mut self, identity: &[u8], out: Option<lane::Outbox>) {
        if let Some(out) = out {
            self.peers.insert(identity.to_vec(), out);
        }
    }

    /// The peer `identity` is gone: nothing goes to it by a lane any more.
    fn close(&mut self, identity: &[u8]) {
        if self.peers.remove(identity).is_some() {
            if self.closed.len() == 64 {
                self.closed.pop_front();
            }
            self.closed.push_back(identity.to_vec());
        }
    }

    /// Whether a message is a lane peer's wake (empty), not one to answer.
    fn is_wake(&self, identity: &[u8], payload: &[u8]) -> bool {
        payload.is_empty() && (self.peers.contains_key(identity) || self.closed.iter().any(|c| c == identity))
    }
}

/// Sends `parcel` to the peer `identity` by its lane `out`; an empty message on `router` wakes
/// it if it sleeps. A peer gone is `EHOSTUNREACH`, as the ROUTER says of one it cannot reach.
fn send_by_lane(router: &zmq::Socket, out: &lane::Outbox, identity: &[u8], parcel: lane::Parcel) -> zmq::Result<()> {
    let wake = || socket::retry(|| router.send_multipart([identity, &[][..]], zmq::DONTWAIT));
    out.send(parcel, wake).map_err(|lane::Gone| zmq::Error::EHOSTUNREACH)
}

/// A command on its way to a worker: as it is (by the worker's lane, or encoded on the way
/// to one without), or encoded with its large literals' data to send as frames after it.
enum ToWorker {
    Command(WorkerCommand),
    Encoded(Vec<u8>, Vec<Elements>),
}

impl ToWorker {
    /// Its size for the log: the bytes it takes, or would take encoded.
    fn size(&self) -> usize {
        match self {
            ToWorker::Command(cmd) => codec::encoded_len(cmd),
            ToWorker::Encoded(bytes, literals) => {
                bytes.len() + literals.iter().map(Elements::size_bytes).sum::<usize>()
            }
        }
    }
}

/// A running dispatcher's state; [`Dispatcher::run`] is its loop.
pub struct Dispatcher {
    router: zmq::Socket,
    lanes: Lanes,
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
    /// What a client's pipeline emitted for the request being handled (kept between
    /// requests: its buffer is used again).
    emitted: Vec<gt_passes::Emitted>,
    /// Workers holding parts of collectives not yet sent: sent once the instructions emitted
    /// with them are routed ([`Dispatcher::route_emitted`]), so that the frees right after a
    /// part usually travel in its batch (its operand is then taken, not copied), and still
    /// before the dispatcher waits for anything.
    held_parts: Vec<usize>,
    hellos: Vec<PendingHello>,
    lost_clients: Vec<(u64, &'static str)>,
    lost_workers: Vec<usize>,
    last_probe: Instant,
    last_client_probe: Instant,
    waits: HashMap<u64, Wait>,
    exchanges: HashMap<u64, ExchangeState>,
    next_collective: u64,
    /// For telling workers that a peer is gone: the context their peer sockets are on.
    ctx: Option<zmq::Context>,
    /// One DEALER per peer address, for those abort messages.
    abort_dealers: HashMap<String, zmq::Socket>,
    /// The cluster key, for reaching peer sockets over TCP.
    key: Option<ClusterKey>,
    /// The profile being written (`GT_PROFILE`).
    profile: Option<Profiler>,
    /// The key of data answers' receipts (a keyed hash of a counter: unguessable).
    receipts: std::collections::hash_map::RandomState,
    next_receipt: u64,
}

/// What goes wrong when a dispatcher cannot run at all (bad sockets); everything a peer does
/// is handled inside the loop.
pub type DispatcherError = zmq::Error;

impl Dispatcher {
    /// A dispatcher on a bound `router`, stopped by any message from a peer whose routing id
    /// starts with `stop_key` (a secret only the owner knows; one socket and the lanes' one
    /// inbox are all the dispatcher polls, which keeps a round trip's system calls down).
    pub fn new(router: zmq::Socket, stop_key: Vec<u8>, log: EventLog, config: DispatcherConfig) -> Dispatcher {
        let (to_me, inbox) = lane::inbox();
        Dispatcher {
            router,
            lanes: Lanes { inbox, to_me, peers: HashMap::new(), socket_first: false, closed: VecDeque::new() },
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
            emitted: Vec::new(),
            held_parts: Vec::new(),
            receipts: std::collections::hash_map::RandomState::new(),
            next_receipt: 0,
            hellos: Vec::new(),
            lost_clients: Vec::new(),
            lost_workers: Vec::new(),
            last_probe: Instant::now(),
            last_client_probe: Instant::now(),
            waits: HashMap::new(),
            exchanges: HashMap::new(),
            next_collective: 1,
            ctx: None,
            abort_dealers: HashMap::new(),
            key: None,
            profile: None,
        }
    }

    /// Writes a profile (`GT_PROFILE`): batches go out timed, and every executed instruction,
    /// copy and transfer is recorded with its source line, signal scope, types and cost.
    pub fn with_profile(mut self, profile: Profiler) -> Dispatcher {
        self.profile = Some(profile);
        self
    }

    /// Whether workers are asked when each instruction ran (someone reads the log, or a
    /// profile is written); otherwise nothing is kept for it.
    fn timing(&self) -> bool {
        self.log.active() || self.profile.is_some()
    }

    /// What is kept of client `c`'s instructions as they are placed, for their EXEC events
    /// and profile rows.
    fn keeps(&self, c: u64) -> Keep {
        match &self.profile {
            Some(p) => Keep::Profile { hotpath: p.hotpath(c) },
            None if self.log.active() => Keep::Types,
            None => Keep::Nothing,
        }
    }

    /// The ZeroMQ context the workers' peer sockets can be reached from (needed for
    /// `inproc://` peers), so that a lost worker's peers in a collective are told at once
    /// instead of waiting out `GT_COLLECTIVE_TIMEOUT`.
    pub fn with_context(mut self, ctx: zmq::Context) -> Dispatcher {
        self.ctx = Some(ctx);
        self
    }

    /// The cluster key, which the workers' peer sockets demand over TCP (for those abort
    /// messages).
    pub fn with_key(mut self, key: Option<ClusterKey>) -> Dispatcher {
        self.key = key;
        self
    }

    /// Serves until a stop request arrives (see [`Dispatcher::new`]); then tells every worker to shut
    /// down and returns.
    pub fn run(mut self) -> Result<(), DispatcherError> {
        loop {
            let timeout = self.config.probe_interval.as_millis() as i64;
            self.log.flush();
            if let Some(p) = &mut self.profile {
                p.flush();
            }
            // Whether every waiting message was read (not cut off at the cap).
            let mut drained = true;
            if let Some(parcel) = self.recv_waiting(self.config.spin, timeout)? {
                self.on_parcel(parcel);
                self.reap();
                drained = false;
                for _ in 1..4096 {
                    if self.stopping {
                        break;
                    }
                    match self.try_recv()? {
                        Some(parcel) => self.on_parcel(parcel),
                        None => {
                            drained = true;
                            break;
                        }
                    }
                    self.reap();
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
                self.send_worker(w, WorkerCommand::Shutdown);
                self.log_worker(EventKind::Disconnect, w, "Shutdown", 0, || "the dispatcher stops".into());
            }
        }
        self.log.flush();
        if let Some(p) = self.profile.take() {
            p.finish();
        }
        Ok(())
    }

    /// At shutdown: sends what is queued and waits (at most `limit`) for the workers to
    /// answer every batch, so the log pairs each WORKER_SEND with its WORKER_RECV.
    fn drain_workers(&mut self, limit: Duration) -> Result<(), DispatcherError> {
        let deadline = Instant::now() + limit;
        // What arrived before the stop (a client's goodbye, say) is still handled.
        while let Ok(Some(parcel)) = self.try_recv() {
            self.on_parcel(parcel);
            self.reap();
        }
        for w in 0..self.workers.len() {
            self.flush_worker(w, None);
        }
        while self.workers.iter().any(|w| w.alive && !w.inflight.is_empty()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let Some(parcel) = self.recv_waiting(Duration::ZERO, left.as_millis().max(1) as i64)? else { break };
            self.on_parcel(parcel);
            self.reap();
            while let Ok(Some(parcel)) = self.try_recv() {
                self.on_parcel(parcel);
                self.reap();
            }
        }
        Ok(())
    }

    // ---- frames ------------------------------------------------------------------------

    /// The next message from any peer, by a lane or the socket, spinning for `spin` first;
    /// `None` after `timeout_ms`.
    fn recv_waiting(&self, spin: Duration, timeout_ms: i64) -> Result<Option<lane::Parcel>, DispatcherError> {
        // With peers on lanes, the socket (a system call per look) is looked at every few
        // turns of the spin; without, every turn, as before lanes.
        let every = if self.lanes.peers.is_empty() { 1 } else { 4 };
        let wait = socket::LaneWait { inbox: &self.lanes.inbox, sock: &self.router, messages: Some(every) };
        Ok(match socket::recv_lane_waiting(&wait, None, spin, timeout_ms)? {
            socket::Waited::Parcel(parcel) => Some(parcel),
            socket::Waited::Frames(frames) => Some(lane::Parcel::Frames(frames)),
            // (The dispatcher holds a way into its own inbox: never gone.)
            socket::Waited::TimedOut | socket::Waited::Rung | socket::Waited::Gone => None,
        })
    }

    /// A message already here, by a lane or the socket (the two in turn).
    fn try_recv(&mut self) -> Result<Option<lane::Parcel>, DispatcherError> {
        let socket_first = self.lanes.socket_first;
        self.lanes.socket_first = !socket_first;
        let from_socket = |router: &zmq::Socket| match socket::recv_frames(router, zmq::DONTWAIT) {
            Ok(frames) => Ok(Some(lane::Parcel::Frames(frames))),
            Err(zmq::Error::EAGAIN) => Ok(None),
            Err(e) => Err(e),
        };
        if socket_first {
            if let Some(frames) = from_socket(&self.router)? {
                return Ok(Some(frames));
            }
        }
        if let Ok(Some(parcel)) = self.lanes.inbox.try_recv() {
            return Ok(Some(parcel));
        }
        if socket_first {
            Ok(None)
        } else {
            from_socket(&self.router)
        }
    }

    /// One message, by a lane (as it was sent, or its frames) or the socket.
    fn on_parcel(&mut self, parcel: lane::Parcel) {
        match parcel {
            lane::Parcel::Frames(frames) => self.on_frames(frames),
            lane::Parcel::Inbound(identity, message) => {
                // Never encoded: the log reports the bytes it would have taken.
                let len = if self.log.active() || self.profile.is_some() { codec::encoded_len(&message) } else { 0 };
                self.on_message(identity, Ok(message), Vec::new(), len);
            }
            lane::Parcel::Command(command) => {
                tracing::warn!(target: "gt::dispatcher", "dropped a worker's command sent to the dispatcher: {command:?}");
            }
        }
    }

    /// One message's frames: the peer's routing id, the message, and for a worker's `Data`
    /// its data frame (passed on to the client as it is), for a client's batch its large
    /// literals'.
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
        // A peer with a lane woke the dispatcher (its message is in the inbox).
        if self.lanes.is_wake(&identity, &payload) {
            return;
        }
        // Data frames: a read's, or a batch's large literals.
        let mut data: Vec<zmq::Message> = frames.collect();
        let len = payload.len() + data.iter().map(|d| d.len()).sum::<usize>();
        let mut message = codec::decode::<Inbound>(&payload, max);
        if let Ok(Inbound::Client(Request::Batch { instrs, .. })) = &mut message {
            // Its large literals' data, each in a frame of its own and none over the limit
            // (the socket lets a frame of up to twice it through).
            if let Some(size) = data.iter().map(|d| d.len()).find(|&size| size > max) {
                let why = CodecError::TooLarge { size, max }.to_string();
                return self.bad_message(&identity, len, format!("a literal's data frame: {why}"));
            }
            if let Err(e) = codec::attach_literals(instrs, std::mem::take(&mut data)) {
                return self.bad_message(&identity, len, e.to_string());
            }
        }
        self.on_message(identity, message, data, len);
    }

    /// One message from `identity` (or why it is not one), and the data frames after it:
    /// a `Data` event's one, nothing else's.
    fn on_message(
        &mut self,
        identity: Vec<u8>,
        message: Result<Inbound, CodecError>,
        mut data: Vec<zmq::Message>,
        len: usize,
    ) {
        // Handling a message cannot panic by design; should a bug make it, the peer that sent
        // the message loses its session and everyone else carries on.
        let peer = identity.clone();
        let handled = catch_unwind(AssertUnwindSafe(|| match message {
            Ok(Inbound::Worker(WorkerEvent::Data { tag, ty, file: false })) if data.len() == 1 => {
                self.on_worker_data(identity, (tag, ty), Some(data.swap_remove(0)), len)
            }
            Ok(Inbound::Worker(WorkerEvent::Data { tag, ty, file: true })) if data.is_empty() => {
                self.on_worker_data(identity, (tag, ty), None, len)
            }
            Ok(Inbound::Worker(WorkerEvent::Data { file: true, .. })) => {
                self.bad_message(&identity, len, "a Data message in a file with a data frame".into())
            }
            Ok(Inbound::Worker(WorkerEvent::Data { .. })) if data.is_empty() => {
                self.bad_message(&identity, len, "a Data message without its data frame".into())
            }
            Ok(Inbound::Worker(WorkerEvent::Data { .. })) => {
                self.bad_message(&identity, len, "a Data message with more than one data frame".into())
            }
            Ok(_) if !data.is_empty() => {
                self.bad_message(&identity, len, "data frames after a message that has none".into())
            }
            Ok(Inbound::Client(req)) => self.on_request(identity, req, len),
            Ok(Inbound::Worker(event)) => self.on_worker_event(identity, event, len),
            Err(e) => self.bad_message(&identity, len, e.to_string()),
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
            if let Some(client) = self.client_ids.get(identity).and_then(|c| self.clients.get_mut(c)) {
                client.unread_failures = true;
            }
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
        if let Request::Hello { name, wait_ms, doorbell, lane, shared_reads } = req {
            if let Some(&c) = self.client_ids.get(&identity) {
                self.welcome_again(c);
            } else if self.enough_workers() {
                self.welcome(identity, (name, doorbell, lane, shared_reads), bytes);
            } else {
                let deadline = Instant::now() + Duration::from_millis(wait_ms);
                self.hellos.push(PendingHello { identity, name, doorbell, lane, shared_reads, deadline, wait_ms });
            }
            return;
        }
        let Some(&c) = self.client_ids.get(&identity) else {
            self.bad_message(&identity, bytes, "a client must send Hello before anything else".into());
            return;
        };
        match req {
            Request::Hello { .. } => unreachable!("handled above"),
            Request::Batch { first_seq, instrs, lines, then } => {
                tracing::debug!(target: "gt::dispatcher", "client {c}: batch #{first_seq} of {} instructions", instrs.len());
                // Sequence numbers never wrap: a batch that would pass 2^64 is refused whole.
                if first_seq.checked_add(instrs.len() as u64).is_none() {
                    let why = format!(
                        "a batch from #{first_seq} of {} instructions runs past sequence number 2^64",
                        instrs.len()
                    );
                    return self.bad_message(&identity, bytes, why);
                }
                if let Some(p) = &mut self.profile {
                    p.lines(c, first_seq, &lines, instrs.len());
                }
                let share = bytes / instrs.len().max(1);
                if self.log.active() || self.profile.is_some() {
                    // One by one: the log and the profile follow each instruction as it is taken.
                    for (k, instr) in instrs.into_iter().enumerate() {
                        self.on_instr(c, first_seq + k as u64, instr, share);
                    }
                } else {
                    self.on_instrs(c, first_seq, instrs);
                }
                // Its sync point, as if it had come alone right after.
                if let Some(then) = then {
                    self.on_request(identity, then.request(), 0);
                }
            }
            Request::Get { seq, value, read } => {
                self.log_recv(c, "Get", bytes, || format!("seq={seq} %{}", value.0));
                // What the passes hold goes first, so that the value's size is known.
                self.flush_pipeline(c, seq);
                if let Some(failure) = self.acknowledge(c, seq, value, read) {
                    return self.send_reply(c, &Reply::Failed { seq, failure });
                }
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

    /// Client `c` read every answer up to the one with `receipt` (an unknown receipt, 0 or
    /// made up, acknowledges nothing), and asks to read `value` as `seq`: the read's failure
    /// when the answers it has not read, this one included, are over its limit. Counted
    /// from when a read is taken, not when it is answered, so that reads sent all at once
    /// cannot pass the limit before their answers come.
    fn acknowledge(&mut self, c: u64, seq: u64, value: ValueId, receipt: u64) -> Option<Failure> {
        let limit = self.config.client_unread_bytes;
        let fresh = self.receipt(c);
        let client = self.clients.get_mut(&c)?;
        if let Some(k) = client.unread.iter().position(|u| u.receipt == receipt) {
            for u in client.unread.drain(..=k) {
                client.unread_bytes -= u.bytes;
            }
        }
        let bytes = answer_bytes(client.namespace.type_of(value).map_or(0, |ty| ty.size_bytes()));
        // One answer alone may be as large as a message.
        if !client.unread.is_empty() && client.unread_bytes.saturating_add(bytes) > limit {
            let why = format!(
                "get: this client left {} bytes of earlier answers unread; this answer's {bytes} bytes would take it over its limit of {limit} (GT_CLIENT_UNREAD_BYTES); read them first",
                client.unread_bytes
            );
            return Some(Failure::new(FailureKind::Limit, why));
        }
        client.unread.push_back(Unread { seq, receipt: fresh, bytes, shared: false });
        client.unread_bytes += bytes;
        None
    }

    /// A new receipt for an answer to client `c`: a keyed hash of a counter, never 0.
    fn receipt(&mut self, c: u64) -> u64 {
        use std::hash::BuildHasher;
        self.next_receipt += 1;
        self.receipts.hash_one((c, self.next_receipt)).max(1)
    }

    /// Read `seq` of client `c` failed: no answer of its to acknowledge.
    fn read_failed(&mut self, c: u64, seq: u64) {
        let Some(client) = self.clients.get_mut(&c) else { return };
        if let Some(k) = client.unread.iter().position(|u| u.seq == seq) {
            let u = client.unread.remove(k).expect("found");
            client.unread_bytes -= u.bytes;
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

    fn welcome(
        &mut self,
        identity: Vec<u8>,
        (name, doorbell, lane, shared_reads): (String, Option<DoorbellKey>, Option<LaneKey>, bool),
        bytes: usize,
    ) {
        let c = self.next_client;
        self.next_client += 1;
        let mut pipeline = (self.config.pipeline)(c);
        pipeline.set_alive_workers(&self.alive_workers());
        let client = ClientState {
            identity: identity.clone(),
            namespace: Namespace::new(),
            pipeline,
            unread: VecDeque::new(),
            unread_bytes: 0,
            doorbell,
            unread_failures: false,
            shared_reads: shared_reads.then_some(None),
        };
        self.clients.insert(c, client);
        self.client_ids.insert(identity, c);
        tracing::info!(target: "gt::dispatcher", "client {c} connected: {name}");
        if let Some(p) = &mut self.profile {
            p.client_joined(c, &name);
        }
        let to_client = self.lanes.accept(lane, &self.clients[&c].identity);
        let by = if to_client.is_some() { " lane" } else { "" };
        self.log.emit(EventKind::Connect, format!("CLIENT {c}"), "Hello", bytes, format!("name={name}{by}"));
        self.welcome_again(c);
        self.lanes.open(&self.clients[&c].identity, to_client);
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
        if let Some(v) = first_pass_id(&instr) {
            let why = format!(
                "{}: value id {v} is reserved for the passes' own values (ids from {} up); use smaller ids",
                instr.mnemonic(),
                ValueId(FIRST_PASS_ID)
            );
            // Its results in the client's range are marked (reads say why); the passes' ids are
            // never the client's to name.
            let mut results = instr.results();
            results.retain(|v| v.0 < FIRST_PASS_ID);
            return self.fail_results(c, seq, &results, Failure::new(FailureKind::Undefined, why));
        }
        if let Some(p) = &mut self.profile {
            p.entered(c, seq, &instr, self.log.now());
        }
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
        // The buffer of emitted instructions is used again by the next request.
        let mut out = std::mem::take(&mut self.emitted);
        client.pipeline.run(instr, seq, &mut out);
        self.route_emitted(c, out.drain(..));
        out.shrink_to(gt_passes::pipeline::SPARE_CAPACITY);
        self.emitted = out;
    }

    /// A batch's instructions from `first_seq` on, as [`Dispatcher::on_instr`] one by one
    /// would take them with the log and profiles off, through the client's pipeline together
    /// ([`gt_passes::Pipeline::run_many`]): an instruction naming the passes' ids is failed
    /// in its place, after those before it went through.
    fn on_instrs(&mut self, c: u64, first_seq: u64, instrs: Vec<Instr>) {
        let mut run = Vec::with_capacity(instrs.len());
        for (seq, instr) in (first_seq..).zip(instrs) {
            if first_pass_id(&instr).is_some() {
                self.run_pipeline(c, std::mem::take(&mut run));
                self.on_instr(c, seq, instr, 0);
            } else {
                run.push((instr, seq));
            }
        }
        self.run_pipeline(c, run);
    }

    /// Client `c`'s instructions through its pipeline, and what comes out routed, a
    /// pipeline's worth of spare capacity at a time (so the buffers keep their size).
    fn run_pipeline(&mut self, c: u64, run: Vec<(Instr, u64)>) {
        let mut run = run.into_iter().peekable();
        while run.peek().is_some() {
            let Some(client) = self.clients.get_mut(&c) else { return };
            let mut out = std::mem::take(&mut self.emitted);
            client.pipeline.run_many(run.by_ref().take(gt_passes::pipeline::SPARE_CAPACITY), &mut out);
            self.route_emitted(c, out.drain(..));
            out.shrink_to(gt_passes::pipeline::SPARE_CAPACITY);
            self.emitted = out;
        }
    }

    /// Routes what a pipeline emitted, each instruction as its client's instruction of origin;
    /// instructions a pass injected are logged as INJECT.
    fn route_emitted(&mut self, c: u64, out: impl IntoIterator<Item = gt_passes::Emitted>) {
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
            self.route(c, seq, i, meta.types, &meta.place);
        }
        // Every part leaves now: a peer must not wait for a part still queued here.
        while let Some(w) = self.held_parts.pop() {
            self.flush_worker(w, None);
        }
    }

    /// Reports what the pipeline's validation found: a pass bug, which stops debug builds
    /// (the message handler's `catch_unwind` then ends only this client's session). The
    /// client's instructions a pass refused fail for the client; what a pass noted (a
    /// placement it left unapplied) goes to the instruction log.
    fn pass_errors(&mut self, c: u64) {
        let Some(client) = self.clients.get_mut(&c) else { return };
        let refusals = client.pipeline.take_refusals();
        for (meta, e) in client.pipeline.take_errors() {
            let msg = format!("client={c} #{}: {e}", meta.seq);
            tracing::error!(target: "gt::dispatcher", "{msg}");
            self.log.emit(EventKind::Error, format!("CLIENT {c}"), "pass", 0, msg.clone());
            debug_assert!(false, "{msg}");
        }
        for r in refusals {
            let why = format!("{}: {}", r.instr.mnemonic(), r.error);
            self.fail(c, r.meta.seq, &r.instr, Failure::new(FailureKind::Type, why));
        }
        if let Some(client) = self.clients.get_mut(&c) {
            for n in client.pipeline.take_notes() {
                let msg = format!("client={c} #{}: {}", n.meta.seq, n.note);
                tracing::warn!(target: "gt::dispatcher", "pass {}: {msg}", n.pass);
                self.log.emit(EventKind::Status, format!("CLIENT {c}"), n.pass, 0, msg);
            }
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
    /// `typing`: its result types as the pipeline carried them (`None`: typed here); `place`:
    /// where its results go (`Meta::place`; empty: the client's home).
    fn route(&mut self, c: u64, seq: u64, instr: Instr, typing: Typing, place: &[u32]) {
        let op = instr.mnemonic();
        if let Some(p) = &mut self.profile {
            p.released(c, &instr);
        }
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
        let typing = typing
            .map(|t| t.map(|types| types.iter().cloned().collect::<shape::ResultTypes>()).map_err(|e| (*e).clone()));
        let typing = typing
            .unwrap_or_else(|| shape::infer(&instr, &|v| ns.type_of(v).cloned().ok_or(TypeError::UnknownValue(v))));
        let types = match typing {
            Ok(t) => t,
            Err(e) => return self.fail(c, seq, &instr, Failure::new(e.kind(), format!("{op}: {e}"))),
        };
        if matches!(instr, Instr::Collective { .. }) {
            return self.route_collective(c, seq, instr, types, operands, place);
        }
        let w = match self.placed(c, place, instr.results().len(), op) {
            Ok(at) if at.iter().all(|&w| w == at[0]) => at[0],
            Ok(_) => {
                let why = format!("{op}: its results are placed on different workers, but it runs on one (a pass bug)");
                return self.fail(c, seq, &instr, Failure::new(FailureKind::Internal, why));
            }
            Err(failure) => return self.fail(c, seq, &instr, failure),
        };
        self.route_on(c, seq, instr, types, &operands, w);
    }

    /// The workers an instruction's `results` go to: `place` checked (one worker for all, or
    /// one per result; each must exist and be alive), or the client's home for each.
    fn placed(
        &mut self,
        c: u64,
        place: &[u32],
        results: usize,
        op: &str,
    ) -> Result<smallvec::SmallVec<[usize; 4]>, Failure> {
        let Some(client) = self.clients.get_mut(&c) else {
            return Err(Failure::new(FailureKind::Connection, format!("{op}: the client is gone")));
        };
        if place.is_empty() {
            let home = home(&mut self.workers, &mut client.namespace, op)?;
            return Ok(smallvec::smallvec![home; results.max(1)]);
        }
        if place.len() != 1 && place.len() != results {
            let why = format!("{op}: placed on {} workers for {results} results (a pass bug)", place.len());
            return Err(Failure::new(FailureKind::Internal, why));
        }
        let mut workers = smallvec::SmallVec::with_capacity(results.max(1));
        for &p in place {
            let w = p as usize;
            match self.workers.get(w) {
                None => {
                    let why = format!(
                        "{op}: placed on worker {w}, but the dispatcher has {} workers (0..{})",
                        self.workers.len(),
                        self.workers.len()
                    );
                    return Err(Failure::new(FailureKind::Type, why));
                }
                Some(worker) if !worker.alive => {
                    let why = format!("{op}: placed on worker {w} (`{}`), which is gone", worker.name);
                    return Err(Failure::new(FailureKind::WorkerLost, why));
                }
                Some(_) => workers.push(w),
            }
        }
        if place.len() == 1 {
            workers.resize(results.max(1), workers[0]);
        }
        Ok(workers)
    }

    /// Queues an instruction (all of whose operands must be on `w`) to run on worker `w`,
    /// its results defined there.
    fn route_on(
        &mut self,
        c: u64,
        seq: u64,
        mut instr: Instr,
        types: shape::ResultTypes,
        operands: &[Location],
        w: usize,
    ) {
        let op = instr.mnemonic();
        if let Some(k) = operands.iter().position(|at| at.worker != w) {
            // A pass placed it where its operand is not (a pass bug, or a client naming values
            // a pass spread): refused, never sent to a worker that cannot run it.
            let value = instr.operands()[k];
            let why = format!(
                "{op}: operand {value} is on worker `{}`, but the instruction runs on worker `{}` (its results' place); move it first",
                self.workers[operands[k].worker].name,
                self.workers[w].name
            );
            return self.fail(c, seq, &instr, Failure::new(FailureKind::Type, why));
        }
        let limits = self.limits();
        let keep = self.keeps(c);
        let Some(client) = self.clients.get_mut(&c) else { return };
        let ns = &mut client.namespace;
        let results = instr.results();
        let facts = facts(keep, &instr, &types, ns);
        if let Err(refusal) = ns.admit(&results, &types, &limits) {
            return self.fail(c, seq, &instr, refused(op, refusal));
        }
        ns.touch(w);
        // Results: reuse a redefined value's buffer (repeat loops), else allocate.
        let worker = &mut self.workers[w];
        let defined = ns.define(w, seq, &results, types, &mut || worker.alloc());
        for at in defined.stale {
            self.workers[at.worker].queue_free(at.buf, (c, seq));
        }
        // Renamed for the wire: worker buffers become the instruction's value ids.
        let mut next = defined.bufs.into_iter().chain(operands.iter().map(|at| at.buf));
        instr.visit_values_mut(&mut |v| *v = next.next().expect("visit order: results, then operands").into());
        self.push(w, instr, (c, seq), facts);
    }

    /// A collective: on one worker, an ordinary instruction there; across workers, one part
    /// per participating worker (its rank), each naming its own buffers, queued on every
    /// participant and sent at once.
    fn route_collective(
        &mut self,
        c: u64,
        seq: u64,
        instr: Instr,
        types: shape::ResultTypes,
        operands: namespace::Locations,
        place: &[u32],
    ) {
        let Instr::Collective { dsts, op, srcs } = &instr else { return };
        let (op, name) = (*op, op.mnemonic());
        let at = match self.placed(c, place, dsts.len(), name) {
            Ok(at) => at,
            Err(failure) => return self.fail(c, seq, &instr, failure),
        };
        let from: Vec<usize> = operands.iter().map(|l| l.worker).collect();
        let mut involved: Vec<usize> = at.iter().chain(&from).copied().collect();
        involved.sort_unstable();
        involved.dedup();
        if involved.len() == 1 {
            return self.route_on(c, seq, instr, types, &operands, involved[0]);
        }
        let ranks = match collective_ranks(op, &from, &at) {
            Ok(ranks) => ranks,
            Err(why) => {
                let why = why.describe(name, dsts, srcs, &|w| self.workers[w].name.clone());
                return self.fail(c, seq, &instr, Failure::new(FailureKind::Type, why));
            }
        };
        if let Some(&w) = ranks.iter().find(|&&w| !self.workers[w].alive) {
            let why = format!("{name}: worker `{}`, which holds an operand, is gone", self.workers[w].name);
            return self.fail(c, seq, &instr, Failure::new(FailureKind::WorkerLost, why));
        }
        if let Some(&w) = ranks.iter().find(|&&w| self.workers[w].peer.is_empty()) {
            let why = format!("{name}: worker `{}` gave no peer address, so it cannot take part", self.workers[w].name);
            return self.fail(c, seq, &instr, Failure::new(FailureKind::WorkerLost, why));
        }
        let limits = self.limits();
        let keep = self.keeps(c);
        let Some(client) = self.clients.get_mut(&c) else { return };
        let ns = &mut client.namespace;
        // Each part is recorded with what it holds and receives; the whole's cost is its own.
        let whole = facts(keep, &instr, &types, ns);
        if let Err(refusal) = ns.admit(dsts, &types, &limits) {
            return self.fail(c, seq, &instr, refused(name, refusal));
        }
        // Each result on its worker.
        let mut bufs = Vec::with_capacity(dsts.len());
        for (i, (&dst, ty)) in dsts.iter().zip(&types).enumerate() {
            let worker = &mut self.workers[at[i]];
            let defined = ns.define(at[i], seq, &[dst], vec![ty.clone()], &mut || worker.alloc());
            bufs.push(defined.bufs[0]);
            for stale in defined.stale {
                self.workers[stale.worker].queue_free(stale.buf, (c, seq));
            }
        }
        for &w in &ranks {
            ns.touch(w);
        }
        let id = self.next_collective;
        self.next_collective += 1;
        let peers: Vec<String> = ranks.iter().map(|&w| self.workers[w].peer.clone()).collect();
        for (rank, &w) in ranks.iter().enumerate() {
            let mine: Vec<usize> = (0..dsts.len()).filter(|&i| at[i] == w).collect();
            let local_srcs: Vec<ValueId> = match op {
                CollectiveOp::Broadcast | CollectiveOp::Move if rank == 0 => vec![operands[0].buf.into()],
                CollectiveOp::Broadcast | CollectiveOp::Move => Vec::new(),
                _ => vec![operands[rank].buf.into()],
            };
            let part = Instr::Collective { dsts: mine.iter().map(|&i| bufs[i].into()).collect(), op, srcs: local_srcs };
            let ty = mine.first().map(|&i| types[i].clone());
            let part_facts = whole.as_ref().map(|whole| part_facts(&instr, whole, &mine, rank));
            let ex = Exchange { index: 0, id, rank: rank as u32, root: 0, peers: peers.clone(), ty };
            self.workers[w].queue_exchange(part, ex, (c, seq), part_facts);
        }
        let state = ExchangeState {
            client: c,
            seq,
            op: name,
            ranks: ranks.clone(),
            left: ranks.len(),
            failure: None,
            reported: false,
        };
        self.exchanges.insert(id, state);
        // Sent when the request's instructions are routed (`route_emitted`).
        for &w in &ranks {
            if !self.held_parts.contains(&w) {
                self.held_parts.push(w);
            }
        }
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
        self.fail_results(c, seq, &instr.results(), failure);
    }

    /// Reports the failure of instruction `seq` and marks `results` as not computed.
    fn fail_results(&mut self, c: u64, seq: u64, results: &[ValueId], failure: Failure) {
        if let Some(client) = self.clients.get_mut(&c) {
            for at in client.namespace.fail(results, seq) {
                self.workers[at.worker].queue_free(at.buf, (c, seq));
            }
        }
        self.send_reply(c, &Reply::Failed { seq, failure });
    }

    /// Queues an instruction for worker `w`; a full batch leaves at once.
    fn push(&mut self, w: usize, instr: Instr, origin: (u64, u64), facts: Option<Facts>) {
        self.workers[w].queue(instr, origin, facts);
        self.flush_if_full(w);
    }

    /// Queues freeing a buffer; a full batch leaves at once.
    fn push_free(&mut self, at: Location, origin: (u64, u64)) {
        self.workers[at.worker].queue_free(at.buf, origin);
        self.flush_if_full(at.worker);
    }

    fn flush_if_full(&mut self, w: usize) {
        let pending = &self.workers[w].pending;
        if pending.instrs.len() >= self.config.worker_batch_size || pending.literal_frames >= codec::MAX_LITERAL_FRAMES
        {
            self.flush_worker(w, None);
        }
    }

    fn on_get(&mut self, c: u64, seq: u64, value: ValueId) {
        self.flush_pipeline(c, seq);
        // A pass that spread the value assembles it on the home worker first.
        let Some(client) = self.clients.get_mut(&c) else { return };
        let mut out = Vec::new();
        client.pipeline.materialize(value, seq, &mut out);
        self.route_emitted(c, out);
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
        // The client's other workers with work outstanding: the answer waits for them, so
        // that the failures of its earlier instructions there come first.
        let others: Vec<usize> = client
            .namespace
            .workers()
            .iter()
            .copied()
            .filter(|&o| o != w && self.workers[o].alive)
            .filter(|&o| !self.workers[o].inflight.is_empty() || !self.workers[o].pending.instrs.is_empty())
            .collect();
        self.flush_worker(w, None);
        // As a sync's: the worker may answer by the client's doorbell, with the receipt its
        // answer would carry (the read's entry, made when it was taken).
        let receipt = self.clients.get(&c).and_then(|client| client.unread.iter().find(|u| u.seq == seq));
        let bell = receipt.map(|u| u.receipt).and_then(|receipt| self.bell_for(c, w, (seq, receipt)));
        let tag = self.next_tag;
        self.next_tag += 1;
        let barrier = (!others.is_empty()).then(|| self.new_wait(c, seq, others.len(), WaitFor::Get(tag)));
        let sent = self.log.now();
        // A large answer to a client that takes them from its shared file: the worker writes
        // it there when it can (no frame, no copy), else it comes here as data.
        let file = if bell.is_none() { self.answer_file(c, seq, ty.size_bytes()) } else { None };
        let get =
            PendingGet { client: c, seq, worker: w, sent, ty, value, barrier, held: None, bell, file: file.clone() };
        self.gets.insert(tag, get);
        for o in others {
            self.flush_worker(o, barrier);
        }
        if let Some(size) = self.send_worker(w, WorkerCommand::Get { tag, value: buf.into(), doorbell: bell, file }) {
            self.log_worker(EventKind::WorkerSend, w, "Get", size, || format!("tag={tag} {buf}"));
        }
    }

    fn on_sync(&mut self, c: u64, seq: u64) {
        self.flush_pipeline(c, seq);
        let Some(client) = self.clients.get(&c) else { return };
        let workers = client.namespace.workers().to_vec();
        if let Some(&w) = workers.iter().find(|&&w| !self.workers[w].alive) {
            let msg = format!("sync: worker `{}`, which held this client's values, is gone", self.workers[w].name);
            return self.send_reply(c, &Reply::Failed { seq, failure: Failure::new(FailureKind::WorkerLost, msg) });
        }
        if workers.is_empty() {
            return self.send_reply(c, &Reply::Synced { seq });
        }
        let bell = match workers.as_slice() {
            [w] => self.bell_for(c, *w, (seq, 0)),
            _ => None,
        };
        // Answered once every worker the client sent work to has run it all.
        let wait = self.new_wait(c, seq, workers.len(), WaitFor::Sync);
        if let Some(entry) = self.waits.get_mut(&wait) {
            entry.bell = bell;
        }
        for w in workers {
            self.flush_worker(w, Some(wait));
        }
    }

    /// The client's doorbell for its wait `seq` (a read's with the receipt its answer
    /// carries, a sync's with 0), when worker `w` may answer it by the bell: all the client's
    /// work is on `w`, `w` runs in this process, nothing it was sent is unread, and nobody is
    /// timing (the log and the profile see every answer). One hop instead of two.
    fn bell_for(&self, c: u64, w: usize, (seq, receipt): (u64, u64)) -> Option<SyncBell> {
        let client = self.clients.get(&c)?;
        let key = client.doorbell?;
        let eligible =
            client.namespace.workers() == [w] && self.workers[w].local && !client.unread_failures && !self.timing();
        eligible.then_some(SyncBell { key, client: c, seq, receipt })
    }

    fn new_wait(&mut self, client: u64, seq: u64, left: usize, what: WaitFor) -> u64 {
        let token = self.next_tag;
        self.next_tag += 1;
        self.waits.insert(token, Wait { client, seq, left, what, bell: None });
        token
    }

    /// A sync's batch is done and its worker says it rang the client's doorbell: the client
    /// has its answer, so the wait ends without one. A wait given no bell (a worker saying it
    /// rang one it was not given) is answered as usual.
    fn wait_rung(&mut self, token: u64) {
        if self.waits.get(&token).is_some_and(|w| w.bell.is_some()) {
            self.waits.remove(&token);
        } else {
            self.wait_done(token, None);
        }
    }

    /// A batch that `token` waits for is done (or, with `lost`, will never be).
    fn wait_done(&mut self, token: u64, lost: Option<&Failure>) {
        let Some(wait) = self.waits.get_mut(&token) else { return };
        wait.left = wait.left.saturating_sub(1);
        // A lost worker fails a sync at once (the failures it reports came just before);
        // a read's barrier is only there for ordering, so its answer still goes out.
        let failed_sync = matches!(wait.what, WaitFor::Sync) && lost.is_some();
        if wait.left > 0 && !failed_sync {
            return;
        }
        let wait = self.waits.remove(&token).expect("present");
        match (wait.what, lost) {
            // Rung before the failure: the client has its answer.
            (WaitFor::Sync, Some(_)) if wait.bell.is_some_and(|b| gt_transport::doorbell::revoke(b.key, b.seq)) => {}
            (WaitFor::Sync, Some(failure)) => {
                self.send_reply(wait.client, &Reply::Failed { seq: wait.seq, failure: failure.clone() })
            }
            (WaitFor::Sync, None) => {
                if let Some(p) = &mut self.profile {
                    p.synced(wait.client, wait.seq);
                }
                self.send_reply(wait.client, &Reply::Synced { seq: wait.seq })
            }
            (WaitFor::Get(tag), _) => {
                let held = self.gets.get_mut(&tag).and_then(|g| {
                    g.barrier = None;
                    g.held.take()
                });
                if let Some(held) = held {
                    let g = self.gets.remove(&tag).expect("present");
                    self.answer_get(g, held);
                }
            }
        }
    }

    /// Sends a read's answer, or holds it while its barrier is not done.
    fn answer_get(&mut self, mut g: PendingGet, answer: Held) {
        if let Some(token) = g.barrier.filter(|t| self.waits.contains_key(t)) {
            g.held = Some(answer);
            g.barrier = Some(token);
            let tag = match &self.waits[&token].what {
                WaitFor::Get(tag) => *tag,
                WaitFor::Sync => return,
            };
            self.gets.insert(tag, g);
            return;
        }
        match answer {
            Held::Data(ty, data) => {
                // Everything the client sent before the read has run on every worker.
                if let Some(p) = &mut self.profile {
                    p.synced(g.client, g.seq);
                }
                let written = if data.is_none() { g.file } else { None };
                self.send_data_reply(g.client, g.seq, ty, data.unwrap_or_else(zmq::Message::new), written)
            }
            Held::Failed(failure) => self.send_reply(g.client, &Reply::Failed { seq: g.seq, failure }),
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
            self.send_worker(w, WorkerCommand::Stats { tag });
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

    /// Hands the allocator's free memory back to the OS. glibc keeps what every thread freed in
    /// that thread's arena, so a crowd of clients come and gone (their replies, their batches,
    /// their threads' arenas in an embedded process) would otherwise stay in the RSS; called
    /// only when such a crowd has left (a few times per crowd), it costs about a millisecond.
    fn trim_heap() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        #[allow(unsafe_code)]
        // SAFETY: `malloc_trim` takes no pointers; it only walks the allocator's own free lists,
        // under the allocator's locks.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Frees everything a client holds and forgets it.
    fn remove_client(&mut self, c: u64, why: &str) {
        let Some(client) = self.clients.remove(&c) else { return };
        self.client_ids.remove(&client.identity);
        self.lanes.close(&client.identity);
        // A crowd of clients come and gone leaves no high-water mark behind: neither in the
        // maps nor in the allocator's free lists.
        if self.clients.len() * 4 < self.clients.capacity() {
            self.clients.shrink_to(self.clients.len() * 2);
            self.client_ids.shrink_to(self.clients.len() * 2);
            Self::trim_heap();
        }
        if let Some(p) = &mut self.profile {
            p.client_left(c);
        }
        if let Some(h) = client.namespace.home() {
            self.workers[h].clients = self.workers[h].clients.saturating_sub(1);
        }
        // Its work still queued on its workers is skipped (what is pending here goes out in
        // later batches, which the workers skip too; the frees below still run).
        for &w in client.namespace.workers() {
            if self.workers[w].alive {
                self.flush_worker(w, None);
                self.send_worker(w, WorkerCommand::DropClient { client: c });
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
        if let WorkerEvent::Register { name, backend, clock, peer, process, lane } = event {
            if self.worker_ids.contains_key(&identity) || self.client_ids.contains_key(&identity) {
                return self.bad_message(&identity, bytes, "registered twice".into());
            }
            let w = self.workers.len();
            let clock = Clock::registered(clock, self.log.now());
            if let Some(p) = &mut self.profile {
                p.worker_joined(w, &name, &backend);
            }
            let mut worker = Worker::new(identity.clone(), (name.clone(), backend.clone(), peer), clock);
            worker.local = process == gt_transport::doorbell::process_key();
            self.workers.push(worker);
            self.worker_ids.insert(identity, w);
            self.tell_pipelines_the_workers();
            tracing::info!(target: "gt::dispatcher", "worker {w} registered: {name} ({backend})");
            let to_worker = self.lanes.accept(lane, &self.workers[w].identity);
            let by = if to_worker.is_some() { " lane" } else { "" };
            self.log.emit(
                EventKind::Connect,
                format!("WORKER {name}"),
                "Register",
                bytes,
                format!("worker={w} backend={backend}{by}"),
            );
            // The welcome is also the first ping (the worker answers it with a `Pong`), so its
            // clock is known to a round trip's precision from the start.
            if self.send_worker(w, WorkerCommand::Welcome { worker: w as u32 }).is_some() {
                let sent = self.log.now();
                self.workers[w].clock.pinged(sent);
            }
            self.lanes.open(&self.workers[w].identity, to_worker);
            return;
        }
        let Some(&w) = self.worker_ids.get(&identity) else {
            return self.bad_message(&identity, bytes, "a worker must register before anything else".into());
        };
        match event {
            WorkerEvent::Register { .. } => unreachable!("handled above"),
            WorkerEvent::Done { batch, failures, nanos, timings, live_bytes, rang } => {
                self.on_done(&identity, w, bytes, (batch, nanos, rang), failures, (timings, live_bytes))
            }
            WorkerEvent::Pong { clock } => {
                let now = self.log.now();
                self.workers[w].clock.ponged(clock, now);
            }
            // (A `Data` with its frame goes to `on_worker_data`.)
            WorkerEvent::Data { .. } => {
                self.bad_message(&identity, bytes, "a Data message without its data frame".into())
            }
            WorkerEvent::Rung { tag, ty } => self.on_worker_rung(w, (tag, ty), bytes),
            WorkerEvent::Failed { tag, failure } => {
                self.log_worker(EventKind::WorkerRecv, w, "Failed", bytes, || format!("tag={tag} {failure}"));
                if let Some(g) = self.take_get(tag, w) {
                    self.answer_get(g, Held::Failed(failure));
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
        (batch, nanos, rang): (u64, u64, bool),
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
            let now = self.log.now();
            let every = self.config.probe_interval.as_nanos() as u64;
            if self.workers[w].memory_logged_at.is_none_or(|at| now.saturating_sub(at) >= every) {
                self.workers[w].memory_logged_at = Some(now);
                let source = format!("WORKER {}", self.workers[w].name);
                self.log.emit(EventKind::Status, source, "memory", 0, format!("live={live_bytes}"));
            }
        }
        for (i, failure) in failures {
            let Some(&(c, seq)) = record.origins.get(i as usize) else { continue };
            if seq == DISPATCHER_SEQ {
                tracing::warn!(target: "gt::dispatcher", "worker `{}`: {failure}", self.workers[w].name);
                continue;
            }
            // A part of a collective: reported once, when every part is done.
            if let Some(&(_, id)) = record.exchanges.iter().find(|(index, _)| *index == i) {
                self.exchange_failed(id, w, failure);
                continue;
            }
            self.computation_failed(c, seq, failure);
        }
        for (_, id) in std::mem::take(&mut record.exchanges) {
            self.exchange_part_done(id);
        }
        match record.wait {
            Some(token) if rang => self.wait_rung(token),
            Some(token) => self.wait_done(token, None),
            None => {}
        }
    }

    /// Instruction `seq` of client `c` failed on a worker: its results were never made (reads
    /// say why, a free is quiet; a redefinition's buffer still holds the value it was to
    /// replace, freed here), and the client is told.
    fn computation_failed(&mut self, c: u64, seq: u64, failure: Failure) {
        if let Some(client) = self.clients.get_mut(&c) {
            for at in client.namespace.computation_failed(seq) {
                self.workers[at.worker].queue_free(at.buf, (c, DISPATCHER_SEQ));
            }
            self.send_reply(c, &Reply::Failed { seq, failure });
        }
    }

    /// Worker `w`'s part of collective `id` failed: kept (peer addresses named as workers)
    /// unless a better failure is kept already.
    fn exchange_failed(&mut self, id: u64, w: usize, failure: Failure) {
        let Some(state) = self.exchanges.get(&id) else { return };
        let mut message = failure.message;
        // Peers are named by their workers, which the client knows, not by socket addresses.
        for &r in &state.ranks {
            let peer = &self.workers[r].peer;
            if !peer.is_empty() {
                message = message.replace(peer.as_str(), &format!("worker `{}`", self.workers[r].name));
            }
        }
        let failure = Failure::new(failure.kind, format!("{message} (on worker `{}`)", self.workers[w].name));
        let state = self.exchanges.get_mut(&id).expect("present");
        // A peer's giving up (WorkerLost) only echoes the failure of the part that gave up.
        let better = match &state.failure {
            None => true,
            Some(kept) => kept.kind == FailureKind::WorkerLost && failure.kind != FailureKind::WorkerLost,
        };
        if better {
            state.failure = Some(failure);
        }
    }

    /// A part of collective `id` is done (or lost): after the last one, its failure (if any)
    /// goes to the client, once.
    fn exchange_part_done(&mut self, id: u64) {
        let Some(state) = self.exchanges.get_mut(&id) else { return };
        state.left = state.left.saturating_sub(1);
        if state.left > 0 {
            return;
        }
        let state = self.exchanges.remove(&id).expect("present");
        let Some(failure) = state.failure else { return };
        if state.reported {
            // The client was told (its worker was lost); its results still were never made.
            if let Some(client) = self.clients.get_mut(&state.client) {
                for at in client.namespace.computation_failed(state.seq) {
                    self.workers[at.worker].queue_free(at.buf, (state.client, DISPATCHER_SEQ));
                }
            }
        } else {
            self.computation_failed(state.client, state.seq, failure);
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
            let (Some(&(c, seq)), Some(note)) = (record.origins.get(i), notes.get(i)) else {
                continue;
            };
            let at = clock.to_dispatcher(t.start);
            if let Some(p) = &mut self.profile {
                p.executed(&self.workers[w].name, (c, (seq != DISPATCHER_SEQ).then_some(seq)), note, (at, t.nanos));
            }
            if !self.log.active() {
                continue;
            }
            let origin = if seq == DISPATCHER_SEQ { "dispatcher".to_string() } else { format!("client={c} #{seq}") };
            let span = (at, Some(t.nanos));
            // The result types without spaces, so that `result=` reads as one detail.
            let types = &note.facts.types;
            let result = types.iter().map(|t| t.to_string().replace(' ', "")).collect::<Vec<_>>().join(",");
            let result = if result.is_empty() { String::new() } else { format!(" result={result}") };
            let bytes = types.iter().fold(0u64, |n, t| n.saturating_add(t.size_bytes() as u64));
            // A part of a collective says which one and with whom, so a timeline shows who
            // sent what to whom.
            let exchange = note.exchange.as_ref().map_or(String::new(), |e| format!(" ; {e}"));
            let details = format!("{origin}{result} {}{exchange}", note.text);
            self.log.emit_at(EventKind::Exec, source.clone(), note.op, bytes, span, details);
        }
    }

    /// A worker answered read `tag` with its data frame (`None`: written into the client's
    /// shared file, as the read asked): its type and data length are checked against what
    /// was asked before the client gets the frame, untouched.
    fn on_worker_data(
        &mut self,
        identity: Vec<u8>,
        (tag, ty): (u64, TensorType),
        data: Option<zmq::Message>,
        bytes: usize,
    ) {
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
            return self.answer_get(g, Held::Failed(failure));
        }
        // A worker answering with another type or length than the value has is
        // broken or lying: the client is told, and the worker is not trusted again.
        let length = data.as_ref().map(|d| d.len());
        let fits = match length {
            Some(n) => n == g.ty.size_bytes(),
            None => g.file.is_some(),
        };
        if ty != g.ty || !fits {
            let what = match length {
                Some(n) => format!("{n} bytes of data"),
                None => "its data in a file it was not given".to_string(),
            };
            let why = format!(
                "get: worker `{}` answered {ty} with {what} for a {} value; its answer was dropped and the worker disconnected",
                self.workers[w].name, g.ty
            );
            self.log_worker(EventKind::Error, w, "Data", bytes, || why.clone());
            self.send_reply(
                g.client,
                &Reply::Failed { seq: g.seq, failure: Failure::new(FailureKind::WorkerLost, why) },
            );
            self.worker_lost(w);
            return;
        }
        if let Some(p) = &mut self.profile {
            p.read(&self.workers[w].name, (g.client, g.seq), &ty, (g.sent, self.log.now()));
        }
        self.answer_get(g, Held::Data(ty, data));
    }

    /// A worker answered read `tag` through the client's doorbell: the client has its data
    /// (and its receipt, whose entry stays until the client acknowledges it, as for an
    /// answer by the socket). One it was not given a bell for is failed (the client still
    /// waits for it). One of another type than the value's (only a broken worker answers
    /// so) already reached the client: the worker is dropped.
    fn on_worker_rung(&mut self, w: usize, (tag, ty): (u64, TensorType), bytes: usize) {
        self.log_worker(EventKind::WorkerRecv, w, "Rung", bytes, || format!("tag={tag} {ty}"));
        let Some(g) = self.take_get(tag, w) else { return };
        if g.bell.is_none() {
            let why =
                format!("get: worker `{}` said it answered a read it was given no doorbell for", self.workers[w].name);
            self.log_worker(EventKind::Error, w, "Rung", bytes, || why.clone());
            self.send_reply(
                g.client,
                &Reply::Failed { seq: g.seq, failure: Failure::new(FailureKind::WorkerLost, why) },
            );
            self.worker_lost(w);
        } else if ty != g.ty {
            let why = format!(
                "get: worker `{}` rang {ty} for a {} value; the worker is disconnected",
                self.workers[w].name, g.ty
            );
            self.log_worker(EventKind::Error, w, "Rung", bytes, || why.clone());
            self.worker_lost(w);
        }
    }

    /// Answers a read: the type, then the worker's data frame as it came (no copy), or the
    /// name of the client's shared file the data is in (`written` there by the worker, or
    /// here).
    fn send_data_reply(&mut self, c: u64, seq: u64, ty: TensorType, data: zmq::Message, written: Option<String>) {
        let Some(client) = self.clients.get_mut(&c) else { return };
        // An answer the client waits for: it reads everything sent before it first (a
        // failure sent instead marks it again).
        client.unread_failures = false;
        let identity = client.identity.clone();
        if data.len() > self.config.max_message_bytes {
            let why = format!(
                "get: the answer cannot be sent: {ty} is {} bytes, over the limit of {} bytes (GT_MAX_MESSAGE_BYTES)",
                data.len(),
                self.config.max_message_bytes
            );
            return self.send_reply(c, &Reply::Failed { seq, failure: Failure::new(FailureKind::Limit, why) });
        }
        // The read's entry, made when it was taken (`acknowledge`), holds its receipt.
        let at = client.unread.iter().position(|u| u.seq == seq);
        let receipt = match at {
            Some(k) => client.unread[k].receipt,
            None => self.receipt(c),
        };
        let file = written.or_else(|| self.share(c, seq, &data));
        let shared = file.is_some();
        let data = if shared { zmq::Message::new() } else { data };
        let head = codec::encode(&Reply::Data { seq, ty: ty.clone(), receipt, file }, usize::MAX).expect("small");
        let bytes = answer_bytes(data.len());
        if self.log.active() {
            self.log.emit(
                EventKind::Send,
                format!("CLIENT {c}"),
                "Data",
                head.len() + data.len(),
                format!("#{seq} {ty}"),
            );
        }
        let sent = self.send_to(&identity, head, Some(data));
        if sent.is_err() {
            self.lost_clients.push((c, "is gone (its process ended or the connection broke)"));
        } else if let Some(client) = self.clients.get_mut(&c) {
            // The value's bytes were counted when the read was taken; the data's are what
            // the socket holds.
            match at.and_then(|k| client.unread.get_mut(k)) {
                Some(u) => {
                    client.unread_bytes = client.unread_bytes - u.bytes + bytes;
                    u.bytes = bytes;
                    u.shared = shared;
                }
                None => {
                    client.unread.push_back(Unread { seq, receipt, bytes, shared });
                    client.unread_bytes += bytes;
                }
            }
        }
    }

    /// Writes the answer `data` to read `seq` into client `c`'s shared file and gives its
    /// name, when the client asked for shared reads, the data is large enough, and the client
    /// has acknowledged the file's last answer (it took that data out); `None`: the answer
    /// goes by the socket. The file is made at the first such answer; one that cannot be
    /// made or written is logged, and the client's answers go by the socket from then on.
    fn share(&mut self, c: u64, seq: u64, data: &[u8]) -> Option<String> {
        let name = self.answer_file(c, seq, data.len())?;
        let client = self.clients.get_mut(&c)?;
        let written = client.shared_reads.as_mut()?.as_mut()?.write(data);
        match written {
            Ok(()) => Some(name),
            Err(e) => {
                tracing::warn!(target: "gt::dispatcher", "client {c}: answers go by the socket: cannot write its shared file: {e}");
                client.shared_reads = None;
                None
            }
        }
    }

    /// Client `c`'s shared answer file for the answer to its read `seq` of `len` bytes: its
    /// name, when the client asked for shared reads, the answer is large enough and no
    /// other answer in the file is unacknowledged (the read's entry is then marked, so the
    /// file is written for no other until this one is acknowledged). Made at the first such
    /// answer; one that cannot be made is logged, and answers go by the socket from then on.
    fn answer_file(&mut self, c: u64, seq: u64, len: usize) -> Option<String> {
        let client = self.clients.get_mut(&c)?;
        let slot = client.shared_reads.as_mut()?;
        let busy = client.unread.iter().any(|u| u.shared && u.seq != seq);
        if len < shared::MIN_BYTES || busy {
            return None;
        }
        if slot.is_none() {
            match shared::AnswerFile::create(&shared::answer_file_name(std::process::id(), c)) {
                Ok(f) => *slot = Some(f),
                Err(e) => {
                    client.shared_reads = None;
                    tracing::warn!(target: "gt::dispatcher", "client {c}: answers go by the socket: cannot make a shared file: {e}");
                    return None;
                }
            }
        }
        let name = slot.as_ref()?.name().to_string();
        if let Some(u) = client.unread.iter_mut().find(|u| u.seq == seq) {
            u.shared = true;
        }
        Some(name)
    }

    /// The read `tag`, taken only when worker `w` was asked it (another cannot answer it).
    fn take_get(&mut self, tag: u64, w: usize) -> Option<PendingGet> {
        match self.gets.get(&tag) {
            Some(g) if g.worker == w && g.held.is_none() => self.gets.remove(&tag),
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

    /// Sends a worker its queued instructions (and, for a wait, an empty batch whose `Done`
    /// counts towards it).
    /// A sync's wait given the client's doorbell sends it along (`Exec`'s `doorbell`).
    fn flush_worker(&mut self, w: usize, wait: Option<u64>) {
        let bell = wait.and_then(|t| self.waits.get(&t)).and_then(|wait| wait.bell);
        let worker = &mut self.workers[w];
        if worker.pending.instrs.is_empty() && wait.is_none() {
            return;
        }
        let (number, Queued { instrs, origins, facts, exchanges, .. }) = worker.take_batch();
        if !worker.alive {
            let why = format!("worker `{}`, which held this client's values, is gone", worker.name);
            let failure = Failure::new(FailureKind::WorkerLost, why);
            for ex in exchanges {
                self.exchange_lost(ex.id, w, failure.clone());
            }
            if let Some(token) = wait {
                self.wait_done(token, Some(&failure));
            }
            return;
        }
        let timed = self.timing();
        let details = self.log.active().then(|| batch_details(number, &instrs));
        let notes = timed.then(|| {
            // Instructions queued before timing began have no facts.
            let mut facts = facts;
            facts.resize_with(instrs.len(), Facts::default);
            let notes = instrs.iter().zip(facts);
            let mut notes: Vec<ExecNote> = notes
                .map(|(i, facts)| ExecNote { op: i.mnemonic(), facts, text: print_instr(i), exchange: None })
                .collect();
            // A part of a collective across workers: which one and with whom.
            for ex in &exchanges {
                let (Some(note), Some(state)) = (notes.get_mut(ex.index as usize), self.exchanges.get(&ex.id)) else {
                    continue;
                };
                let names: Vec<&str> = state.ranks.iter().map(|&r| self.workers[r].name.as_str()).collect();
                note.exchange = Some(format!("collective #{} rank {} of {}", ex.id, ex.rank, names.join(", ")));
            }
            notes
        });
        let charges = workers::charges(&instrs, &origins);
        let owners = origins.iter().map(|(c, _)| *c).collect();
        let parts: Vec<(u32, u64)> = exchanges.iter().map(|ex| (ex.index, ex.id)).collect();
        let data: usize = charges.values().map(|c| c.bytes as usize).sum();
        // By a lane the batch goes as it is; else its large literals go as frames of their
        // own, lent on as they came.
        let by_lane = self.lanes.peers.contains_key(&self.workers[w].identity);
        let mut instrs = instrs;
        let literals = if by_lane { Vec::new() } else { codec::detach_literals(&mut instrs) };
        let framed: usize = literals.iter().map(Elements::size_bytes).sum();
        let cmd = WorkerCommand::Exec { batch: number, instrs, owners, timed, exchanges, doorbell: bell };
        let out = if by_lane {
            Ok(ToWorker::Command(cmd))
        } else {
            let bytes = codec::encode_sized(&cmd, self.config.max_message_bytes, data.saturating_sub(framed));
            bytes.map(|bytes| ToWorker::Encoded(bytes, literals))
        };
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                // Only literal data can make a batch this large: fail each client's part.
                let msg = Failure::new(FailureKind::Limit, format!("cannot send to worker: {e}"));
                let mut told = Vec::new();
                for (c, seq) in origins {
                    if !told.contains(&c) {
                        told.push(c);
                        self.send_reply(c, &Reply::Failed { seq, failure: msg.clone() });
                    }
                }
                // Its collectives' other parts must not wait for these.
                for (_, id) in parts {
                    self.exchange_lost(id, w, msg.clone());
                }
                if let Some(token) = wait {
                    self.wait_done(token, Some(&msg));
                }
                return;
            }
        };
        let size = if details.is_some() { out.size() } else { 0 };
        self.charge(&charges, true);
        // Stamped before sending: the worker may start on it before the send returns.
        let sent = self.log.now();
        self.workers[w].inflight.push_back(Batch { number, origins, charges, wait, exchanges: parts, notes, sent });
        if self.send_worker_out(w, out) {
            if let Some(details) = details {
                let source = format!("WORKER {}", self.workers[w].name);
                self.log.emit_at(EventKind::WorkerSend, source, "Exec", size as u64, (sent, None), details);
            }
        }
    }

    /// Worker `w`'s part of collective `id` will never run (the worker is gone, or the batch
    /// could not be sent): the other participants are told at once (so none waits out its
    /// timeout), and the client gets `failure` once every part is accounted for.
    fn exchange_lost(&mut self, id: u64, w: usize, failure: Failure) {
        let Some(state) = self.exchanges.get_mut(&id) else { return };
        if state.failure.as_ref().is_none_or(|kept| kept.kind == FailureKind::WorkerLost) {
            state.failure = Some(failure);
        }
        let (ranks, rank) = (state.ranks.clone(), state.ranks.iter().position(|&r| r == w));
        if let Some(rank) = rank {
            for (r, &o) in ranks.iter().enumerate() {
                if r != rank && self.workers[o].alive {
                    let peer = self.workers[o].peer.clone();
                    self.send_abort(&peer, id, rank as u32);
                }
            }
        }
        self.exchange_part_done(id);
    }

    /// Tells the peer socket at `peer` that rank `sender` gives up on collective `id`: the
    /// abort message of `collective.rs` (the 17-byte header with kind 1, an empty payload).
    fn send_abort(&mut self, peer: &str, id: u64, sender: u32) {
        let Some(ctx) = &self.ctx else {
            tracing::warn!(target: "gt::dispatcher", "cannot tell {peer} of a lost peer: no context to reach it from");
            return;
        };
        if !self.abort_dealers.contains_key(peer) {
            let dealer = ctx.socket(zmq::DEALER).and_then(|s| {
                // Never block the dispatcher; a dead address only queues one small message.
                s.set_sndhwm(0)?;
                s.set_linger(1000)?;
                socket::connect(&s, peer, self.key.as_ref())?;
                Ok(s)
            });
            match dealer {
                Ok(s) => {
                    self.abort_dealers.insert(peer.to_string(), s);
                }
                Err(e) => {
                    tracing::warn!(target: "gt::dispatcher", "cannot reach peer {peer} to abort collective {id}: {e}");
                    return;
                }
            }
        }
        let mut header = [0u8; 17];
        header[..8].copy_from_slice(&id.to_le_bytes());
        header[12..16].copy_from_slice(&sender.to_le_bytes());
        header[16] = 1;
        let empty: &[u8] = &[];
        let sent = socket::retry(|| self.abort_dealers[peer].send_multipart([&header[..], empty], zmq::DONTWAIT));
        if let Err(e) = sent {
            tracing::warn!(target: "gt::dispatcher", "cannot tell peer {peer} to abort collective {id}: {e}");
        }
    }

    /// Sends a small command; returns its size if the worker took it.
    fn send_worker(&mut self, w: usize, cmd: WorkerCommand) -> Option<usize> {
        let out = ToWorker::Command(cmd);
        let size = if self.log.active() { out.size() } else { 0 };
        self.send_worker_out(w, out).then_some(size)
    }

    /// Returns whether the worker took it; a worker that cannot be routed to is gone.
    fn send_worker_out(&mut self, w: usize, out: ToWorker) -> bool {
        let identity = &self.workers[w].identity;
        let sent = match (self.lanes.peers.get(identity), out) {
            (Some(lane), ToWorker::Command(cmd)) => {
                send_by_lane(&self.router, lane, identity, lane::Parcel::Command(cmd))
            }
            // The encoded batch is moved to ZeroMQ, not copied, and its large literals lent.
            (Some(lane), ToWorker::Encoded(bytes, literals)) => {
                let frames = lane::frames(None, bytes, literals.into_iter().map(gt_transport::loan::frame));
                send_by_lane(&self.router, lane, identity, frames)
            }
            (None, ToWorker::Encoded(bytes, literals)) => {
                socket::send_with_literals(&mut self.router, &[identity.as_slice()], bytes, literals)
            }
            // (An `Exec` to a worker without a lane comes encoded, by `flush_worker`.)
            (None, ToWorker::Command(cmd)) => {
                let bytes =
                    codec::encode(&cmd, self.config.max_message_bytes).expect("commands other than Exec are small");
                socket::send_with_literals(&mut self.router, &[identity.as_slice()], bytes, Vec::new())
            }
        };
        match sent {
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

    /// Which workers are up, by index.
    fn alive_workers(&self) -> Vec<bool> {
        self.workers.iter().map(|w| w.alive).collect()
    }

    /// Tells every client's passes which workers are up (a placement over "every worker"
    /// means those).
    fn tell_pipelines_the_workers(&mut self) {
        let alive = self.alive_workers();
        for client in self.clients.values_mut() {
            client.pipeline.set_alive_workers(&alive);
        }
    }

    /// A worker is gone: everyone waiting on it gets an error now.
    fn worker_lost(&mut self, w: usize) {
        if !self.workers[w].alive {
            return;
        }
        self.workers[w].alive = false;
        self.tell_pipelines_the_workers();
        let name = self.workers[w].name.clone();
        self.abort_dealers.remove(&self.workers[w].peer);
        self.lanes.close(&self.workers[w].identity);
        let message =
            format!("worker `{name}` is gone (its process ended or the connection broke); the values it held are lost");
        tracing::error!(target: "gt::dispatcher", "{message}");
        self.log.emit(EventKind::Disconnect, format!("WORKER {name}"), "Lost", 0, message.clone());
        let failure = Failure::new(FailureKind::WorkerLost, message);
        let worker = &mut self.workers[w];
        let mut owed: Vec<(u64, u64)> = Vec::new();
        let mut waits: Vec<u64> = Vec::new();
        let batches: Vec<Batch> = worker.inflight.drain(..).collect();
        let pending = std::mem::take(&mut worker.pending);
        // Its parts of collectives will never run: the other participants are told now.
        let mut lost_parts: Vec<u64> = pending.exchanges.iter().map(|ex| ex.id).collect();
        for b in &batches {
            self.charge(&b.charges, false);
        }
        for b in batches {
            owed.extend(b.origins);
            waits.extend(b.wait);
            lost_parts.extend(b.exchanges.iter().map(|(_, id)| *id));
        }
        owed.extend(pending.origins);
        let abort_failure = |op: &str| {
            let why =
                format!("{op}: worker `{name}`, a participant, is gone (its process ended or the connection broke)");
            Failure::new(FailureKind::WorkerLost, why)
        };
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
            // A read whose bell rang before the loss has its answer.
            if !g.bell.is_some_and(|b| gt_transport::doorbell::revoke(b.key, b.seq)) {
                self.send_reply(g.client, &Reply::Failed { seq: g.seq, failure: failure.clone() });
            }
        }
        // Collectives whose instruction is each client's first loss are reported there.
        for id in &lost_parts {
            if let Some(state) = self.exchanges.get_mut(id) {
                if first.get(&state.client) == Some(&state.seq) {
                    state.reported = true;
                }
            }
        }
        for (c, seq) in first {
            if self.clients.contains_key(&c) {
                self.send_reply(c, &Reply::Failed { seq, failure: failure.clone() });
            }
        }
        for id in lost_parts {
            let Some(op) = self.exchanges.get(&id).map(|s| s.op) else { continue };
            self.exchange_lost(id, w, abort_failure(op));
        }
        // Each waiting sync is answered itself (after the failures it reports).
        for token in waits {
            self.wait_done(token, Some(&failure));
        }
        let waiting: Vec<u64> = self.stats_tags.iter().filter(|(_, (_, sw))| *sw == w).map(|(t, _)| *t).collect();
        for t in waiting {
            let (collector, _) = self.stats_tags.remove(&t).expect("listed");
            self.stats_arrived(collector, None);
        }
    }

    // ---- replies, probes ---------------------------------------------------------------

    fn send_reply(&mut self, c: u64, reply: &Reply) {
        if let Reply::Failed { seq, .. } = reply {
            self.read_failed(c, *seq);
        }
        let Some(client) = self.clients.get_mut(&c) else { return };
        match reply {
            Reply::Failed { .. } | Reply::Rejected { .. } => client.unread_failures = true,
            // An answer the client waited for: it reads everything sent before it first.
            Reply::Synced { .. } | Reply::Stats { .. } | Reply::Data { .. } => client.unread_failures = false,
            Reply::Welcome { .. } | Reply::Ping => {}
        }
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
        if self.send_to(&identity, bytes, None).is_err() {
            self.lost_clients.push((c, "is gone (its process ended or the connection broke)"));
        }
    }

    fn send_reply_to(&mut self, identity: &[u8], reply: &Reply) {
        if let Ok(bytes) = codec::encode(reply, self.config.max_message_bytes) {
            let _ = self.send_to(identity, bytes, None);
        }
    }

    /// Sends an encoded message (and a read's data frame) to the peer `identity`: by its
    /// lane if it has one, else by the socket.
    fn send_to(&self, identity: &[u8], bytes: Vec<u8>, data: Option<zmq::Message>) -> zmq::Result<()> {
        match (self.lanes.peers.get(identity), data) {
            (Some(out), data) => send_by_lane(&self.router, out, identity, lane::frames(None, bytes, data)),
            (None, Some(data)) => socket::send_with_data(&self.router, &[identity, &bytes], data),
            (None, None) => socket::retry(|| self.router.send_multipart([identity, &bytes], zmq::DONTWAIT)),
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
                    self.welcome(h.identity, (h.name, h.doorbell, h.lane, h.shared_reads), 0);
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
                if self.workers[w].alive && self.send_worker(w, WorkerCommand::Ping).is_some() {
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
                if self.send_to(&identity, ping.clone(), None).is_err() {
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

/// A refusal of the client's limits as its failure.
fn refused(op: &str, refusal: Refusal) -> Failure {
    let kind = match refusal {
        Refusal::Memory { .. } => FailureKind::OutOfMemory,
        Refusal::Credit { .. } => FailureKind::Limit,
    };
    Failure::new(kind, format!("{op}: {refusal}"))
}

/// The first value id of a client's instruction in the passes' range, if any.
fn first_pass_id(instr: &Instr) -> Option<ValueId> {
    let mut found = None;
    instr.visit_values(&mut |v| {
        if v.0 >= FIRST_PASS_ID && found.is_none() {
            found = Some(v);
        }
    });
    found
}

/// Why a collective's operands and results cannot be given ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankError {
    /// Participant `i`'s operand and result are on different workers.
    Split { i: usize, from: usize, to: usize },
    /// Participants `i` and `j` are on one worker.
    Shared { i: usize, j: usize, worker: usize },
}

impl RankError {
    fn describe(self, op: &str, dsts: &[ValueId], srcs: &[ValueId], name: &dyn Fn(usize) -> String) -> String {
        match self {
            RankError::Split { i, from, to } => format!(
                "{op}: participant {i}'s operand {} is on worker `{}` but its result {} is placed on worker `{}` (each participant's result stays where its operand is)",
                srcs[i],
                name(from),
                dsts[i],
                name(to)
            ),
            RankError::Shared { i, j, worker } => format!(
                "{op}: participants {i} and {j} are both on worker `{}` (a collective across workers takes one participant per worker)",
                name(worker)
            ),
        }
    }
}

/// The worker of each rank of a collective across workers, given its operands' workers
/// (`from`) and its results' (`to`): for `all_reduce`, `all_gather` and `reduce_scatter`,
/// rank i is participant i; a `broadcast`'s root (rank 0) holds the operand, then each
/// other worker receiving a result; a `move` goes from rank 0 to rank 1.
fn collective_ranks(op: CollectiveOp, from: &[usize], to: &[usize]) -> Result<Vec<usize>, RankError> {
    match op {
        CollectiveOp::Broadcast | CollectiveOp::Move => {
            let mut ranks = vec![from[0]];
            for &w in to {
                if !ranks.contains(&w) {
                    ranks.push(w);
                }
            }
            Ok(ranks)
        }
        CollectiveOp::AllReduce(_) | CollectiveOp::AllGather { .. } | CollectiveOp::ReduceScatter { .. } => {
            for (i, (&f, &t)) in from.iter().zip(to).enumerate() {
                if f != t {
                    return Err(RankError::Split { i, from: f, to: t });
                }
                if let Some(j) = from[..i].iter().position(|&o| o == f) {
                    return Err(RankError::Shared { i: j, j: i, worker: f });
                }
            }
            Ok(from.to_vec())
        }
    }
}

/// The worker a client's instruction `op` goes to when no pass placed it: its home, chosen
/// (the least loaded) at its first instruction.
fn home(workers: &mut [Worker], ns: &mut Namespace, op: &str) -> Result<usize, Failure> {
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
        Reply::Data { seq, ty, .. } => ("Data", format!("#{seq} {ty}")),
        Reply::Synced { seq } => ("Synced", format!("#{seq}")),
        Reply::Stats { seq, workers, .. } => ("Stats", format!("#{seq} workers={}", workers.len())),
        Reply::Rejected { message } => ("Rejected", message.clone()),
        Reply::Ping => ("Ping", String::new()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What is kept of an instruction as it is placed ([`Dispatcher::keeps`]).
#[derive(Debug, Clone, Copy)]
enum Keep {
    /// Nobody times it.
    Nothing,
    /// Its result types, for the log's EXEC event.
    Types,
    /// Everything a profile row says, with the hot path it was released in.
    Profile { hotpath: Option<(u64, u64)> },
}

/// What `keep` asks of an instruction in the client's ids: its result types `types`, and for
/// a profile its operand types (looked up in `ns`), cost and structure hash.
fn facts(keep: Keep, instr: &Instr, types: &[TensorType], ns: &Namespace) -> Option<Facts> {
    let hotpath = match keep {
        Keep::Nothing => return None,
        Keep::Types => return Some(Facts { types: types.to_vec(), ..Facts::default() }),
        Keep::Profile { hotpath } => hotpath,
    };
    let inputs: Vec<TensorType> = instr.operands().iter().filter_map(|&v| ns.type_of(v).cloned()).collect();
    let cost = gt_ir::cost::cost(instr, &inputs, types);
    let shapes: String = inputs.iter().map(|t| format!("{t};")).collect();
    let hash = gt_ir::structure::structure_hash(instr, shapes.as_bytes());
    Some(Facts { types: types.to_vec(), inputs, cost, hash, hotpath })
}

/// Participant `rank`'s part of `collective` (whose facts are `whole`): the operand it holds
/// (`broadcast` and `move` have one, at rank 0) and the results it receives (`mine`).
fn part_facts(collective: &Instr, whole: &Facts, mine: &[usize], rank: usize) -> Facts {
    let holds = match collective {
        Instr::Collective { op: CollectiveOp::Broadcast | CollectiveOp::Move, .. } if rank > 0 => None,
        Instr::Collective { op: CollectiveOp::Broadcast | CollectiveOp::Move, .. } => whole.inputs.first(),
        _ => whole.inputs.get(rank),
    };
    let inputs: Vec<TensorType> = holds.cloned().into_iter().collect();
    let types: Vec<TensorType> = mine.iter().filter_map(|&i| whole.types.get(i).cloned()).collect();
    let cost = gt_ir::cost::cost(collective, &inputs, &types);
    Facts { types, inputs, cost, hash: whole.hash, hotpath: whole.hotpath }
}

#[cfg(test)]
mod tests {
    use super::{collective_ranks, RankError};
    use gt_ir::{CollectiveOp, ReduceOp};

    #[test]
    fn collective_ranks_follow_the_participants() {
        let all_reduce = CollectiveOp::AllReduce(ReduceOp::Sum);
        assert_eq!(collective_ranks(all_reduce, &[2, 0, 1], &[2, 0, 1]), Ok(vec![2, 0, 1]));
        assert_eq!(collective_ranks(all_reduce, &[2, 0], &[2, 1]), Err(RankError::Split { i: 1, from: 0, to: 1 }));
        assert_eq!(
            collective_ranks(CollectiveOp::AllGather { axis: 0 }, &[1, 0, 1], &[1, 0, 1]),
            Err(RankError::Shared { i: 0, j: 2, worker: 1 })
        );
        // A broadcast's root first, then each other receiving worker once.
        assert_eq!(collective_ranks(CollectiveOp::Broadcast, &[1], &[0, 1, 2, 0]), Ok(vec![1, 0, 2]));
        assert_eq!(collective_ranks(CollectiveOp::Move, &[2], &[0]), Ok(vec![2, 0]));
    }
}
