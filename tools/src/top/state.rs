//! What `gt top` knows, fed the monitor's events and the wall clock and nothing else (no
//! socket, no terminal), so it can be tested with made-up events.
//!
//! # Time
//! Activity is measured on the dispatcher's clock, not on arrival: an `EXEC` event says
//! when its instruction started (`elapsed`) and how long it ran, but arrives only when the
//! worker reports its batch. So each [`TopState::tick`] closes a *window* of dispatcher time
//! that ends a little (the *lag*) before the latest time seen, and every instruction's run is
//! clipped to the windows it overlaps. The lag grows to cover the latest report seen (up to
//! [`MAX_LAG`]) and shrinks back slowly; a run reported later than that loses the part that
//! fell in windows already closed. The wall clock is used only for what is about the
//! watcher: events per second received, how long ago the last one came, and how long a
//! departed peer stays on screen.

use crate::tape::{detail, Lane, OpFamily};
use gt_transport::{EventKind, LogEvent};
use std::collections::BTreeMap;

/// The smallest lag behind the dispatcher's latest time (s).
pub const MIN_LAG: f64 = 0.25;
/// The largest lag (s): a run reported later than this is partly lost.
pub const MAX_LAG: f64 = 2.0;
/// How long a departed worker or client stays on screen (s, wall clock).
pub const GONE_SECONDS: f64 = 5.0;
/// Windows shorter than this are left to grow (s): a share over a few milliseconds is noise.
const MIN_WINDOW: f64 = 0.05;
/// How far behind the clock a gauge or request may be before the clock is taken to have
/// been pushed ahead by garbage (s).
const MAX_JUMP: f64 = 600.0;
/// The longest run believed (s): a larger duration is garbage and is cut to this.
const MAX_DURATION: f64 = 3600.0;
/// The most workers, and clients, tracked: a stream naming more is garbage past this.
const MAX_PEERS: usize = 1024;
/// The most ops told apart per worker; further ones count as [`OVERFLOW_OP`].
const MAX_OPS: usize = 32;
/// The op that ops past [`MAX_OPS`] are counted as.
const OVERFLOW_OP: &str = "…";
/// The longest op name kept, in characters.
const MAX_OP_NAME: usize = 24;
/// The most events held per peer until their window closes (a bound on memory if the
/// dispatcher's clock stops while events pour in).
const MAX_PENDING: usize = 1 << 18;

/// One op's smoothed share of a worker's time.
#[derive(Debug, Clone, PartialEq)]
pub struct OpShare {
    /// The op (`matmul`, `add`, `fused`).
    pub op: String,
    /// Its family, for its colour.
    pub family: OpFamily,
    /// Its share of the worker's time, 0 to 1 (smoothed).
    pub share: f64,
}

/// An instruction run not yet wholly inside a closed window.
#[derive(Debug, Clone)]
struct Run {
    start: f64,
    end: f64,
    /// Index into [`Worker::ops`].
    op: usize,
    bytes: u64,
    /// Whether it was counted in a window's instructions and bytes.
    counted: bool,
}

/// A worker, as seen.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Smoothed share per op, in the order first seen.
    pub ops: Vec<OpShare>,
    /// Smoothed idle share, 0 to 1.
    pub idle: f64,
    /// Smoothed instructions executed per second (of dispatcher time).
    pub instrs_per_s: f64,
    /// Smoothed bytes written per second.
    pub bytes_per_s: f64,
    /// Bytes of live tensors, from its latest memory reading.
    pub live_bytes: Option<u64>,
    /// When it left (wall clock), if it did.
    pub gone_since: Option<f64>,
    /// Whether a window has been measured (the first one is taken as is, not smoothed).
    primed: bool,
    pending: Vec<Run>,
}

impl Worker {
    fn new() -> Worker {
        Worker {
            ops: Vec::new(),
            idle: 1.0,
            instrs_per_s: 0.0,
            bytes_per_s: 0.0,
            live_bytes: None,
            gone_since: None,
            primed: false,
            pending: Vec::new(),
        }
    }

    /// The share of an op, 0 if never seen.
    pub fn share(&self, op: &str) -> f64 {
        self.ops.iter().find(|o| o.op == op).map_or(0.0, |o| o.share)
    }

    /// The busy share (1 - idle).
    pub fn busy(&self) -> f64 {
        (1.0 - self.idle).clamp(0.0, 1.0)
    }

