//! Worker-to-worker collectives: the [`Collectives`] trait a worker calls to run its part of an
//! all-reduce, all-gather, reduce-scatter, broadcast or point-to-point transfer, and
//! [`ZmqCollectives`], which runs them over ZeroMQ with ring algorithms (one ROUTER per worker
//! receives, one DEALER per peer sends). Which workers take part and in what order collectives
//! run is the dispatcher's business; this file only moves and reduces the bytes.
//!
//! # Wire
//! A message is three frames at the receiving ROUTER: the routing id (unused: the sender's rank
//! is in the header), a 17-byte little-endian header (collective id u64, step u32, sender rank
//! u32, kind u8: 0 data, 1 abort) and the payload (raw bytes; `f32` data little-endian). A
//! message is keyed by (id, step, sender), so a message for a later collective or step (a peer
//! ran ahead) is stashed until it is asked for. The rings send a step's chunk in pieces under one
//! key: they arrive in the order sent (one DEALER per peer, and ZeroMQ keeps a connection's
//! order), and are stashed and taken in that order. An all-gather's chunk, whose length the
//! receiver does not know, starts with a 16-byte head under the same key: its length and the
//! length of its pieces (u64 each); the pieces follow.
//! Frames that do not parse cannot be attributed to a rank: they are dropped with a warning and
//! the collective goes on. A well-formed message of the wrong length fails the collective,
//! naming the peer.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use gt_ir::ops::{nan_max, nan_min, ReduceOp};
use gt_transport::codec::{data_frame, from_le_bytes};
use gt_transport::endpoint::{ensure_runtime_dir, is_local, make_private, RuntimeDirError};
use gt_transport::loan::VecLoan;
use gt_transport::socket::{recv_frames, retry, send_with_data};
use gt_transport::{socket, zmq, ClusterKey, Endpoint};
use std::collections::VecDeque;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

/// One collective's participants as this worker sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The collective's id, unique for the life of the workers: messages for an id this rank has
    /// finished (or given up on) are dropped.
    pub id: u64,
    /// This worker's rank: its index in `peers`.
    pub rank: usize,
    /// Every rank's peer socket address ([`ZmqCollectives::address`]), in rank order, own included.
    pub peers: Vec<String>,
}

impl Group {
    fn n(&self) -> usize {
        self.peers.len()
    }
}

/// Bytes a collective hands back: this rank's own (borrowed from the caller) or a peer's as
/// its message arrived, so that no received byte is copied on its way to the caller; only a
/// chunk that came in pieces is copied together, once.
#[derive(Debug)]
pub enum Piece<'a> {
    /// This rank's own bytes.
    Mine(&'a [u8]),
    /// A peer's bytes, in the message that brought them.
    Received(zmq::Message),
    /// A peer's bytes that came in several messages, put together.
    Gathered(Vec<u8>),
}

impl std::ops::Deref for Piece<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Piece::Mine(b) => b,
            Piece::Received(m) => m,
            Piece::Gathered(v) => v,
        }
    }
}

impl AsRef<[u8]> for Piece<'_> {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq<Vec<u8>> for Piece<'_> {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

/// The operations a worker runs its part of. Every rank of a group calls the same operation with
/// the same `Group::id`; a rank's collectives run in one global order, but a peer may be ahead.
/// On an error other than [`CollectiveError::Aborted`], [`ZmqCollectives`] has already told the
/// other ranks (as [`Collectives::abort`] does); telling them again is harmless.
pub trait Collectives {
    /// Elementwise reduction of every rank's `data` (same length everywhere), the result on
    /// every rank, bit-identical everywhere. Mean = sum / n. Owned, so that its memory can be lent
    /// to in-process peers instead of copied; on an error it is gone.
    fn all_reduce(&mut self, g: &Group, op: ReduceOp, data: Vec<f32>) -> Result<Vec<f32>, CollectiveError>;
    /// Every rank's bytes (lengths may differ per rank), in rank order, on every rank.
    fn all_gather<'a>(&mut self, g: &Group, mine: &'a [u8]) -> Result<Vec<Piece<'a>>, CollectiveError>;
    /// Reduces every rank's `data` (same length) and returns this rank's chunk only: chunk `r` has
    /// `counts[r]` elements, starting after the chunks of lower ranks (`counts` sum to
    /// `data.len()`; uneven and zero counts are fine).
    fn reduce_scatter(
        &mut self,
        g: &Group,
        op: ReduceOp,
        data: &[f32],
        counts: &[usize],
    ) -> Result<Vec<f32>, CollectiveError>;
    /// `root`'s bytes on every rank (`data` is read on the root only, where it must be `Some`).
    fn broadcast<'a>(&mut self, g: &Group, root: usize, data: Option<&'a [u8]>) -> Result<Piece<'a>, CollectiveError>;
    /// Rank `from` sends `data` (`Some` there) to rank `to`: `Some(bytes)` on `to`, `None` on
    /// every other rank.
    fn transfer<'a>(
        &mut self,
        g: &Group,
        from: usize,
        to: usize,
        data: Option<&'a [u8]>,
    ) -> Result<Option<Piece<'a>>, CollectiveError>;
    /// Tells every other rank of `g` that this rank gives up on it (it failed or was told to skip
    /// it), so they fail at once instead of waiting out the timeout.
    fn abort(&mut self, g: &Group);
}

