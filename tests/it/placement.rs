//! Values placed on several workers (`Meta::place`, set here by a test pass that places each
//! result by its id): instructions run where their results go, collectives across workers
//! give the interpreter's numbers, a read of a value on a non-home worker, waits that cover
//! every worker a client used, placement errors, reserved ids, and a worker lost in the
//! middle of a collective.

use gt::frontend::{Client, ClientError, ClientOptions, Origin};
use gt::ir::{BinaryOp, CollectiveOp, Instr, Operand, ReduceOp, TensorType, ValueId};
use gt::passes::pipeline::FIRST_PASS_ID;
use gt::passes::{Emit, Pipeline, StreamPass};
use gt::runtime::{Cluster, ClusterOptions, Interpreter};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Places each result on worker `map[id / 100]` (`id / 100` itself while `map` is empty);
/// ids under 100 of an instruction that is not a collective stay at home.
struct PlaceById(Arc<Mutex<Vec<u32>>>);

impl PlaceById {
    fn worker(&self, v: ValueId) -> u32 {
        let k = v.0 / 100;
        self.0.lock().unwrap().get(k as usize).copied().unwrap_or(k)
    }
}

impl StreamPass for PlaceById {
    fn name(&self) -> &'static str {
        "place-by-id"
    }
    fn run(&mut self, instr: Instr, out: &mut Emit) {
        let mut meta = out.meta();
        let results = instr.results();
        let mapped = !self.0.lock().unwrap().is_empty();
        meta.place = match &instr {
            Instr::Collective { dsts, .. } => dsts.iter().map(|&d| self.worker(d)).collect(),
            _ => match results.first() {
                Some(&d) if d.0 >= 100 || mapped => vec![self.worker(d)],
                _ => Vec::new(),
            },
        };
        out.keep_from(instr, meta);
    }
}

fn placing_cluster(workers: usize, map: Arc<Mutex<Vec<u32>>>) -> ClusterOptions {
    let mut options = ClusterOptions::embedded(workers);
    options.dispatcher.pipeline = Arc::new(move |_| {
        let mut p = Pipeline::new();
        p.push(Box::new(PlaceById(map.clone())));
        p
    });
    options
}

fn client(c: &Cluster) -> Client {
    Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap()
}

fn origin(op: &'static str) -> Origin {
    Origin { op, span: None }
}

fn v(n: u32) -> ValueId {
    ValueId(n)
}

fn literal(dst: u32, dims: Vec<usize>, data: Vec<f32>) -> Instr {
    Instr::Literal { dst: v(dst), ty: TensorType::f32(dims), data: data.into() }
}

fn binary(op: BinaryOp, dst: u32, lhs: u32, rhs: u32) -> Instr {
    Instr::Binary { op, dst: v(dst), lhs: Operand::Value(v(lhs)), rhs: Operand::Value(v(rhs)) }
}

fn collective(op: CollectiveOp, dsts: &[u32], srcs: &[u32]) -> Instr {
    Instr::Collective { dsts: dsts.iter().map(|&d| v(d)).collect(), op, srcs: srcs.iter().map(|&s| v(s)).collect() }
}

fn full(dst: u32, dims: Vec<usize>, value: f64) -> Instr {
    Instr::Full { dst: v(dst), ty: TensorType::f32(dims), value }
}

