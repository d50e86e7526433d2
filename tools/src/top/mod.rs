//! `gt top`: an htop-style live view of a running dispatcher, drawn from the events its
//! monitor socket publishes ([`gt_transport::LogEvent`], one per frame): per worker, how
//! busy it is and with which ops, instructions and bytes per second, live memory; per
//! client, its queue and request rate.
//!
//! Three parts: [`TopState`] takes events and the wall clock and keeps the numbers (no
//! socket, no terminal: tested with made-up events); [`draw`] renders a state with ratatui;
//! [`run`] finds the dispatcher ([`crate::discover`]), subscribes, and loops: receive,
//! read keys, tick and redraw every [`TopOptions::refresh`]. A dispatcher that is not there
//! yet, or that dies while watched, is a 'waiting for dispatcher' screen, not an error.
//!
//! Unlike the seeds' `top.py`, busy time comes from the workers' own timings (`EXEC`
//! events carry each instruction's start and duration) rather than from the gap between a
//! batch going out and its answer, so batches are broken down by op and queueing in the
//! dispatcher does not count as work; and the remote monitor is where the server binds it.

mod state;
#[cfg(test)]
mod tests;
mod view;

pub use state::{Client, Link, OpShare, TopState, Worker, GONE_SECONDS, MAX_LAG, MIN_LAG};
pub use view::draw;

use crate::discover::{self, MonitorInfo, MonitorTarget};
use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use gt_transport::{codec, zmq, LogEvent};
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use thiserror::Error;

/// What `gt top` watches and how.
#[derive(Debug, Clone, PartialEq)]
pub struct TopOptions {
    /// The dispatcher's host: this machine (`localhost`, `127.0.0.1`...) or another.
    pub host: String,
    /// Its port; `None` finds the newest dispatcher running on this machine.
    pub port: Option<u16>,
    /// The weight of each new measurement in the smoothed numbers, in (0, 1].
    pub ema_alpha: f64,
    /// How often the screen is redrawn (and the numbers measured).
    pub refresh: Duration,
    /// The cluster key (`--key`, `GT_KEY_FILE`), which a remote dispatcher's TCP monitor
    /// demands.
    pub key: Option<gt_transport::ClusterKey>,
}

impl Default for TopOptions {
    fn default() -> TopOptions {
        TopOptions {
            host: "localhost".to_string(),
            port: None,
            ema_alpha: 0.15,
            refresh: Duration::from_millis(250),
            key: None,
        }
    }
}

