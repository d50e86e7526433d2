//! The embedded cluster (dispatcher and workers as threads, clients over `inproc://`):
//! every run filetest gives the same result as on the interpreter, with several clients at
//! once; clients are isolated; async failures are reported at the next wait naming their op;
//! worker statistics; freeing on goodbye; a pass pipeline plugged into the dispatcher.

use gt::frontend::{Client, ClientError, ClientOptions, Origin};
use gt::ir::{BinaryOp, Instr, Operand, TensorType, UnaryOp, ValueId};
use gt::passes::{Emit, HotPathConfig, PassOptions, Pipeline, StreamPass};
use gt::runtime::{Cluster, ClusterOptions};
use gt::script::run_any;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn cluster(workers: usize) -> Cluster {
    Cluster::start(ClusterOptions::embedded(workers)).unwrap()
}

fn client(c: &Cluster) -> Client {
    Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap()
}

fn origin(op: &'static str) -> Origin {
    Origin { op, span: None }
}

fn full(dst: u32, dims: Vec<usize>, value: f64) -> Instr {
    Instr::Full { dst: ValueId(dst), ty: TensorType::f32(dims), value }
}

fn add(dst: u32, lhs: u32, rhs: u32) -> Instr {
    Instr::Binary {
        op: BinaryOp::Add,
        dst: ValueId(dst),
        lhs: Operand::Value(ValueId(lhs)),
        rhs: Operand::Value(ValueId(rhs)),
    }
}

/// Every run filetest, sorted.
pub(crate) fn run_filetests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gtir/run");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "gtir"));
    files.sort();
    files
}

#[test]
fn run_filetests_pass_on_two_workers_with_two_clients_at_once() {
    filetests_on(&cluster(2), false);
}

#[test]
fn run_filetests_pass_with_every_pass_on() {
    // Eager detection, so that markers land everywhere a repetition could be.
    let options =
        PassOptions { hotpath: HotPathConfig { window: 8, threshold: 1, min_seq: 1 }, ..PassOptions::default() };
    let mut cluster_options = ClusterOptions::embedded(1);
    cluster_options.dispatcher.pipeline =
        Arc::new(move |_| gt::passes::registry::pipeline(gt::passes::KNOWN_PASSES, &options).unwrap());
    filetests_on(&Cluster::start(cluster_options).unwrap(), true);
}

/// Runs every run filetest on the cluster. With `fused`, a failure inside a fused region is
/// reported as the `fused` kernel at the region's end (the instruction the client sent last),
/// so files expecting an error must fail, without naming the same op and line.
fn filetests_on(c: &Cluster, fused: bool) {
    let files = run_filetests();
    assert!(files.len() > 10);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|k| {
                let (ctx, endpoint, files) = (c.context().clone(), c.endpoint().clone(), &files);
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for path in files.iter().skip(k).step_by(2) {
                        let reference = gt::filetest::run_file(path).unwrap();
                        let mut client = Some(Client::connect_in(&ctx, &endpoint, ClientOptions::default()).unwrap());
                        let on_cluster = gt::filetest::run_file_on(path, &mut |loaded, out| {
                            run_any(loaded, client.take().expect("one run per file"), out, Default::default()).0
                        });
                        let expects_error = std::fs::read_to_string(path).unwrap().contains("; error:");
                        match on_cluster {
                            Ok(text) if text == reference => {}
                            Err(e) if fused && expects_error && format!("{e:#}").contains("fused: ") => {}
                            Ok(_) => failures.push(format!("{}: differs from the interpreter", path.display())),
                            Err(e) => failures.push(format!("{}: {e:#}", path.display())),
                        }
                    }
                    failures
                })
            })
            .collect();
        let failures: Vec<String> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        assert!(failures.is_empty(), "{failures:#?}");
    });
}

#[test]
fn clients_cannot_name_each_others_values() {
    let c = cluster(1);
    let mut a = client(&c);
    let mut b = client(&c);
    a.submit(full(0, vec![2], 7.0), origin("full")).unwrap();
    a.sync().unwrap();
    // The same id in b's namespace is undefined: b can neither read nor free a's value.
    let e = b.read(ValueId(0)).unwrap_err();
    assert!(e.to_string().contains("not defined"), "{e}");
    b.submit(Instr::Free { src: ValueId(0) }, origin("free")).unwrap();
    let e = b.sync().unwrap_err();
    assert!(e.to_string().contains("free: value %0 is not defined"), "{e}");
    // b's own %0 is its own.
    b.submit(full(0, vec![1], -1.0), origin("full")).unwrap();
    assert_eq!(b.read(ValueId(0)).unwrap().to_f32(), vec![-1.0]);
    assert_eq!(a.read(ValueId(0)).unwrap().to_f32(), vec![7.0, 7.0]);
}

