//! Hostile and careless clients against an embedded cluster (the hardening issue's findings):
//! streams that verify nowhere, sent straight to the dispatcher, must become that client's
//! errors while the dispatcher, its workers and the other clients carry on.

use gt::frontend::{Client, ClientOptions, Origin};
use gt::ir::{Instr, StmtKind, ValueId};
use gt::runtime::config::EnvConfig;
use gt::runtime::{Cluster, ClusterOptions};

/// An embedded cluster with the settings a user gets by default (the default passes) and
/// these `GT_*` settings.
fn cluster(settings: &[(&str, &str)]) -> Cluster {
    let env = EnvConfig::from_lookup(|k| settings.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).unwrap();
    Cluster::start(ClusterOptions::from_config(&env)).unwrap()
}

fn origin() -> Origin {
    Origin { op: "hostile", span: None }
}

/// The instructions of `.gtir` text, parsed but not verified (a raw client can send anything
/// that decodes: self-redefinitions, undefined operands).
fn instrs(text: &str) -> Vec<Instr> {
    let program = gt::ir::text::parse(text).expect("the test's text parses");
    program
        .body
        .into_iter()
        .filter_map(|s| match s.kind {
            StmtKind::Instr(i) => Some(i),
            _ => None,
        })
        .collect()
}

/// Sends `text` as one batch from a fresh client, then waits; the outcome does not matter,
/// only that an answer comes.
fn send(c: &Cluster, text: &str) {
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs(text) {
        a.submit(i, origin()).unwrap();
    }
    // Either answer is fine; the client must get one (an error here would be a lost dispatcher).
    if let Err(e) = a.sync() {
        assert!(!e.to_string().contains("dispatcher"), "the dispatcher was lost: {e}");
    }
}

/// A well-behaved client still gets right answers.
fn still_serves(c: &Cluster) {
    let mut b = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs("%0 = full f32[3] 2.0\n%1 = add %0, %0\n%2 = mul %1, %0") {
        b.submit(i, origin()).unwrap();
    }
    assert_eq!(b.read(ValueId(2)).unwrap().to_f32(), vec![8.0; 3]);
}

/// Finding 1: a 6-instruction message overflowed the fuse pass's stack (a view of itself in
/// a compile signal), killing the dispatcher and every worker with it.
#[test]
fn a_value_defined_as_a_view_of_itself_does_not_kill_the_dispatcher() {
    let c = cluster(&[]);
    send(
        &c,
        "%3 = zeros f32[2]\n\
         signal_start \"x\" compile\n\
         %3 = broadcast_to %3 shape=[0, 0]\n\
         %5 = zeros f32[3, 0]\n\
         %6 = slice %5 [1]\n\
         %7 = add %6, %3\n\
         signal_end \"x\"",
    );
    still_serves(&c);
    // Every op that reads its own result, in a compiled region, one message each.
    for op in [
        "%1 = neg %1",
        "%1 = add %1, %1",
        "%1 = transpose %1 dim0=0 dim1=1",
        "%1 = reshape %1 shape=[4]",
        "%1 = sum %1 axes=[1]",
        "%1 = matmul %1, %1",
        "%1 = slice %1 [1:]",
    ] {
        send(
            &c,
            &format!(
                "%1 = ones f32[2, 2]\nsignal_start \"x\" compile\n{op}\n%2 = exp %1\n%3 = mul %2, %1\nsignal_end \"x\""
            ),
        );
        send(
            &c,
            &format!(
                "signal_start \"x\" compile\n%1 = ones f32[2, 2]\n%2 = exp %1\n{op}\n%3 = mul %2, %1\nsignal_end \"x\""
            ),
        );
    }
    still_serves(&c);
}

/// A chain `%i = op %(i-1)` of `n` instructions (alternating ops, so the e-graph cannot fold it).
fn chain(n: u32) -> Vec<Instr> {
    use gt::ir::{BinaryOp, Operand, TensorType, UnaryOp};
    let mut v = vec![Instr::Ones { dst: ValueId(0), ty: TensorType::f32(vec![2]) }];
    for i in 1..n {
        let (dst, src) = (ValueId(i), ValueId(i - 1));
        v.push(match i % 3 {
            0 => Instr::Unary { op: UnaryOp::Tanh, dst, src },
            1 => Instr::Binary { op: BinaryOp::Mul, dst, lhs: Operand::Value(src), rhs: Operand::Scalar(0.5) },
            _ => Instr::Binary { op: BinaryOp::Add, dst, lhs: Operand::Value(src), rhs: Operand::Value(src) },
        });
    }
    v
}