    fn op_index(&mut self, command: &str, details: &str) -> usize {
        let name: String = command.chars().take(MAX_OP_NAME).collect();
        if let Some(i) = self.ops.iter().position(|o| o.op == name) {
            return i;
        }
        let (op, family) = if self.ops.len() + 1 >= MAX_OPS {
            if let Some(i) = self.ops.iter().position(|o| o.op == OVERFLOW_OP) {
                return i;
            }
            (OVERFLOW_OP.to_string(), OpFamily::Other)
        } else {
            let family = OpFamily::of(command, details);
            (name, family)
        };
        self.ops.push(OpShare { op, family, share: 0.0 });
        self.ops.len() - 1
    }

    /// Measures the window `[start, end)` of dispatcher time and folds it into the
    /// averages.
    fn close_window(&mut self, start: f64, end: f64, alpha: f64) {
        let width = end - start;
        let mut busy = vec![0.0; self.ops.len()];
        let (mut instrs, mut bytes) = (0u64, 0u64);
        self.pending.retain_mut(|run| {
            if run.start >= end {
                return true;
            }
            // Counted once: in the window it started in, or in this one if it was reported
            // after that one closed.
            if !run.counted {
                run.counted = true;
                instrs += 1;
                bytes = bytes.saturating_add(run.bytes);
            }
            let overlap = run.end.min(end) - run.start.max(start);
            if overlap > 0.0 {
                busy[run.op] += overlap;
            }
            run.end > end
        });
        let total: f64 = busy.iter().sum();
        // Overlapping runs (which one worker should not have) cannot make it more than busy.
        let scale = if total > width { width / total } else { 1.0 };
        // The first window is taken as it is: smoothing it from 'all idle' would only show
        // a warm-up that never happened.
        let alpha = if self.primed { alpha } else { 1.0 };
        self.primed = true;
        let mut busy_share = 0.0;
        for (op, b) in self.ops.iter_mut().zip(busy) {
            let share = b * scale / width;
            busy_share += share;
            op.share = ema(op.share, share, alpha);
        }
        self.idle = ema(self.idle, (1.0 - busy_share).max(0.0), alpha);
        self.instrs_per_s = ema(self.instrs_per_s, instrs as f64 / width, alpha);
        self.bytes_per_s = ema(self.bytes_per_s, bytes as f64 / width, alpha);
    }
}

/// A client, as seen.
#[derive(Debug, Clone, Default)]
pub struct Client {
    /// Instructions sent to its worker and not yet run, from its latest queue reading.
    pub queue_instrs: Option<u64>,
    /// Their bytes.
    pub queue_bytes: Option<u64>,
    /// Smoothed instructions (and requests) received from it per second.
    pub instrs_per_s: f64,
    /// When it left (wall clock), if it did.
    pub gone_since: Option<f64>,
    primed: bool,
    /// Dispatcher times of requests not yet in a closed window.
    pending: Vec<f64>,
}

/// Where the monitor link stands, as the screen tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// No dispatcher found yet; the text says where it is looked for.
    Waiting(String),
    /// Subscribed to a dispatcher's monitor.
    Watching {
        /// Its monitor endpoint.
        endpoint: String,
        /// Its process, when known.
        pid: Option<u32>,
    },
}

/// Everything `gt top` shows.
#[derive(Debug, Clone)]
pub struct TopState {
    alpha: f64,
    link: Link,
    /// Wall clock of the latest tick (s).
    now: f64,
    last_tick: Option<f64>,
    /// Wall clock of the latest event.
    last_event_at: Option<f64>,
    /// The dispatcher's latest time seen.
    clock: Option<f64>,
    /// Where the next window starts, on the dispatcher's clock.
    window_start: Option<f64>,
    lag: f64,
    last_seq: u64,
    events_since_tick: u64,
    events_per_s: f64,
    events_primed: bool,
    events: u64,
    bad_frames: u64,
    restarts: u64,
    workers: BTreeMap<String, Worker>,
    clients: BTreeMap<String, Client>,
}

fn ema(old: f64, new: f64, alpha: f64) -> f64 {
    alpha * new + (1.0 - alpha) * old
}

/// A finite, non-negative duration, cut to [`MAX_DURATION`].
fn sane_duration(d: Option<f64>) -> f64 {
    match d {
        Some(d) if d.is_finite() && d > 0.0 => d.min(MAX_DURATION),
        _ => 0.0,
    }
}

