//! Wire messages. Clients send [`Request`]s and get [`Reply`]s; the dispatcher sends
//! [`WorkerCommand`]s and workers answer with [`WorkerEvent`]s. What the dispatcher's ROUTER
//! receives is an [`Inbound`]: either peer kind, told apart by the variant.
//!
//! Ordering: ZeroMQ keeps the order of messages between two sockets, and every reply a
//! client waits for is sent after the failures of the ops before it, so a client that
//! reads replies in order sees an async op's failure before the answer of its next wait.

pub use crate::doorbell::DoorbellKey;
pub use crate::lane::LaneKey;
pub use gt_ir::FailureKind;
use gt_ir::{Instr, TensorType, ValueId};
use serde::{Deserialize, Serialize};

/// Why an instruction or request failed, as it travels to the client: a kind a caller can
/// match on, and the message (naming the op and the values) for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What happened.
    pub message: String,
}

impl Failure {
    /// A failure of `kind`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure { kind, message: message.into() }
    }
}

/// Everything that reaches the dispatcher's socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Inbound {
    /// From a client.
    Client(Request),
    /// From a worker.
    Worker(WorkerEvent),
}

/// [`Inbound`] by reference, for sending without a copy; encodes exactly as [`Inbound`]
/// (same enum shape; the codec test checks it).
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename = "Inbound")]
pub enum InboundRef<'a> {
    /// From a client.
    Client(&'a Request),
    /// From a worker.
    Worker(&'a WorkerEvent),
}

/// Client -> dispatcher. `seq` numbers are the client's: one counter over instructions and
/// requests, so every reply and failure names a point of the client's stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// First message: who the client is. The dispatcher answers [`Reply::Welcome`] once at
    /// least one worker is registered, or [`Reply::Rejected`] after `wait_ms`.
    Hello {
        /// A name for logs (`gt-run mlp.gtir`).
        name: String,
        /// How long to wait for a worker to register.
        wait_ms: u64,
        /// The client's doorbell, when it runs in the dispatcher's process (`inproc://`): a
        /// worker there may answer its syncs directly ([`crate::doorbell`]).
        doorbell: Option<DoorbellKey>,
        /// The lane it offers, when it runs in the dispatcher's process: taken, every later
        /// message either way goes by it ([`crate::lane`]).
        lane: Option<LaneKey>,
        /// It runs on the dispatcher's host (`ipc://`) and takes large answers from a file in
        /// shared memory instead of through the socket ([`crate::shared`], [`Reply::Data`]'s
        /// `file`).
        shared_reads: bool,
    },
    /// Instructions, in order, numbered `first_seq..first_seq + instrs.len()`. No reply
    /// unless one fails ([`Reply::Failed`] with its seq).
    Batch {
        /// The seq of the first instruction.
        first_seq: u64,
        /// The instructions, in the client's value ids.
        instrs: Vec<Instr>,
        /// The script line each instruction came from (1-based, 0: unknown), one per
        /// instruction, or empty when the client knows none (profiles report them).
        lines: Vec<u32>,
        /// A sync point right after the instructions, in the same message: a wait costs one
        /// message instead of two (answered as the request it stands for).
        then: Option<Then>,
    },
    /// Sync point: a value's data. Answered by [`Reply::Data`] or [`Reply::Failed`].
    Get {
        /// This request's seq.
        seq: u64,
        /// The value.
        value: ValueId,
        /// The receipt of the last [`Reply::Data`] the client took off its socket (0: none):
        /// it and every answer before it are read. The dispatcher answers no more reads
        /// while a client leaves more than `GT_CLIENT_UNREAD_BYTES` of answers unread.
        read: u64,
    },
    /// Sync point: wait until every instruction sent before has run. Answered by
    /// [`Reply::Synced`] (or [`Reply::Failed`] for this seq).
    Sync {
        /// This request's seq.
        seq: u64,
    },
    /// The statistics of every worker. Answered by [`Reply::Stats`].
    Stats {
        /// This request's seq.
        seq: u64,
    },
    /// The client is leaving: free everything it holds. No reply.
    Bye,
}

/// The sync point a [`Request::Batch`] ends with: [`Request::Sync`] or [`Request::Get`],
/// with the same fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Then {
    /// As [`Request::Sync`].
    Sync {
        /// Its seq.
        seq: u64,
    },
    /// As [`Request::Get`].
    Get {
        /// Its seq.
        seq: u64,
        /// The value.
        value: ValueId,
        /// The receipt of the last answer read.
        read: u64,
    },
}

impl Then {
    /// The sync point a request is, if it is one.
    pub fn of(request: &Request) -> Option<Then> {
        match *request {
            Request::Sync { seq } => Some(Then::Sync { seq }),
            Request::Get { seq, value, read } => Some(Then::Get { seq, value, read }),
            _ => None,
        }
    }

    /// The request it stands for.
    pub fn request(self) -> Request {
        match self {
            Then::Sync { seq } => Request::Sync { seq },
            Then::Get { seq, value, read } => Request::Get { seq, value, read },
        }
    }
}

