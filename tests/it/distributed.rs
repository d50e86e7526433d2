//! The distributed mode with real processes and sockets: `gt server`, `gt worker` and
//! `gt-run --connect` give the embedded mode's numbers over IPC and TCP; the faults of the
//! issue: garbage frames, unknown message kinds, another protocol version, oversized
//! messages, a worker killed mid-stream, a dispatcher killed under a waiting client; the
//! instruction log and the monitor socket.

use gt::frontend::{Client, ClientError, ClientOptions, Origin};
use gt::ir::data::Elements;
use gt::ir::{DType, Instr, TensorType, ValueId};
use gt::transport::message::{Reply, Request};
use gt::transport::{codec, zmq, Endpoint, EventKind, LogEvent};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A child process killed when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `gt server` and waits for its "listening" line; returns it and its stdout lines.
pub(crate) fn server(port: u16, host: &str, env: &[(&str, &str)]) -> (Proc, Vec<String>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gt"));
    cmd.args(["server", "-p", &port.to_string(), "--host", host]).stdout(Stdio::piped()).stderr(Stdio::inherit());
    if host != "127.0.0.1" {
        // Its TCP monitor: a port known to be free rather than PORT + 1.
        cmd.args(["--monitor-port", &free_port().to_string()]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // Every start-up line, up to the last (one monitor line per monitor endpoint).
    let mut lines: Vec<String> = Vec::new();
    while !lines.last().is_some_and(|l| l.starts_with("workers join with")) {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "gt server stopped before it was ready: {lines:?}");
        lines.push(line.trim_end().to_string());
    }
    assert!(lines[0].starts_with("gt server listening on"), "{lines:?}");
    (Proc(child), lines)
}

pub(crate) fn worker(port: u16) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_gt"))
            .args(["worker", "--host", "127.0.0.1", "-p", &port.to_string(), "--name", "w-test"])
            .spawn()
            .unwrap(),
    )
}

pub(crate) fn gt_run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gt-run")).args(args).current_dir(root()).output().unwrap()
}

fn connect(endpoint: &str) -> Client {
    Client::connect(&Endpoint::parse(endpoint).unwrap(), ClientOptions::default()).unwrap()
}

fn origin(op: &'static str) -> Origin {
    Origin { op, span: None }
}

#[test]
fn two_terminals_give_the_embedded_numbers_over_ipc_and_tcp() {
    let port = free_port();
    let (_server, lines) = server(port, "127.0.0.1", &[]);
    assert!(lines[1].contains("monitor on ipc://"), "the monitor address is printed: {lines:?}");
    let _worker = worker(port);
    // Several client processes at once, each with its own namespace.
    let embedded = gt_run(&["examples/mlp.gtir"]);
    let runs: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_gt-run"))
                .args(["--connect", &format!("127.0.0.1:{port}"), "examples/mlp.gtir"])
                .current_dir(root())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in runs {
        let o = r.wait_with_output().unwrap();
        assert!(o.status.success());
        assert_eq!(o.stdout, embedded.stdout);
    }
    for example in ["examples/mlp.gtir", "examples/tour.gtir", "examples/reductions.gtir"] {
        let embedded = gt_run(&[example]);
        assert!(embedded.status.success());
        for address in [format!("127.0.0.1:{port}"), format!("tcp://127.0.0.1:{port}")] {
            let remote = gt_run(&["--connect", &address, example]);
            assert!(remote.status.success(), "{}", String::from_utf8_lossy(&remote.stderr));
            assert_eq!(remote.stdout, embedded.stdout, "{example} via {address}");
        }
    }
    // Large literals and reads, as frames of their own across processes (copied there).
    crate::cluster::literals_arrive_whole(&mut connect(&format!("127.0.0.1:{port}")));
    // Large reads through shared memory on this host (IPC), or by the socket when not asked
    // for; over TCP never.
    let ipc = Endpoint::for_peer("127.0.0.1", port);
    assert!(matches!(ipc, Endpoint::Ipc(_)), "{ipc}");
    crate::cluster::large_reads_arrive_whole(&mut Client::connect(&ipc, ClientOptions::default()).unwrap(), true);
    let by_socket = ClientOptions { shared_reads: false, ..ClientOptions::default() };
    crate::cluster::large_reads_arrive_whole(&mut Client::connect(&ipc, by_socket).unwrap(), false);
    let tcp = Endpoint::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
    crate::cluster::large_reads_arrive_whole(&mut Client::connect(&tcp, ClientOptions::default()).unwrap(), false);
}