/// Every walk that follows data is iterative or bounded: a 10^6-deep chain goes through every
/// pass (each mode of `fuse`), the verifier, the printer and the parser on a test thread's
/// ordinary stack.
#[test]
fn a_million_deep_chain_goes_through_every_pass_and_the_text_format() {
    use gt::passes::registry::{default_options, pipeline};
    use gt::passes::Regions;
    const N: u32 = 1_000_000;
    let stream = chain(N);
    for (names, regions, window) in [
        (&["hotpath"][..], Regions::All, 512),
        (&["fuse"][..], Regions::All, 512),
        // The largest region the settings allow.
        (&["fuse"][..], Regions::All, gt::runtime::config::MAX_FUSE_WINDOW),
        (&["fuse"][..], Regions::Signals, 512),
        (&["hotpath", "fuse"][..], Regions::HotPaths, 512),
        (&["dead"][..], Regions::All, 512),
        (&["hotpath", "fuse", "dead"][..], Regions::All, 512),
    ] {
        let mut options = default_options();
        options.fuse.regions = regions;
        options.fuse.window = window;
        let mut p = pipeline(names, &options).unwrap();
        let (mut out, mut released) = (Vec::new(), 0);
        // In compile-signal mode the whole chain is one signal's scope.
        if regions == Regions::Signals {
            p.run(Instr::SignalStart { name: "deep".into(), compile: true, backward: false, place: None }, 0, &mut out);
        }
        for (seq, i) in stream.iter().enumerate() {
            p.run(i.clone(), seq as u64, &mut out);
            // What the passes let go of is counted, not kept: memory stays flat.
            released += out.len();
            out.clear();
        }
        p.flush(u64::from(N), &mut out);
        released += out.len();
        assert!(released >= 2000, "{names:?}: only {released} instructions came out");
        if names == ["fuse"] && regions == Regions::All {
            let kernels = p.stats()[0].1.iter().find(|(k, _)| *k == "kernels").map(|(_, n)| *n);
            let least = u64::from(N) / window as u64;
            assert!(kernels >= Some(least), "{kernels:?} kernels for a chain of 10^6 in windows of {window}");
        }
    }
    // The same chain as a program: printed, parsed back and verified.
    let program = gt::ir::Program {
        body: stream.into_iter().map(|i| gt::ir::Stmt { kind: StmtKind::Instr(i), span: Default::default() }).collect(),
        names: (0..N).map(|i| format!("v{i}")).collect(),
    };
    let text = gt::ir::text::print(&program);
    let parsed = gt::ir::text::parse(&text).unwrap();
    assert_eq!(parsed.body.len(), N as usize);
    gt::ir::verify(&parsed).unwrap();
}

/// Aborts the test process if it is still running after `limit` (a wedged dispatcher would
/// otherwise hang the test run instead of failing it).
struct Watchdog(std::sync::mpsc::Sender<()>);

impl Watchdog {
    fn new(what: &'static str, limit: std::time::Duration) -> Watchdog {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("{what}: still running after {limit:?}: the cluster is wedged");
                std::process::abort();
            }
        });
        Watchdog(tx)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// Every pass combination and each setting that changes a pass, with the clusters they make.
const PASS_SETTINGS: &[&[(&str, &str)]] = &[
    &[("GT_PASSES", "none")],
    &[],
    &[("GT_COMPILE", "1")],
    &[("GT_AUTO_COMPILE", "1"), ("GT_HOTPATH_THRESHOLD", "1"), ("GT_HOTPATH_MIN_SEQ", "1")],
    &[("GT_PASSES", "hotpath")],
    &[("GT_PASSES", "dead"), ("GT_DEAD_WINDOW", "3")],
    &[("GT_PASSES", "hotpath,fuse,dead"), ("GT_COMPILE", "1"), ("GT_FAST_MATH", "1"), ("GT_FUSE_WINDOW", "6")],
    &[("GT_COMPILE", "1"), ("GT_JIT", "0"), ("GT_WORKERS", "2"), ("GT_WORKER_BATCH_SIZE", "3")],
    // Everything large enough split over three workers, and the clients' placements spread.
    &[("GT_WORKERS", "3"), ("GT_AUTO_SHARD", "1"), ("GT_SHARD_THRESHOLD", "16"), ("GT_COLLECTIVE_TIMEOUT", "5")],
    &[("GT_WORKERS", "3"), ("GT_COMPILE", "1"), ("GT_WORKER_BATCH_SIZE", "2")],
];

