//! ZeroMQ socket set-up shared by the dispatcher, workers and clients, so every socket has
//! the same guarantees: no silent drops (unbounded high-water marks; a ROUTER that cannot
//! route reports `EHOSTUNREACH`), heartbeats that close a connection to a dead host, a
//! bounded linger at close, and a bound on what one message can make a peer buffer. With a
//! cluster key, every TCP endpoint is CURVE ([`crate::auth`]); IPC and `inproc://` stay as
//! they are.

use crate::auth::{self, ClusterKey};
use crate::endpoint::Endpoint;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use zmq::{Context, Socket, SocketType};

/// ZMTP heartbeat interval: a silent peer is pinged this often (ms).
pub const HEARTBEAT_IVL_MS: i32 = 1000;
/// A peer that answers no ping for this long is disconnected (ms).
pub const HEARTBEAT_TIMEOUT_MS: i32 = 5000;

/// The largest frame a socket takes off the wire before dropping the connection
/// (`ZMQ_MAXMSGSIZE`): twice the message limit, so a frame somewhat over it still arrives and
/// is answered with a reason by the codec's check, while a peer announcing a huge frame is cut
/// off at its header instead of being buffered.
pub fn wire_limit(max_message_bytes: usize) -> i64 {
    i64::try_from(max_message_bytes.saturating_mul(2)).unwrap_or(i64::MAX)
}

fn common(socket: &Socket, max_message_bytes: usize) -> zmq::Result<()> {
    socket.set_maxmsgsize(wire_limit(max_message_bytes))?;
    // 0 = no limit: a full queue must never drop an instruction.
    socket.set_sndhwm(0)?;
    socket.set_rcvhwm(0)?;
    socket.set_heartbeat_ivl(HEARTBEAT_IVL_MS)?;
    socket.set_heartbeat_timeout(HEARTBEAT_TIMEOUT_MS)?;
    socket.set_heartbeat_ttl(HEARTBEAT_TIMEOUT_MS)?;
    // Pending messages get this long to leave when the socket closes (a goodbye, say).
    socket.set_linger(1000)?;
    Ok(())
}

/// Runs a ZeroMQ call again while a signal interrupts it (`EINTR`): a signal to the process
/// (a profiler's timer, a terminal resize, a child's exit) says nothing about the connection.
pub fn retry<T>(mut call: impl FnMut() -> zmq::Result<T>) -> zmq::Result<T> {
    loop {
        match call() {
            Err(zmq::Error::EINTR) => continue,
            done => return done,
        }
    }
}

/// How long a peer that waits for a message polls before it sleeps, by default
/// (`GT_SPIN_US`): a few wake-ups' worth, so that a quick answer is taken without one, and a
/// waiter idle longer costs this much CPU once per wait.
pub const DEFAULT_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// Waits for `items` as `zmq::poll` does, `timeout_ms` at most (-1: forever), but first polls
/// without sleeping for up to `spin`. A thread asleep in `poll` is woken through the kernel,
/// and on a virtual machine whose other vCPU idles that wake-up alone can cost tens of µs per
/// hop; an answer expected within `spin` is taken without it. Between polls the thread
/// yields, so a spinning waiter gives its core to any runnable thread (a worker's compute).
pub fn poll_spinning(items: &mut [zmq::PollItem], spin: std::time::Duration, timeout_ms: i64) -> zmq::Result<i32> {
    if let Some(ready) = spin_first(spin, |spin| spin_poll(items, spin), |ready| matches!(ready, Ok(n) if *n > 0)) {
        return ready;
    }
    retry(|| zmq::poll(items, timeout_ms))
}

/// Receives one whole message from `sock` ([`recv_frames`]) as [`poll_spinning`] waits for
/// it: trying for up to `spin` without sleeping, then asleep for `timeout_ms` at most (-1:
/// forever); `None` when nothing came. For a wait on one socket this takes about half the
/// system calls of a poll and then a receive (a poll asks the socket twice before it sleeps
/// and once after; a receive sleeps on the socket's signal at once), and every system call
/// counts: on a virtual machine with page-table isolation one costs about a µs.
pub fn recv_waiting(
    sock: &Socket,
    spin: std::time::Duration,
    timeout_ms: i64,
) -> zmq::Result<Option<Vec<zmq::Message>>> {
    let spun = spin_first(
        spin,
        |spin| {
            let start = std::time::Instant::now();
            loop {
                match recv_frames(sock, zmq::DONTWAIT) {
                    Err(zmq::Error::EAGAIN) if start.elapsed() < spin => std::thread::yield_now(),
                    Err(zmq::Error::EAGAIN) => return Ok(None),
                    got => return got.map(Some),
                }
            }
        },
        |got| matches!(got, Ok(Some(_))),
    );
    if let Some(got) = spun {
        return got;
    }
    // The timeout is the socket's own; only this thread uses the socket, and every
    // blocking receive of it goes through here.
    sock.set_rcvtimeo(i32::try_from(timeout_ms).unwrap_or(i32::MAX))?;
    match recv_frames(sock, 0) {
        Err(zmq::Error::EAGAIN) => Ok(None),
        got => got.map(Some),
    }
}