/// Why a collective failed. Errors caused by a peer name it by rank and address.
#[derive(Debug, Error)]
pub enum CollectiveError {
    /// A peer sent nothing for this step in time.
    #[error("collective {id}: nothing from rank {peer_rank} ({peer}) within {waited:?}")]
    Timeout {
        /// The collective.
        id: u64,
        /// The rank waited for.
        peer_rank: usize,
        /// Its address.
        peer: String,
        /// How long.
        waited: Duration,
    },
    /// A peer gave up on the collective.
    #[error("collective {id}: rank {peer_rank} ({peer}) gave up on it")]
    Aborted {
        /// The collective.
        id: u64,
        /// The rank that gave up.
        peer_rank: usize,
        /// Its address (empty when the rank is not in the group).
        peer: String,
    },
    /// A peer's payload cannot be what the step carries.
    #[error("collective {id}: malformed message from rank {peer_rank} ({peer}): {why}")]
    Malformed {
        /// The collective.
        id: u64,
        /// The sender.
        peer_rank: usize,
        /// Its address.
        peer: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A peer's chunk has the wrong size.
    #[error("collective {id}: rank {peer_rank} ({peer}) sent {got} bytes where {expected} were expected")]
    LengthMismatch {
        /// The collective.
        id: u64,
        /// The sender.
        peer_rank: usize,
        /// Its address.
        peer: String,
        /// Bytes expected.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
    /// A message to a peer is over the message limit (the peer's socket would drop it).
    #[error("collective {id}: {bytes} bytes for rank {peer_rank} ({peer}) exceed the {limit}-byte message limit")]
    TooLarge {
        /// The collective.
        id: u64,
        /// The receiver.
        peer_rank: usize,
        /// Its address.
        peer: String,
        /// The payload's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The call itself is wrong (a bug in the caller, not a peer's doing).
    #[error("collective {id}: {why}")]
    InvalidCall {
        /// The collective.
        id: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// A peer's address cannot be connected to.
    #[error("cannot connect to peer {peer}: {source}")]
    Connect {
        /// The address.
        peer: String,
        /// Why.
        source: zmq::Error,
    },
    /// This worker's peer socket cannot be bound.
    #[error("cannot bind the peer socket on {address}: {source}")]
    Bind {
        /// The address.
        address: String,
        /// Why.
        source: zmq::Error,
    },
    /// The IPC socket file cannot be made private.
    #[error("cannot make the peer socket {path} private: {source}")]
    Private {
        /// The socket file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A peer still held memory this rank lent it a timeout after the collective ended here (a
    /// rank hung, or fell that far behind); the data is gone with it.
    #[error("collective {id}: a peer still held this rank's data {waited:?} after the collective ended")]
    Unreturned {
        /// The collective.
        id: u64,
        /// How long this rank waited for it.
        waited: Duration,
    },
    /// ZeroMQ bound a TCP port but does not say which.
    #[error("the peer socket's TCP port is unknown (zmq reported {endpoint:?})")]
    UnknownPort {
        /// What zmq reported as the bound endpoint.
        endpoint: String,
    },
    /// No host name to advertise for a TCP peer socket.
    #[error("no host name to advertise for the peer socket; set GT_PEER_HOST")]
    NoHostName,
    /// The runtime directory for IPC socket files.
    #[error(transparent)]
    RuntimeDir(#[from] RuntimeDirError),
    /// A socket call failed.
    #[error("peer socket: {0}")]
    Zmq(#[from] zmq::Error),
}

const HEADER_LEN: usize = 17;
const KIND_DATA: u8 = 0;
const KIND_ABORT: u8 = 1;
/// Bounds steps (`2n - 2` for all-reduce) and ranks to what the header's u32 fields can number.
const MAX_RANKS: usize = (u32::MAX / 2) as usize;
/// How many finished ids are remembered, so their late messages are dropped, not stashed forever.
const FINISHED_MEMORY: usize = 4096;
/// A closing DEALER gets this long to deliver what it queued: the ring's last message is often
/// still queued when a rank finishes, and its peer needs it. (Linger 0 would discard it.)
const DEALER_LINGER_MS: i32 = 1000;
/// The pieces the rings cut chunks into: small enough to stay in a core's cache between arriving
/// and going on, and for the allocator to reuse their memory instead of faulting in fresh pages,
/// large enough that a message's own cost (a few microseconds) is small beside its bytes'.
const PIECE_BYTES: usize = 256 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    id: u64,
    step: u32,
    sender: u32,
    kind: u8,
}

impl Header {
    fn encode(self) -> [u8; HEADER_LEN] {
        let mut b = [0; HEADER_LEN];
        b[..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..12].copy_from_slice(&self.step.to_le_bytes());
        b[12..16].copy_from_slice(&self.sender.to_le_bytes());
        b[16] = self.kind;
        b
    }

    fn decode(b: &[u8]) -> Option<Header> {
        let b: &[u8; HEADER_LEN] = b.try_into().ok()?;
        let kind = b[16];
        if kind != KIND_DATA && kind != KIND_ABORT {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0; 8];
        id.copy_from_slice(&b[..8]);
        Some(Header { id: u64::from_le_bytes(id), step: u32_at(8), sender: u32_at(12), kind })
    }
}

/// One element of `op`'s fold: `acc` holds the ranks folded so far (Mean sums; the division
/// comes once at the end).
fn combine(op: ReduceOp, acc: f32, x: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => acc + x,
        ReduceOp::Max => nan_max(acc, x),
        ReduceOp::Min => nan_min(acc, x),
    }
}

/// `len` elements split in `n` chunks as evenly as possible, the larger ones first.
pub fn even_counts(len: usize, n: usize) -> Vec<usize> {
    (0..n).map(|c| len / n + usize::from(c < len % n)).collect()
}

fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut at = vec![0];
    at.extend(counts.iter().scan(0, |sum, c| {
        *sum += c;
        Some(*sum)
    }));
    at
}

/// What [`ZmqCollectives::reduce_scatter`] gives each rank, computed serially and bit for bit:
/// chunk `c` is folded in ring order, from rank `c + 1` round to rank `c` (the order the ring
/// accumulates it in), then divided by n for Mean. `inputs[r]` is rank r's data.
pub fn reference_reduce_scatter(op: ReduceOp, inputs: &[&[f32]], counts: &[usize]) -> Vec<Vec<f32>> {
    let n = inputs.len();
    let at = offsets(counts);
    (0..n)
        .map(|c| {
            let chunk = |r: usize| &inputs[(c + r) % n][at[c]..at[c + 1]];
            let mut acc = chunk(1).to_vec();
            for k in 2..=n {
                acc.iter_mut().zip(chunk(k)).for_each(|(a, &x)| *a = combine(op, *a, x));
            }
            if op == ReduceOp::Mean {
                acc.iter_mut().for_each(|a| *a /= n as f32);
            }
            acc
        })
        .collect()
}

/// What [`ZmqCollectives::all_reduce`] gives every rank, computed serially and bit for bit: the
/// [`reference_reduce_scatter`] of the [`even_counts`] split, concatenated.
pub fn reference_all_reduce(op: ReduceOp, inputs: &[&[f32]]) -> Vec<f32> {
    let len = inputs.first().map_or(0, |d| d.len());
    reference_reduce_scatter(op, inputs, &even_counts(len, inputs.len())).concat()
}

/// A message of `bytes`, copied into memory from the process's allocator and handed to ZeroMQ
/// without another copy (`data_frame` does the same for `f32`s): an allocator that reuses
/// freed large buffers (gt's binaries run on mimalloc) then spares a page fault per 4 KiB.
fn message(bytes: &[u8]) -> zmq::Message {
    zmq::Message::from(bytes.to_vec())
}

/// Runs `body` on a message's little-endian `f32`s (its length checked by the caller): the
/// message's own memory where it is aligned (it always is from ZeroMQ's allocator), else a copy.
fn with_f32s<T>(bytes: &[u8], body: impl FnOnce(&[f32]) -> T) -> T {
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(v) if cfg!(target_endian = "little") => body(v),
        _ => body(&from_le_bytes(bytes)),
    }
}

/// Folds `other` into `into`, elementwise; `into_is_left` says which holds the received partial,
/// which goes on the left as [`reference_reduce_scatter`] folds. `op` is chosen once so that the
/// loop vectorizes.
fn fold_into(op: ReduceOp, into: &mut [f32], other: &[f32], into_is_left: bool) {
    // One loop per op and side (each closure its own instance): `combine` with a constant op
    // inlines to the bare operation.
    fn each(into: &mut [f32], other: &[f32], left: bool, f: impl Fn(f32, f32) -> f32) {
        if left {
            into.iter_mut().zip(other).for_each(|(x, &y)| *x = f(*x, y));
        } else {
            into.iter_mut().zip(other).for_each(|(x, &y)| *x = f(y, *x));
        }
    }
    let left = into_is_left;
    match op {
        ReduceOp::Sum | ReduceOp::Mean => each(into, other, left, |a, b| combine(ReduceOp::Sum, a, b)),
        ReduceOp::Max => each(into, other, left, |a, b| combine(ReduceOp::Max, a, b)),
        ReduceOp::Min => each(into, other, left, |a, b| combine(ReduceOp::Min, a, b)),
    }
}

/// [`Collectives`] over ZeroMQ. Receives on one ROUTER (bound by [`ZmqCollectives::bind`]);
/// sends through one DEALER per peer address, connected on first use and kept.
pub struct ZmqCollectives {
    ctx: zmq::Context,
    router: zmq::Socket,
    address: String,
    ipc_file: Option<PathBuf>,
    timeout: Duration,
    max_message_bytes: usize,
    /// The most bytes one ring message carries (a chunk travels in pieces of this size); the same
    /// on every rank.
    piece_bytes: usize,
    /// Whether a chunk of bytes ([`ZmqCollectives::send_chunk`]) to an `inproc://` peer goes
    /// whole: ZeroMQ hands an inproc message over by pointer, so there is no link to overlap
    /// and a chunk in pieces would only be copied together again (all_gather at 16 MB: 0.67 ms
    /// whole, 1.39 ms in pieces on the 2-core VM; over TCP pieces halve it).
    whole_over_inproc: bool,
    dealers: HashMap<String, zmq::Socket>,
    /// The cluster key: over TCP the ROUTER lets in only its holders, and the DEALERs prove it.
    key: Option<ClusterKey>,
    /// Data that arrived before it was asked for, by (id, step, sender); a queue so that even a
    /// duplicate is kept rather than lost.
    stash: HashMap<(u64, u32, u32), VecDeque<zmq::Message>>,
    /// Collectives a peer gave up on (id → the first rank that did), until this rank finishes them.
    aborted: HashMap<u64, usize>,
    finished: HashSet<u64>,
    finished_order: VecDeque<u64>,
}

impl ZmqCollectives {
    /// Binds this worker's peer socket on a transport like `like` (the dispatcher's): `inproc://`
    /// (same `ctx` needed), an `.ipc` file (mode 0600) in gt's runtime directory, or an ephemeral
    /// TCP port, advertised on 127.0.0.1 when `like`'s host is loopback, else on `GT_PEER_HOST`,
    /// else on this machine's host name. Each receive waits at most `timeout`; a message over
    /// `max_message_bytes` is refused by the sender and dropped by the receiving socket. Over
    /// TCP with a cluster `key`, the socket is a CURVE server and peers are reached with CURVE.
    pub fn bind(
        ctx: &zmq::Context,
        like: &Endpoint,
        name: &str,
        timeout: Duration,
        max_message_bytes: usize,
        key: Option<ClusterKey>,
    ) -> Result<ZmqCollectives, CollectiveError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // The name ends up in a path and an address: keep it to characters safe in both.
        let name: String =
            name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(40).collect();
        let tag = format!("{}-{name}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let router = ctx.socket(zmq::ROUTER)?;
        router.set_rcvhwm(0)?;
        router.set_maxmsgsize(i64::try_from(max_message_bytes.max(HEADER_LEN)).unwrap_or(i64::MAX))?;
        router.set_linger(0)?;
        let bind = |address: &str| {
            socket::bind(ctx, &router, address, key.as_ref())
                .map_err(|source| CollectiveError::Bind { address: address.to_string(), source })
        };
        let (address, ipc_file) = match like {
            Endpoint::Inproc(_) => {
                let address = format!("inproc://gt-peer-{tag}");
                bind(&address)?;
                (address, None)
            }
            Endpoint::Ipc(_) => {
                let path = ensure_runtime_dir()?.join(format!("peer-{tag}.ipc"));
                let address = format!("ipc://{}", path.display());
                bind(&address)?;
                // The directory is already 0700; this keeps the file private if it is moved.
                make_private(&path).map_err(|source| CollectiveError::Private { path: path.clone(), source })?;
                (address, Some(path))
            }
            Endpoint::Tcp { host, .. } => {
                let (on, advertised) =
                    if is_local(host) { ("127.0.0.1", "127.0.0.1".to_string()) } else { ("0.0.0.0", peer_host()?) };
                bind(&format!("tcp://{on}:*"))?;
                let endpoint = router.get_last_endpoint()?.unwrap_or_default();
                let port = endpoint.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
                let port = port.ok_or(CollectiveError::UnknownPort { endpoint })?;
                (format!("tcp://{advertised}:{port}"), None)
            }
        };
        Ok(ZmqCollectives {
            ctx: ctx.clone(),
            router,
            address,
            ipc_file,
            timeout,
            max_message_bytes,
            piece_bytes: PIECE_BYTES,
            whole_over_inproc: true,
            dealers: HashMap::new(),
            key,
            stash: HashMap::new(),
            aborted: HashMap::new(),
            finished: HashSet::new(),
            finished_order: VecDeque::new(),
        })
    }

    /// The address peers reach this worker at (what goes in [`Group::peers`]).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// How long one receive waits for a peer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long one receive waits for a peer.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sets the most bytes one ring message carries (tests cut small chunks into many pieces),
    /// over every transport, inproc too. Every rank of a group must use the same, or the pieces'
    /// lengths do not match.
    #[cfg(test)]
    fn set_piece_bytes(&mut self, bytes: usize) {
        self.piece_bytes = bytes.max(4);
        self.whole_over_inproc = false;
    }

    /// Runs `body` for `g`, then forgets `g`'s messages; on a failure of this rank's own (anything
    /// but a peer's abort) tells the other ranks first, so that none waits out its timeout.
    fn guarded<T>(
        &mut self,
        g: &Group,
        body: impl FnOnce(&mut Self) -> Result<T, CollectiveError>,
    ) -> Result<T, CollectiveError> {
        let invalid = |why| Err(CollectiveError::InvalidCall { id: g.id, why });
        let out = if g.peers.is_empty() {
            invalid("a group without ranks")
        } else if g.rank >= g.n() {
            invalid("this rank is not in the group")
        } else if g.n() > MAX_RANKS {
            invalid("more ranks than a message header can number")
        } else {
            body(self)
        };
        match out {
            Ok(_) | Err(CollectiveError::Aborted { .. }) => self.finish(g.id),
            Err(_) => self.abort(g),
        }
        out
    }

    fn finish(&mut self, id: u64) {
        self.stash.retain(|key, _| key.0 != id);
        self.aborted.remove(&id);
        if self.finished.insert(id) {
            self.finished_order.push_back(id);
            if self.finished_order.len() > FINISHED_MEMORY {
                if let Some(old) = self.finished_order.pop_front() {
                    self.finished.remove(&old);
                }
            }
        }
    }

    /// Whether `bytes` for rank `to` are within the message limit (its socket drops more).
    fn fits(&self, g: &Group, to: usize, bytes: usize) -> Result<(), CollectiveError> {
        if bytes > self.max_message_bytes {
            let (peer, limit) = (g.peers[to].clone(), self.max_message_bytes);
            return Err(CollectiveError::TooLarge { id: g.id, peer_rank: to, peer, bytes, limit });
        }
        Ok(())
    }

    fn send(
        &mut self,
        g: &Group,
        to: usize,
        step: u32,
        kind: u8,
        payload: zmq::Message,
    ) -> Result<(), CollectiveError> {
        self.fits(g, to, payload.len())?;
        let dealer = self.dealer(&g.peers[to])?;
        let header = Header { id: g.id, step, sender: g.rank as u32, kind }.encode();
        send_with_data(dealer, &[&header], payload)?;
        Ok(())
    }

    /// The DEALER to `peer`, connected on first use.
    fn dealer(&mut self, peer: &str) -> Result<&mut zmq::Socket, CollectiveError> {
        // Looked up by `&str` first: a send allocates nothing once connected.
        if !self.dealers.contains_key(peer) {
            let sock = self.ctx.socket(zmq::DEALER)?;
            // No high-water mark: a slow peer makes the queue grow, never a message vanish.
            sock.set_sndhwm(0)?;
            sock.set_linger(DEALER_LINGER_MS)?;
            socket::connect(&sock, peer, self.key.as_ref())
                .map_err(|source| CollectiveError::Connect { peer: peer.to_string(), source })?;
            self.dealers.insert(peer.to_string(), sock);
        }
        self.dealers.get_mut(peer).ok_or(CollectiveError::Zmq(zmq::Error::ENOTSOCK))
    }

    /// Sends `range` of `loan` to rank `to` without a copy (see [`VecLoan`]).
    fn send_lent(
        &mut self,
        g: &Group,
        to: usize,
        step: u32,
        loan: &mut VecLoan,
        range: Range<usize>,
    ) -> Result<(), CollectiveError> {
        self.fits(g, to, range.len() * 4)?;
        let dealer = self.dealer(&g.peers[to])?;
        let header = Header { id: g.id, step, sender: g.rank as u32, kind: KIND_DATA }.encode();
        loan.send(dealer, &[&header], range)?;
        Ok(())
    }

    /// Waits for the data of (`g.id`, `step`) from rank `from`, stashing whatever else arrives.
    fn recv(&mut self, g: &Group, from: usize, step: u32) -> Result<zmq::Message, CollectiveError> {
        let key = (g.id, step, from as u32);
        let start = Instant::now();
        loop {
            if let Some(queue) = self.stash.get_mut(&key) {
                if let Some(msg) = queue.pop_front() {
                    if queue.is_empty() {
                        self.stash.remove(&key);
                    }
                    return Ok(msg);
                }
            }
            if let Some(&peer_rank) = self.aborted.get(&g.id) {
                let peer = g.peers.get(peer_rank).cloned().unwrap_or_default();
                return Err(CollectiveError::Aborted { id: g.id, peer_rank, peer });
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                return Err(CollectiveError::Timeout {
                    id: g.id,
                    peer_rank: from,
                    peer: g.peers[from].clone(),
                    waited,
                });
            }
            let left_ms = (self.timeout - waited).as_micros().div_ceil(1000);
            if retry(|| self.router.poll(zmq::POLLIN, i64::try_from(left_ms).unwrap_or(i64::MAX)))? > 0 {
                self.drain()?;
            }
        }
    }

    /// Takes every message waiting on the ROUTER into the stash (or the aborted set).
    fn drain(&mut self) -> Result<(), CollectiveError> {
        loop {
            let mut frames = match recv_frames(&self.router, zmq::DONTWAIT) {
                Ok(frames) => frames,
                Err(zmq::Error::EAGAIN) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            let header = if frames.len() == 3 { Header::decode(&frames[1]) } else { None };
            let Some(h) = header else {
                // Nothing says which rank (if any) sent it, so no collective can be failed for it.
                tracing::warn!(frames = frames.len(), "dropped a malformed message on the peer socket");
                continue;
            };
            if self.finished.contains(&h.id) {
                tracing::debug!(id = h.id, sender = h.sender, "dropped a late message for a finished collective");
            } else if h.kind == KIND_ABORT {
                self.aborted.entry(h.id).or_insert(h.sender as usize);
            } else if let Some(payload) = frames.pop() {
                self.stash.entry((h.id, h.step, h.sender)).or_default().push_back(payload);
            }
        }
    }

    fn recv_f32(&mut self, g: &Group, from: usize, step: u32, len: usize) -> Result<zmq::Message, CollectiveError> {
        let msg = self.recv(g, from, step)?;
        if msg.len() % 4 != 0 {
            let (peer, why) = (g.peers[from].clone(), "f32 data of a length that is not a multiple of 4");
            return Err(CollectiveError::Malformed { id: g.id, peer_rank: from, peer, why });
        }
        exact(g, from, msg, len * 4)
    }

    /// Sends a chunk of bytes whose length the receiver does not know: a head of its length and
    /// the length of its pieces (two little-endian u64s), then its bytes in those pieces
    /// ([`ZmqCollectives::piece_bytes`], or whole to an inproc peer), all as step `step`;
    /// [`ZmqCollectives::recv_chunk`] takes them apart.
    fn send_chunk(&mut self, g: &Group, to: usize, step: u32, bytes: &[u8]) -> Result<(), CollectiveError> {
        let len = bytes.len();
        self.fits(g, to, len)?;
        let whole = self.whole_over_inproc && g.peers[to].starts_with("inproc://");
        let per = if whole { len.max(1) } else { self.piece_bytes };
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&(len as u64).to_le_bytes());
        head[8..].copy_from_slice(&(per as u64).to_le_bytes());
        self.send(g, to, step, KIND_DATA, message(&head))?;
        for p in cut(0..len, per) {
            self.send(g, to, step, KIND_DATA, message(&bytes[p]))?;
        }
        Ok(())
    }

    /// Receives a chunk [`ZmqCollectives::send_chunk`] sent, passing each of its messages on
    /// to `forward` (as step `step + 1`) as it comes. A length beyond the message limit, or a
    /// piece of another length than its place gives it, fails the collective.
    fn recv_chunk(
        &mut self,
        g: &Group,
        from: usize,
        step: u32,
        forward: Option<usize>,
    ) -> Result<Piece<'static>, CollectiveError> {
        let head = self.recv(g, from, step)?;
        let malformed =
            |why| Err(CollectiveError::Malformed { id: g.id, peer_rank: from, peer: g.peers[from].clone(), why });
        let Ok(head_bytes) = <[u8; 16]>::try_from(&head[..]) else {
            return malformed("a chunk's head is not 16 bytes");
        };
        let [len, per] = [0, 8].map(|at| {
            let word: [u8; 8] = head_bytes[at..at + 8].try_into().unwrap_or_default();
            usize::try_from(u64::from_le_bytes(word)).unwrap_or(usize::MAX)
        });
        if len > self.max_message_bytes {
            return malformed(
                "a chunk longer than this rank's message limit (is GT_MAX_MESSAGE_BYTES the same everywhere?)",
            );
        }
        if per == 0 {
            return malformed("a chunk in pieces of 0 bytes");
        }
        if let Some(to) = forward {
            self.send(g, to, step + 1, KIND_DATA, head)?;
        }
        // Taken as they come, and the chunk grows only by what arrived: a head alone (a length
        // in pieces of a byte) costs nothing.
        let mut gathered = Vec::new();
        for p in cut(0..len, per) {
            let msg = exact(g, from, self.recv(g, from, step)?, p.len())?;
            if len <= per {
                // The only piece stays in its message; the next rank gets a copy (a message is
                // moved on, never shared).
                if let Some(to) = forward {
                    self.send(g, to, step + 1, KIND_DATA, message(&msg))?;
                }
                return Ok(Piece::Received(msg));
            }
            gathered.extend_from_slice(&msg);
            if let Some(to) = forward {
                self.send(g, to, step + 1, KIND_DATA, msg)?;
            }
        }
        Ok(Piece::Gathered(gathered))
    }

    /// The pieces a ring sends `range` of elements in: [`ZmqCollectives::piece_bytes`] each, the
    /// last shorter; none for an empty range. Every rank cuts a chunk the same way, so a receiver
    /// knows each piece's length.
    fn pieces(&self, range: Range<usize>) -> impl Iterator<Item = Range<usize>> {
        cut(range, self.piece_bytes / 4)
    }

    /// Ring reduce-scatter over the chunks `at[c]..at[c + 1]` of `data`: at step s rank r sends
    /// chunk r - s - 1 to r + 1 and folds chunk r - s - 2 from r - 1, so chunk c is folded from
    /// rank c + 1 round to rank c, which ends with it whole (in `data`, divided by n for Mean).
    /// Steps 0..n-1. Pipelined: chunks travel in [`ZmqCollectives::pieces`], and a piece goes on to
    /// the next step as soon as it is folded, in the message that brought it (folded in place,
    /// the received partial on the left as [`reference_reduce_scatter`] folds), so links and
    /// folds overlap, a piece is still in cache when it is forwarded, and no step allocates.
    /// With `then_gather`, each finished piece of this rank's chunk goes on as the first step
    /// (`n - 1`) of [`ZmqCollectives::ring_all_gather_f32`]. Chunks other than this rank's are left
    /// partly folded. To an `inproc://` peer the first step's pieces go without a copy, lent
    /// ([`VecLoan`]): the peers fold into them in place and hand them on.
    fn ring_reduce_scatter(
        &mut self,
        g: &Group,
        op: ReduceOp,
        data: &mut VecLoan,
        at: &[usize],
        then_gather: bool,
    ) -> Result<(), CollectiveError> {
        let (n, r) = (g.n(), g.rank);
        if n == 1 {
            return Ok(());
        }
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // The chunk this rank sends at step s; it receives the one it sends at step s + 1.
        let chunk = |s: usize| {
            let c = (r + 2 * n - s - 1) % n;
            at[c]..at[c + 1]
        };
        // A lent frame carries the vector's own bytes, little-endian as peers read them only
        // on a little-endian machine.
        let lend = cfg!(target_endian = "little") && g.peers[next].starts_with("inproc://");
        for p in self.pieces(chunk(0)) {
            if lend {
                self.send_lent(g, next, 0, data, p)?;
            } else {
                let mine = data.slice_mut(p).ok_or_else(|| lent_twice(g))?;
                self.send(g, next, 0, KIND_DATA, data_frame(mine))?;
            }
        }
        let last = n - 2;
        for s in 0..=last {
            for p in self.pieces(chunk(s + 1)) {
                let mut msg = self.recv_f32(g, prev, s as u32, p.len())?;
                let mine = data.slice_mut(p).ok_or_else(|| lent_twice(g))?;
                let out = match bytemuck::try_cast_slice_mut::<u8, f32>(&mut msg) {
                    Ok(acc) if cfg!(target_endian = "little") => {
                        if s == last {
                            fold_final(op, n, acc, mine);
                        } else {
                            fold_into(op, acc, mine, true);
                        }
                        msg
                    }
                    // Not aligned (a TCP receive buffer may not be): fold into our own copy.
                    _ => {
                        with_f32s(&msg, |acc| fold_into(op, mine, acc, false));
                        if s == last {
                            divide_mean(op, n, mine);
                        }
                        data_frame(mine)
                    }
                };
                if s < last {
                    self.send(g, next, s as u32 + 1, KIND_DATA, out)?;
                } else if then_gather {
                    self.send(g, next, n as u32 - 1, KIND_DATA, out)?;
                }
            }
        }
        Ok(())
    }

    /// Ring all-gather of the chunks of `data` (rank r holds chunk r): at step s rank r sends
    /// chunk r - s and receives chunk r - s - 1, in pieces; a received piece is copied in and
    /// its message goes on to the next step as it is. Steps `first..first + n - 1`; the first
    /// step's sends are the caller's (see `then_gather` of
    /// [`ZmqCollectives::ring_reduce_scatter`]). A piece this rank lent comes back in its own
    /// memory, already in place; one that comes back as a copy (a TCP link in the ring) cannot
    /// be written while peers may still hold the loan, so it is returned, to be copied in after
    /// [`VecLoan::reclaim`].
    fn ring_all_gather_f32(
        &mut self,
        g: &Group,
        data: &mut VecLoan,
        at: &[usize],
        first: u32,
    ) -> Result<Vec<LatePiece>, CollectiveError> {
        let (n, r) = (g.n(), g.rank);
        let mut late = Vec::new();
        for s in 0..n.saturating_sub(1) {
            let c = (r + 2 * n - s - 1) % n;
            for p in self.pieces(at[c]..at[c + 1]) {
                let msg = self.recv_f32(g, (r + n - 1) % n, first + s as u32, p.len())?;
                if !data.is_frame_of(&msg, p.clone()) {
                    match data.slice_mut(p.clone()) {
                        Some(into) => with_f32s(&msg, |v| into.copy_from_slice(v)),
                        None => late.push((p, with_f32s(&msg, <[f32]>::to_vec))),
                    }
                }
                if s + 2 < n {
                    self.send(g, (r + 1) % n, first + s as u32 + 1, KIND_DATA, msg)?;
                }
            }
        }
        Ok(late)
    }
}

/// A piece of the result that came back as a copy into a range still lent: where it goes, and
/// its values, copied in once the loan is back.
type LatePiece = (Range<usize>, Vec<f32>);

/// A ring touching a piece it lent: the pieces of a ring never overlap, so this is a bug.
fn lent_twice(g: &Group) -> CollectiveError {
    CollectiveError::InvalidCall { id: g.id, why: "a ring piece overlaps one already lent" }
}

/// `range` cut in consecutive ranges of `per` (at least 1), the last shorter; none for an
/// empty range.
fn cut(range: Range<usize>, per: usize) -> impl Iterator<Item = Range<usize>> {
    let (per, end) = (per.max(1), range.end);
    range.step_by(per).map(move |a| a..(a + per).min(end))
}

/// `msg` when it is `expected` bytes long; else the collective fails naming the peer.
fn exact(g: &Group, from: usize, msg: zmq::Message, expected: usize) -> Result<zmq::Message, CollectiveError> {
    if msg.len() != expected {
        let (peer, got) = (g.peers[from].clone(), msg.len());
        return Err(CollectiveError::LengthMismatch { id: g.id, peer_rank: from, peer, expected, got });
    }
    Ok(msg)
}

/// The last fold of a piece, in one pass: the received partial `acc` folded with `mine`, divided
/// by n for Mean, into both (`mine` keeps it, `acc`'s message carries it on).
fn fold_final(op: ReduceOp, n: usize, acc: &mut [f32], mine: &mut [f32]) {
    fn each(acc: &mut [f32], mine: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        acc.iter_mut().zip(mine).for_each(|(a, x)| {
            *a = f(*a, *x);
            *x = *a;
        });
    }
    let n = n as f32;
    match op {
        ReduceOp::Sum => each(acc, mine, |a, x| combine(ReduceOp::Sum, a, x)),
        ReduceOp::Mean => each(acc, mine, |a, x| combine(ReduceOp::Sum, a, x) / n),
        ReduceOp::Max => each(acc, mine, |a, x| combine(ReduceOp::Max, a, x)),
        ReduceOp::Min => each(acc, mine, |a, x| combine(ReduceOp::Min, a, x)),
    }
}

/// Mean's division, once, by the rank that ends with the whole sum: every rank gets its bits.
fn divide_mean(op: ReduceOp, n: usize, v: &mut [f32]) {
    if op == ReduceOp::Mean {
        v.iter_mut().for_each(|x| *x /= n as f32);
    }
}

impl Collectives for ZmqCollectives {
    /// Ring reduce-scatter, then ring all-gather. Its own memory comes back once every peer
    /// let go of what it was lent (at once, mostly: the last holder is finishing a copy).
    fn all_reduce(&mut self, g: &Group, op: ReduceOp, data: Vec<f32>) -> Result<Vec<f32>, CollectiveError> {
        self.guarded(g, |me| {
            let n = g.n();
            let at = offsets(&even_counts(data.len(), n));
            let mut loan = VecLoan::new(data);
            me.ring_reduce_scatter(g, op, &mut loan, &at, true)?;
            let late = me.ring_all_gather_f32(g, &mut loan, &at, (n - 1) as u32)?;
            let waited = me.timeout;
            let mut data = loan.reclaim(waited).ok_or(CollectiveError::Unreturned { id: g.id, waited })?;
            for (p, v) in late {
                data[p].copy_from_slice(&v);
            }
            Ok(data)
        })
    }

    /// Ring all-gather: at step s rank r sends chunk r - s to r + 1 and receives chunk
    /// r - s - 1 from r - 1. Chunks travel as [`ZmqCollectives::send_chunk`] cuts them, and a
    /// received message goes on to the next step as it came, so links overlap as in
    /// `all_reduce`. A chunk that came in one message stays in it; one that came in several is
    /// put together (a copy). Only sending copies otherwise (once per link).
    fn all_gather<'a>(&mut self, g: &Group, mine: &'a [u8]) -> Result<Vec<Piece<'a>>, CollectiveError> {
        self.guarded(g, |me| {
            let (n, r) = (g.n(), g.rank);
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let mut pieces: Vec<Option<Piece<'a>>> = (0..n).map(|_| None).collect();
            pieces[r] = Some(Piece::Mine(mine));
            if n > 1 {
                me.send_chunk(g, next, 0, mine)?;
            }
            for s in 0..n.saturating_sub(1) {
                let inc = (r + 2 * n - s - 1) % n;
                let forward = (s + 2 < n).then_some(next);
                pieces[inc] = Some(me.recv_chunk(g, prev, s as u32, forward)?);
            }
            // Every index was filled: r itself, and r - s - 1 for s in 0..n - 1.
            Ok(pieces.into_iter().map(|p| p.unwrap_or(Piece::Mine(&[]))).collect())
        })
    }