impl TopState {
    /// A state smoothing with `alpha` (the weight of each new window, clamped to (0, 1];
    /// the seeds' default is 0.15), waiting for a dispatcher.
    pub fn new(alpha: f64) -> TopState {
        let alpha = if alpha.is_finite() { alpha.clamp(1e-3, 1.0) } else { 0.15 };
        TopState {
            alpha,
            link: Link::Waiting(String::new()),
            now: 0.0,
            last_tick: None,
            last_event_at: None,
            clock: None,
            window_start: None,
            lag: MIN_LAG,
            last_seq: 0,
            events_since_tick: 0,
            events_per_s: 0.0,
            events_primed: false,
            events: 0,
            bad_frames: 0,
            restarts: 0,
            workers: BTreeMap::new(),
            clients: BTreeMap::new(),
        }
    }

    /// Forgets the dispatcher's peers and clock (it was replaced), keeping the link and the
    /// watcher's own counters.
    fn forget_dispatcher(&mut self) {
        self.clock = None;
        self.window_start = None;
        self.lag = MIN_LAG;
        self.last_seq = 0;
        self.last_event_at = None;
        self.workers.clear();
        self.clients.clear();
    }

    /// Subscribed to a dispatcher's monitor: everything known of a previous one is dropped.
    pub fn watching(&mut self, endpoint: &str, pid: Option<u32>) {
        self.forget_dispatcher();
        self.events_per_s = 0.0;
        self.events_primed = false;
        self.events_since_tick = 0;
        self.link = Link::Watching { endpoint: endpoint.to_string(), pid };
    }

    /// No dispatcher (none found, or the one watched is gone); `looking` says where one is
    /// looked for.
    pub fn waiting(&mut self, looking: &str) {
        self.forget_dispatcher();
        self.events_per_s = 0.0;
        self.events_primed = false;
        self.events_since_tick = 0;
        self.link = Link::Waiting(looking.to_string());
    }

    /// A frame that was not an event (counted, shown, otherwise ignored).
    pub fn bad_frame(&mut self) {
        self.bad_frames = self.bad_frames.saturating_add(1);
    }

    /// Takes one event in.
    pub fn apply(&mut self, e: &LogEvent) {
        self.events = self.events.saturating_add(1);
        self.events_since_tick = self.events_since_tick.saturating_add(1);
        self.last_event_at = Some(self.now);
        // Sequence numbers only grow within one dispatcher's life: a smaller one is a new
        // dispatcher at the same address.
        if e.seq < self.last_seq {
            self.forget_dispatcher();
            self.restarts += 1;
            self.last_event_at = Some(self.now);
        }
        self.last_seq = e.seq;
        if !e.elapsed.is_finite() {
            return;
        }
        // Gauges and requests are logged as they happen, so one far behind the clock means
        // the clock was pushed ahead by a wild time: measure afresh from here.
        if e.kind != EventKind::Exec && self.clock.is_some_and(|c| e.elapsed < c - MAX_JUMP) {
            self.reset_clock();
        }
        // The first window starts at the first time seen: what ran before the watcher came
        // is not known.
        self.window_start.get_or_insert(e.elapsed);
        let duration = sane_duration(e.duration);
        if e.kind == EventKind::Exec {
            // Reported late: its end is in the past, so it bounds the clock from below, and
            // how late it came tells how far behind the windows must stay.
            let end = e.elapsed + duration;
            if let Some(clock) = self.clock {
                self.lag = self.lag.max((clock - end + MIN_LAG / 2.0).min(MAX_LAG));
            }
            self.advance_clock(end);
        } else {
            self.advance_clock(e.elapsed);
        }
        let now = self.now;
        match Lane::of(e) {
            Lane::Worker(name) => {
                let Some(w) = peer(&mut self.workers, name, Worker::new) else { return };
                match e.kind {
                    EventKind::Connect => w.gone_since = None,
                    EventKind::Disconnect => w.gone_since = Some(now),
                    EventKind::Exec if w.pending.len() < MAX_PENDING => {
                        let op = w.op_index(&e.command, &e.details);
                        w.pending.push(Run {
                            start: e.elapsed,
                            end: e.elapsed + duration,
                            op,
                            bytes: e.bytes,
                            counted: false,
                        });
                    }
                    EventKind::Status if e.command == "memory" => {
                        if let Some(live) = detail(&e.details, "live").and_then(|v| v.parse().ok()) {
                            w.live_bytes = Some(live);
                        }
                    }
                    _ => {}
                }
            }
            Lane::Client(name) => {
                let Some(c) = peer(&mut self.clients, name, Client::default) else { return };
                match e.kind {
                    EventKind::Connect => c.gone_since = None,
                    EventKind::Disconnect => c.gone_since = Some(now),
                    EventKind::Recv if c.pending.len() < MAX_PENDING => c.pending.push(e.elapsed),
                    EventKind::Status if e.command == "queue" => {
                        c.queue_instrs = detail(&e.details, "instrs").and_then(|v| v.parse().ok());
                        c.queue_bytes = detail(&e.details, "bytes").and_then(|v| v.parse().ok());
                    }
                    _ => {}
                }
            }
            Lane::Dispatcher => {}
        }
    }