/// What [`recv_waiting_or_rung`] ended with.
pub enum Waited {
    /// A whole message, by the socket.
    Frames(Vec<zmq::Message>),
    /// A whole message by a lane ([`recv_lane_waiting`]).
    Parcel(crate::lane::Parcel),
    /// The doorbell rang for the sync waited for.
    Rung,
    /// Nothing came in time.
    TimedOut,
    /// The other end of the lane waited on is gone ([`recv_lane_waiting`]).
    Gone,
}

/// What a thread with a lane ([`crate::lane`]) waits on: its inbox, and the socket where it
/// is woken when it sleeps.
pub struct LaneWait<'a> {
    /// The lane's inbox.
    pub inbox: &'a crate::lane::Inbox,
    /// The socket wakes come on.
    pub sock: &'a Socket,
    /// `Some(k)`: the socket carries messages too (the dispatcher's, from peers without a
    /// lane), looked at every `k`-th turn of the spin (each look is a system call); `None`:
    /// it carries wakes (a client's or worker's once its lane is open), looked at only while
    /// sleeping; a message there that is not a wake (the dispatcher answered by its socket a
    /// peer it no longer knows) is still handed back.
    pub messages: Option<u32>,
}

/// [`recv_waiting`] for a thread with a lane, and a doorbell to watch as
/// [`recv_waiting_or_rung`] does: spins over the inbox (and the bell, and now and then the
/// socket), then says it sleeps ([`crate::lane::Inbox::sleep`]) and sleeps on the socket
/// until a message or a wake comes there, or `timeout_ms` (-1: none) passes.
pub fn recv_lane_waiting(
    wait: &LaneWait<'_>,
    bell: Option<(&crate::doorbell::Doorbell, u64)>,
    spin: std::time::Duration,
    timeout_ms: i64,
) -> zmq::Result<Waited> {
    let LaneWait { inbox, sock, messages } = *wait;
    let from_inbox = |got: Result<Option<crate::lane::Parcel>, crate::lane::Gone>| match got {
        Ok(Some(parcel)) => Some(Waited::Parcel(parcel)),
        Ok(None) => None,
        Err(crate::lane::Gone) => Some(Waited::Gone),
    };
    let spun = spin_first(
        spin,
        |spin| {
            let start = std::time::Instant::now();
            for turn in 0u32.. {
                if let Some(got) = from_inbox(inbox.try_recv()) {
                    return Ok(Some(got));
                }
                if bell.is_some_and(|(bell, seq)| bell.rung(seq)) {
                    return Ok(Some(Waited::Rung));
                }
                if messages.is_some_and(|k| turn.is_multiple_of(k.max(1))) {
                    match recv_frames(sock, zmq::DONTWAIT) {
                        Err(zmq::Error::EAGAIN) => {}
                        got => return got.map(|f| Some(Waited::Frames(f))),
                    }
                }
                if start.elapsed() >= spin {
                    break;
                }
                std::thread::yield_now();
            }
            Ok(None)
        },
        |got| matches!(got, Ok(Some(_))),
    );
    if let Some(got) = spun {
        return got.map(|w| w.expect("a hit holds a message or the ring"));
    }
    if bell.is_some_and(|(bell, seq)| bell.decline(seq)) {
        return Ok(Waited::Rung);
    }
    let deadline =
        u64::try_from(timeout_ms).ok().map(|ms| std::time::Instant::now() + std::time::Duration::from_millis(ms));
    loop {
        if let Some(got) = from_inbox(inbox.sleep()) {
            return Ok(got);
        }
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        if left.is_some_and(|left| left.is_zero()) {
            inbox.woke();
            return Ok(from_inbox(inbox.try_recv()).unwrap_or(Waited::TimedOut));
        }
        // (Rounded up: a deadline a fraction of a millisecond away is still waited for.)
        let ms = left.map_or(-1, |left| i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX));
        let got = sock.set_rcvtimeo(ms).and_then(|()| recv_frames(sock, 0));
        inbox.woke();
        match got {
            Err(zmq::Error::EAGAIN) => return Ok(from_inbox(inbox.try_recv()).unwrap_or(Waited::TimedOut)),
            // Woken: the message is in the inbox.
            Ok(frames) if messages.is_none() && frames.iter().all(|f| f.is_empty()) => {}
            Ok(frames) => return Ok(Waited::Frames(frames)),
            Err(e) => return Err(e),
        }
    }
}