/// Why `gt top` could not run.
#[derive(Debug, Error)]
pub enum TopError {
    /// Standard output is not a terminal.
    #[error("gt top needs a terminal: its output is not one (to record events to a file, use `gt trace`)")]
    NotATerminal,
    /// The smoothing weight is out of range.
    #[error("--ema-alpha must be a number in (0, 1], not {alpha}")]
    BadAlpha {
        /// The weight given.
        alpha: f64,
    },
    /// A remote server on the last port has no port for its monitor.
    #[error("a server on port {port} has no monitor port (a remote server's monitor listens on PORT+1)")]
    NoMonitorPort {
        /// The port given.
        port: u16,
    },
    /// The terminal could not be set up, read or drawn on.
    #[error("terminal: {0}")]
    Terminal(#[source] std::io::Error),
    /// ZeroMQ failed (making the socket, or polling it).
    #[error("monitor socket: {0}")]
    Socket(#[source] zmq::Error),
    /// The remote monitor's address was refused.
    #[error("cannot connect to the monitor at {endpoint}: {source}")]
    Connect {
        /// The address.
        endpoint: String,
        /// Why.
        source: zmq::Error,
    },
}

/// The largest frame taken from the monitor: events are a few hundred bytes, so anything
/// this large is not one (ZeroMQ drops it unread).
const MAX_FRAME: usize = 1 << 20;
/// How often the link is checked: a new dispatcher looked for, the watched one checked (s).
const CHECK_EVERY: f64 = 0.5;
/// How long a dispatcher may be silent before its socket is checked for a listener (s):
/// gauges come every ~100 ms while anyone listens.
const SILENT: f64 = 3.0;
/// The longest wait for events or keys in one turn of the loop (s), so keys stay prompt.
const TURN: f64 = 0.05;
/// The most frames taken in one turn, so a flood cannot starve the keys and the screen.
const FRAMES_PER_TURN: usize = 20_000;
/// The shortest refresh period honoured.
const MIN_REFRESH: Duration = Duration::from_millis(20);

/// Where `options` say the dispatcher is.
fn target(options: &TopOptions) -> Result<MonitorTarget, TopError> {
    MonitorTarget::new(&options.host, options.port).ok_or(TopError::NoMonitorPort { port: options.port.unwrap_or(0) })
}

/// A subscription to one dispatcher's monitor.
struct Watch {
    info: MonitorInfo,
    socket: zmq::Socket,
}

impl Watch {
    fn open(ctx: &zmq::Context, info: MonitorInfo, key: Option<&gt_transport::ClusterKey>) -> Result<Watch, TopError> {
        let socket = ctx.socket(zmq::SUB).map_err(TopError::Socket)?;
        // Closing never waits, and a flood queues a bounded amount here.
        let setup = socket
            .set_linger(0)
            .and_then(|()| socket.set_rcvhwm(100_000))
            .and_then(|()| socket.set_maxmsgsize(MAX_FRAME as i64))
            // A remote host may be an IPv6 address, or a name that resolves to one.
            .and_then(|()| socket.set_ipv6(true))
            .and_then(|()| socket.set_subscribe(b""));
        setup.map_err(TopError::Socket)?;
        gt_transport::socket::connect(&socket, &info.endpoint, key)
            .map_err(|source| TopError::Connect { endpoint: info.endpoint.clone(), source })?;
        Ok(Watch { info, socket })
    }

    /// Whether the dispatcher is gone: its process or socket file is, or it has been silent
    /// and nothing listens on its socket any more. (A remote one is never known gone.)
    fn lost(&self, state: &TopState, watched_for: f64) -> bool {
        if !self.info.is_alive() {
            return true;
        }
        let silent = state.quiet_for().unwrap_or(watched_for) >= SILENT;
        silent && self.info.ipc_file().is_some_and(|f| !discover::socket_listening(f))
    }

    /// Takes the frames waiting, at most `wait` for the first.
    fn receive(&self, state: &mut TopState, wait: Duration) -> Result<(), TopError> {
        let mut items = [self.socket.as_poll_item(zmq::POLLIN)];
        match zmq::poll(&mut items, wait.as_millis().min(1000) as i64) {
            Ok(_) => {}
            // A signal (the terminal resized) cut the wait short.
            Err(zmq::Error::EINTR) => return Ok(()),
            Err(e) => return Err(TopError::Socket(e)),
        }
        for _ in 0..FRAMES_PER_TURN {
            let Ok(frame) = self.socket.recv_bytes(zmq::DONTWAIT) else { break };
            match codec::decode::<LogEvent>(&frame, MAX_FRAME) {
                Ok(event) => state.apply(&event),
                Err(_) => state.bad_frame(),
            }
        }
        Ok(())
    }
}

/// Runs `gt top` until the user quits: finds the dispatcher (waiting for one if none is
/// there), subscribes to its monitor and redraws every `options.refresh`. `q`, `Esc` and
/// Ctrl-C quit; the terminal is restored on every way out, a panic included.
pub fn run(options: &TopOptions) -> Result<(), TopError> {
    if !std::io::stdout().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    if !(options.ema_alpha > 0.0 && options.ema_alpha <= 1.0) {
        return Err(TopError::BadAlpha { alpha: options.ema_alpha });
    }
    let target = target(options)?;
    // Also installs a panic hook that restores the terminal before the message is printed.
    let mut terminal = ratatui::try_init().map_err(TopError::Terminal)?;
    let result = watch(&mut terminal, &target, options);
    let restored = ratatui::try_restore().map_err(TopError::Terminal);
    result.and(restored)
}

fn watch(
    terminal: &mut ratatui::DefaultTerminal,
    target: &MonitorTarget,
    options: &TopOptions,
) -> Result<(), TopError> {
    let ctx = zmq::Context::new();
    let refresh = options.refresh.max(MIN_REFRESH).as_secs_f64();
    let started = Instant::now();
    let mut state = TopState::new(options.ema_alpha);
    state.waiting(&target.looking());
    let mut current: Option<(Watch, f64)> = None;
    let (mut next_check, mut next_draw) = (0.0, 0.0);
    loop {
        let now = started.elapsed().as_secs_f64();
        if now >= next_check {
            next_check = now + CHECK_EVERY;
            match &current {
                Some((w, since)) if w.lost(&state, now - since) => {
                    current = None;
                    state.waiting(&target.looking());
                }
                Some(_) => {}
                None => {
                    if let Some(info) = target.find() {
                        let endpoint = info.endpoint.clone();
                        match Watch::open(&ctx, info, options.key.as_ref()) {
                            Ok(w) => {
                                state.watching(&endpoint, w.info.pid);
                                current = Some((w, now));
                            }
                            // Only an address the user gave is theirs to fix; a bad
                            // discovery file is passed over until it changes.
                            Err(e) if matches!(target, MonitorTarget::Remote(_)) => return Err(e),
                            Err(e) => state.waiting(&format!("{} (skipping {endpoint}: {e})", target.looking())),
                        }
                    }
                }
            }
        }

        let wait = Duration::from_secs_f64((next_draw - now).clamp(0.0, TURN));
        match &current {
            Some((w, _)) => {
                w.receive(&mut state, wait)?;
                if keys(Duration::ZERO)? {
                    return Ok(());
                }
            }
            None => {
                if keys(wait)? {
                    return Ok(());
                }
            }
        }

        let now = started.elapsed().as_secs_f64();
        if now >= next_draw {
            state.tick(now);
            terminal.draw(|frame| draw(frame, &state)).map_err(TopError::Terminal)?;
            next_draw = now + refresh;
        }
    }
}

/// Reads the keys typed (waiting at most `wait` for the first); whether one of them quits.
fn keys(wait: Duration) -> Result<bool, TopError> {
    let mut wait = wait;
    while crossterm::event::poll(wait).map_err(TopError::Terminal)? {
        wait = Duration::ZERO;
        if let Event::Key(key) = crossterm::event::read().map_err(TopError::Terminal)? {
            if quits(&key) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// `q`, `Esc` and Ctrl-C quit (in raw mode Ctrl-C is a key, not a signal).
fn quits(key: &KeyEvent) -> bool {
    key.kind == KeyEventKind::Press
        && match key.code {
            KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => true,
            KeyCode::Char('c') => key.modifiers.contains(KeyModifiers::CONTROL),
            _ => false,
        }
}