/// The stream fuzzer as a bounded property test: random well- and ill-formed streams from
/// three clients at once, under every pass setting, never cost the dispatcher, a worker or a
/// well-behaved client anything (see `gt::streamgen`; the `stream` fuzz target runs the same
/// for hours).
#[test]
fn random_streams_from_several_clients_never_fault_the_cluster() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let cases = std::env::var("GT_STREAM_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let _dog = Watchdog::new("random streams", std::time::Duration::from_secs(600));
    for settings in PASS_SETTINGS {
        // Generated programs can build legitimate values of gigabytes (a chain of concats
        // doubling one): a 1 GiB budget fails them as it should, within a test's memory.
        let c = cluster(&[*settings, &[("GT_WORKER_MEMORY", "1073741824")]].concat());
        let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
        let bytes = proptest::collection::vec(proptest::num::u8::ANY, 0..3000);
        let outcome = runner.run(&bytes, |bytes| {
            // Half the cases also spread over workers (placements, collectives), half mix in
            // every dtype.
            let streams = gt::streamgen::fuzz_streams(&bytes, 3);
            gt::streamgen::drive(c.context(), c.endpoint(), &streams).map_err(|f| TestCaseError::fail(f.to_string()))
        });
        if let Err(e) = outcome {
            panic!("with {settings:?}: {e}");
        }
    }
}

/// Sends `instrs` from a fresh client and returns the error its wait reports.
fn refused(c: &Cluster, instrs: Vec<Instr>) -> String {
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs {
        a.submit(i, origin()).unwrap();
    }
    a.sync().expect_err("the stream should be refused").to_string()
}

/// Finding 2: work is bounded. A kernel or matmul over the work limit is refused before it
/// runs; an empty result computes nothing, however long its other axes (the JIT used to spin
/// on the 2^40 empty rows of a transposed `f32[0, 2^40]`).
#[test]
fn enormous_work_is_refused_and_empty_results_cost_nothing() {
    use gt::ir::kernel::{Access, Kernel, MatMulKernel, Precision};
    use gt::ir::TensorType;
    let _dog = Watchdog::new("enormous work", std::time::Duration::from_secs(120));
    let c = cluster(&[("GT_COMPILE", "1")]);
    let one = TensorType::f32(vec![1]);
    let zero_strides = Access { offset: 0, strides: vec![0, 0] };
    let kernel = Kernel::MatMul(MatMulKernel {
        batch: vec![],
        m: 1,
        n: 1,
        k: 1 << 62,
        lhs: zero_strides.clone(),
        rhs: zero_strides,
        epilogue: vec![],
        epilogue_inputs: vec![],
        precision: Precision::F32,
    });
    let e = refused(
        &c,
        vec![
            Instr::Ones { dst: ValueId(0), ty: one.clone() },
            Instr::Fused {
                dst: ValueId(1),
                ty: TensorType::f32(vec![1, 1]),
                srcs: vec![ValueId(0), ValueId(0)],
                kernel: Box::new(kernel),
            },
        ],
    );
    assert!(e.contains("over the limit of 2^42"), "{e}");
    let e = refused(
        &c,
        // 2^30 empty matrices times a 1024x1024 one: 2^50 multiply-adds by the loop extents.
        instrs("%a = zeros f32[1073741824, 0, 1024]\n%b = zeros f32[1024, 1024]\n%c = matmul %a, %b"),
    );
    assert!(e.contains("matmul") && e.contains("over the limit"), "{e}");
    // An empty tensor with a long axis, transposed and compiled: read at once.
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs("%x = randn f32[0, 1099511627776] seed=1\n%y = transpose %x\n%z = mul %y, 2.0") {
        a.submit(i, origin()).unwrap();
    }
    let z = a.read(ValueId(2)).unwrap();
    assert_eq!((z.ty.shape.0.as_slice(), z.data.len()), (&[1usize << 40, 0][..], 0));
    still_serves(&c);
}

/// Finding 2 (a wedged worker): with `GT_OP_TIMEOUT` an instruction that runs too long is
/// cancelled while it runs and fails, naming the setting, its value is gone, and the worker
/// serves the next instruction: an interpreted matmul (stopped between its blocks) and a
/// compiled kernel reducing a 2^40-long row (stopped in its outer loop), which would
/// otherwise run for many minutes.
#[test]
fn an_instruction_past_the_op_timeout_is_cancelled() {
    let _dog = Watchdog::new("op timeout", std::time::Duration::from_secs(120));
    for (settings, text, op) in [
        (
            &[("GT_OP_TIMEOUT", "1"), ("GT_PASSES", "none")][..],
            "%a = zeros f32[6144, 6144]\n%c = matmul %a, %a\n%d = ones f32[2]",
            "matmul",
        ),
        (
            &[("GT_OP_TIMEOUT", "1"), ("GT_COMPILE", "1")][..],
            "%x = ones f32[1]\n%y = broadcast_to %x shape=[1099511627776]\n%c = sum %y\nfree %y\n%d = ones f32[2]",
            "fused",
        ),
    ] {
        let c = cluster(settings);
        let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
        let program = instrs(text);
        let (c_id, d_id) = (ValueId(2), program[program.len() - 1].results()[0]);
        for i in program {
            a.submit(i, origin()).unwrap();
        }
        let e = a.read(c_id).expect_err("the long instruction is cancelled").to_string();
        assert!(e.contains(&format!("{op}: cancelled after")) && e.contains("(GT_OP_TIMEOUT)"), "{e}");
        assert_eq!(a.read(d_id).unwrap().to_f32(), vec![1.0; 2], "the next instruction ran");
        let stats = a.worker_stats().unwrap();
        assert_eq!(stats[0].cancelled, 1);
        drop(a);
        still_serves(&c);
    }
}