/// [`recv_waiting`] for a sync whose answer may also come by `bell` (rung by a worker in
/// this process, [`crate::doorbell`]): while spinning, the bell is watched too; before
/// sleeping on the socket the bell is declined, so from then on only the socket answers.
pub fn recv_waiting_or_rung(
    sock: &Socket,
    (bell, seq): (&crate::doorbell::Doorbell, u64),
    spin: std::time::Duration,
    timeout_ms: i64,
) -> zmq::Result<Waited> {
    let spun = spin_first(
        spin,
        |spin| {
            let start = std::time::Instant::now();
            loop {
                if bell.rung(seq) {
                    return Ok(Some(Waited::Rung));
                }
                match recv_frames(sock, zmq::DONTWAIT) {
                    Err(zmq::Error::EAGAIN) if start.elapsed() < spin => std::thread::yield_now(),
                    Err(zmq::Error::EAGAIN) => return Ok(None),
                    got => return got.map(|f| Some(Waited::Frames(f))),
                }
            }
        },
        |got| matches!(got, Ok(Some(_))),
    );
    if let Some(got) = spun {
        return got.map(|w| w.expect("a hit holds a message or the ring"));
    }
    if bell.decline(seq) {
        return Ok(Waited::Rung);
    }
    match recv_waiting(sock, std::time::Duration::ZERO, timeout_ms)? {
        Some(frames) => Ok(Waited::Frames(frames)),
        None => Ok(Waited::TimedOut),
    }
}

/// The spinning part of a wait: runs `spin_wait(spin)` when this thread may spin now, and
/// returns what it got when that ends the wait (`hit`, or an error); `None`: sleep instead.
fn spin_first<T>(
    spin: std::time::Duration,
    spin_wait: impl FnOnce(std::time::Duration) -> zmq::Result<T>,
    hit: impl FnOnce(&zmq::Result<T>) -> bool,
) -> Option<zmq::Result<T>> {
    // At most one spinner per core in the process and one more (see `SPIN_SLOTS`), and a
    // thread whose last waits all outlasted the spin (a client waiting on long work) stops
    // spinning but for an occasional probe: with many more waiters than cores, or answers
    // slower than `spin`, spinning would only take the cores from the threads doing the work.
    if spin.is_zero() {
        return None;
    }
    let misses = SPUN_OUT.with(std::cell::Cell::get);
    if misses >= SPIN_MISSES && !(misses - SPIN_MISSES).is_multiple_of(SPIN_PROBE) {
        // Not spinning this time still counts toward the next probe.
        SPUN_OUT.with(|m| m.set(misses.saturating_add(1)));
        return None;
    }
    let got = in_spin_slot(|| spin_wait(spin))?;
    let hit = hit(&got);
    SPUN_OUT.with(|m| m.set(if hit { 0 } else { misses.saturating_add(1) }));
    (hit || got.is_err()).then_some(got)
}

/// Runs `f` holding one of the process's spin slots; `None` when all are taken.
fn in_spin_slot<T>(f: impl FnOnce() -> T) -> Option<T> {
    let slots = *SPIN_SLOTS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()) + 1);
    let taken = SPINNING.fetch_add(1, Ordering::Relaxed) < slots;
    let out = taken.then(f);
    SPINNING.fetch_sub(1, Ordering::Relaxed);
    out
}

/// Spins in a row that found nothing after which a thread stops spinning ...
const SPIN_MISSES: u32 = 4;
/// ... but for one wait in this many, which spins again to see whether answers came back.
const SPIN_PROBE: u32 = 16;