    fn reduce_scatter(
        &mut self,
        g: &Group,
        op: ReduceOp,
        data: &[f32],
        counts: &[usize],
    ) -> Result<Vec<f32>, CollectiveError> {
        self.guarded(g, |me| {
            let invalid = |why| Err(CollectiveError::InvalidCall { id: g.id, why });
            if counts.len() != g.n() {
                return invalid("reduce-scatter counts are not one per rank");
            }
            let at = offsets(counts);
            if at.last() != Some(&data.len()) {
                return invalid("reduce-scatter counts do not sum to the data's length");
            }
            // This rank's chunk is never lent; the rest is freed when the last peer lets go.
            let mut loan = VecLoan::new(data.to_vec());
            me.ring_reduce_scatter(g, op, &mut loan, &at, false)?;
            let mine = loan.slice_mut(at[g.rank]..at[g.rank + 1]).ok_or_else(|| lent_twice(g))?;
            Ok(mine.to_vec())
        })
    }

    /// A binomial tree rooted at `root`: every link carries the data once, in log2(n) rounds.
    fn broadcast<'a>(&mut self, g: &Group, root: usize, data: Option<&'a [u8]>) -> Result<Piece<'a>, CollectiveError> {
        self.guarded(g, |me| {
            let n = g.n();
            if root >= n {
                return Err(CollectiveError::InvalidCall { id: g.id, why: "broadcast root is not in the group" });
            }
            // Ranks relative to the root: v's parent is v without its highest bit; its children
            // are v + m for the powers of two m above that bit.
            let v = (g.rank + n - root) % n;
            let top = if v == 0 { 0 } else { 1 << (usize::BITS - 1 - v.leading_zeros()) };
            let bytes = if v == 0 {
                let why = "broadcast without data on the root";
                Piece::Mine(data.ok_or(CollectiveError::InvalidCall { id: g.id, why })?)
            } else {
                Piece::Received(me.recv(g, (v - top + root) % n, 0)?)
            };
            let mut m = if v == 0 { 1 } else { top << 1 };
            while v + m < n {
                me.send(g, (v + m + root) % n, 0, KIND_DATA, message(&bytes))?;
                m <<= 1;
            }
            Ok(bytes)
        })
    }

    fn transfer<'a>(
        &mut self,
        g: &Group,
        from: usize,
        to: usize,
        data: Option<&'a [u8]>,
    ) -> Result<Option<Piece<'a>>, CollectiveError> {
        self.guarded(g, |me| {
            let invalid = |why| Err(CollectiveError::InvalidCall { id: g.id, why });
            if from >= g.n() || to >= g.n() {
                return invalid("transfer between ranks not in the group");
            }
            let data = if g.rank == from {
                match data {
                    Some(d) => d,
                    None => return invalid("transfer without data on the sending rank"),
                }
            } else {
                &[]
            };
            if g.rank == from && g.rank == to {
                Ok(Some(Piece::Mine(data)))
            } else if g.rank == from {
                me.send(g, to, 0, KIND_DATA, message(data)).map(|()| None)
            } else if g.rank == to {
                Ok(Some(Piece::Received(me.recv(g, from, 0)?)))
            } else {
                Ok(None)
            }
        })
    }

    fn abort(&mut self, g: &Group) {
        for to in (0..g.n()).filter(|&to| to != g.rank) {
            if let Err(e) = self.send(g, to, 0, KIND_ABORT, zmq::Message::new()) {
                // The peer then learns by its timeout instead.
                tracing::warn!(id = g.id, peer = %g.peers[to], "cannot tell a peer of an abort: {e}");
            }
        }
        self.finish(g.id);
    }
}

