//! The worker: a DEALER connected to the dispatcher that executes its stream in order on a
//! backend (the CPU interpreter or, with the `cuda` feature, a GPU), one batch at a time, and keeps per-op counts and
//! times (`gt-run --worker-stats`, the seeds' `print_worker_stats`).
//!
//! Every batch is answered with `Done`, listing each instruction that failed, so a failure in
//! the middle of a batch is reported for that instruction (the Python GT answered success).
//!
//! A worker also binds a peer socket ([`ZmqCollectives`]) at start and sends its address in
//! `Register`: a batch's exchanges are its parts of collectives across workers (`exchange.rs`),
//! which it runs in batch order with the other workers of each group.

use crate::backend::{Backend, BackendError, BackendKind};
use crate::cancel::{self, Watch, Why};
use crate::collective::{CollectiveError, Collectives, ZmqCollectives};
use crate::exchange;
use crate::Interpreter;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use gt_ir::data::Elements;
use gt_ir::kernel::Precision;
use gt_ir::{HostTensor, Instr, ValueId};
use gt_transport::doorbell::Answer;
use gt_transport::message::{
    Exchange, Failure, FailureKind, OpStats, SyncBell, Timing, WorkerCommand, WorkerEvent, WorkerStats,
};
use gt_transport::socket::HandshakeFailure;
use gt_transport::{codec, lane, loan, socket, ClusterKey, CodecError, Endpoint, Inbound, InboundRef};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use thiserror::Error;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Its name in logs and stats.
    pub name: String,
    /// Largest message accepted or sent.
    pub max_message_bytes: usize,
    /// Largest tensor the interpreter may allocate.
    pub max_tensor_bytes: usize,
    /// How long to wait for the dispatcher's welcome.
    pub register_timeout: Duration,
    /// What executes the stream.
    pub backend: BackendKind,
    /// How a GPU backend multiplies matrices.
    pub matmul_precision: Precision,
    /// Whether the CPU backend compiles `fused` kernels (`GT_JIT`, on by default).
    pub jit: bool,
    /// The most bytes its values may hold at once (`GT_WORKER_MEMORY`).
    pub memory_budget: usize,
    /// Compute threads for large work on a CPU worker (`GT_THREADS`, `--threads`).
    pub threads: usize,
    /// How long a collective waits for a peer (`GT_COLLECTIVE_TIMEOUT`).
    pub collective_timeout: Duration,
    /// How long one instruction may run before it is cancelled (`GT_OP_TIMEOUT`; `None`:
    /// as long as it takes).
    pub op_timeout: Option<Duration>,
    /// The cluster key (`--key`, `GT_KEY_FILE`): the dispatcher and peers are reached over TCP
    /// with CURVE, and the peer socket lets in only the key's holders.
    pub key: Option<ClusterKey>,
    /// How long the worker polls for its next command before it sleeps (`GT_SPIN_US`,
    /// [`socket::poll_spinning`]).
    pub spin: Duration,
    /// Whether a worker on `inproc://` offers its dispatcher a lane (`GT_LANE`, default on;
    /// [`gt_transport::lane`]).
    pub lane: bool,
}

impl WorkerOptions {
    /// Defaults for a worker called `name`.
    pub fn named(name: impl Into<String>) -> WorkerOptions {
        WorkerOptions {
            name: name.into(),
            max_message_bytes: codec::DEFAULT_MAX_MESSAGE_BYTES,
            max_tensor_bytes: Interpreter::DEFAULT_MAX_TENSOR_BYTES,
            register_timeout: Duration::from_secs(10),
            backend: BackendKind::Cpu,
            matmul_precision: Precision::F32,
            jit: true,
            memory_budget: crate::config::default_worker_memory(),
            threads: crate::config::cores(),
            collective_timeout: crate::config::DEFAULT_COLLECTIVE_TIMEOUT,
            op_timeout: None,
            key: None,
            spin: socket::DEFAULT_SPIN,
            lane: true,
        }
    }
}

