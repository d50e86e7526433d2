//! ZeroMQ socket set-up shared by the dispatcher, workers and clients, so every socket has
//! the same guarantees: no silent drops (unbounded high-water marks; a ROUTER that cannot
//! route reports `EHOSTUNREACH`), heartbeats that close a connection to a dead host, and a
//! bounded linger at close.

use crate::endpoint::Endpoint;
use std::sync::atomic::{AtomicU64, Ordering};
use zmq::{Context, Socket, SocketType};

/// ZMTP heartbeat interval: a silent peer is pinged this often (ms).
pub const HEARTBEAT_IVL_MS: i32 = 1000;
/// A peer that answers no ping for this long is disconnected (ms).
pub const HEARTBEAT_TIMEOUT_MS: i32 = 5000;

fn common(socket: &Socket) -> zmq::Result<()> {
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

/// A ROUTER bound to every endpoint (TCP first, so a busy port fails before IPC is taken).
pub fn router(ctx: &Context, endpoints: &[Endpoint]) -> zmq::Result<Socket> {
    let socket = ctx.socket(SocketType::ROUTER)?;
    common(&socket)?;
    socket.set_router_mandatory(true)?;
    for ep in endpoints {
        socket.bind(&ep.zmq_address())?;
    }
    Ok(socket)
}

/// A DEALER connected to `endpoint`.
pub fn dealer(ctx: &Context, endpoint: &Endpoint) -> zmq::Result<Socket> {
    let socket = ctx.socket(SocketType::DEALER)?;
    common(&socket)?;
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