#[test]
fn the_failing_instruction_of_a_batch_is_reported_at_the_next_wait() {
    let c = cluster(1);
    let mut a = client(&c);
    a.submit(full(0, vec![2], 1.0), origin("full")).unwrap();
    a.submit(full(1, vec![3], 1.0), origin("full")).unwrap();
    a.submit(add(2, 0, 1), origin("add")).unwrap(); // third: shapes do not broadcast
    a.submit(add(3, 0, 0), origin("add")).unwrap();
    // Nothing waits yet, so nothing is reported yet.
    let e = a.read(ValueId(3)).unwrap_err();
    match &e {
        ClientError::Op { seq, origin, failure, later } => {
            let message = &failure.message;
            assert_eq!((*seq, origin.op, *later), (2, "add", 0));
            assert_eq!(failure.kind, gt::ir::FailureKind::Type);
            assert!(message.contains("cannot broadcast [2] with [3]"), "{message}");
        }
        other => panic!("expected an op failure, got {other}"),
    }
    // Reported once; the unrelated value is fine, and a value that depends on the failure says so.
    assert_eq!(a.read(ValueId(3)).unwrap().to_f32(), vec![2.0, 2.0]);
    let e = a.read(ValueId(2)).unwrap_err();
    assert!(e.to_string().contains("instruction #2 failed"), "{e}");
}

#[test]
fn worker_failures_are_reported_with_their_op() {
    let c = cluster(1);
    let mut a = client(&c);
    // Verifies, but is over the worker's 8 GiB limit: the worker reports it.
    a.submit(full(0, vec![65536, 32769], 0.0), origin("full")).unwrap();
    a.submit(full(1, vec![1], 5.0), origin("full")).unwrap();
    let e = a.read(ValueId(1)).unwrap_err();
    assert!(matches!(&e, ClientError::Op { seq: 0, origin, .. } if origin.op == "full"), "{e:?}");
    assert!(e.to_string().contains("over the limit"), "{e}");
    assert_eq!(a.read(ValueId(1)).unwrap().to_f32(), vec![5.0]);
}

#[test]
fn worker_stats_count_ops_and_goodbye_frees_everything() {
    let c = cluster(1);
    let mut a = client(&c);
    a.submit(full(0, vec![4], 1.0), origin("full")).unwrap();
    for _ in 0..10 {
        a.submit(Instr::Unary { op: UnaryOp::Neg, dst: ValueId(1), src: ValueId(0) }, origin("neg")).unwrap();
    }
    let stats = a.worker_stats().unwrap();
    assert_eq!(stats.len(), 1);
    let neg = stats[0].ops.iter().find(|o| o.op == "neg").expect("neg counted");
    assert_eq!(neg.count, 10);
    // %1 was redefined ten times into one buffer: two live values.
    assert_eq!(stats[0].live_values, 2);
    drop(a);
    let mut b = client(&c);
    b.sync().unwrap();
    let stats = b.worker_stats().unwrap();
    assert_eq!(stats[0].live_values, 0, "a's values are freed when it says goodbye");
}

#[test]
fn clients_spread_over_workers() {
    let c = cluster(2);
    let mut a = client(&c);
    let mut b = client(&c);
    for k in [&mut a, &mut b] {
        k.submit(full(0, vec![1], 1.0), origin("full")).unwrap();
        k.sync().unwrap();
    }
    let stats = a.worker_stats().unwrap();
    let per_worker: Vec<u64> = stats.iter().map(|s| s.live_values).collect();
    assert_eq!(per_worker, vec![1, 1], "each client's home is the least loaded worker");
}

/// Rewrites `neg x` into `mul x, -1` (a stand-in for a real pass).
struct NegToMul;
impl StreamPass for NegToMul {
    fn name(&self) -> &'static str {
        "neg-to-mul"
    }
    fn run(&mut self, instr: Instr, out: &mut Emit) {
        // A one-for-one rewrite keeps the input's place (it is not an injected instruction).
        out.keep(match instr {
            Instr::Unary { op: UnaryOp::Neg, dst, src } => {
                Instr::Binary { op: BinaryOp::Mul, dst, lhs: Operand::Value(src), rhs: Operand::Scalar(-1.0) }
            }
            other => other,
        });
    }
}