impl Drop for ZmqCollectives {
    fn drop(&mut self) {
        if let Some(path) = &self.ipc_file {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The host other machines reach this one at: `GT_PEER_HOST`, else the kernel's host name.
fn peer_host() -> Result<String, CollectiveError> {
    let set = |h: String| Some(h.trim().to_string()).filter(|h| !h.is_empty());
    std::env::var("GT_PEER_HOST")
        .ok()
        .and_then(set)
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().and_then(set))
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().and_then(set))
        .or_else(|| std::env::var("HOSTNAME").ok().and_then(set))
        .ok_or(CollectiveError::NoHostName)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];
    const LONG: Duration = Duration::from_secs(20);
    // A worker moves its collectives into its own thread.
    const _: fn() = || {
        fn is_send<T: Send>() {}
        is_send::<ZmqCollectives>();
    };

    fn cluster(n: usize, like: &Endpoint, timeout: Duration) -> (Vec<ZmqCollectives>, Vec<String>) {
        keyed_cluster(n, like, timeout, None)
    }

    fn keyed_cluster(
        n: usize,
        like: &Endpoint,
        timeout: Duration,
        key: Option<&ClusterKey>,
    ) -> (Vec<ZmqCollectives>, Vec<String>) {
        let ctx = zmq::Context::new();
        let bind = |r| ZmqCollectives::bind(&ctx, like, &format!("t{r}"), timeout, 1 << 20, key.cloned()).unwrap();
        let colls: Vec<_> = (0..n).map(bind).collect();
        let peers = colls.iter().map(|c| c.address().to_string()).collect();
        (colls, peers)
    }