/// Dispatcher -> client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// The answer to [`Request::Hello`].
    Welcome {
        /// The client's number in logs.
        client: u64,
        /// The workers registered now.
        workers: Vec<WorkerInfo>,
        /// The largest message the dispatcher takes: the client sends nothing larger (it
        /// reports such a batch as failed itself instead of losing its connection).
        max_message_bytes: u64,
    },
    /// The instruction or request `seq` failed.
    Failed {
        /// Its seq.
        seq: u64,
        /// Why, naming the op.
        failure: Failure,
    },
    /// The answer to [`Request::Get`]: the value's type, and in the next frame of the same
    /// ZeroMQ message its data as raw little-endian bytes (`codec::data_frame`), never
    /// through msgpack: the dispatcher passes the worker's frame on untouched.
    Data {
        /// The request's seq.
        seq: u64,
        /// The value's type.
        ty: TensorType,
        /// What the client sends back in its next [`Request::Get`] to say it read this: a
        /// number it cannot guess for an answer it did not take off its socket.
        receipt: u64,
        /// Where the data is instead of the next frame, for a client that asked for shared
        /// reads: the name of a file in its user's shared-memory folder
        /// ([`crate::shared::dir`]), from offset 0. The client takes the data out as it takes
        /// the answer, so the file is written again only after the receipt comes back.
        file: Option<String>,
    },
    /// The answer to [`Request::Sync`].
    Synced {
        /// The request's seq.
        seq: u64,
    },
    /// The answer to [`Request::Stats`].
    Stats {
        /// The request's seq.
        seq: u64,
        /// One entry per live worker.
        workers: Vec<WorkerStats>,
        /// The counters of the passes on this client's stream, in pipeline order.
        passes: Vec<PassStats>,
    },
    /// A message the dispatcher could not take (garbage, another protocol version, an
    /// oversized frame, a request before `Hello`); the client's state is unchanged.
    Rejected {
        /// Why.
        message: String,
    },
    /// A liveness probe; clients ignore it.
    Ping,
}

/// Dispatcher -> worker. Worker value ids are the dispatcher's buffer ids, never a client's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerCommand {
    /// The answer to [`WorkerEvent::Register`]; the worker answers it with a
    /// [`WorkerEvent::Pong`], as a ping.
    Welcome {
        /// The worker's index.
        worker: u32,
    },
    /// Run these instructions in order, then answer [`WorkerEvent::Done`].
    Exec {
        /// The batch's number.
        batch: u64,
        /// The instructions.
        instrs: Vec<Instr>,
        /// The client each instruction came from (as many as `instrs`; empty: none known),
        /// so that the work of a client that left can be skipped ([`WorkerCommand::DropClient`]).
        owners: Vec<u64>,
        /// Whether to report when each instruction started and how long it ran
        /// ([`WorkerEvent::Done`]'s `timings`): asked only while someone reads the log.
        timed: bool,
        /// The instructions that are this worker's part of a collective across workers
        /// (the collective at `instrs[index]`, renamed to this worker's buffers, names only
        /// its local results and operands); every other instruction runs locally.
        exchanges: Vec<Exchange>,
        /// A client's sync that this batch completes, to be answered by ringing the client's
        /// doorbell when the worker is in its process and none of its instructions failed
        /// here since its last such sync ([`WorkerEvent::Done`]'s `rang`).
        doorbell: Option<SyncBell>,
    },
    /// The client left: skip its instructions still queued here (except frees). Sent to
    /// the worker holding its values, ahead of the frees of those values.
    DropClient {
        /// The client's number (never reused).
        client: u64,
    },
    /// A value's data; answered by [`WorkerEvent::Data`] or [`WorkerEvent::Failed`], or by
    /// [`WorkerEvent::Rung`] when the worker gave the data to the client's doorbell.
    Get {
        /// The dispatcher's tag for the answer.
        tag: u64,
        /// The buffer.
        value: ValueId,
        /// The client's read, to be answered through its doorbell when the worker is in its
        /// process and none of its instructions failed here since its last such answer.
        doorbell: Option<SyncBell>,
        /// The client's shared answer file ([`crate::shared`]), when the answer goes there: a
        /// worker on this host that can open it writes the data into it (answering
        /// [`WorkerEvent::Data`] with `file` set), else it sends the data as usual.
        file: Option<String>,
    },
    /// Statistics; answered by [`WorkerEvent::Stats`].
    Stats {
        /// The dispatcher's tag for the answer.
        tag: u64,
    },
    /// A liveness probe, answered by [`WorkerEvent::Pong`] (which also keeps the
    /// dispatcher's estimate of the worker's clock current).
    Ping,
    /// Stop the worker loop.
    Shutdown,
}