/// Why a worker stopped with an error.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// A socket failed.
    #[error("worker socket error: {0}")]
    Zmq(#[from] gt_transport::zmq::Error),
    /// The dispatcher's host name does not resolve.
    #[error("no dispatcher at {endpoint}: the host `{host}` is unknown ({why})")]
    UnknownHost {
        /// Where it was looked for.
        endpoint: Endpoint,
        /// The host named.
        host: String,
        /// What the resolver said.
        why: std::io::Error,
    },
    /// No dispatcher answered the registration.
    #[error("no dispatcher answered at {endpoint} within {} s (is `gt server` running there?)", .waited.as_secs())]
    NoDispatcher {
        /// Where it was looked for.
        endpoint: Endpoint,
        /// How long.
        waited: Duration,
    },
    /// The dispatcher did not let this worker in: the security handshake failed.
    #[error(
        "the dispatcher at {endpoint} did not let this worker in: {why}; every member of a cluster needs the same key file (`gt keygen`, then `--key FILE` or GT_KEY_FILE on the server, workers and clients)"
    )]
    Handshake {
        /// Where.
        endpoint: Endpoint,
        /// What the handshake said.
        why: HandshakeFailure,
    },
    /// The dispatcher went away (it stopped, or the connection broke).
    #[error("lost the dispatcher at {0}")]
    DispatcherGone(Endpoint),
    /// The dispatcher went away and did not come back in time.
    #[error("lost the dispatcher at {endpoint}; it did not come back within {} s", .waited.as_secs())]
    DispatcherLost {
        /// Where it was.
        endpoint: Endpoint,
        /// How long the worker tried to register again.
        waited: Duration,
    },
    /// The backend could not start (no GPU, no driver, a build without CUDA).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Its compute threads could not start.
    #[error(transparent)]
    Threads(#[from] crate::backend::cpu::threads::ThreadsError),
    /// Its peer socket (for collectives) could not be bound.
    #[error(transparent)]
    Peer(#[from] CollectiveError),
    /// The thread that watches running instructions could not start.
    #[error("cannot start the worker's watcher thread: {0}")]
    Watcher(std::io::Error),
}

/// Per-op counters.
#[derive(Debug, Default)]
struct Stats {
    instructions: u64,
    failures: u64,
    batches: u64,
    reads: u64,
    /// Instructions of departed clients not run.
    skipped: u64,
    /// Instructions cancelled while they ran.
    cancelled: u64,
    ops: OpCounters,
}

/// Each op's count and nanoseconds, by the op's name. A worker runs a few dozen ops at
/// most, and its mnemonics are static strings: a look by address over a short list costs a
/// few ns per instruction, where hashing the name cost tens.
#[derive(Debug, Default)]
struct OpCounters(Vec<(&'static str, (u64, u64))>);

impl OpCounters {
    fn entry(&mut self, op: &'static str) -> &mut (u64, u64) {
        let k = match self.0.iter().position(|(name, _)| std::ptr::eq(*name, op)) {
            Some(k) => k,
            // The same name at another address (another crate's copy of the literal).
            None => match self.0.iter().position(|(name, _)| *name == op) {
                Some(k) => k,
                None => {
                    self.0.push((op, (0, 0)));
                    self.0.len() - 1
                }
            },
        };
        &mut self.0[k].1
    }

    #[cfg(test)]
    fn get(&self, op: &str) -> Option<&(u64, u64)> {
        self.0.iter().find(|(name, _)| *name == op).map(|(_, counts)| counts)
    }

    fn iter(&self) -> impl Iterator<Item = (&'static str, &(u64, u64))> {
        self.0.iter().map(|(name, counts)| (*name, counts))
    }
}

/// The worker's socket to the dispatcher, and the commands the watcher read from it while
/// an instruction ran (they come before anything still in the socket).
struct Link {
    sock: gt_transport::zmq::Socket,
    inbox: VecDeque<WorkerCommand>,
    /// Its lane to an in-process dispatcher, once open: every message both ways goes by it,
    /// and the socket carries wakes.
    lane: Option<OpenLane>,
}

/// An open lane: the worker's inbox, the dispatcher's, and the routing id to send with.
struct OpenLane {
    inbox: lane::Inbox,
    out: lane::Outbox,
    identity: Vec<u8>,
}

impl Link {
    /// The next message already here, by the lane when open (`Err`: the dispatcher is gone).
    fn try_recv(&mut self) -> Result<Option<lane::Parcel>, lane::Gone> {
        match &self.lane {
            Some(open) => open.inbox.try_recv(),
            None => Ok(socket::recv_frames(&self.sock, gt_transport::zmq::DONTWAIT).ok().map(lane::Parcel::Frames)),
        }
    }

    /// Sends a message by the open lane `open`, waking the dispatcher through the socket if
    /// it sleeps (a dispatcher gone is `EAGAIN`, as for a send by the socket).
    fn push(sock: &gt_transport::zmq::Socket, open: &OpenLane, parcel: lane::Parcel) -> gt_transport::zmq::Result<()> {
        let wake = || socket::retry(|| sock.send(&[][..], gt_transport::zmq::DONTWAIT));
        open.out.send(parcel, wake).map_err(|lane::Gone| gt_transport::zmq::Error::EAGAIN)
    }

    /// Sends an event, by the lane as it is when open, else encoded.
    fn send_event(&mut self, event: WorkerEvent, max: usize) -> gt_transport::zmq::Result<()> {
        if let Some(open) = &self.lane {
            let parcel = lane::Parcel::Inbound(open.identity.clone(), Inbound::Worker(event));
            return Link::push(&self.sock, open, parcel);
        }
        // Every event but `Data` (sent by `send`, with its frame) is small.
        self.send(codec::encode(&InboundRef::Worker(&event), max).expect("small"), None)
    }

    /// Sends an encoded event and its data frame, by the lane when open.
    fn send(&mut self, head: Vec<u8>, data: Option<HostTensor>) -> gt_transport::zmq::Result<()> {
        use gt_transport::zmq::{DONTWAIT, SNDMORE};
        if let Some(open) = &self.lane {
            let frames = lane::frames(Some(&open.identity), head, data.map(|d| loan::frame(d.data)));
            return Link::push(&self.sock, open, frames);
        }
        match data {
            None => socket::retry(|| self.sock.send(&head[..], DONTWAIT)),
            Some(HostTensor { data, .. }) => socket::retry(|| self.sock.send(&head[..], SNDMORE | DONTWAIT))
                .and_then(|()| loan::send(&mut self.sock, data, DONTWAIT)),
        }
    }
}

/// How often the watcher looks at the running instruction.
const WATCH_PERIOD: Duration = Duration::from_millis(10);

/// A command from the dispatcher, as it came by the lane or decoded from its frames; `None`
/// (logged) for one that does not decode.
fn command_of(parcel: lane::Parcel, max: usize, name: &str) -> Option<WorkerCommand> {
    match parcel {
        lane::Parcel::Command(command) => Some(command),
        lane::Parcel::Frames(frames) => decode_command(frames, max, name),
        lane::Parcel::Inbound(..) => {
            tracing::warn!(target: "gt::worker", "{name}: dropped a message by the lane that is not a command");
            None
        }
    }
}

/// A command from the dispatcher, or `None` (logged) for a frame that does not decode.
fn decode_command(frames: Vec<gt_transport::zmq::Message>, max: usize, name: &str) -> Option<WorkerCommand> {
    let dropped =
        |e: CodecError| tracing::warn!(target: "gt::worker", "{name}: dropped a message from the dispatcher: {e}");
    let mut frames = frames.into_iter();
    let mut command = codec::decode(&frames.next()?, max).map_err(dropped).ok()?;
    let literals: Vec<_> = frames.collect();
    match &mut command {
        // A batch's large literals come as frames of their own. Should they not match, the
        // batch still runs: a literal left without its data fails, and its client is told.
        WorkerCommand::Exec { instrs, .. } => {
            if let Err(e) = codec::attach_literals(instrs, literals) {
                tracing::warn!(target: "gt::worker", "{name}: a batch's literal data: {e}");
            }
        }
        _ if !literals.is_empty() => {
            tracing::warn!(target: "gt::worker", "{name}: dropped {} data frames after a message that has none", literals.len());
        }
        _ => {}
    }
    Some(command)
}

/// The watcher: while an instruction has run longer than a period, it reads what the
/// dispatcher sent meanwhile (the worker's thread is busy) and cancels the instruction when
/// its client left (`DropClient`) or when it ran past `timeout`. It ends with the worker.
fn watch_running(
    link: Weak<Mutex<Link>>,
    watch: Arc<Watch>,
    timeout: Option<Duration>,
    epoch: Instant,
    max: usize,
    name: String,
) {
    let mut seen = 0;
    loop {
        std::thread::sleep(WATCH_PERIOD);
        let Some(link) = link.upgrade() else { return };
        let Some((n, owner, started)) = watch.running() else { continue };
        // Only an instruction seen on the last look too: short ones never meet the watcher.
        if std::mem::replace(&mut seen, n) != n {
            continue;
        }
        let ran = Duration::from_nanos((epoch.elapsed().as_nanos() as u64).saturating_sub(started));
        if let Some(limit) = timeout.filter(|limit| ran >= *limit) {
            watch.cancel(n, Why::Timeout(limit));
        }
        // The worker's thread holds the socket only to send or receive, never while it computes.
        let Ok(mut guard) = link.try_lock() else { continue };
        // (A dispatcher gone is the worker's thread's to see.)
        while let Ok(Some(parcel)) = guard.try_recv() {
            let Some(command) = command_of(parcel, max, &name) else { continue };
            if matches!(command, WorkerCommand::DropClient { client } if client == owner) {
                watch.cancel(n, Why::ClientLeft);
            }
            guard.inbox.push_back(command);
        }
    }
}

/// [`run_worker`], registering again (with a fresh backend: the dispatcher let go of the
/// old values when it lost the worker) whenever the dispatcher goes away, for up to `window`
/// each time: a dispatcher that was restarted, or paused past the heartbeat timeout, gets its
/// worker back. A `window` of zero stops at the first loss.
pub fn run_worker_reconnecting(
    ctx: &gt_transport::zmq::Context,
    endpoint: &Endpoint,
    options: &WorkerOptions,
    window: Duration,
) -> Result<(), WorkerError> {
    let mut attempt = options.clone();
    // Set once the dispatcher was lost: until when to keep registering again.
    let mut lost: Option<Instant> = None;
    loop {
        match run_worker(ctx, endpoint, &attempt) {
            Err(WorkerError::DispatcherGone(_)) if !window.is_zero() => {
                tracing::warn!(target: "gt::worker", "{}: lost the dispatcher at {endpoint}; registering again for up to {} s", options.name, window.as_secs());
                attempt.register_timeout = window;
                lost = Some(Instant::now() + window);
            }
            // A dispatcher dying as the connection is made hangs up mid-handshake: that
            // says nothing about keys while it is coming back.
            Err(WorkerError::Handshake { why: HandshakeFailure::Closed, .. })
                if lost.is_some_and(|until| Instant::now() < until) =>
            {
                std::thread::sleep(Duration::from_millis(100));
                let until = lost.unwrap_or_else(Instant::now);
                attempt.register_timeout =
                    until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            }
            Err(
                WorkerError::NoDispatcher { endpoint, .. }
                | WorkerError::Handshake { endpoint, why: HandshakeFailure::Closed },
            ) if lost.is_some() => {
                return Err(WorkerError::DispatcherLost { endpoint, waited: window });
            }
            done => return done,
        }
    }
}

/// Waits up to `timeout` for the dispatcher's first message, failing at once when the
/// connection's handshake fails (a dispatcher with another key, or none, never answers).
fn wait_for_welcome(
    sock: &gt_transport::zmq::Socket,
    events: Option<&gt_transport::zmq::Socket>,
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<(), WorkerError> {
    use gt_transport::zmq::{poll, POLLIN};
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // ZeroMQ retries a name that does not resolve quietly: say so rather than blame
            // a missing server.
            if let Some((host, why)) = gt_transport::endpoint::unresolvable_host(&endpoint.to_string()) {
                return Err(WorkerError::UnknownHost { endpoint: endpoint.clone(), host, why });
            }
            return Err(WorkerError::NoDispatcher { endpoint: endpoint.clone(), waited: timeout });
        }
        let mut items = vec![sock.as_poll_item(POLLIN)];
        items.extend(events.map(|e| e.as_poll_item(POLLIN)));
        socket::retry(|| poll(&mut items, left.as_millis().max(1) as i64))?;
        if items[0].is_readable() {
            return Ok(());
        }
        if let Some(why) = events.map(socket::handshake_failure).transpose()?.flatten() {
            return Err(WorkerError::Handshake { endpoint: endpoint.clone(), why });
        }
    }
}

/// Connects to the dispatcher at `endpoint`, registers, and executes until told to shut down.
pub fn run_worker(
    ctx: &gt_transport::zmq::Context,
    endpoint: &Endpoint,
    options: &WorkerOptions,
) -> Result<(), WorkerError> {
    // The backend first: a worker that cannot execute should not register.
    crate::backend::cpu::threads::use_threads(options.threads, options.spin)?;
    let mut backend = options.backend.start(
        options.max_tensor_bytes,
        options.memory_budget,
        options.matmul_precision,
        options.jit,
    )?;
    // The peer socket on a transport like the dispatcher's, so that peers that reach the
    // dispatcher reach each other the same way.
    let mut net = ZmqCollectives::bind(
        ctx,
        endpoint,
        &options.name,
        options.collective_timeout,
        options.max_message_bytes,
        options.key.clone(),
    )?;
    // Its connection's events are watched from before it connects, so that neither a refused
    // handshake nor a disconnect once the dispatcher knows this worker goes unseen.
    let (sock, events) = socket::dealer(ctx, endpoint, options.max_message_bytes, options.key.as_ref())?;
    let max = options.max_message_bytes;
    // The worker's clock: timings are nanoseconds since here; the dispatcher maps them onto
    // its own timeline from the clock readings in `Register` and each `Pong`.
    let epoch = Instant::now();
    let clock = || epoch.elapsed().as_nanos() as u64;
    // A lane, offered to a dispatcher in this process (over `inproc://`).
    let offer = (options.lane && matches!(endpoint, Endpoint::Inproc(_))).then(lane::offer);
    let register = Inbound::Worker(WorkerEvent::Register {
        name: options.name.clone(),
        backend: backend.name().into(),
        clock: clock(),
        peer: net.address().to_string(),
        process: gt_transport::doorbell::process_key(),
        lane: offer.as_ref().map(|(offer, _)| offer.key()),
    });
    let register = codec::encode(&register, max).expect("a registration is small");
    if let Err(e) = socket::retry(|| sock.send(&register[..], gt_transport::zmq::DONTWAIT)) {
        // A handshake refused before the registration left drops the connection it was
        // queued on: say why rather than that a send failed.
        let refused = match (e, &events) {
            (gt_transport::zmq::Error::EAGAIN, Some(ev)) => {
                socket::handshake_failure_within(ev, socket::HANDSHAKE_REPORT)?
            }
            _ => None,
        };
        return Err(
            refused.map_or(WorkerError::from(e), |why| WorkerError::Handshake { endpoint: endpoint.clone(), why })
        );
    }
    wait_for_welcome(&sock, events.as_ref(), endpoint, options.register_timeout)?;
    // The welcome is on the socket; once it is read, the lane is open if the dispatcher took
    // it (it did before it sent the welcome).
    let mut inbox = VecDeque::new();
    while let Ok(frames) = socket::recv_frames(&sock, gt_transport::zmq::DONTWAIT) {
        inbox.extend(decode_command(frames, max, &options.name));
    }
    let lane =
        offer.and_then(|(offer, inbox)| offer.accepted().map(|(out, identity)| OpenLane { inbox, out, identity }));
    // From here the link is shared with the watcher, which reads it while an instruction
    // runs long (see `watch_running`).
    let link = Arc::new(Mutex::new(Link { sock, inbox, lane }));
    let lock = || -> MutexGuard<'_, Link> { link.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) };
    let watch = Watch::new();
    cancel::install(Some(watch.clone()));
    {
        let (link, watch, name) = (Arc::downgrade(&link), watch.clone(), options.name.clone());
        let timeout = options.op_timeout;
        std::thread::Builder::new()
            .name(format!("gt-watch-{}", options.name))
            .spawn(move || watch_running(link, watch, timeout, epoch, max, name))
            .map_err(WorkerError::Watcher)?;
    }
    let mut stats = Stats::default();
    // Never block on a send: with no dispatcher to send to (an in-process one that stopped),
    // a blocking send would wait forever.
    let gone = || WorkerError::DispatcherGone(endpoint.clone());
    // (Sent from a slice so that a send a signal interrupted can be made again.)
    let sent = |r: gt_transport::zmq::Result<()>| match r {
        Err(gt_transport::zmq::Error::EAGAIN) => Err(gone()),
        r => r.map_err(WorkerError::from),
    };
    let send_frames = |head: Vec<u8>, data: Option<HostTensor>| sent(lock().send(head, data));
    let send = |event: WorkerEvent| sent(lock().send_event(event, max));
    // A read's answer: its type, then its data as a frame of raw bytes (its buffer lent, so
    // a client in this process takes it without a copy); a value over the message limit is
    // a failure named to the client.
    let send_data = |tag: u64, HostTensor { ty, data }: HostTensor| -> Result<(), WorkerError> {
        let size = ty.size_bytes();
        if size > max {
            let why = format!("get: {ty} is {size} bytes, over the message limit of {max} (GT_MAX_MESSAGE_BYTES)");
            return send(WorkerEvent::Failed { tag, failure: Failure::new(FailureKind::Limit, why) });
        }
        let event = WorkerEvent::Data { tag, ty: ty.clone(), file: false };
        let head = codec::encode(&InboundRef::Worker(&event), max).expect("small");
        send_frames(head, Some(HostTensor { ty, data }))
    };
    // Clients' shared answer files this worker has open, by name.
    let mut answer_files: HashMap<String, gt_transport::shared::AnswerWriter> = HashMap::new();
    // Commands read but not yet run, and the clients that left: everything already here is
    // read before each command runs, so the work a departed client queued is skipped.
    let mut queue: VecDeque<WorkerCommand> = VecDeque::new();
    let mut dropped: HashSet<u64> = HashSet::new();
    // Clients with an instruction failed here since their last sync by doorbell: their next
    // one is answered by the dispatcher, which reports the failure first.
    let mut failed: HashSet<u64> = HashSet::new();
    // A batch's `Done` held while the read right behind it rings the client's doorbell.
    let mut held_done: Option<WorkerEvent> = None;
    let release = |held: &mut Option<WorkerEvent>| held.take().map_or(Ok(()), send);
    let take =
        |command: WorkerCommand, queue: &mut VecDeque<WorkerCommand>, (dropped, failed): Clients<'_>| match command {
            WorkerCommand::DropClient { client } => {
                dropped.insert(client);
                failed.remove(&client);
            }
            c => queue.push_back(c),
        };
    loop {
        {
            let mut guard = lock();
            for command in guard.inbox.drain(..) {
                take(command, &mut queue, (&mut dropped, &mut failed));
            }
            let Link { sock, lane, .. } = &mut *guard;
            if queue.is_empty() {
                let parcel = if let Some(open) = lane {
                    let wait = socket::LaneWait { inbox: &open.inbox, sock, messages: None };
                    // (A bounded sleep: a wake lost by a bug would cost a second, not the worker.)
                    match socket::recv_lane_waiting(&wait, None, options.spin, 1000)? {
                        socket::Waited::Parcel(parcel) => Some(parcel),
                        socket::Waited::Frames(frames) => Some(lane::Parcel::Frames(frames)),
                        socket::Waited::Gone => return Err(gone()),
                        socket::Waited::Rung | socket::Waited::TimedOut => None,
                    }
                } else if let Some(ev) = &events {
                    let mut items =
                        [sock.as_poll_item(gt_transport::zmq::POLLIN), ev.as_poll_item(gt_transport::zmq::POLLIN)];
                    socket::poll_spinning(&mut items, options.spin, -1)?;
                    if !items[0].is_readable() && items[1].is_readable() {
                        return Err(gone());
                    }
                    Some(lane::Parcel::Frames(socket::recv_frames(sock, 0)?))
                } else {
                    socket::recv_waiting(sock, options.spin, -1)?.map(lane::Parcel::Frames)
                };
                if let Some(c) = parcel.and_then(|parcel| command_of(parcel, max, &options.name)) {
                    take(c, &mut queue, (&mut dropped, &mut failed));
                }
            }
            loop {
                match guard.try_recv() {
                    Ok(Some(parcel)) => {
                        if let Some(c) = command_of(parcel, max, &options.name) {
                            take(c, &mut queue, (&mut dropped, &mut failed));
                        }
                    }
                    Ok(None) => break,
                    Err(lane::Gone) => return Err(gone()),
                }
            }
        }
        let Some(cmd) = queue.pop_front() else { continue };
        if !matches!(cmd, WorkerCommand::Get { .. }) {
            release(&mut held_done)?;
        }
        match cmd {
            WorkerCommand::Welcome { worker } => {
                tracing::info!(target: "gt::worker", "{} registered as worker {worker} at {endpoint}", options.name);
                send(WorkerEvent::Pong { clock: clock() })?;
            }
            WorkerCommand::Exec { batch, mut instrs, owners, timed, exchanges, doorbell } => {
                let start = Instant::now();
                let mut timings = timed.then(Vec::new);
                let batch_ref =
                    BatchRef { instrs: &mut instrs, exchanges: &exchanges, owners: &owners, dropped: &dropped };
                let watching = Watching { watch: &watch, timeout: options.op_timeout, epoch };
                let failures =
                    execute_batch((backend.as_mut(), &mut net), &mut stats, batch_ref, &watching, timings.as_mut());
                let nanos = start.elapsed().as_nanos() as u64;
                tracing::debug!(target: "gt::worker", "{}: batch {batch}: {} instructions, {} failed, {nanos} ns", options.name, instrs.len(), failures.len());
                // Rung before `Done` leaves: the client wakes one hop sooner.
                note_failures((&failures, &owners), (&mut dropped, &mut failed));
                let rang =
                    doorbell.is_some_and(|b| may_ring(&b, &mut failed) && gt_transport::doorbell::ring(b.key, b.seq));
                let (timings, live_bytes) = (timings.unwrap_or_default(), backend.live_bytes() as u64);
                let done = WorkerEvent::Done { batch, failures, nanos, timings, live_bytes, rang };
                // A read waiting right behind, which a doorbell may answer (`x.item()` after
                // its op): its ring goes first, then this, then the read's own event.
                match queue.front() {
                    Some(WorkerCommand::Get { doorbell: Some(_), .. }) => held_done = Some(done),
                    _ => send(done)?,
                }
            }
            WorkerCommand::DropClient { client } => {
                answer_files.retain(|name, _| !gt_transport::shared::is_answer_file_of(name, client));
            }
            WorkerCommand::Get { tag, value, doorbell, file } => {
                stats.reads += 1;
                // Into the client's shared file, straight from where the value lies, when the
                // read names one this worker can write; else by the dispatcher.
                let shared = file.filter(|_| doorbell.is_none());
                if let Some(ty) =
                    shared.and_then(|name| write_shared(&mut answer_files, &name, backend.as_mut(), value))
                {
                    release(&mut held_done)?;
                    let event = WorkerEvent::Data { tag, ty, file: true };
                    send_frames(codec::encode(&InboundRef::Worker(&event), max).expect("small"), None)?;
                    continue;
                }
                // Through the client's doorbell when it may (the data moves, no copy), else
                // by the dispatcher.
                let answer = match backend.read(value) {
                    Ok(HostTensor { ty, data }) => match doorbell.filter(|b| may_ring(b, &mut failed)) {
                        Some(b) => {
                            let answer = Answer { ty: ty.clone(), data, receipt: b.receipt };
                            match gt_transport::doorbell::ring_with(b.key, b.seq, answer) {
                                Ok(()) => ReadAnswer::Rung(ty),
                                Err(Answer { ty, data, .. }) => ReadAnswer::Data(HostTensor { ty, data }),
                            }
                        }
                        None => ReadAnswer::Data(HostTensor { ty, data }),
                    },
                    Err(e) => ReadAnswer::Failed(Failure::new(e.kind(), e.to_string())),
                };
                // The batch held for this read goes first.
                release(&mut held_done)?;
                match answer {
                    ReadAnswer::Data(data) => send_data(tag, data)?,
                    ReadAnswer::Rung(ty) => send(WorkerEvent::Rung { tag, ty })?,
                    ReadAnswer::Failed(failure) => send(WorkerEvent::Failed { tag, failure })?,
                }
            }
            WorkerCommand::Stats { tag } => {
                let stats = snapshot(&options.name, &stats, backend.as_ref());
                send(WorkerEvent::Stats { tag, stats })?;
            }
            WorkerCommand::Ping => send(WorkerEvent::Pong { clock: clock() })?,
            WorkerCommand::Shutdown => return Ok(()),
        }
    }
}

/// Writes `value` into the client's shared answer file `name` (opened the first time, then
/// kept) where the backend holds it, without a copy: its type, or `None` when the file cannot
/// be opened or written or the backend cannot hand the value over (the read then goes as
/// data).
fn write_shared(
    files: &mut HashMap<String, gt_transport::shared::AnswerWriter>,
    name: &str,
    backend: &mut dyn Backend,
    value: ValueId,
) -> Option<gt_ir::TensorType> {
    if !files.contains_key(name) {
        match gt_transport::shared::AnswerWriter::open(name) {
            Ok(file) => files.insert(name.to_string(), file),
            Err(e) => {
                tracing::debug!(target: "gt::worker", "answers by the dispatcher: cannot open {name}: {e}");
                return None;
            }
        };
    }
    let file = files.get_mut(name)?;
    let mut written = None;
    backend.with_bytes(value, &mut |ty, bytes| written = Some((ty, file.write(bytes))));
    match written? {
        (ty, Ok(())) => Some(ty),
        (_, Err(e)) => {
            tracing::debug!(target: "gt::worker", "answers by the dispatcher: cannot write {name}: {e}");
            files.remove(name);
            None
        }
    }
}

/// How a read was answered: its data to send, through the client's doorbell (its type to
/// report), or not at all.
enum ReadAnswer {
    Data(HostTensor),
    Rung(gt_ir::TensorType),
    Failed(Failure),
}

/// The clients that left, and those with a failure since their last sync by doorbell.
type Clients<'a> = (&'a mut HashSet<u64>, &'a mut HashSet<u64>);

/// After a batch ran (its `failures`, the client of each instruction): notes which clients
/// had a failure. A failure whose client is not known (a batch without owners) could be
/// anyone's: no doorbell rings on this worker after one.
fn note_failures((failures, owners): (&[(u32, Failure)], &[u64]), (dropped, failed): Clients<'_>) {
    for (i, _) in failures {
        match owners.get(*i as usize) {
            Some(o) if dropped.contains(o) => {}
            Some(&o) => {
                failed.insert(o);
            }
            None => {
                failed.insert(ANYONE);
            }
        }
    }
}

/// Whether a wait may be answered by its client's doorbell: none of the client's instructions
/// failed here since its last wait given a bell (else the dispatcher answers, after the
/// failures). That wait's bell is spent either way.
fn may_ring(bell: &SyncBell, failed: &mut HashSet<u64>) -> bool {
    !failed.remove(&bell.client) && !failed.contains(&ANYONE)
}

/// In the clients with a failure, one whose client was not known.
const ANYONE: u64 = u64::MAX;

/// A batch's instructions, the exchanges among them, each instruction's client, and the
/// clients that left (whose instructions, but for frees, are skipped).
struct BatchRef<'a> {
    instrs: &'a mut [Instr],
    exchanges: &'a [Exchange],
    owners: &'a [u64],
    dropped: &'a HashSet<u64>,
}