#[test]
fn collectives_across_workers_give_the_interpreters_numbers() {
    let c = Cluster::start(placing_cluster(3, Arc::default())).unwrap();
    let mut a = client(&c);
    assert_eq!(a.workers().len(), 3);
    let program = vec![
        // Operands on workers 1 and 2 (and the home, 0), an elementwise op on each.
        literal(100, vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        literal(200, vec![2, 3], vec![10.0, -20.0, 30.0, 0.5, 0.25, -6.0]),
        literal(0, vec![2, 3], vec![7.0, 8.0, 9.0, 1.0, 2.0, 3.0]),
        binary(BinaryOp::Mul, 101, 100, 100),
        binary(BinaryOp::Add, 201, 200, 200),
        collective(CollectiveOp::AllReduce(ReduceOp::Sum), &[102, 202], &[101, 201]),
        collective(CollectiveOp::AllReduce(ReduceOp::Max), &[103, 203], &[101, 201]),
        collective(CollectiveOp::AllReduce(ReduceOp::Mean), &[104, 204], &[101, 201]),
        collective(CollectiveOp::AllGather { axis: 1 }, &[105, 205], &[101, 201]),
        collective(CollectiveOp::AllGather { axis: 0 }, &[106, 206], &[101, 201]),
        collective(CollectiveOp::ReduceScatter { op: ReduceOp::Sum, axis: 1 }, &[107, 207], &[101, 201]),
        collective(CollectiveOp::ReduceScatter { op: ReduceOp::Min, axis: 0 }, &[108, 208], &[101, 201]),
        // Three ranks (small integers: the ring's order of summing is exact).
        collective(CollectiveOp::AllReduce(ReduceOp::Sum), &[109, 209, 9], &[100, 200, 0]),
        collective(CollectiveOp::AllGather { axis: -1 }, &[110, 210, 10], &[100, 200, 0]),
        collective(CollectiveOp::ReduceScatter { op: ReduceOp::Sum, axis: 1 }, &[111, 211, 11], &[100, 200, 0]),
        // A broadcast from worker 1 to the home, itself and worker 2; a move to worker 2.
        collective(CollectiveOp::Broadcast, &[12, 112, 212], &[101]),
        collective(CollectiveOp::Broadcast, &[213, 214], &[101]),
        collective(CollectiveOp::Move, &[215], &[101]),
        // Results go on being used where they are.
        binary(BinaryOp::Sub, 216, 215, 202),
        binary(BinaryOp::Add, 116, 102, 112),
    ];
    let mut reference = Interpreter::new();
    for instr in &program {
        reference.execute(instr).unwrap();
        a.submit(instr.clone(), origin(instr.mnemonic())).unwrap();
    }
    a.sync().unwrap();
    let results: Vec<u32> = vec![
        101, 201, 102, 202, 103, 203, 104, 204, 105, 205, 106, 206, 107, 207, 108, 208, 109, 209, 9, 110, 210, 10, 111,
        211, 11, 12, 112, 212, 213, 214, 215, 216, 116,
    ];
    for r in results {
        let got = a.read(v(r)).unwrap();
        let want = reference.read(v(r)).unwrap();
        assert_eq!(got, want, "%{r}");
    }
    // The values live where they were placed.
    let stats = a.worker_stats().unwrap();
    assert!(stats.iter().all(|s| s.live_values >= 5), "{stats:#?}");
    let counted =
        |op: &str| stats.iter().map(|s| s.ops.iter().find(|o| o.op == op).map_or(0, |o| o.count)).sum::<u64>();
    assert_eq!(counted("move"), 2, "a move runs on its two workers");
}

#[test]
fn a_failure_on_another_worker_is_reported_before_a_later_wait() {
    let c = Cluster::start(placing_cluster(3, Arc::default())).unwrap();
    let mut a = client(&c);
    a.submit(full(0, vec![2], 1.0), origin("full")).unwrap();
    a.sync().unwrap();
    // Verifies, but is over the worker's tensor limit: worker 2 reports it.
    a.submit(full(200, vec![65536, 32769], 0.0), origin("full")).unwrap();
    a.submit(full(1, vec![2], 5.0), origin("full")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(matches!(&e, ClientError::Op { seq: 2, .. }), "{e:?}");
    assert!(e.to_string().contains("over the limit"), "{e}");
    a.sync().unwrap();
    // A read of a home value waits for worker 2 too.
    a.submit(full(201, vec![65536, 32769], 0.0), origin("full")).unwrap();
    let e = a.read(v(1)).unwrap_err();
    assert!(matches!(&e, ClientError::Op { seq: 6, .. }), "{e:?}");
    assert_eq!(a.read(v(1)).unwrap().to_f32(), vec![5.0, 5.0]);
    // A collective whose operand failed fails once, and its peer is free again.
    a.submit(full(100, vec![65536, 32769], 0.0), origin("full")).unwrap();
    a.submit(full(202, vec![2], 3.0), origin("full")).unwrap();
    let all_reduce = CollectiveOp::AllReduce(ReduceOp::Sum);
    a.submit(collective(all_reduce, &[101, 203], &[100, 202]), origin("all_reduce")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(matches!(&e, ClientError::Op { seq: 9, later: 1, .. }), "{e:?}");
    let e = a.read(v(203)).unwrap_err();
    assert!(e.to_string().contains("not computed because instruction #11 failed"), "{e}");
    a.submit(binary(BinaryOp::Add, 204, 202, 202), origin("add")).unwrap();
    assert_eq!(a.read(v(204)).unwrap().to_f32(), vec![6.0, 6.0]);
}

#[test]
fn misplaced_instructions_and_reserved_ids_are_refused() {
    let c = Cluster::start(placing_cluster(2, Arc::default())).unwrap();
    let mut a = client(&c);
    a.submit(full(100, vec![2], 1.0), origin("full")).unwrap();
    // Its operand is on worker 1, its result placed on the home.
    a.submit(full(1, vec![2], 1.0), origin("full")).unwrap();
    a.submit(binary(BinaryOp::Add, 2, 1, 100), origin("add")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(matches!(&e, ClientError::Op { seq: 2, .. }), "{e:?}");
    assert!(e.to_string().contains("operand %100 is on worker"), "{e}");
    // A worker that does not exist.
    a.submit(full(900, vec![2], 1.0), origin("full")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(e.to_string().contains("placed on worker 9, but the dispatcher has 2 workers"), "{e}");
    // Two participants of an all_reduce on one worker.
    a.submit(full(101, vec![2], 1.0), origin("full")).unwrap();
    a.submit(full(3, vec![2], 1.0), origin("full")).unwrap();
    let all_reduce = CollectiveOp::AllReduce(ReduceOp::Sum);
    a.submit(collective(all_reduce, &[102, 103, 4], &[100, 101, 3]), origin("all_reduce")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(e.to_string().contains("participants 0 and 1 are both on worker"), "{e}");
    // The passes' ids are not the client's.
    a.submit(full(FIRST_PASS_ID + 5, vec![2], 1.0), origin("full")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(e.to_string().contains("reserved for the passes"), "{e}");
    // Nothing of that broke the client.
    a.submit(binary(BinaryOp::Add, 104, 100, 101), origin("add")).unwrap();
    assert_eq!(a.read(v(104)).unwrap().to_f32(), vec![2.0, 2.0]);
}

/// A worker that registers with a peer socket, runs its batches (answering `Done`) until one
/// holds a part of a collective, and then vanishes (closes its sockets) without a word.
/// Sends its index at the dispatcher on `index`.
fn vanishing_worker(
    ctx: &gt::transport::zmq::Context,
    endpoint: &gt::transport::Endpoint,
    index: std::sync::mpsc::Sender<u32>,
) -> std::thread::JoinHandle<()> {
    use gt::transport::message::{WorkerCommand, WorkerEvent};
    use gt::transport::{codec, zmq, Inbound};
    let sock = ctx.socket(zmq::DEALER).unwrap();
    sock.set_linger(0).unwrap();
    sock.connect(&endpoint.zmq_address()).unwrap();
    let peer = ctx.socket(zmq::ROUTER).unwrap();
    peer.set_linger(0).unwrap();
    let address = format!("inproc://vanishing-peer-{}", std::process::id());
    peer.bind(&address).unwrap();
    let send = |sock: &zmq::Socket, e: WorkerEvent| {
        sock.send(codec::encode(&Inbound::Worker(e), 1 << 20).unwrap(), 0).unwrap();
    };
    send(
        &sock,
        WorkerEvent::Register {
            name: "vanishing".into(),
            backend: "cpu".into(),
            clock: 0,
            peer: address,
            process: gt::transport::doorbell::process_key(),
            lane: None,
        },
    );
    std::thread::spawn(move || {
        while sock.poll(zmq::POLLIN, 10_000).unwrap_or(0) > 0 {
            let Ok(bytes) = sock.recv_bytes(0) else { return };
            match codec::decode::<WorkerCommand>(&bytes, 1 << 30) {
                Ok(WorkerCommand::Welcome { worker }) => {
                    index.send(worker).unwrap();
                    send(&sock, WorkerEvent::Pong { clock: 1 });
                }
                Ok(WorkerCommand::Ping) => send(&sock, WorkerEvent::Pong { clock: 1 }),
                Ok(WorkerCommand::Exec { exchanges, .. }) if !exchanges.is_empty() => {
                    drop(peer);
                    return;
                }
                Ok(WorkerCommand::Exec { batch, .. }) => send(&sock, crate::done(batch)),
                Ok(WorkerCommand::Shutdown) => return,
                _ => {}
            }
        }
    })
}

#[test]
fn a_worker_lost_in_a_collective_frees_its_peers_at_once() {
    let map: Arc<Mutex<Vec<u32>>> = Arc::default();
    let mut options = placing_cluster(1, map.clone());
    options.dispatcher.min_workers = 2;
    let c = Cluster::start(options).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let vanishing = vanishing_worker(c.context(), c.endpoint(), tx);
    let lost = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // Ids under 100 on the real worker, from 100 on the vanishing one.
    *map.lock().unwrap() = vec![1 - lost, lost];
    let mut a = client(&c);
    assert_eq!(a.workers().len(), 2);
    a.submit(full(0, vec![4], 1.0), origin("full")).unwrap();
    a.submit(full(100, vec![4], 2.0), origin("full")).unwrap();
    a.sync().unwrap();
    // Another client, served after the loss below (a new one would wait for 2 workers).
    let mut b = client(&c);
    let start = Instant::now();
    let all_reduce = CollectiveOp::AllReduce(ReduceOp::Sum);
    a.submit(collective(all_reduce, &[1, 101], &[0, 100]), origin("all_reduce")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert!(matches!(&e, ClientError::Op { seq: 3, .. }), "{e:?}");
    assert!(e.to_string().contains("worker `vanishing` is gone"), "{e}");
    vanishing.join().unwrap();
    // The real worker's part gave up at once: it runs the next work.
    a.submit(binary(BinaryOp::Add, 2, 0, 0), origin("add")).unwrap();
    let started = Instant::now();
    assert_eq!(a.read(v(2)).unwrap().to_f32(), vec![2.0; 4]);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    // Its result was never made.
    let e = a.read(v(1)).unwrap_err();
    assert!(e.to_string().contains("not computed"), "{e}");
    // The dispatcher goes on serving other clients.
    b.submit(full(0, vec![2], 3.0), origin("full")).unwrap();
    assert_eq!(b.read(v(0)).unwrap().to_f32(), vec![3.0; 2]);
}