/// Finding 6 (a dead client's work): an instruction running when its client leaves is
/// cancelled, not finished, so the next client is not kept waiting behind it.
#[test]
fn a_departed_clients_running_instruction_is_cancelled() {
    let _dog = Watchdog::new("departed client", std::time::Duration::from_secs(120));
    let c = cluster(&[("GT_PASSES", "none")]);
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs("%a = zeros f32[6144, 6144]\n%c = matmul %a, %a\n%d = matmul %c, %a") {
        a.submit(i, origin()).unwrap();
    }
    a.flush().unwrap();
    // Long enough for the matmul to be running, far shorter than it takes.
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(a);
    let mut b = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    b.sync().unwrap();
    let stats = b.worker_stats().unwrap();
    assert_eq!(stats[0].cancelled, 1, "{stats:?}");
    let matmuls = stats[0].ops.iter().find(|o| o.op == "matmul").map_or(0, |o| o.count);
    assert_eq!((matmuls, stats[0].skipped), (1, 1), "the second matmul was skipped, not run");
    assert_eq!(stats[0].live_values, 0);
    still_serves(&c);
}

/// Finding 5 (rank): a rank over the limit is refused by the type rules, so no walk over a
/// shape is long.
#[test]
fn a_rank_over_the_limit_is_refused() {
    let c = cluster(&[]);
    let dims = vec![1; 2_000_000];
    let e = refused(&c, vec![Instr::Zeros { dst: ValueId(0), ty: gt::ir::TensorType::f32(dims) }]);
    assert!(e.contains("rank 2000000 is over the limit of 64 dimensions"), "{e}");
    let e = refused(&c, instrs(&format!("%x = ones f32[{}]\n%y = unsqueeze %x axis=0", vec!["1"; 64].join(", "))));
    assert!(e.contains("rank 65"), "{e}");
    still_serves(&c);
}

/// A worker that registers, runs nothing, and answers every read with `f32[1] [666]`.
fn rogue_worker(ctx: &gt::transport::zmq::Context, endpoint: &gt::transport::Endpoint) -> std::thread::JoinHandle<()> {
    use gt::transport::message::{WorkerCommand, WorkerEvent};
    use gt::transport::{codec, zmq, Inbound};
    let sock = ctx.socket(zmq::DEALER).unwrap();
    sock.connect(&endpoint.zmq_address()).unwrap();
    let send = move |sock: &zmq::Socket, e: WorkerEvent| {
        sock.send(codec::encode(&Inbound::Worker(e), 1 << 20).unwrap(), 0).unwrap();
    };
    send(
        &sock,
        WorkerEvent::Register {
            name: "rogue".into(),
            backend: "cpu".into(),
            clock: 0,
            peer: String::new(),
            process: gt::transport::doorbell::process_key(),
            lane: None,
        },
    );
    std::thread::spawn(move || {
        while sock.poll(zmq::POLLIN, 5000).unwrap_or(0) > 0 {
            let Ok(bytes) = sock.recv_bytes(0) else { return };
            match codec::decode::<WorkerCommand>(&bytes, 1 << 30) {
                Ok(WorkerCommand::Exec { batch, .. }) => send(&sock, crate::done(batch)),
                Ok(WorkerCommand::Get { tag, .. }) => {
                    let head = codec::encode(
                        &Inbound::Worker(WorkerEvent::Data { tag, ty: gt::ir::TensorType::f32(vec![1]), file: false }),
                        1 << 20,
                    );
                    sock.send(head.unwrap(), zmq::SNDMORE).unwrap();
                    sock.send(codec::data_frame(&[666.0]), 0).unwrap();
                }
                Ok(WorkerCommand::Shutdown) => return,
                _ => {}
            }
        }
    })
}