/// Where the running instruction is watched, its time limit, and the worker's clock.
struct Watching<'a> {
    watch: &'a Watch,
    timeout: Option<Duration>,
    epoch: Instant,
}

/// Runs a batch; with `timings`, records when each instruction run started (on the clock
/// that started at `epoch`) and how long it ran: the backend's own device times when it
/// keeps them ([`Backend::take_timings`]), else the host's. Exchanges run their part of a
/// collective through `net`; a skipped one still tells its peers, so none waits for it.
fn execute_batch(
    (backend, net): (&mut dyn Backend, &mut dyn Collectives),
    stats: &mut Stats,
    BatchRef { instrs, exchanges, owners, dropped }: BatchRef<'_>,
    Watching { watch, timeout, epoch }: &Watching<'_>,
    mut timings: Option<&mut Vec<Timing>>,
) -> Vec<(u32, Failure)> {
    let owner = |i: usize| owners.get(i).copied();
    // Clients found gone while this batch ran (the watcher saw them leave).
    let mut left: HashSet<u64> = HashSet::new();
    // A departed client's instructions are skipped, its frees still run.
    let skip = |i: usize, instr: &Instr, left: &HashSet<u64>| {
        !matches!(instr, Instr::Free { .. }) && owner(i).is_some_and(|o| dropped.contains(&o) || left.contains(&o))
    };
    let epoch = *epoch;
    stats.batches += 1;
    let mut failures = Vec::new();
    if timings.is_some() {
        backend.start_timing(epoch);
    }
    // (A garbled batch naming an index twice: the first entry counts.)
    let mut parts: HashMap<usize, &Exchange> = HashMap::new();
    for ex in exchanges {
        parts.entry(ex.index as usize).or_insert(ex);
    }
    // A part whose operand dies with it (freed among the frees right after it) takes the
    // operand from the backend instead of copying it; that free then has nothing to do.
    let mut dying_parts: HashMap<usize, usize> = HashMap::new();
    for &i in parts.keys() {
        let Some(Instr::Collective { dsts, srcs, .. }) = instrs.get(i) else { continue };
        let [src] = srcs[..] else { continue };
        if dsts.contains(&src) {
            continue;
        }
        let mut frees = instrs[i + 1..].iter().take_while(|f| matches!(f, Instr::Free { .. }));
        if let Some(k) = frees.position(|f| *f == Instr::Free { src }) {
            dying_parts.insert(i, i + 1 + k);
        }
    }
    let mut taken: HashSet<usize> = HashSet::new();
    // Untimed, one clock reading per instruction run, not two: each one's end is the next
    // one's start (a reading costs tens of ns, as much as a tiny op's own work). Timed (for
    // the log), each slice is read on its own, so that slices never touch.
    let mut clock = Instant::now();
    for i in 0..instrs.len() {
        let slot = &mut instrs[i];
        let part = parts.get(&i).copied();
        if taken.contains(&i) {
            // Its value went with the collective before it: run, in no time.
            stats.instructions += 1;
            stats.ops.entry(slot.mnemonic()).0 += 1;
            if let Some(t) = timings.as_deref_mut() {
                let start = Instant::now().saturating_duration_since(epoch).as_nanos() as u64;
                t.push(Timing { index: i as u32, start, nanos: 0 });
            }
            continue;
        }
        if skip(i, slot, &left) {
            stats.skipped += 1;
            if let Some(ex) = part {
                net.abort(&exchange::group(ex));
            }
            continue;
        }
        // A literal's data is moved into the backend, not copied (it can be a large upload);
        // what stays behind is the instruction without its elements.
        let literal = match slot {
            Instr::Literal { dst, ty, data } if part.is_none() => {
                Some((*dst, ty.clone(), std::mem::replace(data, Elements::zeros(ty.dtype, 0))))
            }
            _ => None,
        };
        let instr = &instrs[i];
        // Its operands freed right after it, which the backend may write its result over.
        let mut dying: SmallVec<[ValueId; 2]> = SmallVec::new();
        if part.is_none()
            && literal.is_none()
            && matches!(instr, Instr::Unary { .. } | Instr::Binary { .. } | Instr::Fused { .. })
        {
            let operands = instr.operands();
            for f in instrs[i + 1..].iter().map_while(|f| if let Instr::Free { src } = f { Some(src) } else { None }) {
                if operands.contains(f) && !dying.contains(f) {
                    dying.push(*f);
                }
            }
        }
        let op = instr.mnemonic();
        let t0 = if timings.is_some() { Instant::now() } else { clock };
        let number = watch.begin(owner(i).unwrap_or(u64::MAX), t0.saturating_duration_since(epoch).as_nanos() as u64);
        // The interpreter reports bad input as errors; a panic would be a bug, and it must
        // not take the worker (and every client's values) down with it.
        let mut took = false;
        let mut donated = None;
        let consume = dying_parts.contains_key(&i).then_some(&mut took);
        let mut result = catch_unwind(AssertUnwindSafe(|| match (part, literal) {
            (Some(ex), _) => {
                exchange::run(backend, net, instr, ex, consume).map_err(|e| Failure::new(e.kind(), e.to_string()))
            }
            (None, Some((dst, ty, data))) => {
                backend.write(dst, ty, data).map_err(|e| Failure::new(e.kind(), e.to_string()))
            }
            (None, None) => backend
                .execute_donating(instr, &dying)
                .map(|donor| {
                    // Its free (among those right after it) finds the value gone: it has run.
                    let free = donor.and_then(|src| instrs[i + 1..].iter().position(|f| *f == Instr::Free { src }));
                    donated = free.map(|k| i + 1 + k);
                })
                .map_err(|e| Failure::new(e.kind(), e.to_string())),
        }));
        if took {
            taken.extend(dying_parts.get(&i).copied());
        }
        taken.extend(donated);
        let cancelled = watch.end(number, *timeout);
        // A part of a collective is never cancelled: its peers finished theirs with it (its
        // waits are bounded by GT_COLLECTIVE_TIMEOUT instead).
        if let Some(why) = cancelled.filter(|_| part.is_none()) {
            // Its loops stopped early: what it wrote is not its result.
            stats.cancelled += 1;
            if let (Why::ClientLeft, Some(o)) = (why, owner(i)) {
                left.insert(o);
            }
            if matches!(result, Ok(Ok(()))) {
                for src in instr.results() {
                    let _ = backend.execute(&Instr::Free { src });
                }
            }
            result = Ok(Err(Failure::new(FailureKind::Cancelled, why.message(op, t0.elapsed()))));
        }
        if let (Err(_), Some(ex)) = (&result, part) {
            net.abort(&exchange::group(ex));
        }
        clock = Instant::now();
        let dt = clock.saturating_duration_since(t0).as_nanos() as u64;
        if let Some(t) = timings.as_deref_mut() {
            let start = t0.saturating_duration_since(epoch).as_nanos() as u64;
            t.push(Timing { index: i as u32, start, nanos: dt });
        }
        let entry = stats.ops.entry(op);
        entry.0 += 1;
        entry.1 += dt;
        stats.instructions += 1;
        let failure = match result {
            Ok(Ok(())) => continue,
            Ok(Err(failure)) => failure,
            Err(_) => Failure::new(
                FailureKind::Internal,
                format!("{op}: internal error (the backend panicked); please report it"),
            ),
        };
        stats.failures += 1;
        failures.push((i as u32, failure));
    }
    // An asynchronous backend reports failures of queued work here; they belong to the
    // batch, so the last instruction carries them.
    if let (Err(e), Some(last)) = (backend.finish(), instrs.len().checked_sub(1)) {
        let last = last as u32;
        if failures.last().is_none_or(|(i, _)| *i != last) {
            stats.failures += 1;
        }
        failures.retain(|(i, _)| *i != last);
        let message = format!("{e} (while running this batch, up to this instruction)");
        failures.push((last, Failure::new(e.kind(), message)));
    }
    if let Some(t) = timings {
        if let Some(device) = backend.take_timings() {
            // The device's times for the instructions it ran (in order), host times for the rest.
            let mut device = device.into_iter();
            for (timing, d) in t.iter_mut().zip(&mut device) {
                *timing = Timing { index: timing.index, ..d };
            }
        }
    }
    failures
}