std::thread_local! {
    /// This thread's spins in a row that found nothing (and waits since it stopped spinning).
    static SPUN_OUT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Threads of this process in [`poll_spinning`]'s spin, and how many may be: one per core
/// and one more. A round trip has three waiters (client, dispatcher, worker); with one slot
/// per core on a 2-core machine one of them slept each time and was woken through the
/// kernel, and a spinner yields between polls, so the third shares a core at little cost.
/// Measured on a 2-core Xeon VM, same binary: an embedded sync round trip 36-50 -> 21-22 µs,
/// an MLP training step unchanged (`bench/results/transport-vm-xeon.txt`).
static SPINNING: AtomicUsize = AtomicUsize::new(0);
static SPIN_SLOTS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Polls `items` without sleeping until one is ready (> 0) or `spin` has passed (0).
fn spin_poll(items: &mut [zmq::PollItem], spin: std::time::Duration) -> zmq::Result<i32> {
    let start = std::time::Instant::now();
    loop {
        let ready = retry(|| zmq::poll(items, 0))?;
        if ready > 0 || start.elapsed() >= spin {
            return Ok(ready);
        }
        std::thread::yield_now();
    }
}

/// Whether a ZeroMQ address goes over TCP (what a cluster key protects).
pub fn is_tcp(address: &str) -> bool {
    address.starts_with("tcp://")
}

/// Binds `socket` to `address`: as a CURVE server with `key` when it is TCP, without security
/// otherwise.
pub fn bind(ctx: &Context, socket: &Socket, address: &str, key: Option<&ClusterKey>) -> zmq::Result<()> {
    match key {
        Some(key) if is_tcp(address) => auth::curve_server(ctx, socket, key)?,
        _ => auth::no_security(socket)?,
    }
    socket.bind(address)
}

/// Connects `socket` to `address`: as a CURVE client with `key` when it is TCP, without
/// security otherwise.
pub fn connect(socket: &Socket, address: &str, key: Option<&ClusterKey>) -> zmq::Result<()> {
    match key {
        Some(key) if is_tcp(address) => auth::curve_client(socket, key)?,
        _ => auth::no_security(socket)?,
    }
    socket.connect(address)
}

/// A ROUTER bound to every endpoint (TCP first, so a busy port fails before IPC is taken; TCP
/// as a CURVE server with `key`), taking messages of at most about `max_message_bytes` (see
/// [`wire_limit`]).
pub fn router(
    ctx: &Context,
    endpoints: &[Endpoint],
    max_message_bytes: usize,
    key: Option<&ClusterKey>,
) -> zmq::Result<Socket> {
    let socket = ctx.socket(SocketType::ROUTER)?;
    common(&socket, max_message_bytes)?;
    socket.set_router_mandatory(true)?;
    for ep in endpoints {
        bind(ctx, &socket, &ep.zmq_address(), key)?;
    }
    Ok(socket)
}

/// A DEALER connected to `endpoint` (TCP as a CURVE client with `key`), taking messages of at
/// most about `max_message_bytes`, and the PAIR that receives its connection's events (see
/// [`disconnect_events`]).
pub fn dealer(
    ctx: &Context,
    endpoint: &Endpoint,
    max_message_bytes: usize,
    key: Option<&ClusterKey>,
) -> zmq::Result<(Socket, Option<Socket>)> {
    let socket = ctx.socket(SocketType::DEALER)?;
    common(&socket, max_message_bytes)?;
    // Watched before connecting: a handshake refused within microseconds (a loopback peer
    // with another key) still reaches the monitor.
    let events = disconnect_events(ctx, &socket, endpoint)?;
    connect(&socket, &endpoint.zmq_address(), key)?;
    Ok((socket, events))
}

/// An XPUB (a PUB that sees subscriptions) bound to every endpoint (TCP as a CURVE server
/// with `key`), for the monitor.
pub fn monitor_publisher(ctx: &Context, endpoints: &[Endpoint], key: Option<&ClusterKey>) -> zmq::Result<Socket> {
    let socket = ctx.socket(SocketType::XPUB)?;
    socket.set_sndhwm(10_000)?;
    socket.set_linger(0)?;
    for ep in endpoints {
        bind(ctx, &socket, &ep.zmq_address(), key)?;
    }
    Ok(socket)
}

/// A PAIR that receives `sock`'s DISCONNECTED and failed-handshake events, so a client or
/// worker waiting on the dispatcher learns that it is gone, or that it was never let in
/// (`None` for `inproc://`, which has no such events; see [`handshake_failure`]). Call it
/// before the peer can know about `sock`, so that no disconnect goes unseen.
pub fn disconnect_events(ctx: &Context, sock: &Socket, endpoint: &Endpoint) -> zmq::Result<Option<Socket>> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if matches!(endpoint, Endpoint::Inproc(_)) {
        return Ok(None);
    }
    let name = format!("inproc://gt-events-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let events = [
        zmq::SocketEvent::DISCONNECTED,
        zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL,
        zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL,
        zmq::SocketEvent::HANDSHAKE_FAILED_AUTH,
    ];
    sock.monitor(&name, events.iter().fold(0, |all, e| all | *e as i32))?;
    let pair = ctx.socket(SocketType::PAIR)?;
    pair.connect(&name)?;
    Ok(Some(pair))
}

/// Why a connection's handshake failed, as its socket's monitor told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeFailure {
    /// The server's authentication refused this peer's key: it is not the cluster's.
    #[error("the server refused this peer's key (not the cluster's key)")]
    Refused,
    /// One side speaks CURVE and the other does not.
    #[error("one side has a cluster key and the other has none")]
    Mechanism,
    /// The CURVE handshake could not be decrypted: the two sides hold different keys.
    #[error("the two sides hold different cluster keys")]
    Keys,
    /// The server hung up during the handshake. A client sees this when the server could not
    /// decrypt its hello (another cluster key) and, as often as the precise reason, when one
    /// side has no key.
    #[error("the server hung up during the handshake: this key is not the server's, or one side has no key")]
    Closed,
    /// Any other protocol error (ZeroMQ's `ZMQ_PROTOCOL_ERROR_*` code).
    #[error("ZeroMQ protocol error {0:#x} in the handshake")]
    Protocol(u32),
}

