//! ZeroMQ socket set-up shared by the dispatcher, workers and clients, so every socket has
//! the same guarantees: no silent drops (unbounded high-water marks; a ROUTER that cannot
//! route reports `EHOSTUNREACH`), heartbeats that close a connection to a dead host, a
//! bounded linger at close, and a bound on what one message can make a peer buffer.

use crate::endpoint::Endpoint;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A ROUTER bound to every endpoint (TCP first, so a busy port fails before IPC is taken),
/// taking messages of at most about `max_message_bytes` (see [`wire_limit`]).
pub fn router(ctx: &Context, endpoints: &[Endpoint], max_message_bytes: usize) -> zmq::Result<Socket> {
    let socket = ctx.socket(SocketType::ROUTER)?;
    common(&socket, max_message_bytes)?;
    socket.set_router_mandatory(true)?;
    for ep in endpoints {
        socket.bind(&ep.zmq_address())?;
    }
    Ok(socket)
}

/// A DEALER connected to `endpoint`, taking messages of at most about `max_message_bytes`.
pub fn dealer(ctx: &Context, endpoint: &Endpoint, max_message_bytes: usize) -> zmq::Result<Socket> {
    let socket = ctx.socket(SocketType::DEALER)?;
    common(&socket, max_message_bytes)?;
    socket.connect(&endpoint.zmq_address())?;
    Ok(socket)
}

/// An XPUB (a PUB that sees subscriptions) bound to every endpoint, for the monitor.
pub fn monitor_publisher(ctx: &Context, endpoints: &[Endpoint]) -> zmq::Result<Socket> {
    let socket = ctx.socket(SocketType::XPUB)?;
    socket.set_sndhwm(10_000)?;
    socket.set_linger(0)?;
    for ep in endpoints {
        socket.bind(&ep.zmq_address())?;
    }
    Ok(socket)
}

/// A PAIR that receives `sock`'s DISCONNECTED events, so a client or worker waiting on the
/// dispatcher learns that it is gone (`None` for `inproc://`, which has no such events).
/// Call it before the peer can know about `sock`, so that no disconnect goes unseen.
pub fn disconnect_events(ctx: &Context, sock: &Socket, endpoint: &Endpoint) -> zmq::Result<Option<Socket>> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if matches!(endpoint, Endpoint::Inproc(_)) {
        return Ok(None);
    }
    let name = format!("inproc://gt-events-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    sock.monitor(&name, zmq::SocketEvent::DISCONNECTED as i32)?;
    let pair = ctx.socket(SocketType::PAIR)?;
    pair.connect(&name)?;
    Ok(Some(pair))
}

/// The most frames of one message kept by [`recv_frames`] (a routing id, a message and a
/// data frame, and one more so that an extra frame is seen); the rest are read and dropped.
pub const MAX_FRAMES: usize = 4;

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
/// `data` frame, moved to ZeroMQ without a copy, none of it blocking. `EAGAIN` (the peer
/// cannot be sent to) comes from the first frame; once a message is started its frames queue
/// at once, and a call a signal interrupted is made again without sending anything twice.
pub fn send_with_data(sock: &Socket, frames: &[&[u8]], data: zmq::Message) -> zmq::Result<()> {
    for frame in frames {
        retry(|| sock.send(*frame, zmq::SNDMORE | zmq::DONTWAIT))?;
    }
    let mut data = Some(data);
    retry(|| match data.take() {
        Some(d) => sock.send(d, zmq::DONTWAIT),
        None => Ok(()),
    })
}
