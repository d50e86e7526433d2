//! The async client: a DEALER connected to a dispatcher. Instructions are buffered and sent
//! in batches without waiting; only sync points (`read`, `sync`, `worker_stats`) wait. An
//! instruction that fails is reported at the next wait, naming the op and where it came from
//! (its script span), even if the wait itself is about another value.
//!
//! A batch leaves when it reaches `batch_size` instructions or 1 MiB of literal data, at
//! every sync point, on [`Client::flush`] and when the client is dropped.

use gt_ir::data::Elements;
use gt_ir::{HostTensor, Instr, Span, ValueId};
use gt_transport::doorbell::{Answer, Doorbell};
use gt_transport::message::{Failure, FailureKind, PassStats, Reply, Request, Then, WorkerInfo, WorkerStats};
use gt_transport::shared::{self, SharedError};
use gt_transport::socket::{HandshakeFailure, Waited};
use gt_transport::{codec, lane, loan, socket, zmq, ClusterKey, CodecError, Endpoint, Inbound, InboundRef};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use thiserror::Error;

/// How a client connects and batches.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Its name in the dispatcher's log.
    pub name: String,
    /// Instructions per batch at most (`GT_CLIENT_BATCH_SIZE`, default 256).
    pub batch_size: usize,
    /// Instructions in flight at most (`GT_CLIENT_WINDOW`, default 65536): past it, the client
    /// waits for the workers to catch up, so a fast client cannot queue without bound.
    pub window: usize,
    /// Largest message sent or accepted.
    pub max_message_bytes: usize,
    /// How long to wait for the dispatcher (and a worker) at connect.
    pub connect_timeout: Duration,
    /// The cluster key (`--key`, `GT_KEY_FILE`): a TCP dispatcher is reached with CURVE.
    pub key: Option<ClusterKey>,
    /// How long a wait for an answer polls before it sleeps (`GT_SPIN_US`,
    /// [`socket::poll_spinning`]).
    pub spin: Duration,
    /// Whether a client on `inproc://` offers a doorbell, through which a worker in this
    /// process answers its syncs and reads directly (`GT_DOORBELL`, default on;
    /// [`gt_transport::doorbell`]).
    pub doorbell: bool,
    /// Whether a client on `inproc://` offers its dispatcher a lane: messages both ways go
    /// through in-process queues instead of ZeroMQ once it is welcomed (`GT_LANE`, default
    /// on; [`gt_transport::lane`]).
    pub lane: bool,
    /// Whether a client on `ipc://` (the dispatcher's host) takes answers of 1 MiB and more
    /// from a file in shared memory instead of through the socket (`GT_SHARED_READS`,
    /// default on; [`gt_transport::shared`]).
    pub shared_reads: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            name: "client".into(),
            batch_size: 256,
            window: 1 << 16,
            max_message_bytes: codec::DEFAULT_MAX_MESSAGE_BYTES,
            connect_timeout: Duration::from_secs(10),
            key: None,
            spin: socket::DEFAULT_SPIN,
            doorbell: true,
            lane: true,
            shared_reads: true,
        }
    }
}

/// Where an instruction came from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The op's mnemonic (`add`), or the request (`get`).
    pub op: &'static str,
    /// Its script span, when it came from a script.
    pub span: Option<Span>,
}