#[test]
fn the_dispatcher_runs_each_stream_through_the_pipeline() {
    let mut options = ClusterOptions::embedded(1);
    options.dispatcher.pipeline = Arc::new(|_client| {
        let mut p = Pipeline::new();
        p.push(Box::new(NegToMul));
        p
    });
    let c = Cluster::start(options).unwrap();
    let mut a = client(&c);
    a.submit(full(0, vec![2], 3.0), origin("full")).unwrap();
    a.submit(Instr::Unary { op: UnaryOp::Neg, dst: ValueId(1), src: ValueId(0) }, origin("neg")).unwrap();
    assert_eq!(a.read(ValueId(1)).unwrap().to_f32(), vec![-3.0, -3.0]);
    let ops: Vec<String> = a.worker_stats().unwrap()[0].ops.iter().map(|o| o.op.clone()).collect();
    assert!(ops.contains(&"mul".to_string()) && !ops.contains(&"neg".to_string()), "{ops:?}");
}

#[test]
fn a_client_past_its_window_waits_and_reports_failures_there() {
    let c = cluster(1);
    let options = ClientOptions { batch_size: 8, window: 32, ..Default::default() };
    let mut a = Client::connect_in(c.context(), c.endpoint(), options).unwrap();
    a.submit(full(0, vec![2], 1.0), origin("full")).unwrap();
    a.submit(full(1, vec![3], 1.0), origin("full")).unwrap();
    a.submit(add(2, 0, 1), origin("add")).unwrap(); // fails
                                                    // Thousands of instructions without a sync point: the window makes the client wait (and
                                                    // report the failure) long before the end, instead of queueing everything.
    let mut reported_at = None;
    for k in 0..5000 {
        if let Err(e) = a.submit(Instr::Unary { op: UnaryOp::Neg, dst: ValueId(3), src: ValueId(0) }, origin("neg")) {
            assert!(matches!(&e, ClientError::Op { seq: 2, origin, .. } if origin.op == "add"), "{e}");
            reported_at = Some(k);
            break;
        }
    }
    assert!(reported_at.is_some_and(|k| k < 64), "reported at {reported_at:?}");
    assert_eq!(a.read(ValueId(0)).unwrap().to_f32(), vec![1.0, 1.0]);
}

/// Literals of every dtype and size, more large ones than one message carries, uploaded in
/// one go and read back: large ones travel as frames of their own (lent within a process),
/// small ones inside their batch; every value arrives whole.
pub(crate) fn literals_arrive_whole(client: &mut Client) {
    use gt::ir::data::Elements;
    use half::bf16;
    let mut sent = Vec::new();
    for k in 0..40u32 {
        let n = [5000usize, 4096, 10, 20_000, 0][k as usize % 5] + k as usize;
        let data = match k % 6 {
            0 => Elements::F32((0..n).map(|i| i as f32 * 0.25 - k as f32).collect()),
            1 => Elements::F64((0..n).map(|i| i as f64 / 3.0).collect()),
            2 => Elements::I64((0..n).map(|i| i as i64 * -7 + i64::from(k)).collect()),
            3 => Elements::BF16((0..n).map(|i| bf16::from_f32(i as f32 * 0.5)).collect()),
            4 => Elements::I32((0..n).map(|i| i as i32 ^ 0x5555).collect()),
            _ => Elements::Bool((0..n).map(|i| i % 3 == 0).collect()),
        };
        let ty = TensorType::new(data.dtype(), vec![n]);
        client.submit(Instr::Literal { dst: ValueId(k), ty, data: data.clone() }, origin("tensor")).unwrap();
        sent.push(data);
    }
    for (k, data) in sent.iter().enumerate() {
        let got = client.read(ValueId(k as u32)).unwrap();
        assert_eq!(&got.data, data, "literal {k} ({} of {})", data.len(), data.dtype());
    }
}

#[test]
fn large_literals_and_reads_travel_as_frames_of_their_own() {
    let c = cluster(1);
    let mut client = client(&c);
    literals_arrive_whole(&mut client);
}

