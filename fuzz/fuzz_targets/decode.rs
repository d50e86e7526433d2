//! Fuzz target: the wire decoder must answer every frame with a message or an error, never
//! a panic, a hang or a huge allocation, for every message type a peer can send.

#![no_main]

use gt_transport::message::{Inbound, Reply, WorkerCommand};
use gt_transport::{codec, LogEvent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Fuzz the body behind a valid header too, or nearly every input stops at the header.
    let mut framed = codec::frame_with_version(codec::PROTOCOL_VERSION, &[]);
    framed.extend_from_slice(data);
    for frame in [data, framed.as_slice()] {
        let _ = codec::decode::<Inbound>(frame, 1 << 20);
        let _ = codec::decode::<Reply>(frame, 1 << 20);
        let _ = codec::decode::<WorkerCommand>(frame, 1 << 20);
        let _ = codec::decode::<LogEvent>(frame, 1 << 20);
    }
});