#[test]
fn a_server_on_every_interface_listens_on_tcp() {
    let port = free_port();
    // Beyond the loopback without a key only when told (`auth.rs` tests the refusal).
    let (_server, lines) = server(port, "0.0.0.0", &[("GT_INSECURE", "1")]);
    assert!(lines[0].contains(&format!("tcp://*:{port}")), "{lines:?}");
    let _worker = worker(port);
    let mut c = connect(&format!("tcp://127.0.0.1:{port}"));
    c.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![1]), value: 2.0 }, origin("full")).unwrap();
    assert_eq!(c.read(ValueId(0)).unwrap().to_f32(), vec![2.0]);
}

/// A file's permission bits.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().mode() & 0o777
}

/// Sends raw frames on a DEALER and returns the dispatcher's answer.
fn raw_exchange(sock: &zmq::Socket, frames: &[&[u8]]) -> Reply {
    sock.send_multipart(frames.iter().copied(), 0).unwrap();
    assert!(sock.poll(zmq::POLLIN, 5000).unwrap() > 0, "no answer to {frames:?}");
    codec::decode(&sock.recv_bytes(0).unwrap(), usize::MAX).unwrap()
}

#[test]
fn garbage_is_rejected_and_everyone_else_is_still_served() {
    let port = free_port();
    let (_server, _) = server(port, "127.0.0.1", &[("GT_MAX_MESSAGE_BYTES", "65536")]);
    let _worker = worker(port);
    let mut good = connect(&format!("127.0.0.1:{port}"));
    good.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![3]), value: 1.5 }, origin("full")).unwrap();
    good.sync().unwrap();

    let ctx = zmq::Context::new();
    let raw = ctx.socket(zmq::DEALER).unwrap();
    raw.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let rejected = |reply: Reply, what: &str| match reply {
        Reply::Rejected { message } => assert!(message.contains(what), "{message:?} should mention {what:?}"),
        other => panic!("expected Rejected mentioning {what:?}, got {other:?}"),
    };
    rejected(raw_exchange(&raw, &[b"hello world"]), "not a gt message");
    rejected(raw_exchange(&raw, &[&codec::frame_with_version(99, b"\x80")]), "protocol version 99");
    let unknown = rmp_serde::to_vec(&std::collections::BTreeMap::from([("Launch", 1u8)])).unwrap();
    rejected(raw_exchange(&raw, &[&codec::frame_with_version(codec::PROTOCOL_VERSION, &unknown)]), "malformed");
    // Only a worker's `Data` and a batch with large literals carry more frames.
    let sync = codec::encode(&gt::transport::Inbound::Client(Request::Sync { seq: 1 }), 1 << 10).unwrap();
    rejected(raw_exchange(&raw, &[&sync, b"data"]), "data frames after a message that has none");
    rejected(raw_exchange(&raw, &[&sync, b"a", b"b"]), "data frames after a message that has none");
    // A batch's literal left empty for a frame must get one, of its type's length.
    let literal =
        Instr::Literal { dst: ValueId(5), ty: TensorType::f32(vec![2]), data: Elements::zeros(DType::F32, 0) };
    let batch = Request::Batch { first_seq: 1, instrs: vec![literal], lines: vec![], then: None };
    let batch = codec::encode(&gt::transport::Inbound::Client(batch), 1 << 10).unwrap();
    rejected(raw_exchange(&raw, &[&batch]), "1 literals wait for their data frame, and 0 frames came");
    rejected(raw_exchange(&raw, &[&batch, b"abc"]), "a data frame of 3 bytes for a f32[2] value (8 bytes)");
    rejected(
        raw_exchange(&raw, &[&batch, &[0; 8], &[0; 8]]),
        "1 literals wait for their data frame, and 2 frames came",
    );
    rejected(raw_exchange(&raw, &[&vec![0u8; 100_000]]), "over the limit");
    // Far over the limit (a huge declared frame): cut off at the header, never buffered.
    let huge = ctx.socket(zmq::DEALER).unwrap();
    huge.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    huge.send(vec![0u8; 4 << 20], 0).unwrap();
    assert_eq!(huge.poll(zmq::POLLIN, 500).unwrap(), 0, "a frame over twice the limit was answered");
    let get =
        codec::encode(&gt::transport::Inbound::Client(Request::Get { seq: 0, value: ValueId(0), read: 0 }), 1 << 20)
            .unwrap();
    rejected(raw_exchange(&raw, &[&get]), "Hello");

    // The good client's value and connection are untouched.
    assert_eq!(good.read(ValueId(0)).unwrap().to_f32(), vec![1.5; 3]);
    // And a client that sends too large a batch is told, not dropped.
    let big = Instr::Literal {
        dst: ValueId(1),
        ty: TensorType::f32(vec![100_000]),
        data: gt_ir::data::Elements::F32(vec![0.0; 100_000]),
    };
    good.submit(big, origin("tensor")).unwrap();
    let e = good.sync().unwrap_err();
    assert!(e.to_string().contains("over the limit"), "{e}");
    assert_eq!(good.read(ValueId(0)).unwrap().to_f32(), vec![1.5; 3]);
}