#[test]
fn a_large_literal_of_the_wrong_length_fails_alone_at_its_instruction() {
    // It is not sent as a frame of its own (it does not fit its type): it stays in its batch,
    // and the checks name it; the batch's other instructions run.
    use gt::ir::data::Elements;
    let c = cluster(1);
    let mut client = client(&c);
    let literal = |dst: u32, n: usize, declared: usize| Instr::Literal {
        dst: ValueId(dst),
        ty: TensorType::f32(vec![declared]),
        data: Elements::F32(vec![0.5; n]),
    };
    client.submit(literal(0, 5000, 5000), origin("tensor")).unwrap();
    client.submit(literal(1, 5001, 5000), origin("tensor")).unwrap();
    client.submit(literal(2, 6000, 6000), origin("tensor")).unwrap();
    let err = client.sync().unwrap_err().to_string();
    assert!(err.contains("needs 5000 values, found 5001"), "{err}");
    assert_eq!(client.read(ValueId(0)).unwrap().data, Elements::F32(vec![0.5; 5000]));
    assert_eq!(client.read(ValueId(2)).unwrap().data, Elements::F32(vec![0.5; 6000]));
}

/// A sync of an embedded client is answered once: by its doorbell when its worker rings it
/// (the dispatcher then sends nothing), and over the socket when the client declined the
/// bell, after a failure it may not have read yet, or when the bell names nothing in this
/// process (a client that says it has one it does not).
#[test]
fn a_sync_is_answered_once_by_the_doorbell_or_by_the_dispatcher() {
    use gt::transport::doorbell::{Doorbell, DoorbellKey};
    use gt::transport::message::{Reply, Request, Then};
    use gt::transport::{codec, socket, zmq, Inbound};
    use std::time::Instant;
    let c = cluster(1);
    let connect = |key: DoorbellKey| {
        let raw = c.context().socket(zmq::DEALER).unwrap();
        raw.connect(&c.endpoint().zmq_address()).unwrap();
        let hello =
            Request::Hello { name: "raw".into(), wait_ms: 1000, doorbell: Some(key), lane: None, shared_reads: false };
        raw.send(codec::encode(&Inbound::Client(hello), 1 << 20).unwrap(), 0).unwrap();
        raw
    };
    let send =
        |raw: &zmq::Socket, req: Request| raw.send(codec::encode(&Inbound::Client(req), 1 << 20).unwrap(), 0).unwrap();
    // (Liveness pings, which come every second, are not answers.)
    let recv = |raw: &zmq::Socket| -> Reply {
        loop {
            assert!(raw.poll(zmq::POLLIN, 5000).unwrap() > 0, "no answer");
            match codec::decode(&socket::recv_frames(raw, 0).unwrap()[0], 1 << 20).unwrap() {
                Reply::Ping => continue,
                reply => return reply,
            }
        }
    };
    let quiet = |raw: &zmq::Socket, ms: i64| loop {
        if raw.poll(zmq::POLLIN, ms).unwrap() == 0 {
            return true;
        }
        match codec::decode(&socket::recv_frames(raw, 0).unwrap()[0], 1 << 20).unwrap() {
            Reply::Ping => continue,
            reply => panic!("an answer the client did not ask for: {reply:?}"),
        }
    };
    let rung = |bell: &Doorbell, seq: u64| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !bell.rung(seq) {
            assert!(Instant::now() < deadline, "sync #{seq} was not rung");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let batch = |first_seq: u64, instrs: Vec<Instr>, then: Option<Then>| Request::Batch {
        first_seq,
        instrs,
        lines: vec![],
        then,
    };
    let bell = Doorbell::register();
    let raw = connect(bell.key());
    assert!(matches!(recv(&raw), Reply::Welcome { .. }));
    // Rung: the sync alone after its work, and one in the batch's own message.
    send(&raw, batch(0, vec![full(0, vec![2], 1.0)], None));
    bell.arm(1);
    send(&raw, Request::Sync { seq: 1 });
    rung(&bell, 1);
    bell.arm(3);
    send(&raw, batch(2, vec![add(1, 0, 0)], Some(Then::Sync { seq: 3 })));
    rung(&bell, 3);
    // Declined before the worker got to it: the dispatcher answers, and only that sync (the
    // rung ones got no answer on the socket).
    bell.arm(4);
    assert!(!bell.decline(4));
    send(&raw, Request::Sync { seq: 4 });
    assert_eq!(recv(&raw), Reply::Synced { seq: 4 });
    // A failure goes to the client over the socket; the sync after it is the dispatcher's
    // (the client may not have read the failure yet), the next one rings again.
    bell.arm(6);
    send(&raw, batch(5, vec![add(2, 0, 9)], Some(Then::Sync { seq: 6 })));
    assert!(matches!(recv(&raw), Reply::Failed { seq: 5, .. }));
    assert_eq!(recv(&raw), Reply::Synced { seq: 6 });
    assert!(!bell.rung(6));
    bell.arm(7);
    send(&raw, Request::Sync { seq: 7 });
    rung(&bell, 7);
    // A read rung: its data moved into the bell, with the receipt its answer carries, which
    // the next read acknowledges (answered by the socket: its bell was not armed for it).
    bell.arm(8);
    send(&raw, Request::Get { seq: 8, value: ValueId(1), read: 0 });
    rung(&bell, 8);
    let answer = bell.take_answer(8).expect("a rung read has its answer");
    assert_eq!((answer.ty, answer.data.to_f64()), (TensorType::f32(vec![2]), vec![2.0, 2.0]));
    send(&raw, Request::Get { seq: 9, value: ValueId(1), read: answer.receipt });
    match recv(&raw) {
        Reply::Data { seq: 9, receipt, .. } => assert_ne!(receipt, answer.receipt),
        other => panic!("expected the data of read #9, got {other:?}"),
    }
    // A bell this process does not have: answered over the socket.
    let other = connect(DoorbellKey([1, 2]));
    assert!(matches!(recv(&other), Reply::Welcome { .. }));
    send(&other, batch(0, vec![full(0, vec![1], 1.0)], Some(Then::Sync { seq: 1 })));
    assert_eq!(recv(&other), Reply::Synced { seq: 1 });
    assert!(quiet(&raw, 0));
}

/// The Rust client on an embedded cluster, syncing and reading by its doorbell or not,
/// reports every failure at the next wait and never misses or doubles an answer.
#[test]
fn syncs_report_failures_with_and_without_the_doorbell() {
    let c = cluster(1);
    for doorbell in [true, false] {
        let mut client =
            Client::connect_in(c.context(), c.endpoint(), ClientOptions { doorbell, ..Default::default() }).unwrap();
        client.submit(full(0, vec![4], 2.0), origin("full")).unwrap();
        for round in 0..200u32 {
            client.submit(add(1, 0, 0), origin("add")).unwrap();
            if round % 7 == 3 {
                client.submit(add(2, 0, 99), origin("add")).unwrap();
                let e = client.sync().unwrap_err();
                assert!(e.to_string().contains("%99"), "round {round}: {e}");
            } else if round % 5 == 1 {
                let read =
                    client.read(ValueId(1)).unwrap_or_else(|e| panic!("round {round}, doorbell {doorbell}: {e}"));
                assert_eq!(read.data.to_f64(), vec![4.0; 4]);
            } else {
                client.sync().unwrap_or_else(|e| panic!("round {round}, doorbell {doorbell}: {e}"));
            }
        }
        assert_eq!(client.read(ValueId(1)).unwrap().data.to_f64(), vec![4.0; 4]);
    }
}

/// Embedded clients and workers talk through lanes, also when every thread sleeps at once
/// (`GT_SPIN_US=0`: every message then needs its wake on the socket), beside a client
/// without one: work, reads (with large data frames each way), failures at the next wait,
/// and the log saying who has a lane.
#[test]
fn lanes_carry_every_message_whether_their_ends_spin_or_sleep() {
    for spin in [Duration::ZERO, gt::transport::socket::DEFAULT_SPIN] {
        let dir = crate::scratch("cluster", &format!("lanes-{}", spin.as_micros()));
        let log = dir.join("log.txt");
        let mut options = ClusterOptions::embedded(1);
        options.dispatcher.spin = spin;
        options.instruction_log = Some(log.clone());
        let c = Cluster::start(options).unwrap();
        let connect = |lane| {
            let options = ClientOptions { spin, lane, ..Default::default() };
            Client::connect_in(c.context(), c.endpoint(), options).unwrap()
        };
        let (mut by_lane, mut by_socket) = (connect(true), connect(false));
        assert!(by_lane.lane_open() && !by_socket.lane_open());
        // A literal large enough to travel as a data frame of its own, and a read as large.
        let big: Vec<f32> = (0..300_000).map(|i| i as f32).collect();
        for client in [&mut by_lane, &mut by_socket] {
            let literal = Instr::Literal {
                dst: ValueId(0),
                ty: TensorType::f32(vec![big.len()]),
                data: gt::Elements::F32(big.clone()),
            };
            client.submit(literal, origin("literal")).unwrap();
            for round in 0..150u32 {
                client.submit(add(1, 0, 0), origin("add")).unwrap();
                match round % 6 {
                    0 => {
                        client.submit(add(2, 0, 99), origin("add")).unwrap();
                        let e = client.sync().unwrap_err();
                        assert!(e.to_string().contains("%99"), "round {round}: {e}");
                    }
                    1 => assert_eq!(client.read(ValueId(1)).unwrap().data.to_f64()[7], 14.0),
                    _ => client.sync().unwrap(),
                }
            }
            let read = client.read(ValueId(1)).unwrap().data.to_f64();
            assert!(read.iter().enumerate().all(|(i, &x)| x == 2.0 * i as f64));
        }
        drop((by_lane, by_socket, c));
        let log = std::fs::read_to_string(&log).unwrap();
        let line =
            |what: &str| log.lines().find(|l| l.contains(what)).unwrap_or_else(|| panic!("{what}:\n{log}")).to_string();
        assert!(line("Register").contains("lane"), "the worker has a lane");
        let hellos: Vec<_> = log.lines().filter(|l| l.contains("Hello")).collect();
        assert_eq!(hellos.len(), 2, "{log}");
        assert!(hellos[0].ends_with("lane") && !hellos[1].ends_with("lane"), "{hellos:?}");
    }
}

/// A client's batch goes through its lane as it is, never encoded, yet is held to the same
/// message limit as one sent by the socket: a literal over it fails at its instruction, named
/// alike either way, and the client goes on.
#[test]
fn a_literal_over_the_message_limit_fails_alike_by_lane_and_by_socket() {
    let mut options = ClusterOptions::embedded(1);
    options.dispatcher.max_message_bytes = 64 << 10;
    let c = Cluster::start(options).unwrap();
    let mut errors = Vec::new();
    for lane in [true, false] {
        let options = ClientOptions { lane, max_message_bytes: 64 << 10, ..Default::default() };
        let mut client = Client::connect_in(c.context(), c.endpoint(), options).unwrap();
        assert_eq!(client.lane_open(), lane);
        let n = 20_000;
        let literal =
            Instr::Literal { dst: ValueId(0), ty: TensorType::f32(vec![n]), data: gt::Elements::F32(vec![1.5; n]) };
        client.submit(literal, origin("tensor")).unwrap();
        let e = client.sync().unwrap_err();
        assert_eq!(e.kind(), gt::transport::message::FailureKind::Limit, "{e}");
        errors.push(e.to_string());
        client.submit(full(1, vec![3], 2.0), origin("full")).unwrap();
        assert_eq!(client.read(ValueId(1)).unwrap().data.to_f64(), [2.0; 3]);
    }
    assert_eq!(errors[0], errors[1]);
    assert!(errors[0].contains("80000 bytes is over the limit of 65536"), "{}", errors[0]);
}

/// A client on a lane whose dispatcher stops is told so at its next wait (its lane is gone),
/// whether it spins or sleeps; it does not hang.
#[test]
fn a_lane_client_learns_that_its_dispatcher_stopped() {
    for spin in [Duration::ZERO, gt::transport::socket::DEFAULT_SPIN] {
        let c = cluster(1);
        let options = ClientOptions { spin, ..Default::default() };
        let mut client = Client::connect_in(c.context(), c.endpoint(), options).unwrap();
        assert!(client.lane_open());
        client.submit(full(0, vec![4], 2.0), origin("full")).unwrap();
        client.sync().unwrap();
        drop(c);
        let e = client.sync().unwrap_err();
        assert!(matches!(e, ClientError::Disconnected(_)), "{e}");
    }
}

/// A worker of this process that rings a client's doorbell and vanishes before it says so:
/// the dispatcher, failing the lost worker's waits, finds the bell rung and sends nothing for
/// that sync (its client has its answer), while the instruction whose value was lost is
/// reported; a sync it never rang is failed, and its bell can no longer ring.
#[test]
fn a_worker_lost_after_it_rang_does_not_answer_the_wait_twice() {
    use gt::transport::doorbell::{self, Doorbell};
    use gt::transport::message::{FailureKind, Reply, Request, Then, WorkerCommand, WorkerEvent};
    use gt::transport::{codec, socket, zmq, Inbound};
    let c = cluster(0);
    // The worker: registers as one of this process, rings the first sync's bell and goes.
    let sock = c.context().socket(zmq::DEALER).unwrap();
    sock.set_linger(0).unwrap();
    sock.connect(&c.endpoint().zmq_address()).unwrap();
    let register = WorkerEvent::Register {
        name: "ringer".into(),
        backend: "cpu".into(),
        clock: 0,
        peer: String::new(),
        process: doorbell::process_key(),
        lane: None,
    };
    sock.send(codec::encode(&Inbound::Worker(register), 1 << 20).unwrap(), 0).unwrap();
    let worker = std::thread::spawn(move || {
        while sock.poll(zmq::POLLIN, 5000).unwrap() > 0 {
            let bytes = sock.recv_bytes(0).unwrap();
            match codec::decode::<WorkerCommand>(&bytes, 1 << 30) {
                Ok(WorkerCommand::Exec { doorbell: Some(bell), .. }) => {
                    assert!(doorbell::ring(bell.key, bell.seq), "the client waits for sync #{}", bell.seq);
                    return bell.seq;
                }
                Ok(WorkerCommand::Welcome { .. } | WorkerCommand::Ping) => {
                    let pong = Inbound::Worker(WorkerEvent::Pong { clock: 1 });
                    sock.send(codec::encode(&pong, 1 << 20).unwrap(), 0).unwrap();
                }
                _ => {}
            }
        }
        panic!("no sync with a doorbell came");
    });
    let bell = Doorbell::register();
    let raw = c.context().socket(zmq::DEALER).unwrap();
    raw.connect(&c.endpoint().zmq_address()).unwrap();
    let send = |req: Request| raw.send(codec::encode(&Inbound::Client(req), 1 << 20).unwrap(), 0).unwrap();
    // (Liveness pings, which come every second, are not answers.)
    let recv = || -> Reply {
        loop {
            assert!(raw.poll(zmq::POLLIN, 5000).unwrap() > 0, "no answer");
            match codec::decode(&socket::recv_frames(&raw, 0).unwrap()[0], 1 << 20).unwrap() {
                Reply::Ping => continue,
                reply => return reply,
            }
        }
    };
    send(Request::Hello {
        name: "raw".into(),
        wait_ms: 5000,
        doorbell: Some(bell.key()),
        lane: None,
        shared_reads: false,
    });
    assert!(matches!(recv(), Reply::Welcome { .. }));
    bell.arm(1);
    send(Request::Batch {
        first_seq: 0,
        instrs: vec![full(0, vec![2], 1.0)],
        lines: vec![],
        then: Some(Then::Sync { seq: 1 }),
    });
    assert_eq!(worker.join().unwrap(), 1);
    assert!(bell.rung(1));
    // The client goes on at once (its next wait armed before the dispatcher sees the loss).
    bell.arm(2);
    // The loss: the instruction's value is gone (reported), the rung sync is not answered.
    match recv() {
        Reply::Failed { seq: 0, failure } => assert_eq!(failure.kind, FailureKind::WorkerLost, "{failure:?}"),
        other => panic!("expected the lost instruction's failure, got {other:?}"),
    }
    // The next sync fails by the socket (the worker is gone), and only it.
    send(Request::Sync { seq: 2 });
    match recv() {
        Reply::Failed { seq: 2, .. } => {}
        other => panic!("expected sync #2 to fail, got {other:?}"),
    }
    assert!(!bell.rung(2));
    // Nothing more (a second answer of sync #1 would come here).
    loop {
        if raw.poll(zmq::POLLIN, 300).unwrap() == 0 {
            break;
        }
        match codec::decode(&socket::recv_frames(&raw, 0).unwrap()[0], 1 << 20).unwrap() {
            Reply::Ping => {}
            other => panic!("a second answer: {other:?}"),
        }
    }
}

/// A client that asked for shared reads gets each large answer in the dispatcher's file
/// instead of a data frame, but only once it has acknowledged the file's last answer (a
/// write must never meet its read): a second read sent before the first answer's receipt
/// comes back by the socket. Small answers always come by the socket.
#[test]
fn large_answers_go_through_the_shared_file_once_the_last_one_is_acknowledged() {
    use gt::ir::data::Elements;
    use gt::transport::message::{Reply, Request, Then};
    use gt::transport::shared::AnswerReader;
    use gt::transport::{codec, socket, zmq, Inbound};
    let c = cluster(1);
    let raw = c.context().socket(zmq::DEALER).unwrap();
    raw.connect(&c.endpoint().zmq_address()).unwrap();
    let send = |req: Request| raw.send(codec::encode(&Inbound::Client(req), 1 << 20).unwrap(), 0).unwrap();
    let recv = || -> (Reply, Vec<zmq::Message>) {
        loop {
            assert!(raw.poll(zmq::POLLIN, 5000).unwrap() > 0, "no answer");
            let frames = socket::recv_frames(&raw, 0).unwrap();
            match codec::decode(&frames[0], 1 << 20).unwrap() {
                Reply::Ping => continue,
                reply => return (reply, frames),
            }
        }
    };
    send(Request::Hello { name: "raw".into(), wait_ms: 1000, doorbell: None, lane: None, shared_reads: true });
    assert!(matches!(recv().0, Reply::Welcome { .. }));
    let n = 300_000;
    let instrs = vec![full(0, vec![n], 1.5), full(1, vec![4], 2.0)];
    send(Request::Batch { first_seq: 0, instrs, lines: vec![], then: Some(Then::Sync { seq: 2 }) });
    assert_eq!(recv().0, Reply::Synced { seq: 2 });
    let mut reader = AnswerReader::default();
    let ty = TensorType::f32(vec![n]);
    // Two reads at once: the first through the file, the second by the socket.
    send(Request::Get { seq: 3, value: ValueId(0), read: 0 });
    send(Request::Get { seq: 4, value: ValueId(0), read: 0 });
    let (first, _) = recv();
    let Reply::Data { seq: 3, file: Some(name), .. } = first else { panic!("expected #3 in the file: {first:?}") };
    assert_eq!(reader.read(&name, &ty).unwrap(), Elements::F32(vec![1.5; n]));
    let (second, frames) = recv();
    let Reply::Data { seq: 4, file: None, receipt, .. } = second else {
        panic!("expected #4 by the socket: {second:?}")
    };
    assert_eq!(frames[1].len(), n * 4);
    // Acknowledged (the last receipt covers both): the file again; a small value never.
    send(Request::Get { seq: 5, value: ValueId(0), read: receipt });
    let (third, _) = recv();
    let Reply::Data { seq: 5, file: Some(again), receipt, .. } = third else {
        panic!("expected #5 in the file: {third:?}")
    };
    assert_eq!(again, name, "one file per client");
    assert_eq!(reader.read(&again, &ty).unwrap(), Elements::F32(vec![1.5; n]));
    send(Request::Get { seq: 6, value: ValueId(1), read: receipt });
    let (small, frames) = recv();
    assert!(matches!(small, Reply::Data { seq: 6, file: None, .. }), "{small:?}");
    assert_eq!(frames[1].len(), 16);
    assert_eq!(reader.reads(), 2);
    send(Request::Bye);
}

/// A client on a dispatcher's host reads large values of every dtype through the shared
/// file (and small ones by the socket) and gets what it wrote; without shared reads, the
/// same by the socket.
pub(crate) fn large_reads_arrive_whole(client: &mut Client, shared: bool) {
    use gt::ir::data::Elements;
    let big = [
        Elements::F32((0..400_000).map(|i| i as f32 * 0.25).collect()),
        Elements::I64((0..200_000).map(|i| i * -7).collect()),
        Elements::Bool((0..1_500_000).map(|i| i % 3 == 0).collect()),
        Elements::F32(vec![3.0; 10]),
    ];
    for (k, data) in big.iter().enumerate() {
        let ty = TensorType::new(data.dtype(), vec![data.len()]);
        client
            .submit(Instr::Literal { dst: ValueId(100 + k as u32), ty, data: data.clone() }, origin("tensor"))
            .unwrap();
    }
    for round in 0..2 {
        for (k, data) in big.iter().enumerate() {
            let got = client.read(ValueId(100 + k as u32)).unwrap();
            assert_eq!(&got.data, data, "value {k}, round {round}");
        }
    }
    assert_eq!(client.shared_reads(), if shared { 6 } else { 0 });
}
