//! Fuzz target: random client streams (`gt::streamgen`: mostly well-typed, with hostile
//! instructions mixed in) from three clients at once against one embedded cluster kept for
//! the whole run. A finding is a lost or rejected connection, an internal error, or a wrong
//! number read by a well-behaved client beside them. The pass settings come from the
//! environment, one run per set: `GT_COMPILE=1 cargo fuzz run stream`, `GT_AUTO_COMPILE=1 ..`,
//! `GT_PASSES=none ..`.

#![no_main]

use gt::runtime::config::EnvConfig;
use gt::runtime::{Cluster, ClusterOptions};
use gt::transport::{zmq, Endpoint};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// The context and endpoint of a cluster that lives for the whole process.
fn cluster() -> &'static (zmq::Context, Endpoint) {
    static CLUSTER: OnceLock<(zmq::Context, Endpoint)> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let mut env = EnvConfig::from_env().expect("valid GT_* settings");
        // Inputs can build legitimate values of gigabytes (a chain of concats doubling one);
        // a 1 GiB budget makes them fail their op, as they should, under the fuzzer's RSS
        // limit instead of passing it.
        if std::env::var_os("GT_WORKER_MEMORY").is_none() {
            env.worker_memory = 1 << 30;
        }
        let c = Cluster::start(ClusterOptions::from_config(&env)).expect("an embedded cluster starts");
        let at = (c.context().clone(), c.endpoint().clone());
        // Never stopped: libFuzzer runs until it exits the process.
        std::mem::forget(c);
        at
    })
}

fuzz_target!(|data: &[u8]| {
    let (ctx, endpoint) = cluster();
    // The first byte's bits choose spreading over workers and every dtype.
    let streams = gt::streamgen::fuzz_streams(data, 3);
    if let Err(finding) = gt::streamgen::drive(ctx, endpoint, &streams) {
        panic!("{finding}");
    }
});