/// A client failure.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Nothing answered the hello in time.
    #[error(
        "cannot connect to the dispatcher at {endpoint}: no answer within {seconds} s (is `gt server` running there?)"
    )]
    NoAnswer {
        /// Where.
        endpoint: String,
        /// How long the client waited (`GT_CONNECT_TIMEOUT`).
        seconds: u64,
    },
    /// The dispatcher's host name does not resolve.
    #[error("cannot connect to the dispatcher at {endpoint}: the host `{host}` is unknown ({why})")]
    UnknownHost {
        /// Where.
        endpoint: String,
        /// The host named.
        host: String,
        /// What the resolver said.
        why: std::io::Error,
    },
    /// The dispatcher did not let this client in: the security handshake failed.
    #[error(
        "cannot connect to the dispatcher at {endpoint}: it did not let this client in: {why}; every member of a cluster needs the same key file (`gt keygen`, then `--key FILE` or GT_KEY_FILE on the server, workers and clients)"
    )]
    Handshake {
        /// Where.
        endpoint: String,
        /// What the handshake said.
        why: HandshakeFailure,
    },
    /// The dispatcher refused the hello (no worker registered in time, another version).
    #[error("cannot connect to the dispatcher at {endpoint}: {dispatcher_message}")]
    Refused {
        /// Where.
        endpoint: String,
        /// The dispatcher's own words (text from the wire).
        dispatcher_message: String,
    },
    /// An instruction or request failed on the dispatcher or a worker.
    #[error("{failure}{}", if *later > 0 { format!(" ({later} later instructions failed too)") } else { String::new() })]
    Op {
        /// Its seq in the client's stream.
        seq: u64,
        /// What it was.
        origin: Origin,
        /// Why, as the dispatcher or worker said (`failure.kind` to match on).
        failure: Failure,
        /// How many later instructions failed before this was reported.
        later: u64,
    },
    /// The dispatcher refused a message (another protocol version, too large, ...).
    #[error("the dispatcher rejected a message: {dispatcher_message}")]
    Rejected {
        /// The dispatcher's own words (text from the wire).
        dispatcher_message: String,
    },
    /// The dispatcher's answer is another kind of reply than the question's: a broken or
    /// rogue dispatcher.
    #[error("the dispatcher answered `{op}` with {got}")]
    BadReply {
        /// The request.
        op: &'static str,
        /// The kind of reply that came back.
        got: &'static str,
    },
    /// The dispatcher's data does not have its type's length: a broken or rogue dispatcher.
    #[error("the dispatcher answered `get` with {bytes} bytes of data for a {ty} value")]
    BadData {
        /// Bytes that came.
        bytes: usize,
        /// The type they came with.
        ty: gt_ir::TensorType,
    },
    /// The answer's data was in the dispatcher's shared file, which could not be read.
    #[error(transparent)]
    SharedRead(#[from] SharedError),
    /// The connection to the dispatcher broke while waiting.
    #[error("lost the connection to the dispatcher at {0}")]
    Disconnected(String),
    /// A message could not be encoded or decoded.
    #[error("{0}")]
    Codec(#[from] CodecError),
    /// A socket failed.
    #[error("socket error: {0}")]
    Zmq(#[from] zmq::Error),
}

impl ClientError {
    /// What kind of failure: the runtime's for a failed instruction, else
    /// [`FailureKind::Connection`].
    pub fn kind(&self) -> FailureKind {
        match self {
            ClientError::Op { failure, .. } => failure.kind,
            _ => FailureKind::Connection,
        }
    }

    /// The op and script span of the instruction that failed, when the error is about one.
    pub fn origin(&self) -> Option<Origin> {
        match self {
            ClientError::Op { origin, .. } => Some(*origin),
            _ => None,
        }
    }
}

/// Instructions kept for error messages at most; older ones are named by seq only (the
/// window keeps far fewer in flight unless it is set higher).
const MAX_ORIGINS: usize = 1 << 20;
/// Literal bytes that make a batch leave early.
const MAX_BATCH_DATA: usize = 1 << 20;

/// A connection to a dispatcher.
pub struct Client {
    socket: zmq::Socket,
    /// Receives the socket's disconnect events (not for `inproc://`, which has none).
    events: Option<zmq::Socket>,
    endpoint: String,
    options: ClientOptions,
    id: u64,
    workers: Vec<WorkerInfo>,
    next_seq: u64,
    buffer: Vec<Instr>,
    buffer_first_seq: u64,
    buffer_data: usize,
    /// How many of the buffered literals travel as frames of their own.
    buffer_literal_frames: usize,
    origins: VecDeque<Origin>,
    origins_base: u64,
    first_error: Option<(u64, Failure)>,
    later_errors: u64,
    closed: bool,
    /// The data of the last `Data` reply received, or why it could not be taken (a frame
    /// not of the type's length, a shared file that could not be read).
    data: Option<Result<gt_ir::data::Elements, ClientError>>,
    /// The receipt of the last `Data` reply received, sent with the next read to say so.
    last_receipt: u64,
    /// Where each line of the script starts (byte offsets), when the client was told its
    /// source: batches then say each instruction's line, for profiles.
    line_starts: Option<Vec<u32>>,
    /// Its doorbell, on `inproc://` (a worker in this process may answer a sync or a read by
    /// it) when it spins while waiting (it is watched only then).
    doorbell: Option<std::sync::Arc<Doorbell>>,
    /// Its lane to an in-process dispatcher (on `inproc://`, when offered).
    lane: Lane,
    /// The dispatcher's file of its large answers, when it asked for shared reads.
    shared: shared::AnswerReader,
}

/// A client's lane: offered in its `Hello`, open from the `Welcome` on if the dispatcher took
/// it. Open, every message both ways goes by it, and the socket carries wakes.
enum Lane {
    None,
    Offered(std::sync::Arc<lane::Offer>, lane::Inbox),
    Open { inbox: lane::Inbox, out: lane::Outbox, identity: Vec<u8> },
}

impl Client {
    /// Connects on a new context (for `ipc://` and `tcp://` endpoints).
    pub fn connect(endpoint: &Endpoint, options: ClientOptions) -> Result<Client, ClientError> {
        Client::connect_in(&zmq::Context::new(), endpoint, options)
    }

    /// Connects on `ctx` (the embedded cluster's context, for `inproc://`).
    pub fn connect_in(ctx: &zmq::Context, endpoint: &Endpoint, options: ClientOptions) -> Result<Client, ClientError> {
        let (socket, events) = socket::dealer(ctx, endpoint, options.max_message_bytes, options.key.as_ref())?;
        let inproc = matches!(endpoint, Endpoint::Inproc(_));
        let doorbell = (options.doorbell && inproc && !options.spin.is_zero()).then(Doorbell::register);
        let lane = match options.lane && inproc {
            true => {
                let (offer, inbox) = lane::offer();
                Lane::Offered(offer, inbox)
            }
            false => Lane::None,
        };
        let mut client = Client {
            socket,
            events,
            endpoint: endpoint.to_string(),
            options,
            id: 0,
            workers: Vec::new(),
            next_seq: 0,
            buffer: Vec::new(),
            buffer_first_seq: 0,
            buffer_data: 0,
            buffer_literal_frames: 0,
            origins: VecDeque::new(),
            origins_base: 0,
            first_error: None,
            later_errors: 0,
            closed: false,
            data: None,
            last_receipt: 0,
            line_starts: None,
            doorbell,
            lane,
            shared: shared::AnswerReader::default(),
        };
        client.hello()?;
        Ok(client)
    }

    fn hello(&mut self) -> Result<(), ClientError> {
        if let Some((host, why)) = gt_transport::endpoint::unresolvable_host(&self.endpoint) {
            return Err(ClientError::UnknownHost { endpoint: self.endpoint.clone(), host, why });
        }
        let wait = self.options.connect_timeout;
        let hello = Request::Hello {
            name: self.options.name.clone(),
            wait_ms: wait.as_millis() as u64,
            doorbell: self.doorbell.as_ref().map(|b| b.key()),
            lane: match &self.lane {
                Lane::Offered(offer, _) => Some(offer.key()),
                _ => None,
            },
            shared_reads: self.options.shared_reads && self.endpoint.starts_with("ipc://"),
        };
        if let Err(e) = self.send(&hello) {
            // A handshake refused before the hello left drops the connection it was queued on.
            let refused = match (&e, &self.events) {
                (ClientError::Disconnected(_), Some(events)) => {
                    socket::handshake_failure_within(events, socket::HANDSHAKE_REPORT)?
                }
                _ => None,
            };
            return Err(refused.map_or(e, |why| ClientError::Handshake { endpoint: self.endpoint.clone(), why }));
        }
        // The dispatcher answers within `wait` (Welcome or Rejected); a little slack for the trip.
        let deadline = Instant::now() + wait + Duration::from_secs(1);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut items = vec![self.socket.as_poll_item(zmq::POLLIN)];
            items.extend(self.events.as_ref().map(|e| e.as_poll_item(zmq::POLLIN)));
            if left.is_zero() || socket::retry(|| zmq::poll(&mut items, left.as_millis().max(1) as i64))? == 0 {
                return Err(ClientError::NoAnswer { endpoint: self.endpoint.clone(), seconds: wait.as_secs() });
            }
            if !items[0].is_readable() {
                // A dispatcher with another key, or none, never answers: say so now.
                if let Some(why) = self.events.as_ref().map(socket::handshake_failure).transpose()?.flatten() {
                    return Err(ClientError::Handshake { endpoint: self.endpoint.clone(), why });
                }
                continue;
            }
            match self.recv()? {
                Reply::Welcome { client, workers, max_message_bytes } => {
                    tracing::info!(target: "gt::client", "connected to {} as client {client}; {} workers", self.endpoint, workers.len());
                    self.id = client;
                    // Nothing larger than the dispatcher takes leaves this client.
                    let theirs = usize::try_from(max_message_bytes).unwrap_or(usize::MAX);
                    self.options.max_message_bytes = self.options.max_message_bytes.min(theirs);
                    self.workers = workers;
                    // The lane is open if the dispatcher took it (it did before the welcome).
                    self.lane = match std::mem::replace(&mut self.lane, Lane::None) {
                        Lane::Offered(offer, inbox) => match offer.accepted() {
                            Some((out, identity)) => Lane::Open { inbox, out, identity },
                            None => Lane::None,
                        },
                        other => other,
                    };
                    return Ok(());
                }
                Reply::Rejected { message } => {
                    return Err(ClientError::Refused { endpoint: self.endpoint.clone(), dispatcher_message: message })
                }
                _ => {}
            }
        }
    }

    /// Whether this client talks to its dispatcher through a lane (in-process queues,
    /// [`gt_transport::lane`]) rather than its socket.
    pub fn lane_open(&self) -> bool {
        matches!(self.lane, Lane::Open { .. })
    }

    /// The text of the script whose spans its instructions carry: from now on each batch
    /// tells the dispatcher every instruction's line (profiles report them).
    pub fn set_source(&mut self, text: &str) {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1));
        self.line_starts = Some(starts.map(|i| u32::try_from(i).unwrap_or(u32::MAX)).collect());
    }

    /// The 1-based line of the instruction `seq`, 0 when unknown.
    fn line_of(&self, seq: u64) -> u32 {
        let (Some(starts), Some(span)) = (&self.line_starts, self.origin_of(seq).span) else { return 0 };
        // The line holding the span's first byte: the last line start at or before it.
        let line = starts.partition_point(|&s| s <= span.start);
        u32::try_from(line).unwrap_or(u32::MAX)
    }

    /// The client's number at the dispatcher.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The workers registered when the client connected.
    pub fn workers(&self) -> &[WorkerInfo] {
        &self.workers
    }

    /// Where it is connected.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Queues an instruction (sent without waiting). Fails only if the connection is unusable.
    pub fn submit(&mut self, instr: Instr, origin: Origin) -> Result<(), ClientError> {
        let seq = self.take_seq(origin);
        if self.buffer.is_empty() {
            self.buffer_first_seq = seq;
        }
        if let Instr::Literal { data, .. } = &instr {
            self.buffer_data += data.size_bytes();
            self.buffer_literal_frames += usize::from(codec::is_detached_literal(&instr));
        }
        self.buffer.push(instr);
        if self.buffer.len() >= self.options.batch_size
            || self.buffer_data >= MAX_BATCH_DATA
            || self.buffer_literal_frames >= codec::MAX_LITERAL_FRAMES
        {
            self.flush()?;
            if self.origins.len() > self.options.window {
                // Flow control: everything confirmed before going on. A failure found here
                // is reported now (this is a wait).
                tracing::debug!(target: "gt::client", "client {}: window full, waiting", self.id);
                self.sync()?;
            }
        }
        Ok(())
    }

    fn take_seq(&mut self, origin: Origin) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.origins.len() == MAX_ORIGINS {
            self.origins.pop_front();
            self.origins_base += 1;
        }
        self.origins.push_back(origin);
        seq
    }

    fn origin_of(&self, seq: u64) -> Origin {
        seq.checked_sub(self.origins_base)
            .and_then(|i| self.origins.get(i as usize))
            .copied()
            .unwrap_or(Origin { op: "instruction", span: None })
    }

    /// Sends the buffered instructions now.
    pub fn flush(&mut self) -> Result<(), ClientError> {
        self.send_buffer()?;
        // Pick up failures already reported, so that the origins stay few.
        self.drain()
    }

    fn send_buffer(&mut self) -> Result<(), ClientError> {
        self.send_buffer_then(None).map(|_| ())
    }

    /// Sends the buffered instructions, ending with the sync point `then` when given: `true`
    /// when `then` went with them (else the caller sends it alone).
    fn send_buffer_then(&mut self, then: Option<Then>) -> Result<bool, ClientError> {
        if self.buffer.is_empty() {
            return Ok(false);
        }
        let (first_seq, mut instrs) = (self.buffer_first_seq, std::mem::take(&mut self.buffer));
        let n = instrs.len();
        tracing::debug!(target: "gt::client", "client {}: sends #{first_seq}..#{} ({n} instructions)", self.id, first_seq + n as u64);
        self.buffer_literal_frames = 0;
        let data = std::mem::take(&mut self.buffer_data);
        let lines = match self.line_starts {
            Some(_) => (first_seq..first_seq + n as u64).map(|seq| self.line_of(seq)).collect(),
            None => Vec::new(),
        };
        let max = self.options.max_message_bytes;
        // By a lane, the batch goes as it is, literals in it; no frame carries it, but a
        // literal over the limit is refused alike.
        if let Lane::Open { identity, .. } = &self.lane {
            let too_large = instrs.iter().find_map(|i| match i {
                Instr::Literal { data, .. } if data.size_bytes() > max => Some(data.size_bytes()),
                _ => None,
            });
            if let Some(size) = too_large {
                let e = CodecError::TooLarge { size, max };
                self.note_failure(
                    first_seq,
                    Failure::new(FailureKind::Limit, format!("{e} ({n} instructions in the batch)")),
                );
                return Ok(false);
            }
            let batch = Inbound::Client(Request::Batch { first_seq, instrs, lines, then });
            let parcel = lane::Parcel::Inbound(identity.clone(), batch);
            return self.send_parcel(parcel).map(|()| then.is_some());
        }
        // Large literals leave as frames of their own (lent: an in-process dispatcher takes
        // them without a copy); the message carries the rest.
        let literals = codec::detach_literals(&mut instrs);
        let framed: usize = literals.iter().map(Elements::size_bytes).sum();
        let encoded = match literals.iter().map(Elements::size_bytes).find(|&size| size > max) {
            Some(size) => Err(CodecError::TooLarge { size, max }),
            None => codec::encode_sized(
                &InboundRef::Client(&Request::Batch { first_seq, instrs, lines, then }),
                max,
                data - framed,
            ),
        };
        match encoded {
            // Too large to send: reported as the failure of its first instruction.
            Err(e) => {
                self.note_failure(
                    first_seq,
                    Failure::new(FailureKind::Limit, format!("{e} ({n} instructions in the batch)")),
                );
                Ok(false)
            }
            Ok(head) => self.send_frames(head, literals).map(|()| then.is_some()),
        }
    }

    /// Reads replies already here without waiting (failures of earlier instructions).
    fn drain(&mut self) -> Result<(), ClientError> {
        self.drain_before(u64::MAX)
    }

    /// [`Client::drain`] while waiting for `seq` (whose own answer, if one came, is dropped).
    fn drain_before(&mut self, seq: u64) -> Result<(), ClientError> {
        loop {
            let frames = match &self.lane {
                Lane::Open { inbox, .. } => match inbox.try_recv() {
                    Ok(Some(parcel)) => match frames_of(parcel) {
                        Some(frames) => frames,
                        None => continue,
                    },
                    Ok(None) => return Ok(()),
                    Err(lane::Gone) => return Err(self.disconnected()),
                },
                _ if socket::retry(|| self.socket.poll(zmq::POLLIN, 0))? > 0 => socket::recv_frames(&self.socket, 0)?,
                _ => return Ok(()),
            };
            let reply = self.reply(frames)?;
            self.absorb(reply, seq)?;
        }
    }

    /// The dispatcher is gone: this client is closed.
    fn disconnected(&mut self) -> ClientError {
        self.closed = true;
        ClientError::Disconnected(self.endpoint.clone())
    }

    /// Keeps the earliest instruction's failure to report (passes may reorder instructions,
    /// so failures need not arrive in stream order); the others are counted.
    fn note_failure(&mut self, seq: u64, message: Failure) {
        match &self.first_error {
            Some((first, _)) if *first <= seq => self.later_errors += 1,
            Some(_) => {
                self.later_errors += 1;
                self.first_error = Some((seq, message));
            }
            None => self.first_error = Some((seq, message)),
        }
    }

    /// Takes a reply that is not the one waited for.
    fn absorb(&mut self, reply: Reply, waiting: u64) -> Result<(), ClientError> {
        match reply {
            Reply::Failed { seq, failure } if seq != waiting => self.note_failure(seq, failure),
            Reply::Rejected { message } => return Err(ClientError::Rejected { dispatcher_message: message }),
            _ => {}
        }
        Ok(())
    }

    /// The error to report at a wait, if an earlier instruction failed.
    fn take_error(&mut self) -> Option<ClientError> {
        let (seq, failure) = self.first_error.take()?;
        let later = std::mem::take(&mut self.later_errors);
        Some(ClientError::Op { seq, origin: self.origin_of(seq), failure, later })
    }

    /// Sends a request and waits for its answer.
    fn request(&mut self, make: impl FnOnce(u64) -> Request, op: &'static str) -> Result<Reply, ClientError> {
        // Numbered after the buffered instructions, which already have their seqs.
        let seq = self.take_seq(Origin { op, span: None });
        tracing::debug!(target: "gt::client", "client {}: {op} #{seq}, waiting", self.id);
        let request = make(seq);
        // A sync or a read may be answered by the doorbell: armed before the dispatcher can
        // see the request.
        let bell = match (&request, &self.doorbell) {
            (Request::Sync { .. } | Request::Get { .. }, Some(bell)) => {
                bell.arm(seq);
                Some(std::sync::Arc::clone(bell))
            }
            _ => None,
        };
        // No drain: the wait below reads everything that comes before the answer. A sync
        // point goes in the same message as the instructions before it.
        if !self.send_buffer_then(Then::of(&request))? {
            self.send(&request)?;
        }
        let reply = loop {
            let frames = if let Lane::Open { inbox, .. } = &self.lane {
                let wait = socket::LaneWait { inbox, sock: &self.socket, messages: None };
                let bell = bell.as_deref().map(|bell| (bell, seq));
                match socket::recv_lane_waiting(&wait, bell, self.options.spin, 1000)? {
                    Waited::Parcel(parcel) => frames_of(parcel),
                    Waited::Frames(frames) => Some(frames),
                    Waited::Rung => {
                        self.drain_before(seq)?;
                        break self.rung(&request, bell.expect("rung").0);
                    }
                    Waited::TimedOut => None,
                    Waited::Gone => return Err(self.disconnected()),
                }
            } else if let Some(e) = &self.events {
                let mut items = [self.socket.as_poll_item(zmq::POLLIN), e.as_poll_item(zmq::POLLIN)];
                socket::poll_spinning(&mut items, self.options.spin, 1000)?;
                if items[0].is_readable() {
                    Some(socket::recv_frames(&self.socket, 0)?)
                } else if items[1].is_readable() {
                    return Err(self.disconnected());
                } else {
                    None
                }
            } else if let Some(bell) = &bell {
                match socket::recv_waiting_or_rung(&self.socket, (bell, seq), self.options.spin, 1000)? {
                    Waited::Frames(frames) => Some(frames),
                    Waited::Parcel(parcel) => frames_of(parcel),
                    Waited::Rung => {
                        // What the dispatcher sent before it handed the wait over (the failures
                        // of earlier instructions) is on the socket now: read first.
                        self.drain_before(seq)?;
                        break self.rung(&request, bell);
                    }
                    Waited::TimedOut | Waited::Gone => None,
                }
            } else {
                // In-process: nothing reports a lost connection, and one socket is waited on.
                socket::recv_waiting(&self.socket, self.options.spin, 1000)?
            };
            if let Some(frames) = frames {
                let reply = self.reply(frames)?;
                match reply {
                    Reply::Data { seq: s, .. }
                    | Reply::Synced { seq: s }
                    | Reply::Stats { seq: s, .. }
                    | Reply::Failed { seq: s, .. }
                        if s == seq =>
                    {
                        break reply
                    }
                    other => self.absorb(other, seq)?,
                }
            }
        };
        // Answered by the socket: the bell can no longer ring for this wait (a stale answer
        // in it would only be dropped).
        if let Some(bell) = &bell {
            if bell.decline(seq) {
                let _ = bell.take_answer(seq);
            }
        }
        let earlier = self.take_error();
        // Everything up to `seq` has run: its origins are no longer needed.
        while self.origins_base <= seq && !self.origins.is_empty() {
            self.origins.pop_front();
            self.origins_base += 1;
        }
        if let Some(e) = earlier {
            return Err(e);
        }
        match reply {
            Reply::Failed { seq, failure } => {
                Err(ClientError::Op { seq, origin: Origin { op, span: None }, failure, later: 0 })
            }
            r => Ok(r),
        }
    }

    /// The answer a worker gave `request` through the doorbell, as the dispatcher's reply.
    fn rung(&mut self, request: &Request, bell: &Doorbell) -> Reply {
        match *request {
            Request::Get { seq, .. } => match bell.take_answer(seq) {
                Some(Answer { ty, data, receipt }) => {
                    self.last_receipt = receipt;
                    // Checked as the socket's data frame is: the type's length, or not taken.
                    let fits = data.len() == ty.shape.numel() && data.dtype() == ty.dtype;
                    let bad = || ClientError::BadData { bytes: data.size_bytes(), ty: ty.clone() };
                    self.data = Some(if fits { Ok(data) } else { Err(bad()) });
                    Reply::Data { seq, ty, receipt, file: None }
                }
                // (A bell rings a read only with its answer.)
                None => Reply::Rejected { message: format!("read #{seq} was rung without its data") },
            },
            Request::Sync { seq } => Reply::Synced { seq },
            _ => Reply::Rejected { message: "a doorbell rang for a request that is not a wait".into() },
        }
    }

    /// A value's data (a sync point).
    pub fn read(&mut self, value: ValueId) -> Result<HostTensor, ClientError> {
        let read = self.last_receipt;
        match self.request(|seq| Request::Get { seq, value, read }, "get")? {
            Reply::Data { ty, .. } => match self.data.take() {
                Some(Ok(data)) => Ok(HostTensor { ty, data }),
                Some(Err(e)) => Err(e),
                None => Err(ClientError::BadData { bytes: 0, ty }),
            },
            other => Err(ClientError::BadReply { op: "get", got: reply_kind(&other) }),
        }
    }

    /// Waits until every instruction sent so far has run; reports any that failed.
    pub fn sync(&mut self) -> Result<(), ClientError> {
        match self.request(|seq| Request::Sync { seq }, "sync")? {
            Reply::Synced { .. } => Ok(()),
            other => Err(ClientError::BadReply { op: "sync", got: reply_kind(&other) }),
        }
    }

    /// How many answers it took from the dispatcher's shared file ([`ClientOptions::shared_reads`]).
    pub fn shared_reads(&self) -> u64 {
        self.shared.reads()
    }

    /// Every live worker's statistics.
    pub fn worker_stats(&mut self) -> Result<Vec<WorkerStats>, ClientError> {
        Ok(self.stats()?.0)
    }

    /// Every live worker's statistics, and those of the passes on this client's stream.
    pub fn stats(&mut self) -> Result<(Vec<WorkerStats>, Vec<PassStats>), ClientError> {
        match self.request(|seq| Request::Stats { seq }, "stats")? {
            Reply::Stats { workers, passes, .. } => Ok((workers, passes)),
            other => Err(ClientError::BadReply { op: "stats", got: reply_kind(&other) }),
        }
    }

    /// Sends `req` (a batch goes through `send_buffer`, with its literal frames), by the
    /// lane as it is when the lane is open.
    fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        if let Lane::Open { identity, .. } = &self.lane {
            let parcel = lane::Parcel::Inbound(identity.clone(), Inbound::Client(req.clone()));
            return self.send_parcel(parcel);
        }
        let bytes = codec::encode(&InboundRef::Client(req), self.options.max_message_bytes)?;
        self.send_frames(bytes, Vec::new())
    }

    /// Sends an encoded message and its literals' data frames (lent: an in-process
    /// dispatcher takes them without a copy), by the lane when it is open.
    fn send_frames(&mut self, head: Vec<u8>, literals: Vec<Elements>) -> Result<(), ClientError> {
        if let Lane::Open { identity, .. } = &self.lane {
            let frames = lane::frames(Some(identity), head, literals.into_iter().map(loan::frame));
            return self.send_parcel(frames);
        }
        // Never block: a send can only wait when the dispatcher is gone (an in-process one
        // that stopped); connected sockets queue without limit.
        match socket::send_with_literals(&mut self.socket, &[], head, literals) {
            Err(zmq::Error::EAGAIN) => Err(ClientError::Disconnected(self.endpoint.clone())),
            r => Ok(r?),
        }
    }

    /// Sends a message by the open lane, waking the dispatcher through the socket if it
    /// sleeps (no open lane: the dispatcher cannot be reached by one).
    fn send_parcel(&mut self, parcel: lane::Parcel) -> Result<(), ClientError> {
        let sent = match &self.lane {
            Lane::Open { out, .. } => out.send(parcel, || socket::retry(|| self.socket.send(&[][..], zmq::DONTWAIT))),
            _ => Err(lane::Gone),
        };
        sent.map_err(|lane::Gone| self.disconnected())
    }

    /// Receives one reply; a `Data` reply's data frame is kept for [`Client::read`].
    fn recv(&mut self) -> Result<Reply, ClientError> {
        let frames = socket::recv_frames(&self.socket, 0)?;
        self.reply(frames)
    }

    /// One reply from its frames; a `Data` reply's data frame is kept for [`Client::read`].
    fn reply(&mut self, mut frames: Vec<zmq::Message>) -> Result<Reply, ClientError> {
        let reply = codec::decode(&frames[0], self.options.max_message_bytes)?;
        if let Reply::Data { ty, receipt, file: Some(name), .. } = &reply {
            self.last_receipt = *receipt;
            // Taken out now: the dispatcher writes the file again once this receipt is back.
            self.data = Some(self.shared.read(name, ty).map_err(ClientError::SharedRead));
        } else if let Reply::Data { ty, receipt, .. } = &reply {
            self.last_receipt = *receipt;
            // A frame lent by a worker in this process is taken as it is; others are copied.
            let data = match (frames.len() > 1).then(|| frames.swap_remove(1)) {
                Some(frame) if frame.len() == ty.size_bytes() => loan::take(frame, ty.dtype),
                Some(frame) => Err(frame),
                None => Err(zmq::Message::new()),
            };
            let bad = |frame: zmq::Message| ClientError::BadData { bytes: frame.len(), ty: ty.clone() };
            self.data = Some(data.or_else(|frame| codec::data_of(&frame, ty).map_err(|_| bad(frame))));
        }
        Ok(reply)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.flush();
            let _ = self.send(&Request::Bye);
        }
    }
}