/// Instructions that keep a worker busy for many seconds.
fn heavy(c: &mut Client) {
    let ty = TensorType::f32(vec![1024, 1024]);
    c.submit(Instr::Randn { dst: ValueId(0), ty, seed: 1 }, origin("randn")).unwrap();
    for _ in 0..400 {
        c.submit(Instr::MatMul { dst: ValueId(1), lhs: ValueId(0), rhs: ValueId(0) }, origin("matmul")).unwrap();
    }
    c.flush().unwrap();
}

#[test]
fn a_worker_killed_mid_stream_fails_its_waiting_client_within_two_seconds() {
    let port = free_port();
    let (_server, _) = server(port, "127.0.0.1", &[]);
    let mut w = worker(port);
    let mut c = connect(&format!("127.0.0.1:{port}"));
    heavy(&mut c);
    let waiter = std::thread::spawn(move || {
        let r = c.sync();
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(500));
    w.0.kill().unwrap();
    let killed = Instant::now();
    let (result, at) = waiter.join().unwrap();
    let e = result.expect_err("the wait must fail");
    assert!(e.to_string().contains("worker `w-test` is gone"), "{e}");
    assert_eq!(e.kind(), gt::ir::FailureKind::WorkerLost, "{e}");
    assert!(at.duration_since(killed) < Duration::from_secs(2), "took {:?}", at.duration_since(killed));
}

#[test]
fn a_dispatcher_killed_under_a_waiting_client_is_an_error_not_a_hang() {
    let port = free_port();
    let (mut server, _) = server(port, "127.0.0.1", &[]);
    let _worker = worker(port);
    let mut c = connect(&format!("tcp://127.0.0.1:{port}"));
    heavy(&mut c);
    let waiter = std::thread::spawn(move || c.sync());
    std::thread::sleep(Duration::from_millis(300));
    server.0.kill().unwrap();
    let e = waiter.join().unwrap().expect_err("the wait must fail");
    assert!(matches!(e, ClientError::Disconnected(_)), "{e}");
    assert_eq!(e.kind(), gt::ir::FailureKind::Connection);
}

#[test]
fn a_worker_with_no_dispatcher_says_so_and_exits_2() {
    let port = free_port();
    let o = Command::new(env!("CARGO_BIN_EXE_gt"))
        .args(["worker", "--host", "127.0.0.1", "-p", &port.to_string(), "--wait", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no dispatcher answered") && err.contains(&port.to_string()), "{err}");
}

#[test]
fn connect_to_nothing_is_an_error_naming_the_address() {
    let port = free_port();
    let o = Command::new(env!("CARGO_BIN_EXE_gt-run"))
        .args(["--connect", &format!("127.0.0.1:{port}"), "examples/tour.gtir"])
        .env("GT_CONNECT_TIMEOUT", "1")
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("cannot connect to the dispatcher at tcp://127.0.0.1:{port}")), "{err}");
}

#[test]
fn the_instruction_log_pairs_every_worker_send_with_a_later_receive() {
    let dir = std::env::temp_dir().join(format!("gt-log-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("ops.log");
    let o = Command::new(env!("CARGO_BIN_EXE_gt-run"))
        .args(["-q", "examples/mlp.gtir"])
        .env("GT_INSTRUCTION_LOG", &log)
        .env("GT_WORKER_BATCH_SIZE", "4")
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&log).unwrap();
    // It holds literal tensor data: this user's alone.
    assert_eq!(mode(&log), 0o600);
    let events: Vec<LogEvent> = text.lines().filter_map(LogEvent::parse_line).collect();
    let kinds = |k: EventKind| events.iter().filter(|e| e.kind == k).count();
    assert!(text.starts_with("===="), "header first");
    assert_eq!(kinds(EventKind::Connect), 2, "one worker and one client:\n{text}");
    assert!(kinds(EventKind::Recv) > 10 && kinds(EventKind::Send) > 0, "{text}");
    assert!(kinds(EventKind::WorkerSend) > 3, "batches of 4: {text}");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "sequence numbers count from 1 without gaps");
        if e.kind == EventKind::WorkerSend && e.command == "Exec" {
            let batch = e.details.split_whitespace().next().unwrap();
            let done = events[i..].iter().position(|r| r.kind == EventKind::WorkerRecv && r.details.starts_with(batch));
            assert!(done.is_some(), "{batch} is sent, then received back:\n{text}");
        }
    }
    let recv = events.iter().find(|e| e.kind == EventKind::Recv && e.command == "matmul").unwrap();
    assert!(recv.source.starts_with("CLIENT ") && recv.details.contains("= matmul %"), "{recv:?}");
    let bye = events.iter().position(|e| e.kind == EventKind::Disconnect && e.source == "CLIENT 1").expect("goodbye");
    assert!(events[bye].details.contains("freed"), "{:?}", events[bye]);
    let last = events.last().unwrap();
    assert!(
        last.kind == EventKind::Disconnect && last.command == "Shutdown",
        "the worker's shutdown ends the log: {last:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_monitor_socket_publishes_the_log_events() {
    let port = free_port();
    let (_server, lines) = server(port, "127.0.0.1", &[]);
    let monitor = lines[1].trim_start_matches("gt server monitor on ").to_string();
    // Tools find it without being told: the server writes its endpoints to a known file.
    let discovery_file = gt::transport::endpoint::discovery_path(&port.to_string());
    let discovery = std::fs::read_to_string(&discovery_file).unwrap();
    assert!(discovery.contains(&format!("monitor={monitor}")), "{discovery}");
    // Sockets and discovery files are private, in a directory only this user can enter.
    let ipc = gt::transport::endpoint::ipc_path(port);
    assert_eq!(ipc.parent(), discovery_file.parent());
    assert_eq!((mode(&discovery_file), mode(&ipc), mode(ipc.parent().unwrap())), (0o600, 0o600, 0o700));
    let _worker = worker(port);
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&monitor).unwrap();
    // Subscriptions take a moment to reach the publisher; keep sending until events arrive.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = connect(&format!("127.0.0.1:{port}"));
    let mut got: Vec<LogEvent> = Vec::new();
    let recv_full = |e: &LogEvent| e.kind == EventKind::Recv && e.command == "full";
    while !got.iter().any(recv_full) {
        assert!(Instant::now() < deadline, "no events on {monitor}");
        c.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![1]), value: 1.0 }, origin("full")).unwrap();
        c.sync().unwrap();
        while sub.poll(zmq::POLLIN, 50).unwrap() > 0 {
            got.push(codec::decode(&sub.recv_bytes(0).unwrap(), usize::MAX).unwrap());
        }
    }
    // Once subscribed, every event of a round trip arrives.
    let first = got.iter().position(recv_full).unwrap();
    let kinds: Vec<EventKind> = got[first..].iter().map(|e| e.kind).collect();
    for k in [EventKind::Recv, EventKind::WorkerSend, EventKind::WorkerRecv, EventKind::Send] {
        assert!(kinds.contains(&k), "{k:?} missing from {got:?}");
    }
}