/// A worker in another process (its `Register` names a process key not the dispatcher's)
/// that says it rang every client's doorbell: it is never given one, so its syncs are still
/// answered by the dispatcher, and a read it says it answered by a bell fails naming it.
#[test]
fn a_worker_claiming_to_ring_doorbells_it_was_not_given_is_not_believed() {
    use gt::transport::doorbell::DoorbellKey;
    use gt::transport::message::{WorkerCommand, WorkerEvent};
    use gt::transport::{codec, zmq, Inbound};
    let c = Cluster::start(ClusterOptions::embedded(0)).unwrap();
    let sock = c.context().socket(zmq::DEALER).unwrap();
    sock.connect(&c.endpoint().zmq_address()).unwrap();
    let send = move |sock: &zmq::Socket, e: WorkerEvent| {
        sock.send(codec::encode(&Inbound::Worker(e), 1 << 20).unwrap(), 0).unwrap();
    };
    let register = WorkerEvent::Register {
        name: "liar".into(),
        backend: "cpu".into(),
        clock: 0,
        peer: String::new(),
        process: DoorbellKey([1, 1]),
        lane: None,
    };
    send(&sock, register);
    let _liar = std::thread::spawn(move || {
        while sock.poll(zmq::POLLIN, 5000).unwrap_or(0) > 0 {
            let Ok(bytes) = sock.recv_bytes(0) else { return };
            match codec::decode::<WorkerCommand>(&bytes, 1 << 30) {
                Ok(WorkerCommand::Exec { batch, doorbell, .. }) => {
                    assert_eq!(doorbell, None, "a worker of another process was given a doorbell");
                    let done = WorkerEvent::Done {
                        batch,
                        failures: vec![],
                        nanos: 0,
                        timings: vec![],
                        live_bytes: 0,
                        rang: true,
                    };
                    send(&sock, done);
                }
                Ok(WorkerCommand::Get { tag, doorbell, .. }) => {
                    assert_eq!(doorbell, None, "a worker of another process was given a doorbell");
                    send(&sock, WorkerEvent::Rung { tag, ty: gt::ir::TensorType::f32(vec![4]) });
                }
                Ok(WorkerCommand::Shutdown) => return,
                _ => {}
            }
        }
    });
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs("%x = ones f32[4]") {
        a.submit(i, origin()).unwrap();
    }
    for _ in 0..20 {
        a.sync().unwrap();
    }
    let e = a.read(ValueId(0)).unwrap_err().to_string();
    assert!(e.contains("worker `liar` said it answered a read it was given no doorbell for"), "{e}");
}

/// Finding 3 (replies): a worker answering a read with another type or length is caught by
/// the dispatcher, which tells the client and stops trusting the worker.
#[test]
fn a_worker_answering_the_wrong_type_is_caught() {
    let c = Cluster::start(ClusterOptions::embedded(0)).unwrap();
    let _rogue = rogue_worker(c.context(), c.endpoint());
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs("%x = ones f32[4]") {
        a.submit(i, origin()).unwrap();
    }
    let e = a.read(ValueId(0)).unwrap_err().to_string();
    assert!(e.contains("worker `rogue` answered f32[1] with 4 bytes of data for a f32[4] value"), "{e}");
}

/// A rogue dispatcher cannot panic a client or fool it with data of another length: the
/// client checks each answer against its question.
#[test]
fn a_client_checks_the_dispatchers_answers() {
    use gt::transport::message::{Reply, Request};
    use gt::transport::{codec, zmq, Endpoint, Inbound};
    let ctx = zmq::Context::new();
    let endpoint = Endpoint::Inproc("rogue-dispatcher".into());
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.bind(&endpoint.zmq_address()).unwrap();
    let fake = std::thread::spawn(move || {
        let mut answered = 0;
        while answered < 3 {
            let frames = router.recv_multipart(0).unwrap();
            let reply = match codec::decode::<Inbound>(&frames[1], 1 << 20) {
                Ok(Inbound::Client(Request::Hello { .. })) => {
                    (Reply::Welcome { client: 1, workers: vec![], max_message_bytes: 1 << 20 }, None)
                }
                // Four elements promised, one sent.
                Ok(Inbound::Client(Request::Get { seq, .. })) => (
                    Reply::Data { seq, ty: gt::ir::TensorType::f32(vec![4]), receipt: 1, file: None },
                    Some(vec![666.0]),
                ),
                // Data where statistics were asked for.
                Ok(Inbound::Client(Request::Stats { seq })) => {
                    (Reply::Data { seq, ty: gt::ir::TensorType::f32(vec![1]), receipt: 1, file: None }, Some(vec![1.0]))
                }
                _ => continue,
            };
            answered += 1;
            let (reply, data) = reply;
            let bytes = codec::encode(&reply, 1 << 20).unwrap();
            let more = if data.is_some() { zmq::SNDMORE } else { 0 };
            router.send_multipart([frames[0].as_slice(), bytes.as_slice()], more).unwrap();
            if let Some(data) = data {
                router.send(codec::data_frame(&data), 0).unwrap();
            }
        }
    });
    let mut a = Client::connect_in(&ctx, &endpoint, ClientOptions::default()).unwrap();
    let e = a.read(ValueId(0)).unwrap_err().to_string();
    assert_eq!(e, "the dispatcher answered `get` with 4 bytes of data for a f32[4] value");
    let e = a.stats().unwrap_err().to_string();
    assert_eq!(e, "the dispatcher answered `stats` with Data");
    fake.join().unwrap();
}

