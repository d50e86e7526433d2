//! A stand-in for a dispatcher's monitor, to try `gt top` without a runtime: binds an XPUB
//! socket in gt's runtime directory, writes a discovery file, and publishes made-up events
//! (two workers running ops, two clients sending, gauges every 100 ms) for `--seconds`.
//! `cargo run -p gt-tools --example fake_dispatcher -- [--seconds N] [--name NAME] [--tcp ENDPOINT]`
//! (`--tcp` also binds the monitor there, as a server does on PORT+1 for remote watchers).

use gt_transport::endpoint::{discovery_path, ensure_runtime_dir, write_private};
use gt_transport::{codec, zmq, EventKind, LogEvent};
use std::time::{Duration, Instant};

struct Publisher {
    socket: zmq::Socket,
    seq: u64,
}

impl Publisher {
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        elapsed: f64,
        kind: EventKind,
        source: &str,
        command: &str,
        bytes: u64,
        duration: Option<f64>,
        details: String,
    ) {
        self.seq += 1;
        let event = LogEvent {
            elapsed,
            seq: self.seq,
            kind,
            source: source.to_string(),
            command: command.to_string(),
            bytes,
            duration,
            details,
        };
        let frame = codec::encode(&event, codec::DEFAULT_MAX_MESSAGE_BYTES).expect("events are small");
        let _ = self.socket.send(frame, zmq::DONTWAIT);
    }
}

/// A worker's made-up program: (op, seconds, bytes written), run in a loop with a gap after
/// each.
struct Sim {
    name: &'static str,
    program: &'static [(&'static str, f64, u64)],
    gap: f64,
    next: usize,
    /// When its next instruction starts (s).
    at: f64,
    /// Runs done and not yet reported: (op, start, duration, bytes).
    done: Vec<(&'static str, f64, f64, u64)>,
    live: u64,
}

fn main() {
    let mut seconds = 60.0;
    let mut name = format!("fake-{}", std::process::id());
    let mut tcp = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--seconds", Some(v)) => seconds = v.parse().expect("--seconds N"),
            ("--name", Some(v)) => name = v,
            ("--tcp", Some(v)) => tcp = Some(v),
            _ => panic!("usage: fake_dispatcher [--seconds N] [--name NAME] [--tcp ENDPOINT]"),
        }
    }
    let dir = ensure_runtime_dir().expect("runtime directory");
    let ctx = zmq::Context::new();
    let socket = ctx.socket(zmq::XPUB).expect("XPUB");
    let monitor = format!("ipc://{}", dir.join(format!("{name}-monitor.ipc")).display());
    socket.bind(&monitor).expect("bind the monitor");
    if let Some(tcp) = &tcp {
        socket.set_ipv6(true).expect("IPv6");
        socket.bind(tcp).expect("bind the TCP monitor");
    }
    let file = discovery_path(&name);
    let text = format!("pid={}\nendpoint=tcp://127.0.0.1:0\nmonitor={monitor}\n", std::process::id());
    write_private(&file, text.as_bytes()).expect("discovery file");
    eprintln!("publishing on {monitor} for {seconds} s ({})", file.display());

    let mut out = Publisher { socket, seq: 0 };
    let mut sims = [
        Sim {
            name: "worker-0",
            program: &[
                ("matmul", 0.004, 1 << 20),
                ("add", 0.001, 1 << 18),
                ("relu", 0.0005, 1 << 18),
                ("fused", 0.002, 1 << 19),
            ],
            gap: 0.0008,
            next: 0,
            at: 0.0,
            done: Vec::new(),
            live: 3 << 28,
        },
        Sim {
            name: "worker-1",
            program: &[("sum", 0.003, 4096), ("exp", 0.001, 1 << 16), ("get", 0.0002, 0)],
            gap: 0.006,
            next: 0,
            at: 0.0,
            done: Vec::new(),
            live: 5 << 20,
        },
    ];
    let start = Instant::now();
    for c in ["1", "2"] {
        out.send(0.0, EventKind::Connect, &format!("CLIENT {c}"), "Hello", 0, None, String::new());
    }
    for s in &sims {
        out.send(0.0, EventKind::Connect, &format!("WORKER {}", s.name), "Register", 0, None, String::new());
    }
    let (mut next_report, mut next_status, mut next_recv) = (0.05, 0.1, 0.0);
    let mut recvs = 0u64;
    let mut client2 = true;
    loop {
        let now = start.elapsed().as_secs_f64();
        if now > seconds {
            break;
        }
        for s in &mut sims {
            while s.at < now {
                let (op, d, b) = s.program[s.next % s.program.len()];
                s.done.push((op, s.at, d, b));
                s.at += d + s.gap;
                s.next += 1;
            }
        }
        // Workers report their batches every 50 ms, so EXEC events come late.
        if now >= next_report {
            next_report += 0.05;
            for s in &mut sims {
                let source = format!("WORKER {}", s.name);
                out.send(now, EventKind::WorkerSend, &source, "Exec", 2048, None, format!("batch={}", s.next));
                for (i, (op, at, d, b)) in s.done.drain(..).enumerate() {
                    out.send(at, EventKind::Exec, &source, op, b, Some(d), format!("client=1 #{i} %b{i} = {op}"));
                }
                out.send(now, EventKind::WorkerRecv, &source, "Done", 64, None, String::new());
            }
        }
        while next_recv < now {
            let c = if client2 && recvs.is_multiple_of(3) { "2" } else { "1" };
            out.send(
                next_recv,
                EventKind::Recv,
                &format!("CLIENT {c}"),
                "add",
                117,
                None,
                format!("#{recvs} %2 = add %0, %1"),
            );
            recvs += 1;
            next_recv += 0.004;
        }
        if client2 && now > 8.0 {
            client2 = false;
            out.send(now, EventKind::Disconnect, "CLIENT 2", "Goodbye", 0, None, String::new());
        }
        if now >= next_status {
            next_status += 0.1;
            for s in &sims {
                let wobble = (now.sin() * 1e6) as u64;
                out.send(
                    now,
                    EventKind::Status,
                    &format!("WORKER {}", s.name),
                    "memory",
                    0,
                    None,
                    format!("live={}", s.live + wobble),
                );
            }
            out.send(
                now,
                EventKind::Status,
                "CLIENT 1",
                "queue",
                0,
                None,
                format!("instrs={} bytes={}", recvs % 40, (recvs % 40) * 117),
            );
            if client2 {
                out.send(now, EventKind::Status, "CLIENT 2", "queue", 0, None, "instrs=0 bytes=0".to_string());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(&file);
}