#[test]
fn a_client_process_that_dies_has_its_values_freed() {
    let port = free_port();
    let (_server, _) = server(port, "127.0.0.1", &[]);
    let _worker = worker(port);
    let dir = std::env::temp_dir().join(format!("gt-dying-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("hold.gtir");
    // Creates values, syncs (so they exist on the worker), then waits on some work. (A worker
    // runs its queue in order, so the frees run after the work already sent: keep it short.)
    std::fs::write(
        &script,
        "%a = randn f32[512, 512] seed=1\n%b = randn f32[512, 512] seed=2\nprint %a\n\
         repeat 200 {\n  %c = matmul %a, %b\n}\nprint %c\n",
    )
    .unwrap();
    let mut dying = Command::new(env!("CARGO_BIN_EXE_gt-run"))
        .args(["-q", "--keep-values", "--connect", &format!("127.0.0.1:{port}"), script.to_str().unwrap()])
        .spawn()
        .unwrap();
    let mut observer = connect(&format!("127.0.0.1:{port}"));
    let live = |c: &mut Client| c.worker_stats().unwrap()[0].live_values;
    let deadline = Instant::now() + Duration::from_secs(20);
    while live(&mut observer) < 3 {
        assert!(Instant::now() < deadline, "the client's values never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    dying.kill().unwrap();
    dying.wait().unwrap();
    let killed = Instant::now();
    while live(&mut observer) > 0 {
        assert!(killed.elapsed() < Duration::from_secs(10), "values of a dead client are never freed");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_worker_whose_dispatcher_dies_exits_with_an_error() {
    let port = free_port();
    let (mut server, _) = server(port, "127.0.0.1", &[]);
    let mut w = Command::new(env!("CARGO_BIN_EXE_gt"))
        .args(["worker", "--host", "127.0.0.1", "-p", &port.to_string(), "--reconnect", "1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = connect(&format!("127.0.0.1:{port}")); // returns once the worker is registered
    drop(c);
    server.0.kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = w.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the worker outlived its dispatcher");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut w.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("lost the dispatcher") && err.contains("did not come back within 1 s"), "{err}");
}

/// Finding 6 (healing): a worker registers again with a dispatcher that was restarted where
/// the killed one was, and the new dispatcher's clients are served.
#[test]
fn a_worker_comes_back_to_a_restarted_dispatcher() {
    let port = free_port();
    let (mut first, _) = server(port, "127.0.0.1", &[]);
    let mut w = Command::new(env!("CARGO_BIN_EXE_gt"))
        .args(["worker", "--host", "127.0.0.1", "-p", &port.to_string(), "--name", "w-back"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(connect(&format!("127.0.0.1:{port}")));
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let (_second, _) = server(port, "127.0.0.1", &[]);
    // `connect` waits (10 s at most) for a worker: the same process, registered again. Its
    // new connection may still flap once as it settles (the worker then registers again and
    // the client is told its worker is gone), so a client tries a few times.
    let deadline = Instant::now() + Duration::from_secs(10);
    let served = loop {
        let mut c = connect(&format!("127.0.0.1:{port}"));
        assert_eq!(c.workers().iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["w-back"]);
        c.submit(Instr::Full { dst: ValueId(0), ty: TensorType::f32(vec![2]), value: 4.0 }, origin("full")).unwrap();
        match c.read(ValueId(0)) {
            Ok(t) => break t.to_f32(),
            Err(e) if e.to_string().contains("is gone") && Instant::now() < deadline => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(served, vec![4.0, 4.0]);
    let _ = w.kill();
    let _ = w.wait();
}

/// A server whose stdout was closed (`gt server | head -1`) keeps serving: its start-up
/// lines are not worth dying for (it panicked on the broken pipe).
#[test]
fn a_server_with_its_stdout_closed_keeps_serving() {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gt"))
        .args(["server", "-p", &port.to_string(), "--workers", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let server = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    let o = loop {
        let o = gt_run(&["--connect", &format!("127.0.0.1:{port}"), "examples/tour.gtir"]);
        if o.status.success() || Instant::now() > deadline {
            break o;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(server);
}