/// Found by the `stream` fuzz target: a signal delivered to a thread waiting in ZeroMQ made
/// the call fail with `EINTR`, and the client reported "Interrupted system call" (the
/// dispatcher's and workers' loops would have stopped). Waits are retried now.
#[test]
#[allow(unsafe_code)] // libc's signal and pthread_kill: the only way to deliver a signal to one thread
fn signals_do_not_break_waits() {
    use std::os::unix::thread::JoinHandleExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    extern "C" fn ignore(_: libc::c_int) {}
    // SAFETY: installs a handler that does nothing, for a signal nothing else here uses.
    unsafe { libc::signal(libc::SIGUSR2, ignore as *const () as libc::sighandler_t) };
    let c = cluster(&[]);
    let (ctx, endpoint) = (c.context().clone(), c.endpoint().clone());
    let done = Arc::new(AtomicBool::new(false));
    let finished = done.clone();
    let reader = std::thread::spawn(move || {
        let mut a = Client::connect_in(&ctx, &endpoint, ClientOptions::default()).unwrap();
        for k in 0..300 {
            for i in instrs("%0 = full f32[3] 2.0\n%1 = add %0, %0\n%2 = mul %1, %0") {
                a.submit(i, origin()).unwrap();
            }
            let got = a.read(ValueId(2)).unwrap_or_else(|e| panic!("read {k}: {e}")).to_f32();
            assert_eq!(got, vec![8.0; 3]);
        }
        finished.store(true, Ordering::SeqCst);
    });
    let thread = reader.as_pthread_t();
    let mut sent = 0;
    while !done.load(Ordering::SeqCst) && !reader.is_finished() {
        // SAFETY: the thread is alive (not finished) and the signal's handler does nothing.
        unsafe { libc::pthread_kill(thread, libc::SIGUSR2) };
        sent += 1;
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    reader.join().unwrap();
    assert!(sent > 10, "only {sent} signals were sent");
}

/// Two 400 kB values, then a third over a 1 MB limit: refused with `limit` in the message;
/// then `between` and a free of the second make room for it.
fn over_memory(c: &Cluster, between: &str, limit: &str) {
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    let text =
        format!("%a = ones f32[100000]\n%b = ones f32[100000]\n%c = add %a, %b\n{between}free %b\n%c = add %a, %a");
    let all = instrs(&text);
    for i in all[..3].iter().cloned() {
        a.submit(i, origin()).unwrap();
    }
    let e = a.sync().unwrap_err();
    assert_eq!(e.kind(), gt::ir::FailureKind::OutOfMemory, "{e}");
    let e = e.to_string();
    assert!(e.contains(&format!("add: results need 400000 bytes with 800000 bytes held, {limit}")), "{e}");
    for i in all[3..].iter().cloned() {
        a.submit(i, origin()).unwrap();
    }
    assert_eq!(a.read(ValueId(2)).unwrap().to_f32()[..2], [2.0, 2.0]);
}

/// Finding 5 (memory): values past a worker's budget fail their op, naming the budget, and
/// the worker carries on (the process used to abort when an allocation failed).
#[test]
fn a_worker_over_its_memory_budget_fails_the_op_not_the_process() {
    let c = cluster(&[("GT_WORKER_MEMORY", "1000000")]);
    over_memory(&c, "", "over the worker's memory budget of 1000000 (GT_WORKER_MEMORY)");
    still_serves(&c);
}

/// Finding 6 (sequence numbers): a batch whose numbers would run past 2^64 is refused whole,
/// never wrapped onto earlier numbers.
#[test]
fn sequence_numbers_do_not_wrap() {
    use gt::transport::message::{Reply, Request};
    use gt::transport::{codec, zmq, Inbound};
    let c = cluster(&[]);
    let raw = c.context().socket(zmq::DEALER).unwrap();
    raw.connect(&c.endpoint().zmq_address()).unwrap();
    let exchange = |req: Request| -> Reply {
        raw.send(codec::encode(&Inbound::Client(req), 1 << 20).unwrap(), 0).unwrap();
        assert!(raw.poll(zmq::POLLIN, 5000).unwrap() > 0, "no answer");
        codec::decode(&raw.recv_bytes(0).unwrap(), 1 << 20).unwrap()
    };
    assert!(matches!(
        exchange(Request::Hello { name: "raw".into(), wait_ms: 1000, doorbell: None, lane: None, shared_reads: false }),
        Reply::Welcome { .. }
    ));
    let batch = Request::Batch {
        first_seq: u64::MAX - 1,
        instrs: instrs("%a = ones f32[1]\n%b = ones f32[1]\n%c = ones f32[1]"),
        lines: Vec::new(),
        then: None,
    };
    match exchange(batch) {
        Reply::Rejected { message } => assert!(message.contains("runs past sequence number 2^64"), "{message}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    still_serves(&c);
}

/// Finding 5 (unread answers): a client that asks for data and never reads it cannot make
/// the dispatcher buffer more than `GT_CLIENT_UNREAD_BYTES`: past it, its reads fail naming
/// the limit until it shows, with an answer's receipt, that it read them. A made-up receipt
/// acknowledges nothing, and the Rust client, which reads what it asks for, never meets it.
#[test]
fn a_client_that_does_not_read_its_answers_is_bounded() {
    use gt::transport::message::{Reply, Request};
    use gt::transport::{codec, socket, zmq, Inbound};
    let c = cluster(&[("GT_CLIENT_UNREAD_BYTES", "1000000")]);
    let raw = c.context().socket(zmq::DEALER).unwrap();
    raw.connect(&c.endpoint().zmq_address()).unwrap();
    let send = |req: Request| raw.send(codec::encode(&Inbound::Client(req), 1 << 20).unwrap(), 0).unwrap();
    let recv = || -> Reply {
        assert!(raw.poll(zmq::POLLIN, 5000).unwrap() > 0, "no answer");
        codec::decode(&socket::recv_frames(&raw, 0).unwrap()[0], 1 << 20).unwrap()
    };
    send(Request::Hello { name: "raw".into(), wait_ms: 1000, doorbell: None, lane: None, shared_reads: false });
    assert!(matches!(recv(), Reply::Welcome { .. }));
    // A 400 kB value, asked for ten times without reading in between.
    send(Request::Batch { first_seq: 0, instrs: instrs("%a = ones f32[100000]"), lines: Vec::new(), then: None });
    for seq in 1..=10 {
        send(Request::Get { seq, value: ValueId(0), read: 0 });
    }
    let (mut data, mut refused, mut last) = (0, 0, 0);
    for _ in 1..=10 {
        match recv() {
            Reply::Data { receipt, .. } => (data, last) = (data + 1, receipt),
            Reply::Failed { failure, .. } => {
                assert!(failure.message.contains("over its limit of 1000000 (GT_CLIENT_UNREAD_BYTES)"), "{failure:?}");
                refused += 1;
            }
            other => panic!("expected data or a failure, got {other:?}"),
        }
    }
    // Two answers (800 kB) fit in the 1 MB limit; the reads after them are refused.
    assert_eq!((data, refused), (2, 8));
    send(Request::Get { seq: 11, value: ValueId(0), read: last.wrapping_add(1) });
    assert!(matches!(recv(), Reply::Failed { .. }), "a made-up receipt acknowledged the answers");
    send(Request::Get { seq: 12, value: ValueId(0), read: last });
    assert!(matches!(recv(), Reply::Data { .. }), "the receipt of the last answer acknowledges them all");
    // The Rust client reads a value far over the limit, many times.
    let mut b = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs("%a = ones f32[300000]") {
        b.submit(i, origin()).unwrap();
    }
    for _ in 0..5 {
        assert_eq!(b.read(ValueId(0)).unwrap().data.len(), 300_000);
    }
    still_serves(&c);
}

/// Finding 6 (a dead client's work): a client that leaves with much work queued does not keep
/// the worker busy for the next client: its queued instructions are skipped.
#[test]
fn a_departed_clients_queued_work_is_skipped() {
    let c = cluster(&[("GT_WORKER_BATCH_SIZE", "8")]);
    let mut a = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    let mut heavy = instrs("%x = randn f32[384, 384] seed=1");
    heavy.extend(
        (0..400).flat_map(|_| instrs("%x = randn f32[384, 384] seed=1\n%y = matmul %x, %x").into_iter().skip(1)),
    );
    for i in heavy {
        a.submit(i, origin()).unwrap();
    }
    a.flush().unwrap();
    drop(a); // says goodbye with ~400 matmuls queued
    let mut b = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    b.sync().unwrap();
    still_serves(&c);
    let stats = b.worker_stats().unwrap();
    let matmuls = stats[0].ops.iter().find(|o| o.op == "matmul").map_or(0, |o| o.count);
    assert!(stats[0].skipped > 0 && matmuls < 400, "{matmuls} matmuls run, {} skipped", stats[0].skipped);
    assert_eq!(stats[0].live_values, 0, "the frees of the departed client's values still ran");
}

/// Finding 5 (memory, per client): one client's values past its quota fail its instruction,
/// naming the quota, and another client still has the worker's memory.
#[test]
fn a_client_over_its_memory_quota_fails_and_others_do_not() {
    let c = cluster(&[("GT_CLIENT_MEMORY", "1000000")]);
    // A redefinition replaces its old value's bytes too.
    over_memory(&c, "%b = ones f32[100000]\n", "over this client's memory quota of 1000000 (GT_CLIENT_MEMORY)");
    // Another client has its own quota.
    let mut b = Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap();
    for i in instrs("%a = ones f32[200000]") {
        b.submit(i, origin()).unwrap();
    }
    assert_eq!(b.read(ValueId(0)).unwrap().data.len(), 200_000);
}

/// Found by the `stream` fuzz target (an input that used 5 GB): a chain of concats doubling a
/// value is legitimate but large; a worker's memory budget fails it with an error.
#[test]
fn a_doubling_chain_fails_at_the_memory_budget() {
    let c = cluster(&[("GT_WORKER_MEMORY", "1073741824"), ("GT_COMPILE", "1")]);
    let bytes = [
        0x3f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x04, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0x07, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xdf, 0xff, 0x9e, 0xff, 0x05,
    ];
    let mut bytes = bytes.to_vec();
    bytes.extend([0xff; 40]);
    bytes.extend([0xdf, 0xff, 0x9e, 0xff, 0x05]);
    bytes.extend([0xff; 20]);
    let streams = gt::streamgen::streams(&bytes, 3);
    let concats =
        streams.iter().flatten().filter(|s| matches!(s, gt::streamgen::Step::Instr(Instr::Concat { .. }))).count();
    assert!(concats >= 10, "the input makes a doubling chain ({concats} concats)");
    gt::streamgen::drive(c.context(), c.endpoint(), &streams).unwrap();
    still_serves(&c);
}

/// Finding 5 (credit): a client that never waits cannot queue without bound at the
/// dispatcher: past its credit its instructions fail, naming it, and once the worker catches
/// up it is served again.
#[test]
fn a_client_that_never_waits_runs_out_of_credit() {
    let c = cluster(&[("GT_CLIENT_CREDIT", "500"), ("GT_WORKER_BATCH_SIZE", "16")]);
    let options = ClientOptions { window: usize::MAX, ..ClientOptions::default() };
    let mut a = Client::connect_in(c.context(), c.endpoint(), options).unwrap();
    // Seconds of work first, then many tiny instructions without a wait.
    let mut stream = instrs("%x = randn f32[512, 512] seed=1\n%y = matmul %x, %x");
    for _ in 0..40 {
        stream.push(stream[1].clone());
    }
    for _ in 0..5000 {
        stream.extend(instrs("%z = full f32[1] 1.0"));
    }
    for i in stream {
        a.submit(i, origin()).unwrap();
    }
    let e = a.sync().unwrap_err();
    assert_eq!(e.kind(), gt::ir::FailureKind::Limit, "{e}");
    let e = e.to_string();
    assert!(e.contains("sent and not yet run, over its credit of 500 instructions"), "{e}");
    a.submit(instrs("%w = full f32[2] 3.0").remove(0), origin()).unwrap();
    assert_eq!(a.read(ValueId(0)).unwrap().to_f32(), vec![3.0, 3.0]);
}

/// Found by the `stream` fuzz target (every pass set): a read issued before the worker
/// reported that the value's instruction failed (a concat over the memory budget) got the
/// buffer's older value back, of another type; the reply check then took the honest worker
/// for a liar and dropped it. Such a read now fails, naming the instruction.
#[test]
fn a_read_racing_its_values_failure_fails_and_keeps_the_worker() {
    let c = cluster(&[("GT_PASSES", "fuse,dead"), ("GT_WORKER_MEMORY", "1073741824")]);
    let bytes = [
        0x40, 0x0a, 0x0a, 0x1b, 0x19, 0x1b, 0x1b, 0x1b, 0x00, 0xc7, 0x55, 0x55, 0x55, 0x55, 0x94, 0x55, 0x1b, 0x1b,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0x1b, 0x55, 0x55, 0x94, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0xae, 0xf3, 0xa8,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x38, 0x1b, 0x3b, 0x0a, 0x7c,
    ];
    let streams = gt::streamgen::streams(&bytes, 3);
    gt::streamgen::drive(c.context(), c.endpoint(), &streams).unwrap();
    still_serves(&c);
}