impl HandshakeFailure {
    /// The failure a monitor event reports (its id and value), if it is one.
    fn of_event(event: u16, value: u32) -> Option<HandshakeFailure> {
        const MECHANISM_MISMATCH: u32 = 0x1100_0002;
        const CRYPTOGRAPHIC: u32 = 0x1100_0001;
        const KEY_EXCHANGE: u32 = 0x1000_0003;
        match u32::from(event) {
            e if e == zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u32 => Some(HandshakeFailure::Refused),
            e if e == zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL as u32 => Some(match value {
                MECHANISM_MISMATCH => HandshakeFailure::Mechanism,
                CRYPTOGRAPHIC | KEY_EXCHANGE => HandshakeFailure::Keys,
                code => HandshakeFailure::Protocol(code),
            }),
            e if e == zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL as u32 => Some(HandshakeFailure::Closed),
            _ => None,
        }
    }
}

/// Reads every event waiting on `events` (a [`disconnect_events`] PAIR) and returns the first
/// failed handshake among them, if any, preferring a precise reason to [`HandshakeFailure::Closed`];
/// other events are dropped.
pub fn handshake_failure(events: &Socket) -> zmq::Result<Option<HandshakeFailure>> {
    let mut first = None;
    loop {
        let frames = match retry(|| events.recv_multipart(zmq::DONTWAIT)) {
            Ok(frames) => frames,
            Err(zmq::Error::EAGAIN) => return Ok(first),
            Err(e) => return Err(e),
        };
        // The first frame: the event (u16) and its value (u32), in native byte order.
        if let Some(head) = frames.first().filter(|f| f.len() >= 6) {
            let event = u16::from_ne_bytes([head[0], head[1]]);
            let value = u32::from_ne_bytes([head[2], head[3], head[4], head[5]]);
            let this = HandshakeFailure::of_event(event, value);
            if first.is_none() || first == Some(HandshakeFailure::Closed) && this.is_some() {
                first = this.or(first);
            }
        }
    }
}

/// How long a peer whose first send failed waits for its monitor to report a refused
/// handshake (it is reported before the connection is dropped, so at once in practice).
pub const HANDSHAKE_REPORT: std::time::Duration = std::time::Duration::from_secs(1);

/// [`handshake_failure`], waiting up to `wait` for one to be reported: a send that found no
/// connection to queue on (the handshake failed and ZeroMQ dropped the pipe) asks this to
/// tell a refusal from a peer that went away.
pub fn handshake_failure_within(events: &Socket, wait: std::time::Duration) -> zmq::Result<Option<HandshakeFailure>> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        if let Some(why) = handshake_failure(events)? {
            return Ok(Some(why));
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || retry(|| events.poll(zmq::POLLIN, left.as_millis().max(1) as i64))? == 0 {
            return handshake_failure(events);
        }
    }
}

/// The most frames of one message kept by [`recv_frames`] (a routing id, a message and its
/// data frames, and one more so that an extra frame is seen); the rest are read and dropped.
pub const MAX_FRAMES: usize = 3 + crate::codec::MAX_LITERAL_FRAMES;

/// Receives one whole message (all its frames, as ZeroMQ messages: a data frame can be sent
/// on without a copy). `flags` apply to the first frame (`DONTWAIT`); the rest are already
/// there. Frames past [`MAX_FRAMES`] are dropped.
pub fn recv_frames(sock: &Socket, flags: i32) -> zmq::Result<Vec<zmq::Message>> {
    let mut frames = vec![retry(|| sock.recv_msg(flags))?];
    while retry(|| sock.get_rcvmore())? {
        let frame = retry(|| sock.recv_msg(0))?;
        if frames.len() < MAX_FRAMES {
            frames.push(frame);
        }
    }
    Ok(frames)
}

/// Sends one message: `frames` (a routing id and a message, or a message alone) and then a
/// `data` frame, moved to ZeroMQ without a copy (copied when small), none of it blocking. `EAGAIN` (the peer
/// cannot be sent to) comes from the first frame; once a message is started its frames queue
/// at once.
///
/// A signal must not interrupt the data frame's send: the `zmq` crate drops a message whose
/// send failed, so `EINTR` there would lose it with nothing to send again (and leave the
/// frames before it waiting for an end). The data frame goes out with this thread's signals
/// blocked for the moment of the call (they are delivered right after); the byte frames
/// before it are simply sent again.
pub fn send_with_data(sock: &Socket, frames: &[&[u8]], data: zmq::Message) -> zmq::Result<()> {
    for frame in frames {
        retry(|| sock.send(*frame, zmq::SNDMORE | zmq::DONTWAIT))?;
    }
    if data.len() <= COPIED_DATA {
        // A copy this small costs less than the two system calls that block signals.
        return retry(|| sock.send(&data[..], zmq::DONTWAIT));
    }
    with_signals_blocked(|| sock.send(data, zmq::DONTWAIT))
}

