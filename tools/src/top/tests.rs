//! Tests of `gt top`: the state machine fed made-up events, and the screen drawn on a
//! fixed-size test terminal (snapshots in `snapshots/`).

use super::state::{GONE_SECONDS, MIN_LAG};
use super::view::{bytes, rate, uptime};
use super::*;
use crate::tape::OpFamily;
use gt_transport::EventKind;
use ratatui::backend::TestBackend;
use ratatui::style::Color;
use ratatui::Terminal;

/// Makes events with growing sequence numbers.
#[derive(Default)]
struct Feed {
    seq: u64,
}

impl Feed {
    fn event(&mut self, t: f64, kind: EventKind, source: &str, command: &str, details: &str) -> LogEvent {
        self.seq += 1;
        LogEvent {
            elapsed: t,
            seq: self.seq,
            kind,
            source: source.to_string(),
            command: command.to_string(),
            bytes: 0,
            duration: None,
            details: details.to_string(),
        }
    }

    fn exec(&mut self, worker: &str, op: &str, start: f64, duration: f64, bytes: u64) -> LogEvent {
        let mut e = self.event(start, EventKind::Exec, &format!("WORKER {worker}"), op, "client=1 #3 %b2 = op");
        e.duration = Some(duration);
        e.bytes = bytes;
        e
    }

    fn memory(&mut self, t: f64, worker: &str, live: u64) -> LogEvent {
        self.event(t, EventKind::Status, &format!("WORKER {worker}"), "memory", &format!("live={live}"))
    }

    fn queue(&mut self, t: f64, client: &str, instrs: u64, bytes: u64) -> LogEvent {
        self.event(
            t,
            EventKind::Status,
            &format!("CLIENT {client}"),
            "queue",
            &format!("instrs={instrs} bytes={bytes}"),
        )
    }

    fn recv(&mut self, t: f64, client: &str) -> LogEvent {
        self.event(t, EventKind::Recv, &format!("CLIENT {client}"), "add", "#4 %2 = add %0, %1")
    }