impl gt_ir::Executor for Client {
    type Error = ClientError;

    fn execute(&mut self, instr: &Instr) -> Result<(), ClientError> {
        self.execute_at(instr, None)
    }

    fn execute_at(&mut self, instr: &Instr, span: Option<Span>) -> Result<(), ClientError> {
        self.execute_owned(instr.clone(), span)
    }

    fn execute_owned(&mut self, instr: Instr, span: Option<Span>) -> Result<(), ClientError> {
        if let Instr::GetData { src } = instr {
            return self.read(src).map(|_| ());
        }
        let op = instr.mnemonic();
        self.submit(instr, Origin { op, span })
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, ClientError> {
        Client::read(self, value)
    }

    fn sync(&mut self) -> Result<(), ClientError> {
        Client::sync(self)
    }

    fn error_kind(error: &ClientError) -> FailureKind {
        error.kind()
    }

    fn error_span(error: &ClientError) -> Option<(Span, &'static str)> {
        error.origin().and_then(|o| o.span.map(|s| (s, o.op)))
    }

    fn error_op(error: &ClientError) -> Option<&'static str> {
        error.origin().map(|o| o.op)
    }
}

/// A dispatcher's message by the lane: its frames (the dispatcher sends a client nothing
/// else; anything else is dropped, logged).
fn frames_of(parcel: lane::Parcel) -> Option<Vec<zmq::Message>> {
    match parcel {
        lane::Parcel::Frames(frames) => Some(frames),
        other => {
            tracing::warn!(target: "gt::client", "dropped a message from the dispatcher that is not a reply: {other:?}");
            None
        }
    }
}

/// A reply's kind, for errors.
fn reply_kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Welcome { .. } => "Welcome",
        Reply::Failed { .. } => "Failed",
        Reply::Data { .. } => "Data",
        Reply::Synced { .. } => "Synced",
        Reply::Stats { .. } => "Stats",
        Reply::Rejected { .. } => "Rejected",
        Reply::Ping => "Ping",
    }
}