/// Sends one message: `frames` (a routing id, or nothing), the encoded message `head`
/// (moved to ZeroMQ, not copied), then each of `literals` as a data frame of its own, lent
/// (see [`crate::loan`]); none of it blocking. `EAGAIN` comes from the first frame.
pub fn send_with_literals(
    sock: &mut Socket,
    frames: &[&[u8]],
    head: Vec<u8>,
    literals: Vec<gt_ir::data::Elements>,
) -> zmq::Result<()> {
    let more = |last: bool| if last { zmq::DONTWAIT } else { zmq::SNDMORE | zmq::DONTWAIT };
    for frame in frames {
        retry(|| sock.send(*frame, zmq::SNDMORE | zmq::DONTWAIT))?;
    }
    let n = literals.len();
    send_bytes(sock, head, more(n == 0))?;
    for (i, data) in literals.into_iter().enumerate() {
        crate::loan::send(sock, data, more(i + 1 == n))?;
    }
    Ok(())
}

/// Sends `bytes` as one frame with `flags`: copied when small (a send a signal interrupts
/// can then be made again), else moved to ZeroMQ with signals held back.
pub(crate) fn send_bytes(sock: &Socket, bytes: Vec<u8>, flags: i32) -> zmq::Result<()> {
    if bytes.len() <= COPIED_DATA {
        retry(|| sock.send(&bytes[..], flags))
    } else {
        with_signals_blocked(|| sock.send(bytes, flags))
    }
}

/// The largest data frame [`send_with_data`] sends as a copy (which it can send again after
/// a signal) rather than moved with signals blocked.
const COPIED_DATA: usize = 16 << 10;