/// Worker -> dispatcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerEvent {
    /// First message: the worker's name and backend.
    Register {
        /// Its name (`worker-0`, a host name...).
        name: String,
        /// Its backend (`cpu`).
        backend: String,
        /// Its clock when it sent this: nanoseconds since it started (timings are on it).
        clock: u64,
        /// The address its peers reach it at for collectives (its peer socket).
        peer: String,
        /// Its process's key ([`crate::doorbell::process_key`]): a worker in the
        /// dispatcher's own process may answer clients' waits through their doorbells.
        process: DoorbellKey,
        /// The lane it offers, when it runs in the dispatcher's process ([`crate::lane`]).
        lane: Option<LaneKey>,
    },
    /// The answer to [`WorkerCommand::Ping`] and [`WorkerCommand::Welcome`].
    Pong {
        /// The worker's clock when it answered.
        clock: u64,
    },
    /// A batch ran.
    Done {
        /// The batch's number.
        batch: u64,
        /// The instructions that failed: index in the batch, and why.
        failures: Vec<(u32, Failure)>,
        /// Time spent executing the batch, in nanoseconds.
        nanos: u64,
        /// For a timed batch, each instruction run: when it started and how long it ran.
        timings: Vec<Timing>,
        /// The bytes its values hold after the batch.
        live_bytes: u64,
        /// The batch's doorbell was rung: its client has its sync's answer, the dispatcher
        /// sends none.
        rang: bool,
    },
    /// The answer to [`WorkerCommand::Get`]: the value's type, its data in the next frame
    /// (as [`Reply::Data`]).
    Data {
        /// The tag.
        tag: u64,
        /// The value's type.
        ty: TensorType,
        /// The data is in the file the read named, not in a frame (none follows).
        file: bool,
    },
    /// The answer to [`WorkerCommand::Get`] went to the client through its doorbell: the
    /// value's type (its data went with it).
    Rung {
        /// The tag.
        tag: u64,
        /// The value's type.
        ty: TensorType,
    },
    /// A [`WorkerCommand::Get`] that failed.
    Failed {
        /// The tag.
        tag: u64,
        /// Why.
        failure: Failure,
    },
    /// The answer to [`WorkerCommand::Stats`].
    Stats {
        /// The tag.
        tag: u64,
        /// The statistics.
        stats: WorkerStats,
    },
}

/// The sync point (a batch's sync, or a read) for a worker to answer by the client's
/// doorbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncBell {
    /// The client's doorbell.
    pub key: DoorbellKey,
    /// The client's number (whose failures on the worker keep it from ringing).
    pub client: u64,
    /// The sync point's seq.
    pub seq: u64,
    /// For a read, the receipt its answer carries ([`Reply::Data`]'s); 0 for a sync.
    pub receipt: u64,
}

/// A worker's part of a collective across workers: which instruction of the batch it is,
/// the collective's group and this worker's place in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// The collective's position in the batch's `instrs`.
    pub index: u32,
    /// The collective's id, unique for the life of the dispatcher (hence of its workers).
    pub id: u64,
    /// This worker's rank in the group.
    pub rank: u32,
    /// The sending rank of a `broadcast` or `move` (0 for the others).
    pub root: u32,
    /// Every rank's peer address ([`WorkerEvent::Register`]'s `peer`), in rank order.
    pub peers: Vec<String>,
    /// The type of this worker's result (`None` when it receives nothing).
    pub ty: Option<TensorType>,
}

/// When one instruction of a batch ran, on the worker's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    /// Its index in the batch.
    pub index: u32,
    /// When it started: nanoseconds since the worker started. For a GPU, when the device
    /// started it (CUDA events), not when it was queued.
    pub start: u64,
    /// How long it ran, in nanoseconds.
    pub nanos: u64,
}

/// A registered worker, as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Its index at the dispatcher.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Its backend.
    pub backend: String,
}

/// One worker's counters (the seeds' `print_worker_stats`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Its name.
    pub name: String,
    /// Its backend.
    pub backend: String,
    /// Instructions executed.
    pub instructions: u64,
    /// Instructions that failed.
    pub failures: u64,
    /// Batches received.
    pub batches: u64,
    /// Data requests answered.
    pub reads: u64,
    /// Instructions of clients that had left, skipped instead of run.
    pub skipped: u64,
    /// Instructions cancelled while they ran (`GT_OP_TIMEOUT`, or their client left).
    pub cancelled: u64,
    /// Values held now.
    pub live_values: u64,
    /// Bytes held now.
    pub live_bytes: u64,
    /// The most bytes held at once since the worker started.
    pub peak_bytes: u64,
    /// Per op (mnemonic), sorted by total time, longest first.
    pub ops: Vec<OpStats>,
}

/// Counts and time of one op on one worker.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OpStats {
    /// The op's mnemonic.
    pub op: String,
    /// Times executed.
    pub count: u64,
    /// Total time, nanoseconds.
    pub nanos: u64,
}

/// One pass's counters on one client stream (`gt-run --pass-stats`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PassStats {
    /// The pass.
    pub pass: String,
    /// (counter, value), as the pass names them.
    pub counters: Vec<(String, u64)>,
}