fn snapshot(name: &str, stats: &Stats, backend: &dyn Backend) -> WorkerStats {
    let mut ops: Vec<OpStats> = stats
        .ops
        .iter()
        .map(|(op, (count, nanos))| OpStats { op: op.to_string(), count: *count, nanos: *nanos })
        .collect();
    ops.sort_by(|a, b| b.nanos.cmp(&a.nanos).then(a.op.cmp(&b.op)));
    WorkerStats {
        name: name.to_string(),
        backend: backend.name().into(),
        instructions: stats.instructions,
        failures: stats.failures,
        batches: stats.batches,
        reads: stats.reads,
        skipped: stats.skipped,
        cancelled: stats.cancelled,
        live_values: backend.live_values() as u64,
        live_bytes: backend.live_bytes() as u64,
        peak_bytes: backend.peak_bytes() as u64,
        ops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::{Shape, TensorType, UnaryOp, ValueId};
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Counts the allocations of the threads that ask it to ([`counted`]).
    struct Counting;

    thread_local! {
        // `const` and without a destructor, so the allocator may touch it at any time.
        static COUNT: Cell<Option<u64>> = const { Cell::new(None) };
        static BYTES: Cell<u64> = const { Cell::new(0) };
    }

    fn note(bytes: usize) {
        let _ = COUNT.try_with(|c| {
            if let Some(n) = c.get() {
                c.set(Some(n + 1));
                let _ = BYTES.try_with(|b| b.set(b.get() + bytes as u64));
            }
        });
    }

    #[allow(unsafe_code)]
    // SAFETY: forwards every call to `System` unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// `f`'s result, how many allocations this thread made while it ran and their bytes.
    fn counted_bytes<R>(f: impl FnOnce() -> R) -> (R, u64, u64) {
        BYTES.with(|b| b.set(0));
        COUNT.with(|c| c.set(Some(0)));
        let r = f();
        let n = COUNT.with(|c| c.replace(None)).unwrap_or(0);
        (r, n, BYTES.with(Cell::get))
    }

    /// A batch of `n` small ops as a training loop issues them: `neg` of a one-element
    /// value, then the free of the one before.
    fn small_ops(first: u32, n: u32) -> Vec<Instr> {
        let v = ValueId;
        let mut instrs = Vec::new();
        for i in first..first + n {
            instrs.push(Instr::Unary { dst: v(i + 1), op: UnaryOp::Neg, src: v(0) });
            if i > 1 {
                instrs.push(Instr::Free { src: v(i) });
            }
        }
        instrs
    }

    /// A CPU worker's backend and batch runner on this thread, without a dispatcher.
    struct Harness {
        backend: Box<dyn crate::backend::Backend>,
        net: ZmqCollectives,
        _ctx: gt_transport::zmq::Context,
        watch: Arc<Watch>,
        stats: Stats,
    }

    impl Harness {
        fn new(name: &str) -> Harness {
            Harness::on(&gt_transport::zmq::Context::new(), name)
        }

        /// A harness whose collective socket is on `ctx` (peers in this process share one).
        fn on(ctx: &gt_transport::zmq::Context, name: &str) -> Harness {
            let options = WorkerOptions::named(name);
            let backend =
                options.backend.start(options.max_tensor_bytes, 1 << 30, options.matmul_precision, false).unwrap();
            let ctx = ctx.clone();
            let endpoint = Endpoint::Inproc(name.into());
            let net = ZmqCollectives::bind(&ctx, &endpoint, name, Duration::from_secs(1), 1 << 20, None).unwrap();
            Harness { backend, net, _ctx: ctx, watch: Watch::new(), stats: Stats::default() }
        }

        /// Runs `instrs` as one batch: its failures, and the allocations this thread made
        /// meanwhile and their bytes.
        fn run(&mut self, instrs: Vec<Instr>) -> (Vec<(u32, Failure)>, u64, u64) {
            self.run_exchanging(instrs, &[])
        }

        /// [`Harness::run`] of a batch with parts of collectives.
        fn run_exchanging(
            &mut self,
            mut instrs: Vec<Instr>,
            exchanges: &[Exchange],
        ) -> (Vec<(u32, Failure)>, u64, u64) {
            let dropped = HashSet::new();
            let watching = Watching { watch: &self.watch, timeout: None, epoch: Instant::now() };
            let batch = BatchRef { instrs: &mut instrs, exchanges, owners: &[], dropped: &dropped };
            let (backend, net, stats) = (self.backend.as_mut(), &mut self.net, &mut self.stats);
            counted_bytes(|| execute_batch((backend, net), stats, batch, &watching, None))
        }
    }

    #[test]
    fn a_sync_rings_its_doorbell_only_after_no_failure_of_its_client() {
        use gt_transport::doorbell::Doorbell;
        let bell = Doorbell::register();
        let sync = |seq: u64| {
            bell.arm(seq);
            Some(SyncBell { key: bell.key(), client: 7, seq, receipt: 0 })
        };
        let (mut dropped, mut failed) = (HashSet::new(), HashSet::new());
        let failure = || (0, Failure::new(FailureKind::Internal, "boom"));
        // What a worker does after a batch: notes its failures, then rings if it may.
        let ring_doorbell = |bell: Option<SyncBell>, batch: (&[(u32, Failure)], &[u64]), clients: Clients<'_>| {
            let (dropped, failed) = clients;
            note_failures(batch, (&mut *dropped, &mut *failed));
            bell.is_some_and(|b| may_ring(&b, failed) && gt_transport::doorbell::ring(b.key, b.seq))
        };
        // Clean: rung.
        assert!(ring_doorbell(sync(1), (&[], &[7, 7]), (&mut dropped, &mut failed)));
        assert!(bell.rung(1));
        // A failure of client 7 in an earlier batch (not yet reported): the next sync is the
        // dispatcher's; another client's failure does not count; the one after rings again.
        assert!(!ring_doorbell(None, (&[failure()], &[7]), (&mut dropped, &mut failed)));
        assert!(!ring_doorbell(sync(2), (&[], &[7]), (&mut dropped, &mut failed)));
        assert!(!bell.rung(2));
        assert!(!ring_doorbell(None, (&[failure()], &[8]), (&mut dropped, &mut failed)));
        assert!(ring_doorbell(sync(3), (&[], &[7]), (&mut dropped, &mut failed)));
        // A failure in the sync's own batch; an empty batch (the sync after its work left).
        assert!(!ring_doorbell(sync(4), (&[failure()], &[7]), (&mut dropped, &mut failed)));
        assert!(!bell.rung(4));
        assert!(ring_doorbell(sync(5), (&[], &[]), (&mut dropped, &mut failed)));
        // A client that left is not remembered.
        dropped.insert(9);
        ring_doorbell(None, (&[failure()], &[9]), (&mut dropped, &mut failed));
        assert!(!failed.contains(&9));
        // A bell the client declined is not rung: the dispatcher answers.
        let armed = sync(6);
        assert!(!bell.decline(6));
        assert!(!ring_doorbell(armed, (&[], &[7]), (&mut dropped, &mut failed)));
        // A failure of nobody known: no bell rings here again.
        assert!(!ring_doorbell(None, (&[failure()], &[]), (&mut dropped, &mut failed)));
        assert!(!ring_doorbell(sync(7), (&[], &[7]), (&mut dropped, &mut failed)));
        assert!(!ring_doorbell(sync(8), (&[], &[7]), (&mut dropped, &mut failed)));
    }

    #[test]
    fn the_small_op_path_allocates_nothing_in_a_steady_loop() {
        let mut worker = Harness::new("alloc-test");
        let ty = TensorType::new(gt_ir::DType::F32, Shape::new(vec![1]));
        worker.backend.write(ValueId(0), ty, Elements::F32(vec![1.0])).unwrap();
        // Warm up (the stats' map, the values' map at its size), then a steady loop.
        let (failures, _, _) = worker.run(small_ops(1, 100));
        assert!(failures.is_empty(), "{failures:?}");
        let n = 1000;
        let (failures, allocations, _) = worker.run(small_ops(101, n));
        assert!(failures.is_empty(), "{failures:?}");
        let per_op = allocations as f64 / f64::from(n);
        println!("{allocations} allocations for {n} small ops and their frees: {per_op} per op");
        // Nothing: types, operand and result lists are inline, and each result is written
        // into the buffer of the value freed before it (`backend::cpu::spare`).
        assert_eq!(allocations, 0, "{per_op} allocations per small op");
    }

    #[test]
    fn a_collectives_operand_that_dies_with_it_is_taken_not_copied() {
        // Two workers all_reduce 4 MB each; with the operand's free right after the part, the
        // worker hands its buffer to the ring instead of copying it out.
        let n = 1 << 20;
        let operand_bytes = 4 * n as u64;
        let ty = TensorType::new(gt_ir::DType::F32, Shape::new(vec![n]));
        let v = ValueId;
        let part = Instr::Collective {
            dsts: vec![v(1)],
            op: gt_ir::CollectiveOp::AllReduce(gt_ir::ReduceOp::Sum),
            srcs: vec![v(0)],
        };
        let ctx = gt_transport::zmq::Context::new();
        let addresses = std::sync::Mutex::new(vec![String::new(); 2]);
        let ready = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            for rank in 0..2 {
                let (part, ty, ctx, ready, addresses) = (part.clone(), ty.clone(), &ctx, &ready, &addresses);
                scope.spawn(move || {
                    let mut w = Harness::on(ctx, &format!("take-test-{rank}"));
                    addresses.lock().unwrap()[rank] = w.net.address().to_string();
                    ready.wait();
                    let peers = addresses.lock().unwrap().clone();
                    for (id, freed) in [(1, true), (2, false)] {
                        let data = Elements::F32(vec![rank as f32 + 1.0; n]);
                        w.backend.write(v(0), ty.clone(), data).unwrap();
                        let mut instrs = vec![part.clone()];
                        instrs.extend(freed.then_some(Instr::Free { src: v(0) }));
                        let ex = Exchange {
                            index: 0,
                            id,
                            rank: rank as u32,
                            root: 0,
                            peers: peers.clone(),
                            ty: Some(ty.clone()),
                        };
                        let (failures, _, bytes) = w.run_exchanging(instrs, &[ex]);
                        assert!(failures.is_empty(), "{failures:?}");
                        assert_eq!(w.backend.read(v(1)).unwrap().data, Elements::F32(vec![3.0; n]));
                        if freed {
                            // The result alone is left, and the free counted as run.
                            assert_eq!((w.backend.live_values(), w.stats.ops.get("free").map_or(0, |c| c.0)), (1, 1));
                            assert!(bytes < operand_bytes, "{bytes} bytes allocated: the operand was copied");
                        } else {
                            // Kept for later: read out, a copy (what the check above would miss).
                            assert_eq!(w.backend.live_values(), 2);
                            assert!(bytes >= operand_bytes, "{bytes} bytes allocated, yet the operand stays");
                            w.backend.execute(&Instr::Free { src: v(0) }).unwrap();
                        }
                        w.backend.execute(&Instr::Free { src: v(1) }).unwrap();
                    }
                    assert_eq!(w.backend.live_bytes(), 0);
                });
            }
        });
    }

    /// An optimizer's update as it reaches a worker (`t = g lr; w' = w - t; free w; free t`)
    /// writes `w'` over `w`: no bytes allocated for it, `w`'s free counted as run, and the
    /// values left are `g` and `w'`.
    #[test]
    fn an_update_whose_operand_dies_writes_over_it() {
        let mut worker = Harness::new("donate-test");
        let n = 100_000usize;
        let ty = TensorType::new(gt_ir::DType::F32, Shape::new(vec![n]));
        let v = ValueId;
        worker.backend.write(v(0), ty.clone(), Elements::F32((0..n).map(|i| i as f32).collect())).unwrap();
        worker.backend.write(v(1), ty.clone(), Elements::F32(vec![2.0; n])).unwrap();
        let value = |x: ValueId| gt_ir::Operand::Value(x);
        let update = vec![
            Instr::Binary { dst: v(2), op: gt_ir::BinaryOp::Mul, lhs: value(v(1)), rhs: gt_ir::Operand::Scalar(0.5) },
            Instr::Binary { dst: v(3), op: gt_ir::BinaryOp::Sub, lhs: value(v(0)), rhs: value(v(2)) },
            Instr::Free { src: v(0) },
            Instr::Free { src: v(2) },
        ];
        let (failures, _, bytes) = worker.run(update);
        assert!(failures.is_empty(), "{failures:?}");
        // `t` is new (n floats); `w'` is not.
        assert!(bytes < (n * 4 + n * 2) as u64, "{bytes} bytes allocated");
        let w = worker.backend.read(v(3)).unwrap();
        assert_eq!(w.to_f32()[..3], [-1.0, 0.0, 1.0]);
        assert!(worker.backend.read(v(0)).is_err());
        assert_eq!(worker.backend.live_values(), 2);
        assert_eq!(worker.backend.live_bytes(), 2 * n * 4);
        assert_eq!(worker.stats.ops.get("free").map(|(count, _)| *count), Some(2));
        assert_eq!(worker.stats.failures, 0);
    }

    #[test]
    fn large_results_are_computed_in_place_not_copied_after() {
        // A product, a binary and a unary op of f32 values: each allocates its result's
        // bytes once (a result copied after it was computed shows up as twice that).
        let mut worker = Harness::new("bytes-test");
        let (rows, k, cols) = (256usize, 64usize, 512usize);
        for (id, (r, c)) in [(0, (rows, k)), (1, (k, cols)), (2, (rows, cols))] {
            let ty = TensorType::new(gt_ir::DType::F32, Shape::new(vec![r, c]));
            let data = Elements::F32((0..r * c).map(|i| (i % 7) as f32).collect());
            worker.backend.write(ValueId(id), ty, data).unwrap();
        }
        let result_bytes = (rows * cols * 4) as u64;
        let v = ValueId;
        // A first product takes its threads' packing space for good (`gemm` keeps a slab of
        // the L2 cache's size per thread on AVX-512 hosts), which is not a copy of a result.
        let (failures, ..) = worker.run(vec![Instr::MatMul { dst: v(6), lhs: v(0), rhs: v(1) }]);
        assert!(failures.is_empty(), "{failures:?}");
        for instr in [
            Instr::MatMul { dst: v(3), lhs: v(0), rhs: v(1) },
            Instr::Binary {
                dst: v(4),
                op: gt_ir::BinaryOp::Sub,
                lhs: gt_ir::Operand::Value(v(2)),
                rhs: gt_ir::Operand::Value(v(3)),
            },
            Instr::Unary { dst: v(5), op: UnaryOp::Neg, src: v(4) },
        ] {
            let name = instr.mnemonic();
            let (failures, _, bytes) = worker.run(vec![instr]);
            assert!(failures.is_empty(), "{failures:?}");
            assert!(
                (result_bytes..result_bytes + result_bytes / 2).contains(&bytes),
                "{name}: {bytes} bytes allocated for a {result_bytes}-byte result"
            );
        }
    }
}