    /// Forgets the dispatcher's time and what is waiting to be measured, keeping the peers
    /// and their averages.
    fn reset_clock(&mut self) {
        self.clock = None;
        self.window_start = None;
        self.lag = MIN_LAG;
        for w in self.workers.values_mut() {
            w.pending.clear();
        }
        for c in self.clients.values_mut() {
            c.pending.clear();
        }
    }

    fn advance_clock(&mut self, t: f64) {
        let clock = self.clock.map_or(t, |c| c.max(t));
        self.clock = Some(clock);
    }

    /// Advances to wall-clock time `now` (s, any origin, not decreasing): closes the
    /// window of dispatcher time that is complete, updates the rates, and drops peers that
    /// left more than [`GONE_SECONDS`] ago.
    pub fn tick(&mut self, now: f64) {
        let now = if now.is_finite() { now.max(self.now) } else { self.now };
        if let Some(last) = self.last_tick {
            let dt = now - last;
            if dt > 0.0 {
                let rate = self.events_since_tick as f64 / dt;
                let alpha = if self.events_primed { self.alpha } else { 1.0 };
                self.events_primed = true;
                self.events_per_s = ema(self.events_per_s, rate, alpha);
                self.events_since_tick = 0;
            }
        } else {
            self.events_since_tick = 0;
        }
        self.last_tick = Some(now);
        self.now = now;

        if let (Some(clock), Some(start)) = (self.clock, self.window_start) {
            let end = clock - self.lag;
            if end - start >= MIN_WINDOW {
                self.close_window(start, end);
                self.window_start = Some(end);
                // Back toward the smallest lag, so one late report does not delay the
                // picture for good.
                self.lag = (self.lag * 0.95).max(MIN_LAG);
            }
        }
        self.workers.retain(|_, w| w.gone_since.is_none_or(|t| now - t < GONE_SECONDS));
        self.clients.retain(|_, c| c.gone_since.is_none_or(|t| now - t < GONE_SECONDS));
    }

    fn close_window(&mut self, start: f64, end: f64) {
        let width = end - start;
        let alpha = self.alpha;
        for w in self.workers.values_mut() {
            w.close_window(start, end, alpha);
        }
        for c in self.clients.values_mut() {
            let before = c.pending.len();
            c.pending.retain(|&t| t >= end);
            let n = before - c.pending.len();
            let a = if c.primed { alpha } else { 1.0 };
            c.primed = true;
            c.instrs_per_s = ema(c.instrs_per_s, n as f64 / width, a);
        }
    }

    /// Where the link stands.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The dispatcher's uptime: its latest time seen (s).
    pub fn uptime(&self) -> Option<f64> {
        self.clock
    }

    /// Seconds (wall clock) since the latest event, `None` before the first.
    pub fn quiet_for(&self) -> Option<f64> {
        self.last_event_at.map(|t| (self.now - t).max(0.0))
    }

    /// Smoothed events received per second.
    pub fn events_per_s(&self) -> f64 {
        self.events_per_s
    }

    /// Events received from the dispatcher watched.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Frames that were not events.
    pub fn bad_frames(&self) -> u64 {
        self.bad_frames
    }

    /// How often the dispatcher watched was replaced by a new one at the same address.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// How far the windows stay behind the dispatcher's latest time (s).
    pub fn lag(&self) -> f64 {
        self.lag
    }

    /// The workers, by name.
    pub fn workers(&self) -> &BTreeMap<String, Worker> {
        &self.workers
    }

    /// The clients, by name.
    pub fn clients(&self) -> &BTreeMap<String, Client> {
        &self.clients
    }

    /// The smoothing weight.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
}

/// The peer `name` of `map`, made on first sight unless the map is full or the name empty.
fn peer<T>(map: &mut BTreeMap<String, T>, name: String, make: fn() -> T) -> Option<&mut T> {
    if name.is_empty() || (map.len() >= MAX_PEERS && !map.contains_key(&name)) {
        return None;
    }
    Some(map.entry(name).or_insert_with(make))
}
