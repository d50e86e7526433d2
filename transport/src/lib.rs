//! gt-transport: how gt's processes talk. Wire messages ([`message`]), the msgpack codec
//! with a protocol version and a size limit ([`codec`]), endpoints (`inproc://` embedded,
//! `ipc://` same host, `tcp://` remote; [`endpoint`]), ZeroMQ socket set-up ([`socket`]),
//! the cluster key that authenticates and encrypts TCP ([`auth`]), the doorbells through which
//! a worker answers an embedded client's sync directly ([`doorbell`]), the in-process queues an
//! embedded client or worker and its dispatcher talk through ([`lane`]),
//! large answers to same-host clients through shared memory ([`shared`]),
//! the instruction-log event that the log file and the monitor socket carry ([`event`]), and
//! the profile format that `GT_PROFILE` writes and `gt prof` reads ([`profile`]).
//!
//! # Topology
//! One dispatcher binds a ROUTER socket; clients and workers connect DEALER sockets to it.
//! A peer's first message says what it is ([`Request::Hello`] or
//! [`WorkerEvent::Register`]); every frame starts with the codec header, so a peer of
//! another protocol version is told so instead of being misread.

pub mod auth;
pub mod codec;
pub mod doorbell;
pub mod endpoint;
pub mod event;
pub mod lane;
pub mod loan;
pub mod message;
pub mod profile;
pub mod shared;
pub mod socket;

pub use auth::{ClusterKey, KeyError, KeyFormatError};
pub use codec::{decode, encode, CodecError, DEFAULT_MAX_MESSAGE_BYTES, PROTOCOL_VERSION};
pub use endpoint::{Endpoint, EndpointError};
pub use event::{EventKind, LogEvent};
pub use message::{
    Failure, FailureKind, Inbound, InboundRef, OpStats, PassStats, Reply, Request, WorkerCommand, WorkerEvent,
    WorkerInfo, WorkerStats,
};
pub use zmq;

/// Helpers of this crate's unit tests.
#[cfg(test)]
pub(crate) mod testing {
    /// An empty scratch directory of one test's own (`part`: the module testing).
    pub fn scratch(part: &str, name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gt-{part}-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