    fn inproc(n: usize) -> (Vec<ZmqCollectives>, Vec<String>) {
        cluster(n, &Endpoint::Inproc("d".into()), LONG)
    }

    fn group(id: u64, rank: usize, peers: &[String]) -> Group {
        Group { id, rank, peers: peers.to_vec() }
    }

    /// Runs `f(rank, collectives)` on a thread per rank; the sockets outlive every thread.
    fn on_every_rank<T: Send>(
        colls: &mut [ZmqCollectives],
        f: impl Fn(usize, &mut ZmqCollectives) -> T + Sync,
    ) -> Vec<T> {
        std::thread::scope(|s| {
            let f = &f;
            let threads: Vec<_> = colls.iter_mut().enumerate().map(|(r, c)| s.spawn(move || f(r, c))).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        })
    }

    /// Values with fractions and both signs, so that the order of a sum shows in its bits.
    fn input(case: usize, rank: usize, len: usize) -> Vec<f32> {
        let mut x = (case as u64 * 7919 + rank as u64 * 104_729) | 1;
        (0..len)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 200.0
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn all_reduce_gives_every_rank_the_reference_bits() {
        // Whole chunks, and chunks cut into pieces of one element and of three.
        for (n, piece) in (1..=5).flat_map(|n| [PIECE_BYTES, 4, 12].map(|p| (n, p))) {
            let (mut colls, peers) = inproc(n);
            colls.iter_mut().for_each(|c| c.set_piece_bytes(piece));
            let cases: Vec<(ReduceOp, usize)> =
                OPS.iter().flat_map(|&op| [0, 1, n - 1, n, 7, 100].map(|len| (op, len))).collect();
            let got = on_every_rank(&mut colls, |r, c| {
                let run = |(i, &(op, len)): (usize, &(ReduceOp, usize))| {
                    let data = input(i, r, len);
                    let at = data.as_ptr();
                    let data = c.all_reduce(&group(i as u64, r, &peers), op, data).unwrap();
                    // Lent and taken back, never copied into a new vector.
                    assert_eq!(data.as_ptr(), at);
                    data
                };
                cases.iter().enumerate().map(run).collect::<Vec<_>>()
            });
            for (i, &(op, len)) in cases.iter().enumerate() {
                let inputs: Vec<_> = (0..n).map(|r| input(i, r, len)).collect();
                let refs: Vec<&[f32]> = inputs.iter().map(|v| &v[..]).collect();
                let want = reference_all_reduce(op, &refs);
                for (r, per_rank) in got.iter().enumerate() {
                    assert_eq!(bits(&per_rank[i]), bits(&want), "n {n} piece {piece} {op:?} len {len} rank {r}");
                }
                // The reference is the plain serial reduction, up to rounding.
                for (e, w) in want.iter().enumerate() {
                    let column = inputs.iter().map(|v| v[e]);
                    let serial = match op {
                        ReduceOp::Sum => column.sum(),
                        ReduceOp::Mean => column.sum::<f32>() / n as f32,
                        ReduceOp::Max => column.fold(f32::NEG_INFINITY, f32::max),
                        ReduceOp::Min => column.fold(f32::INFINITY, f32::min),
                    };
                    assert!((serial - w).abs() <= 1e-3, "n {n} {op:?} element {e}: {w} vs {serial}");
                }
            }
        }
    }

    #[test]
    fn all_gather_collects_pieces_of_every_size() {
        // Whole chunks (inproc's default), then messages of 4 bytes (many per chunk, the last
        // short) and of 37 (chunks of whole messages); rank 0's chunk is empty.
        for (n, bytes) in (1..=5).flat_map(|n| [None, Some(4), Some(37)].map(|p| (n, p))) {
            let (mut colls, peers) = inproc(n);
            if let Some(bytes) = bytes {
                colls.iter_mut().for_each(|c| c.set_piece_bytes(bytes));
            }
            let piece = |r: usize| (0..r * r * 37).map(|i| (r * 7 + i) as u8).collect::<Vec<u8>>();
            let got = on_every_rank(&mut colls, |r, c| owned(c.all_gather(&group(1, r, &peers), &piece(r)).unwrap()));
            let want: Vec<_> = (0..n).map(piece).collect();
            assert!(got.iter().all(|g| *g == want), "n {n}, pieces of {bytes:?} bytes");
        }
    }

    #[test]
    fn reduce_scatter_with_uneven_and_zero_counts() {
        for (n, piece) in (1..=5).flat_map(|n| [PIECE_BYTES, 4, 8].map(|p| (n, p))) {
            let (mut colls, peers) = inproc(n);
            colls.iter_mut().for_each(|c| c.set_piece_bytes(piece));
            let counts: Vec<usize> = (0..n).map(|r| (r * 3 + 2) % 5).collect();
            let len = counts.iter().sum();
            for (i, op) in OPS.into_iter().enumerate() {
                let got = on_every_rank(&mut colls, |r, c| {
                    c.reduce_scatter(&group(i as u64, r, &peers), op, &input(i, r, len), &counts).unwrap()
                });
                let inputs: Vec<_> = (0..n).map(|r| input(i, r, len)).collect();
                let refs: Vec<&[f32]> = inputs.iter().map(|v| &v[..]).collect();
                let want = reference_reduce_scatter(op, &refs, &counts);
                for r in 0..n {
                    assert_eq!(got[r].len(), counts[r]);
                    assert_eq!(bits(&got[r]), bits(&want[r]), "n {n} piece {piece} {op:?} rank {r}");
                }
            }
        }
    }

    #[test]
    fn broadcast_from_the_first_and_a_middle_rank() {
        for n in 1..=5 {
            let (mut colls, peers) = inproc(n);
            for (id, root) in [(0, 0), (1, n / 2), (2, n - 1)] {
                let bytes: Vec<u8> = (0..1000 + id).map(|i| (i * 31 + root) as u8).collect();
                let got = on_every_rank(&mut colls, |r, c| {
                    c.broadcast(&group(id as u64, r, &peers), root, (r == root).then_some(&bytes[..])).unwrap().to_vec()
                });
                assert!(got.iter().all(|g| *g == bytes), "n {n} root {root}");
            }
        }
    }

    #[test]
    fn transfer_reaches_only_the_receiver() {
        let (mut colls, peers) = inproc(3);
        let got = on_every_rank(&mut colls, |r, c| {
            let a = c.transfer(&group(1, r, &peers), 2, 0, (r == 2).then_some(&b"hello"[..])).unwrap();
            let b = c.transfer(&group(2, r, &peers), 1, 1, (r == 1).then_some(&b"self"[..])).unwrap();
            let (a, b) = (a.map(|p| p.to_vec()), b.map(|p| p.to_vec()));
            (a, b)
        });
        assert_eq!(got[0], (Some(b"hello".to_vec()), None));
        assert_eq!(got[1], (None, Some(b"self".to_vec())));
        assert_eq!(got[2], (None, None));
    }

    #[test]
    fn a_rank_running_ahead_loses_nothing() {
        let (mut colls, peers) = inproc(3);
        // Pieces of two elements: a step's pieces wait in order under one key.
        colls.iter_mut().for_each(|c| c.set_piece_bytes(8));
        let got = on_every_rank(&mut colls, |r, c| {
            (0..10u64)
                .map(|id| {
                    // Rank 0 goes at once; the others lag, so its messages for later ids wait.
                    std::thread::sleep(Duration::from_millis(3 * r as u64));
                    let g = group(id, r, &peers);
                    let data = c.all_reduce(&g, ReduceOp::Sum, vec![(r + 1) as f32 * id as f32; 5]).unwrap();
                    // 10 bytes in pieces of 8: two messages per chunk wait under one key.
                    let all = owned(c.all_gather(&g_next(&g), &[r as u8; 10]).unwrap());
                    (data, all)
                })
                .collect::<Vec<_>>()
        });
        for per_rank in &got {
            for (id, (data, all)) in per_rank.iter().enumerate() {
                assert_eq!(*data, vec![6.0 * id as f32; 5]);
                assert_eq!(*all, vec![vec![0; 10], vec![1; 10], vec![2; 10]]);
            }
        }
        // A root finishes every broadcast before its peer starts the first.
        let (mut colls, peers) = inproc(2);
        let got = on_every_rank(&mut colls, |r, c| {
            if r == 1 {
                std::thread::sleep(Duration::from_millis(100));
            }
            let each = |id: u64| c.broadcast(&group(id, r, &peers), 0, Some(&[id as u8; 4])).unwrap().to_vec();
            (0..10).map(each).collect::<Vec<_>>()
        });
        assert_eq!(got[0], got[1]);
    }

    fn owned(pieces: Vec<Piece>) -> Vec<Vec<u8>> {
        pieces.iter().map(|p| p.to_vec()).collect()
    }

    fn g_next(g: &Group) -> Group {
        Group { id: g.id + 1000, ..g.clone() }
    }

    #[test]
    fn a_silent_peer_times_out_by_name_and_hears_of_it() {
        let (mut colls, peers) = cluster(2, &Endpoint::Inproc("d".into()), Duration::from_millis(200));
        let start = Instant::now();
        let err = colls[0].all_reduce(&group(7, 0, &peers), ReduceOp::Sum, vec![1.0; 4]).unwrap_err();
        match &err {
            CollectiveError::Timeout { id: 7, peer_rank: 1, peer, waited } => {
                assert_eq!(*peer, peers[1]);
                assert!(*waited >= Duration::from_millis(200) && start.elapsed() < Duration::from_secs(5));
            }
            other => panic!("not a timeout: {other}"),
        }
        assert!(err.to_string().contains(&peers[1]), "{err}");
        // Rank 0 told rank 1 it gave up, so rank 1 fails at once, naming rank 0.
        let err = colls[1].all_reduce(&group(7, 1, &peers), ReduceOp::Sum, vec![1.0; 4]).unwrap_err();
        // (Without the abort it would be a timeout: 200 ms is all it waits.)
        assert!(matches!(err, CollectiveError::Aborted { id: 7, peer_rank: 0, .. }), "{err}");
        // The next collective is unaffected.
        let got = on_every_rank(&mut colls, |r, c| owned(c.all_gather(&group(8, r, &peers), &[r as u8]).unwrap()));
        assert_eq!(got[0], vec![vec![0], vec![1]]);
    }

    #[test]
    fn an_abort_fails_the_others_at_once() {
        let (mut colls, peers) = inproc(3);
        let start = Instant::now();
        let got = on_every_rank(&mut colls, |r, c| {
            let g = group(3, r, &peers);
            if r == 2 {
                c.abort(&g);
                None
            } else {
                Some(c.all_reduce(&g, ReduceOp::Max, vec![1.0; 9]).unwrap_err())
            }
        });
        assert!(start.elapsed() < Duration::from_secs(5));
        for err in got.iter().take(2) {
            assert!(matches!(err, Some(CollectiveError::Aborted { id: 3, peer_rank: 2, .. })), "{err:?}");
        }
        let got = on_every_rank(&mut colls, |r, c| {
            c.all_reduce(&group(4, r, &peers), ReduceOp::Max, vec![r as f32; 2]).unwrap()
        });
        assert!(got.iter().all(|d| *d == [2.0; 2]));
    }

    /// A socket that can send rank 0 anything, the way a confused or hostile peer would.
    fn rogue(colls: &[ZmqCollectives], to: &str) -> zmq::Socket {
        let sock = colls[0].ctx.socket(zmq::DEALER).unwrap();
        sock.connect(to).unwrap();
        sock
    }

    /// A peer that keeps the memory a rank lent it past the rank's timeout: the rank fails
    /// the collective naming it unreturned (its data is gone), and the peer's frame stays
    /// readable until the peer drops it, which frees the vector.
    #[test]
    fn memory_a_peer_keeps_is_never_taken_back_from_under_it() {
        let ctx = zmq::Context::new();
        let timeout = Duration::from_millis(200);
        let mut c = ZmqCollectives::bind(&ctx, &Endpoint::Inproc("d".into()), "u0", timeout, 1 << 20, None).unwrap();
        // Rank 1 is a bare ROUTER that answers by hand.
        let peer = ctx.socket(zmq::ROUTER).unwrap();
        peer.bind("inproc://unreturned-peer").unwrap();
        let to_rank0 = ctx.socket(zmq::DEALER).unwrap();
        to_rank0.connect(c.address()).unwrap();
        let peers = vec![c.address().to_string(), "inproc://unreturned-peer".to_string()];
        let (err, held) = std::thread::scope(|s| {
            let rank1 = s.spawn(move || {
                // A message as it arrives: routing id, header, payload (the payload kept as is).
                let take = || (0..3).map(|_| peer.recv_msg(0).unwrap()).collect::<Vec<_>>().pop().unwrap();
                // Rank 0 lends its chunk for rank 1 (elements 4..8): kept.
                let lent = take();
                let data = |step| [Header { id: 5, step, sender: 1, kind: KIND_DATA }.encode().to_vec(), vec![0u8; 16]];
                // Its partial of rank 0's chunk, then its own chunk, reduced, as a copy.
                to_rank0.send_multipart(data(0), 0).unwrap();
                drop(take());
                to_rank0.send_multipart(data(1), 0).unwrap();
                lent
            });
            let err = c.all_reduce(&group(5, 0, &peers), ReduceOp::Sum, vec![2.0; 8]).unwrap_err();
            (err, rank1.join().unwrap())
        });
        assert!(matches!(err, CollectiveError::Unreturned { id: 5, .. }), "{err}");
        // Still the lender's bytes, readable by the peer; dropping it frees the vector.
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&held), [2.0; 4]);
        drop(held);
    }

    #[test]
    fn garbage_on_the_peer_socket_is_dropped() {
        let (mut colls, peers) = inproc(2);
        let sock = rogue(&colls, &peers[0]);
        sock.send("x", 0).unwrap();
        sock.send_multipart([&[0u8; 16][..], b"payload"], 0).unwrap();
        let mut bad_kind = Header { id: 1, step: 0, sender: 1, kind: KIND_DATA }.encode();
        bad_kind[16] = 9;
        sock.send_multipart([&bad_kind[..], b"payload"], 0).unwrap();
        let header = Header { id: 1, step: 0, sender: 1, kind: KIND_DATA }.encode();
        sock.send_multipart([&header[..], b"a", b"b", b"c", b"d"], 0).unwrap();
        let got = on_every_rank(&mut colls, |r, c| {
            c.all_reduce(&group(1, r, &peers), ReduceOp::Sum, vec![r as f32 + 0.5; 3]).unwrap()
        });
        assert!(got.iter().all(|d| *d == [2.0; 3]));
    }

    #[test]
    fn a_peers_bad_payload_fails_naming_it() {
        let (mut colls, peers) = cluster(2, &Endpoint::Inproc("d".into()), Duration::from_secs(5));
        let sock = rogue(&colls, &peers[0]);
        // Claims to be rank 1's first ring step: 3 bytes of f32 data, then 12 where 8 belong.
        let header = |id| Header { id, step: 0, sender: 1, kind: KIND_DATA }.encode();
        sock.send_multipart([&header(2)[..], &[0; 3]], 0).unwrap();
        sock.send_multipart([&header(3)[..], &[0; 12]], 0).unwrap();
        let err = colls[0].all_reduce(&group(2, 0, &peers), ReduceOp::Sum, vec![0.0; 4]).unwrap_err();
        assert!(
            matches!(&err, CollectiveError::Malformed { id: 2, peer_rank: 1, peer, .. } if *peer == peers[1]),
            "{err}"
        );
        let err = colls[0].all_reduce(&group(3, 0, &peers), ReduceOp::Sum, vec![0.0; 4]).unwrap_err();
        let want =
            CollectiveError::LengthMismatch { id: 3, peer_rank: 1, peer: peers[1].clone(), expected: 8, got: 12 };
        assert_eq!(err.to_string(), want.to_string());
        // An all_gather chunk's head that is not 16 bytes, a length beyond the message limit,
        // pieces of 0 bytes, and a piece longer than its place.
        sock.send_multipart([&header(4)[..], &[0; 3]], 0).unwrap();
        let head = |len: u64, per: u64| [len.to_le_bytes(), per.to_le_bytes()].concat();
        sock.send_multipart([&header(5)[..], &head(u64::MAX, 4)], 0).unwrap();
        sock.send_multipart([&header(6)[..], &head(6, 4)], 0).unwrap();
        sock.send_multipart([&header(6)[..], &[0; 4]], 0).unwrap();
        sock.send_multipart([&header(6)[..], &[0; 4]], 0).unwrap();
        sock.send_multipart([&header(7)[..], &head(6, 0)], 0).unwrap();
        // A head of a chunk at the message limit in pieces of one byte, then silence: a
        // timeout, with nothing allocated for pieces that never came.
        sock.send_multipart([&header(8)[..], &head(1 << 20, 1)], 0).unwrap();
        for (id, want) in [(4, "not 16 bytes"), (5, "message limit"), (7, "pieces of 0 bytes")] {
            let err = colls[0].all_gather(&group(id, 0, &peers), &[1; 4]).unwrap_err();
            assert!(
                matches!(&err, CollectiveError::Malformed { peer_rank: 1, why, .. } if why.contains(want)),
                "{err}"
            );
        }
        let err = colls[0].all_gather(&group(6, 0, &peers), &[1; 4]).unwrap_err();
        let want = CollectiveError::LengthMismatch { id: 6, peer_rank: 1, peer: peers[1].clone(), expected: 2, got: 4 };
        assert_eq!(err.to_string(), want.to_string());
        colls[0].set_timeout(Duration::from_millis(200));
        let err = colls[0].all_gather(&group(8, 0, &peers), &[1; 4]).unwrap_err();
        assert!(matches!(&err, CollectiveError::Timeout { id: 8, peer_rank: 1, .. }), "{err}");
    }

    #[test]
    fn bad_calls_and_oversized_messages_are_errors() {
        let (mut colls, peers) = cluster(2, &Endpoint::Inproc("d".into()), Duration::from_secs(5));
        let c = &mut colls[0];
        let err = c.reduce_scatter(&group(1, 0, &peers), ReduceOp::Sum, &[1.0; 5], &[2, 2]).unwrap_err();
        assert!(matches!(err, CollectiveError::InvalidCall { id: 1, .. }), "{err}");
        let err = c.broadcast(&group(2, 0, &peers), 2, None).unwrap_err();
        assert!(matches!(err, CollectiveError::InvalidCall { id: 2, .. }), "{err}");
        let err = c.all_gather(&group(3, 5, &peers), &[]).unwrap_err();
        assert!(matches!(err, CollectiveError::InvalidCall { id: 3, .. }), "{err}");
        let err = c.transfer(&group(4, 0, &peers), 0, 1, Some(&vec![0; (1 << 20) + 1])).unwrap_err();
        assert!(matches!(err, CollectiveError::TooLarge { id: 4, peer_rank: 1, limit: 1048576, .. }), "{err}");
    }

    /// Rings of in-process ranks and one over TCP, first, in the middle or last: a piece a rank
    /// lent to an in-process peer comes back as a copy (after the TCP link), so it is written
    /// only once every peer let go of the loan; every rank still gets the reference bits, for
    /// lengths shorter than the ring and uneven ones, pieces of one element and more.
    #[test]
    fn a_ring_mixing_inproc_and_tcp_peers() {
        let ctx = zmq::Context::new();
        let tcp = Endpoint::Tcp { host: "localhost".into(), port: 1 };
        let inproc = Endpoint::Inproc("d".into());
        let rings: [&[&Endpoint]; 4] = [
            &[&inproc, &tcp],
            &[&tcp, &inproc, &inproc],
            &[&inproc, &inproc, &tcp, &inproc],
            &[&inproc, &inproc, &tcp],
        ];
        for (ring, piece) in rings.iter().flat_map(|r| [PIECE_BYTES, 4, 12].map(|p| (r, p))) {
            let n = ring.len();
            let bind = |(r, like)| ZmqCollectives::bind(&ctx, like, &format!("m{r}"), LONG, 1 << 20, None).unwrap();
            let mut colls: Vec<_> = ring.iter().copied().enumerate().map(bind).collect();
            colls.iter_mut().for_each(|c| c.set_piece_bytes(piece));
            let peers: Vec<String> = colls.iter().map(|c| c.address().to_string()).collect();
            let cases: Vec<(ReduceOp, usize)> =
                [(ReduceOp::Sum, 1001), (ReduceOp::Mean, 0), (ReduceOp::Max, 1), (ReduceOp::Min, n - 1)].into();
            let counts = [25].repeat(n);
            let got = on_every_rank(&mut colls, |r, c| {
                let reduced: Vec<_> = (0..)
                    .zip(&cases)
                    .map(|(i, &(op, len))| c.all_reduce(&group(i, r, &peers), op, input(i as usize, r, len)).unwrap())
                    .collect();
                let max = c.reduce_scatter(&group(9, r, &peers), ReduceOp::Max, &input(9, r, 25 * n), &counts);
                (reduced, max.unwrap())
            });
            for (i, &(op, len)) in cases.iter().enumerate() {
                let inputs: Vec<_> = (0..n).map(|r| input(i, r, len)).collect();
                let want = reference_all_reduce(op, &inputs.iter().map(|v| &v[..]).collect::<Vec<_>>());
                for (r, (reduced, _)) in got.iter().enumerate() {
                    assert_eq!(bits(&reduced[i]), bits(&want), "{ring:?} piece {piece} {op:?} len {len} rank {r}");
                }
            }
            let maxes: Vec<_> = (0..n).map(|r| input(9, r, 25 * n)).collect();
            let want =
                reference_reduce_scatter(ReduceOp::Max, &maxes.iter().map(|v| &v[..]).collect::<Vec<_>>(), &counts);
            for (r, (_, max)) in got.iter().enumerate() {
                assert_eq!(bits(max), bits(&want[r]), "{ring:?} piece {piece} rank {r}");
            }
        }
    }

    #[test]
    fn ipc_and_tcp_peers() {
        let ipc = Endpoint::Ipc("/ignored/d.ipc".into());
        let tcp = Endpoint::Tcp { host: "localhost".into(), port: 1 };
        for like in [ipc, tcp] {
            let (mut colls, peers) = cluster(3, &like, LONG);
            // Many pieces, of a length (25 elements) that leaves some of a TCP receive buffer's
            // messages unaligned.
            colls.iter_mut().for_each(|c| c.set_piece_bytes(100));
            let files: Vec<_> = colls.iter().filter_map(|c| c.ipc_file.clone()).collect();
            if matches!(like, Endpoint::Ipc(_)) {
                assert_eq!(files.len(), 3);
                assert!(peers.iter().all(|p| p.starts_with("ipc://")));
                #[cfg(unix)]
                for f in &files {
                    use std::os::unix::fs::PermissionsExt;
                    assert_eq!(std::fs::metadata(f).unwrap().permissions().mode() & 0o777, 0o600);
                }
            } else {
                assert!(peers.iter().all(|p| p.starts_with("tcp://127.0.0.1:")), "{peers:?}");
            }
            let got = on_every_rank(&mut colls, |r, c| {
                let data = c.all_reduce(&group(1, r, &peers), ReduceOp::Mean, input(0, r, 1000)).unwrap();
                // Chunks of 250 bytes in messages of 100: unaligned in TCP receive buffers.
                let all = owned(c.all_gather(&group(2, r, &peers), &[r as u8; 250]).unwrap());
                (data, all)
            });
            let inputs: Vec<_> = (0..3).map(|r| input(0, r, 1000)).collect();
            let want = reference_all_reduce(ReduceOp::Mean, &inputs.iter().map(|v| &v[..]).collect::<Vec<_>>());
            for (data, all) in &got {
                assert_eq!(bits(data), bits(&want));
                assert_eq!(*all, vec![vec![0; 250], vec![1; 250], vec![2; 250]]);
            }
            drop(colls);
            assert!(files.iter().all(|f| !f.exists()), "socket files left behind");
        }
    }

    #[test]
    fn tcp_peers_with_a_cluster_key_let_in_only_its_holders() {
        let tcp = Endpoint::Tcp { host: "localhost".into(), port: 1 };
        let (a, b) = (ClusterKey::generate().unwrap(), ClusterKey::generate().unwrap());
        let (mut colls, peers) = keyed_cluster(2, &tcp, Duration::from_secs(2), Some(&a));
        let got = on_every_rank(&mut colls, |r, c| owned(c.all_gather(&group(1, r, &peers), &[r as u8; 10]).unwrap()));
        assert_eq!(got[0], vec![vec![0; 10], vec![1; 10]]);
        // A rank with another key, or none, reaches nobody and is reached by nobody: its
        // messages (data, or a forged abort) never arrive, so the keyed rank waits out its
        // timeout instead of taking them.
        for intruder_key in [Some(&b), None] {
            let (mut intruder, theirs) = keyed_cluster(1, &tcp, Duration::from_secs(2), intruder_key);
            let mixed = vec![peers[0].clone(), theirs[0].clone()];
            let mut pair = vec![colls.remove(0), intruder.remove(0)];
            let got = on_every_rank(&mut pair, |r, c| {
                if r == 1 {
                    c.abort(&group(2, r, &mixed));
                }
                c.all_gather(&group(2, r, &mixed), &[r as u8; 10]).unwrap_err()
            });
            assert!(matches!(got[0], CollectiveError::Timeout { id: 2, peer_rank: 1, .. }), "{}", got[0]);
            colls.insert(0, pair.remove(0));
        }
        let got = on_every_rank(&mut colls, |r, c| owned(c.all_gather(&group(3, r, &peers), &[r as u8; 10]).unwrap()));
        assert_eq!(got[1], vec![vec![0; 10], vec![1; 10]], "the keyed ranks still serve each other");
    }
}