    fn peer(&mut self, t: f64, kind: EventKind, source: &str) -> LogEvent {
        self.event(t, kind, source, "", "")
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

macro_rules! assert_close {
    ($a:expr, $b:expr) => {{
        let (a, b): (f64, f64) = ($a, $b);
        assert!(close(a, b), "{} = {a}, expected {b}", stringify!($a));
    }};
}

fn watched(alpha: f64) -> TopState {
    let mut s = TopState::new(alpha);
    s.watching("ipc:///run/gt/9000-monitor.ipc", Some(4242));
    s
}

/// Two windows of one worker: the first measured as it is, the second smoothed.
#[test]
fn shares_rates_and_smoothing() {
    let mut s = watched(0.15);
    let mut f = Feed::default();
    s.apply(&f.peer(0.0, EventKind::Connect, "WORKER w0"));
    s.apply(&f.exec("w0", "matmul", 0.1, 0.3, 1000));
    s.apply(&f.exec("w0", "add", 0.5, 0.1, 500));
    s.apply(&f.memory(1.0 + MIN_LAG, "w0", 4096));
    s.tick(10.0);
    // The window [0, 1): matmul 0.3 s, add 0.1 s.
    let w = &s.workers()["w0"];
    assert_close!(w.share("matmul"), 0.3);
    assert_close!(w.share("add"), 0.1);
    assert_close!(w.idle, 0.6);
    assert_close!(w.instrs_per_s, 2.0);
    assert_close!(w.bytes_per_s, 1500.0);
    assert_eq!(w.live_bytes, Some(4096));
    assert_eq!(w.ops[0].family, OpFamily::MatMul);
    assert_eq!(w.ops[1].family, OpFamily::Binary);

    // The window [1, 2): nothing ran; each number moves 15% of the way to it.
    s.apply(&f.memory(2.0 + MIN_LAG, "w0", 8192));
    s.tick(10.25);
    let w = &s.workers()["w0"];
    assert_close!(w.share("matmul"), 0.85 * 0.3);
    assert_close!(w.share("add"), 0.85 * 0.1);
    assert_close!(w.idle, 0.15 + 0.85 * 0.6);
    assert_close!(w.instrs_per_s, 0.85 * 2.0);
    assert_close!(w.bytes_per_s, 0.85 * 1500.0);
    assert_eq!(w.live_bytes, Some(8192));
    assert_close!(s.uptime().unwrap(), 2.0 + MIN_LAG);
}

/// A tick with too little new dispatcher time closes no window.
#[test]
fn windows_wait_for_the_dispatcher_clock() {
    let mut s = watched(1.0);
    let mut f = Feed::default();
    s.apply(&f.exec("w0", "matmul", 0.0, 0.2, 0));
    s.tick(1.0);
    assert_close!(s.workers()["w0"].idle, 1.0);
    assert!(s.workers()["w0"].ops.iter().all(|o| o.share == 0.0));
    s.apply(&f.memory(1.0 + MIN_LAG, "w0", 1));
    s.tick(2.0);
    assert_close!(s.workers()["w0"].share("matmul"), 0.2);
}

/// A run over a window's edge counts in both, clipped to each; it is counted as an
/// instruction once. Overlapping runs never make a worker more than fully busy.
#[test]
fn runs_are_clipped_to_windows() {
    let mut s = watched(1.0);
    let mut f = Feed::default();
    s.apply(&f.peer(0.0, EventKind::Connect, "WORKER w0"));
    s.apply(&f.exec("w0", "matmul", 0.5, 0.7, 100));
    s.apply(&f.memory(1.0 + MIN_LAG, "w0", 0));
    s.tick(1.0);
    let w = &s.workers()["w0"];
    assert_close!(w.share("matmul"), 0.5);
    assert_close!(w.instrs_per_s, 1.0);
    s.apply(&f.memory(2.0 + MIN_LAG, "w0", 0));
    s.tick(2.0);
    let w = &s.workers()["w0"];
    assert_close!(w.share("matmul"), 0.2);
    assert_close!(w.instrs_per_s, 0.0);
    assert_close!(w.bytes_per_s, 0.0);

    // [2, 3): two runs of the whole second each.
    s.apply(&f.exec("w0", "exp", 2.0, 1.0, 0));
    s.apply(&f.exec("w0", "sum", 2.0, 1.0, 0));
    s.apply(&f.memory(3.0 + MIN_LAG, "w0", 0));
    s.tick(3.0);
    let w = &s.workers()["w0"];
    assert_close!(w.share("exp"), 0.5);
    assert_close!(w.share("sum"), 0.5);
    assert_close!(w.idle, 0.0);
}

/// A run reported long after it ended holds the windows back, then the lag shrinks.
#[test]
fn late_reports_grow_the_lag() {
    let mut s = watched(1.0);
    let mut f = Feed::default();
    s.apply(&f.memory(0.0, "w0", 0));
    s.apply(&f.memory(5.0, "w0", 0));
    s.apply(&f.exec("w0", "matmul", 3.0, 0.5, 0));
    let lag = s.lag();
    assert!(lag > 1.5 && lag <= MAX_LAG, "lag {lag}");
    s.tick(1.0);
    // The window runs to 5 - lag, so a run reported as late ends in a window not yet
    // closed; here, the next one.
    let end = 5.0 - lag;
    assert!(end < 3.5);
    let w = &s.workers()["w0"];
    assert_close!(w.share("matmul"), (end - 3.0) / end);
    assert!(s.lag() < lag);
    // A report later than the largest lag is cut to it.
    s.apply(&f.memory(100.0, "w0", 0));
    s.apply(&f.exec("w0", "add", 1.0, 0.1, 0));
    assert_close!(s.lag(), MAX_LAG);
}

#[test]
fn clients_queues_and_request_rates() {
    let mut s = watched(1.0);
    let mut f = Feed::default();
    s.apply(&f.peer(0.0, EventKind::Connect, "CLIENT 1"));
    for i in 0..30 {
        s.apply(&f.recv(0.01 + f64::from(i) * 0.01, "1"));
    }
    s.apply(&f.queue(0.5, "1", 12, 4096));
    s.apply(&f.queue(0.5, "2", 0, 0));
    s.apply(&f.queue(2.0 + MIN_LAG, "1", 7, 2048));
    s.tick(1.0);
    let c = &s.clients()["1"];
    assert_close!(c.instrs_per_s, 15.0);
    assert_eq!((c.queue_instrs, c.queue_bytes), (Some(7), Some(2048)));
    assert_eq!(s.clients()["2"].queue_instrs, Some(0));
    assert_close!(s.clients()["2"].instrs_per_s, 0.0);
}

/// A peer that leaves is shown as gone, then dropped a few seconds later; one that comes
/// back before that stays.
#[test]
fn departed_peers_are_removed() {
    let mut s = watched(0.15);
    let mut f = Feed::default();
    s.tick(1.0);
    s.apply(&f.peer(0.0, EventKind::Connect, "WORKER w0"));
    s.apply(&f.peer(0.0, EventKind::Connect, "WORKER w1"));
    s.apply(&f.peer(0.0, EventKind::Connect, "CLIENT 1"));
    s.tick(2.0);
    s.apply(&f.peer(0.5, EventKind::Disconnect, "WORKER w0"));
    s.apply(&f.peer(0.5, EventKind::Disconnect, "CLIENT 1"));
    s.apply(&f.peer(0.5, EventKind::Disconnect, "WORKER w1"));
    s.apply(&f.peer(0.6, EventKind::Connect, "WORKER w1"));
    s.tick(3.0);
    assert_eq!(s.workers()["w0"].gone_since, Some(2.0));
    assert!(s.clients()["1"].gone_since.is_some());
    assert_eq!(s.workers()["w1"].gone_since, None);
    s.tick(2.0 + GONE_SECONDS - 0.1);
    assert!(s.workers().contains_key("w0"));
    s.tick(2.0 + GONE_SECONDS + 0.1);
    assert!(!s.workers().contains_key("w0"));
    assert!(s.clients().is_empty());
    assert_eq!(s.workers().keys().collect::<Vec<_>>(), ["w1"]);
}

/// Events per second are by arrival, on the wall clock.
#[test]
fn events_per_second() {
    let mut s = watched(0.5);
    let mut f = Feed::default();
    s.tick(0.0);
    for _ in 0..10 {
        s.apply(&f.memory(0.0, "w0", 0));
    }
    s.tick(2.0);
    assert_close!(s.events_per_s(), 5.0);
    s.tick(3.0);
    assert_close!(s.events_per_s(), 2.5);
    // Arrivals are known to the tick: these came by the tick at 0.
    assert_eq!(s.quiet_for(), Some(3.0));
    assert_eq!(s.events(), 10);
}

/// A smaller sequence number is a new dispatcher at the same address: what was known of
/// the old one goes.
#[test]
fn a_restarted_dispatcher_starts_afresh() {
    let mut s = watched(1.0);
    let mut f = Feed::default();
    s.apply(&f.memory(99.0, "old", 1));
    s.apply(&f.memory(100.0, "old", 1));
    assert_close!(s.uptime().unwrap(), 100.0);
    let mut fresh = Feed::default();
    s.apply(&fresh.memory(0.5, "new", 2));
    assert_eq!(s.workers().keys().collect::<Vec<_>>(), ["new"]);
    assert_close!(s.uptime().unwrap(), 0.5);
    assert_eq!(s.restarts(), 1);
    s.waiting("looking");
    assert!(s.workers().is_empty());
    assert_eq!(s.link(), &Link::Waiting("looking".into()));
}

/// A wild time pushes the clock ahead; the next gauge on the real clock brings it back.
#[test]
fn a_wild_time_does_not_stop_the_clock() {
    let mut s = watched(1.0);
    let mut f = Feed::default();
    s.apply(&f.memory(10.0, "w0", 0));
    s.apply(&f.exec("w0", "matmul", 1e300, 1.0, 0));
    s.apply(&f.memory(10.1, "w0", 0));
    s.apply(&f.exec("w0", "add", 10.2, 0.5, 0));
    s.apply(&f.memory(11.0 + MIN_LAG, "w0", 0));
    s.tick(1.0);
    assert_close!(s.uptime().unwrap(), 11.0 + MIN_LAG);
    assert_close!(s.workers()["w0"].share("add"), 0.5 / 0.9);
    assert_close!(s.workers()["w0"].share("matmul"), 0.0);
}

/// Odd events are taken without a panic, and every number stays in range.
#[test]
fn odd_events_are_survived() {
    let mut s = watched(0.3);
    let mut f = Feed::default();
    for d in [f64::NAN, -1.0, f64::INFINITY, f64::NEG_INFINITY, 1e300, f64::MIN_POSITIVE] {
        let mut e = f.exec("w0", "matmul", 0.5, 0.0, u64::MAX);
        e.duration = Some(d);
        s.apply(&e);
    }
    let mut e = f.exec("w0", "add", f64::NAN, 1.0, u64::MAX);
    s.apply(&e);
    e.elapsed = -1e308;
    s.apply(&e);
    e.elapsed = f64::INFINITY;
    s.apply(&e);
    e.duration = None;
    s.apply(&e);
    // Many distinct ops, names of any length, peers with no name, sources of no kind.
    for i in 0..100 {
        s.apply(&f.exec("w0", &format!("op{i}-{}", "x".repeat(i * 10)), 1.0, 0.001, 1));
    }
    s.apply(&f.exec("", "add", 1.0, 0.1, 0));
    s.apply(&f.event(1.0, EventKind::Exec, "DISPATCHER", "add", ""));
    s.apply(&f.event(1.0, EventKind::Status, "WORKER w0", "memory", "live=-5"));
    s.apply(&f.event(1.0, EventKind::Status, "WORKER w0", "memory", "live"));
    s.apply(&f.event(1.0, EventKind::Status, "CLIENT 9", "queue", "instrs=x bytes=99999999999999999999999"));
    s.apply(&f.event(1.0, EventKind::Disconnect, "CLIENT", "", ""));
    s.apply(&f.event(1.0, EventKind::Error, "garbage", "", ""));
    s.apply(&f.memory(5.0, "w0", u64::MAX));
    for now in [0.0, 1.0, f64::NAN, -5.0, 2.0, f64::INFINITY, 3.0] {
        s.tick(now);
    }
    let w = &s.workers()["w0"];
    assert!(w.ops.len() <= 32, "{} ops", w.ops.len());
    for o in &w.ops {
        assert!((0.0..=1.0).contains(&o.share), "{}: {}", o.op, o.share);
        assert!(o.op.chars().count() <= 24);
    }
    assert!((0.0..=1.0).contains(&w.idle) && w.instrs_per_s.is_finite() && w.bytes_per_s.is_finite());
    assert_eq!(w.live_bytes, Some(u64::MAX));
    assert_eq!(s.clients()["9"].queue_instrs, None);
    assert!(!s.workers().contains_key(""));
    // And it all draws.
    render(&s, 120, 30);
    render(&s, 20, 5);

    // A smoothing weight out of range is brought into it.
    assert_close!(TopState::new(f64::NAN).alpha(), 0.15);
    assert_close!(TopState::new(7.0).alpha(), 1.0);
    assert!(TopState::new(-1.0).alpha() > 0.0);
}

fn render(state: &TopState, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| draw(frame, state)).unwrap();
    terminal
}

/// A busy screen: two workers (one gone), two clients.
fn busy_state() -> TopState {
    let mut s = watched(1.0);
    let mut f = Feed::default();
    s.tick(100.0);
    s.apply(&f.peer(60.0, EventKind::Connect, "WORKER worker-0"));
    s.apply(&f.peer(60.0, EventKind::Connect, "WORKER worker-1"));
    s.apply(&f.peer(60.0, EventKind::Connect, "CLIENT 1"));
    s.apply(&f.peer(60.0, EventKind::Connect, "CLIENT 2"));
    // worker-0 over [60, 61): matmul 45%, add 20%, fused 10%, relu 0.3% (hidden in the list).
    let mut t = 60.0;
    for (op, share) in [("matmul", 0.45), ("add", 0.2), ("fused", 0.1), ("relu", 0.003)] {
        s.apply(&f.exec("worker-0", op, t, share, 1 << 20));
        t += share;
    }
    for i in 0..40 {
        s.apply(&f.recv(60.0 + f64::from(i) * 0.02, "1"));
    }
    s.apply(&f.exec("worker-1", "sum", 60.5, 0.25, 4));
    s.apply(&f.memory(60.5, "worker-0", 3 << 30));
    s.apply(&f.memory(60.5, "worker-1", 12_345));
    s.apply(&f.queue(60.5, "1", 17, 5 << 20));
    s.apply(&f.queue(60.5, "2", 0, 0));
    s.apply(&f.memory(61.0 + MIN_LAG, "worker-1", 12_345));
    s.apply(&f.peer(61.0 + MIN_LAG, EventKind::Disconnect, "CLIENT 2"));
    s.tick(101.0);
    s
}

#[test]
fn screen_while_watching() {
    let s = busy_state();
    let terminal = render(&s, 120, 30);
    insta::assert_snapshot!("watching_120x30", terminal.backend());
    // The bar is in the ops' colours: matmul's cells come first.
    let buffer = terminal.backend().buffer();
    let bar = (0..120u16).find(|&x| buffer[(x, 4)].symbol() == "█").expect("a bar on worker-0's row");
    let (r, g, b) = OpFamily::MatMul.rgb();
    assert_eq!(buffer[(bar, 4)].fg, Color::Rgb(r, g, b));
}

#[test]
fn screen_on_a_narrow_terminal() {
    let terminal = render(&busy_state(), 72, 16);
    insta::assert_snapshot!("watching_72x16", terminal.backend());
    for (w, h) in [(1, 1), (10, 3), (40, 8), (300, 80)] {
        render(&busy_state(), w, h);
    }
}

#[test]
fn screen_while_waiting() {
    let mut s = TopState::new(0.15);
    s.waiting("looking for dispatchers (*.dispatcher files) in /run/user/1000/gt");
    s.tick(1.0);
    insta::assert_snapshot!("waiting_100x14", render(&s, 100, 14).backend());
}

#[test]
fn screen_before_the_first_event() {
    let mut s = watched(0.15);
    s.tick(1.0);
    insta::assert_snapshot!("connecting_100x14", render(&s, 100, 14).backend());
}

#[test]
fn bars_follow_the_terminal_width() {
    assert_eq!(view::bar_width(120, 10), 36);
    assert_eq!(view::bar_width(200, 10), 60);
    assert_eq!(view::bar_width(400, 10), 60);
    // Narrower than the seeds' 30 when the other columns need the room, never under 8.
    assert_eq!(view::bar_width(80, 10), 18);
    assert_eq!(view::bar_width(20, 10), 8);
}

#[test]
fn human_units() {
    assert_eq!(
        [rate(0.0), rate(0.04), rate(12.34), rate(320.2), rate(12_345.0), rate(3.4e6)],
        ["0", "0", "12.3", "320", "12.3k", "3.4M"]
    );
    assert_eq!(rate(f64::NAN), "0");
    assert_eq!(
        [bytes(512.0), bytes(1536.0), bytes(3.0 * 1048576.0), bytes(1.5 * 1073741824.0)],
        ["512B", "1.5KB", "3.0MB", "1.5GB"]
    );
    assert_eq!(bytes(u64::MAX as f64), "16384.0PB");
    assert_eq!([uptime(12.34), uptime(184.0), uptime(7500.0)], ["12.3s", "3m04s", "2h05m"]);
}

#[test]
fn keys_that_quit() {
    use crossterm::event::{KeyEvent, KeyEventState};
    let key = |code, modifiers| KeyEvent { code, modifiers, kind: KeyEventKind::Press, state: KeyEventState::NONE };
    assert!(quits(&key(KeyCode::Char('q'), KeyModifiers::NONE)));
    assert!(quits(&key(KeyCode::Esc, KeyModifiers::NONE)));
    assert!(quits(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
    assert!(!quits(&key(KeyCode::Char('c'), KeyModifiers::NONE)));
    assert!(!quits(&KeyEvent { kind: KeyEventKind::Release, ..key(KeyCode::Char('q'), KeyModifiers::NONE) }));
}

#[test]
fn run_refuses_without_a_terminal() {
    // Under the test harness, stdout is captured or piped (never a terminal in CI).
    if std::io::stdout().is_terminal() {
        return;
    }
    let e = run(&TopOptions::default()).unwrap_err();
    assert!(matches!(e, TopError::NotATerminal));
    assert!(e.to_string().contains("gt top needs a terminal"), "{e}");
}

#[test]
fn targets() {
    let opts = |host: &str, port| TopOptions { host: host.into(), port, ..TopOptions::default() };
    assert!(matches!(target(&opts("localhost", None)).unwrap(), MonitorTarget::Newest));
    assert!(matches!(target(&opts("127.0.0.1", Some(9000))).unwrap(), MonitorTarget::Local(9000)));
    match target(&opts("gpu-box", Some(9000))).unwrap() {
        MonitorTarget::Remote(m) => assert_eq!(m.endpoint, "tcp://gpu-box:9001"),
        t => panic!("{t:?}"),
    }
    assert!(matches!(target(&opts("gpu-box", Some(65535))), Err(TopError::NoMonitorPort { port: 65535 })));
}