/// Runs `call` with every signal that can be blocked held back on this thread.
fn with_signals_blocked<T>(call: impl FnOnce() -> zmq::Result<T>) -> zmq::Result<T> {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
    let mut old = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), Some(&mut old)).map_err(|_| zmq::Error::EINVAL)?;
    let done = call();
    // Restoring a mask read from this thread a moment ago cannot fail.
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair of PAIR sockets on `inproc://NAME`: (receiving end, sending end).
    fn pair(ctx: &Context, name: &str) -> (Socket, Socket) {
        let pull = ctx.socket(zmq::PAIR).unwrap();
        pull.bind(&format!("inproc://{name}")).unwrap();
        let push = ctx.socket(zmq::PAIR).unwrap();
        push.connect(&format!("inproc://{name}")).unwrap();
        (pull, push)
    }

    /// libzmq wakes a waiting thread through its signaler: an eventfd when built with
    /// `ZMQ_HAVE_EVENTFD` (set by `third_party/zmq-sys`'s build script), a unix socketpair
    /// otherwise, which costs a socket send and receive per wake-up. Nothing else in this
    /// process makes eventfds, so none while a socket lives means the define was lost.
    #[cfg(target_os = "linux")]
    #[test]
    fn zmq_wakes_threads_through_an_eventfd() {
        let ctx = Context::new();
        let (_pull, _push) = pair(&ctx, "eventfd-test");
        let eventfds = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().contains("eventfd"))
            .count();
        assert!(eventfds > 0, "libzmq signals through socketpairs: was it built without ZMQ_HAVE_EVENTFD?");
    }

    #[test]
    fn a_spinning_wait_takes_what_arrives_and_times_out_as_poll_does() {
        use std::time::{Duration, Instant};
        let ctx = Context::new();
        for (i, spin) in [Duration::ZERO, Duration::from_micros(200), Duration::from_millis(1)].into_iter().enumerate()
        {
            let (pull, push) = pair(&ctx, &format!("spin-test-{i}"));
            // Nothing waiting: the wait spins, then sleeps out its timeout, and says so.
            let start = Instant::now();
            let ready = poll_spinning(&mut [pull.as_poll_item(zmq::POLLIN)], spin, 20).unwrap();
            assert_eq!(ready, 0, "spin {spin:?}");
            assert!(start.elapsed() >= Duration::from_millis(20), "spin {spin:?}: returned before its timeout");
            // A message sent while the receiver waits (spinning or asleep) is seen, whole.
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(100));
                push.send(&b"ping"[..], 0).unwrap();
                push
            });
            let ready = poll_spinning(&mut [pull.as_poll_item(zmq::POLLIN)], spin, 5000).unwrap();
            assert_eq!(ready, 1, "spin {spin:?}");
            assert_eq!(pull.recv_bytes(zmq::DONTWAIT).unwrap(), b"ping");
            drop(sender.join().unwrap());
        }
    }

    #[test]
    fn a_receiving_wait_takes_a_whole_message_and_times_out() {
        use std::time::{Duration, Instant};
        let ctx = Context::new();
        for (i, spin) in [Duration::ZERO, Duration::from_micros(200), Duration::from_millis(1)].into_iter().enumerate()
        {
            let (pull, push) = pair(&ctx, &format!("recv-test-{i}"));
            // Nothing waiting: the wait spins, then sleeps out its timeout, and says so.
            let start = Instant::now();
            assert!(recv_waiting(&pull, spin, 20).unwrap().is_none(), "spin {spin:?}");
            assert!(start.elapsed() >= Duration::from_millis(20), "spin {spin:?}: returned before its timeout");
            // A message of two frames sent while the receiver waits (spinning or asleep)
            // comes whole, and a later wait does not see it again.
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(100));
                push.send_multipart([&b"head"[..], &b"data"[..]], 0).unwrap();
                push
            });
            let frames = recv_waiting(&pull, spin, 5000).unwrap().expect("the message");
            let frames: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
            assert_eq!(frames, [&b"head"[..], &b"data"[..]], "spin {spin:?}");
            let push = sender.join().unwrap();
            assert!(recv_waiting(&pull, spin, 1).unwrap().is_none(), "spin {spin:?}");
            // A later blocking receive after a wait with a timeout still finds what is there.
            push.send(&b"again"[..], 0).unwrap();
            assert_eq!(recv_waiting(&pull, spin, -1).unwrap().expect("the message")[0].to_vec(), b"again");
        }
    }

    #[test]
    fn small_and_large_data_frames_arrive_whole() {
        let ctx = Context::new();
        let (pull, push) = pair(&ctx, "data-frames");
        // Either side of the size below which a data frame is copied rather than moved.
        for n in [0, 1, COPIED_DATA, COPIED_DATA + 1, 1 << 20] {
            let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            send_with_data(&push, &[b"head"], zmq::Message::from(&data[..])).unwrap();
            let frames = recv_frames(&pull, 0).unwrap();
            assert_eq!(frames.len(), 2, "{n} bytes");
            assert_eq!(&frames[0][..], b"head");
            assert_eq!(&frames[1][..], &data[..], "{n} bytes");
        }
    }

    /// A keyed or plain ROUTER on a fresh loopback port, on its own context.
    fn server(key: Option<&ClusterKey>) -> (Context, Socket, Endpoint) {
        let ctx = Context::new();
        let any_port = Endpoint::Tcp { host: "127.0.0.1".into(), port: 0 };
        let sock = router(&ctx, &[any_port], 1 << 20, key).unwrap();
        let bound = sock.get_last_endpoint().unwrap().unwrap();
        let port = bound.rsplit(':').next().unwrap().parse().unwrap();
        (ctx, sock, Endpoint::Tcp { host: "127.0.0.1".into(), port })
    }

    /// What a DEALER with `key` (and `server_key` as the server's, when another) meets at `ep`:
    /// the server's echo, or the handshake failure its monitor reports.
    fn attempt(
        server: &Socket,
        ep: &Endpoint,
        key: Option<&ClusterKey>,
        server_key: Option<&ClusterKey>,
    ) -> Result<(), HandshakeFailure> {
        let ctx = Context::new();
        let sock = ctx.socket(SocketType::DEALER).unwrap();
        sock.set_linger(0).unwrap();
        let events = disconnect_events(&ctx, &sock, ep).unwrap().unwrap();
        if let Some(k) = key {
            auth::curve_client(&sock, k).unwrap();
        }
        if let Some(s) = server_key {
            sock.set_curve_serverkey(s.public()).unwrap();
        }
        sock.connect(&ep.zmq_address()).unwrap();
        sock.send(&b"ping"[..], 0).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Some(f) = handshake_failure(&events).unwrap() {
                assert_eq!(server.poll(zmq::POLLIN, 100).unwrap(), 0, "a refused peer's message arrived");
                return Err(f);
            }
            if server.poll(zmq::POLLIN, 50).unwrap() > 0 {
                let frames = server.recv_multipart(0).unwrap();
                assert_eq!(frames[1], b"ping");
                return Ok(());
            }
        }
        panic!("neither a message nor a handshake failure within 5 s");
    }

    /// Every message sent with [`send_with_data`] arrives whole while signals keep
    /// interrupting the sending thread (the stream fuzzer's signals once made a send fail with
    /// `EINTR` and lose its data frame).
    #[test]
    #[allow(unsafe_code)] // libc's signal and pthread_kill: the only way to signal one thread
    fn signals_lose_no_message() {
        use std::os::unix::thread::JoinHandleExt;
        extern "C" fn ignore(_: libc::c_int) {}
        // SAFETY: a handler that does nothing, for a signal nothing else in this crate uses;
        // `signal` installs it so that interrupted calls fail with EINTR rather than restart.
        unsafe { libc::signal(libc::SIGUSR1, ignore as *const () as libc::sighandler_t) };
        let ctx = Context::new();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_rcvhwm(0).unwrap();
        router.bind("inproc://signals").unwrap();
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_sndhwm(0).unwrap();
        dealer.connect("inproc://signals").unwrap();
        const N: u32 = 20_000;
        let sender = std::thread::spawn(move || {
            for i in 0..N {
                send_with_data(&dealer, &[b"head"], zmq::Message::from(i.to_le_bytes().to_vec())).unwrap();
            }
            dealer
        });
        let thread = sender.as_pthread_t();
        let mut signals = 0;
        while !sender.is_finished() {
            // SAFETY: the thread has not finished and the signal's handler does nothing.
            unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
            signals += 1;
        }
        let _dealer = sender.join().unwrap();
        for i in 0..N {
            let frames = recv_frames(&router, 0).unwrap();
            assert_eq!(frames.len(), 3, "message {i}");
            assert_eq!(&frames[1][..], b"head", "message {i}");
            assert_eq!(&frames[2][..], i.to_le_bytes(), "message {i}: data frame");
        }
        assert_eq!(router.poll(zmq::POLLIN, 0).unwrap(), 0, "more messages than sent");
        assert!(signals > 10, "only {signals} signals were sent");
    }

    #[test]
    fn only_holders_of_the_cluster_key_get_through_and_the_others_are_told_why() {
        let (a, b) = (ClusterKey::generate().unwrap(), ClusterKey::generate().unwrap());
        let (_ctx, keyed, ep) = server(Some(&a));
        // Which side notices first is a race: the client hears the precise reason, or that the
        // server hung up.
        let mismatch = [Err(HandshakeFailure::Mechanism), Err(HandshakeFailure::Closed)];
        assert_eq!(attempt(&keyed, &ep, Some(&a), None), Ok(()));
        assert!(mismatch.contains(&attempt(&keyed, &ep, None, None)));
        let other = attempt(&keyed, &ep, Some(&b), None);
        assert!([Err(HandshakeFailure::Keys), Err(HandshakeFailure::Closed)].contains(&other), "{other:?}");
        // The server's public key (not secret) with a pair of one's own: refused by ZAP.
        assert_eq!(attempt(&keyed, &ep, Some(&b), Some(&a)), Err(HandshakeFailure::Refused));
        // The keyed server still serves its cluster.
        assert_eq!(attempt(&keyed, &ep, Some(&a), None), Ok(()));
        let (_ctx2, plain, ep2) = server(None);
        assert_eq!(attempt(&plain, &ep2, None, None), Ok(()));
        assert!(mismatch.contains(&attempt(&plain, &ep2, Some(&a), None)));
    }

    #[test]
    fn a_peer_refused_before_its_first_send_learns_why_from_the_failed_send() {
        use std::time::{Duration, Instant};
        // When the peer itself finds the handshake impossible (here: a server greeting it with
        // CURVE while it has no key), ZeroMQ drops the connection and its queue. If that
        // happens before the first message leaves (a loaded machine deschedules the peer
        // between connect and send), the send has nowhere to go, and the watch set up by
        // `dealer` holds the reason. A raw TCP server sends the greeting at once, so the
        // order is certain here.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            use std::io::Write;
            let (mut conn, _) = listener.accept().unwrap();
            // A ZMTP 3.0 greeting: signature, version, mechanism "CURVE" padded to 20 bytes,
            // as-server, filler.
            let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0];
            greeting.extend(b"CURVE".iter().copied().chain(std::iter::repeat_n(0, 15)));
            greeting.push(1);
            greeting.extend([0; 31]);
            conn.write_all(&greeting).unwrap();
            let _ = wait.recv();
        });
        let ctx = Context::new();
        let ep = Endpoint::Tcp { host: "127.0.0.1".into(), port };
        let (sock, events) = dealer(&ctx, &ep, 1 << 20, None).unwrap();
        sock.set_linger(0).unwrap();
        let events = events.expect("TCP connections are watched");
        // The first sends may still find the queue (ZeroMQ drops it when the socket next
        // takes its commands, at most a millisecond apart); then they find none.
        let deadline = Instant::now() + Duration::from_secs(2);
        while sock.send(&b"late"[..], zmq::DONTWAIT).is_ok() {
            assert!(Instant::now() < deadline, "the refused connection's queue was never dropped");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(handshake_failure_within(&events, HANDSHAKE_REPORT).unwrap(), Some(HandshakeFailure::Mechanism));
        drop(done);
        server.join().unwrap();
    }
}
