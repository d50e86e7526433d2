//! Cancelling an instruction while it runs: a worker numbers each instruction it starts in
//! a [`Watch`]; a watcher thread beside the worker marks the running one cancelled when it
//! has run past `GT_OP_TIMEOUT` or when its client left, and the long loops (the blocks of a
//! matrix product, a compiled kernel's outer loop) stop early when they see the mark. The
//! worker then discards what the instruction wrote and reports it cancelled.
//!
//! Nothing here is checked per element: a loop looks once per block, so an instruction that
//! is never cancelled pays a relaxed atomic load per block, and small instructions none.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Why an instruction was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// It ran longer than the worker's `GT_OP_TIMEOUT`.
    Timeout(Duration),
    /// The client that sent it left.
    ClientLeft,
}

const WHY_TIMEOUT: u8 = 1;
const WHY_CLIENT: u8 = 2;

/// The instruction a worker is running, and whether it is cancelled. Shared by the worker's
/// thread (which starts and ends instructions), the watcher (which cancels) and the compute
/// threads (which look).
#[derive(Debug, Default)]
pub struct Watch {
    /// The running instruction's number (0: none runs).
    running: AtomicU64,
    /// The number of the instruction cancelled (0: none).
    cancelled: AtomicU64,
    /// Why ([`WHY_TIMEOUT`], [`WHY_CLIENT`]; 0 before any cancel).
    why: AtomicU8,
    /// Its client.
    owner: AtomicU64,
    /// When it started, in nanoseconds on the worker's clock.
    started: AtomicU64,
    /// The last number given.
    last: AtomicU64,
}

impl Watch {
    /// A new watch with nothing running.
    pub fn new() -> Arc<Watch> {
        Arc::new(Watch::default())
    }

    /// The worker starts an instruction of `owner` at `now` (nanoseconds); returns its number.
    pub fn begin(&self, owner: u64, now: u64) -> u64 {
        let n = self.last.load(Ordering::Relaxed) + 1;
        self.last.store(n, Ordering::Relaxed);
        self.owner.store(owner, Ordering::Relaxed);
        self.started.store(now, Ordering::Relaxed);
        self.running.store(n, Ordering::Release);
        n
    }

    /// The worker is done with instruction `n`: why it was cancelled, if it was.
    pub fn end(&self, n: u64, timeout: Option<Duration>) -> Option<Why> {
        self.running.store(0, Ordering::Release);
        if self.cancelled.load(Ordering::Acquire) != n {
            return None;
        }
        match self.why.load(Ordering::Relaxed) {
            WHY_CLIENT => Some(Why::ClientLeft),
            WHY_TIMEOUT => Some(Why::Timeout(timeout.unwrap_or_default())),
            _ => None,
        }
    }

    /// The running instruction (its number, client and start), if one runs.
    pub fn running(&self) -> Option<(u64, u64, u64)> {
        let n = self.running.load(Ordering::Acquire);
        (n != 0).then(|| (n, self.owner.load(Ordering::Relaxed), self.started.load(Ordering::Relaxed)))
    }

    /// Cancels instruction `n` (nothing if another runs by now: it finished).
    pub fn cancel(&self, n: u64, why: Why) {
        if self.running.load(Ordering::Acquire) != n {
            return;
        }
        let code = match why {
            Why::Timeout(_) => WHY_TIMEOUT,
            Why::ClientLeft => WHY_CLIENT,
        };
        self.why.store(code, Ordering::Relaxed);
        self.cancelled.store(n, Ordering::Release);
    }

    /// Whether instruction `n` is cancelled.
    fn is_cancelled(&self, n: u64) -> bool {
        n != 0 && self.cancelled.load(Ordering::Relaxed) == n
    }
}

impl Why {
    /// The failure message for `op`.
    pub fn message(self, op: &str, ran: Duration) -> String {
        match self {
            Why::Timeout(limit) => format!(
                "{op}: cancelled after {:.1} s: it ran past the worker's op timeout of {} s (GT_OP_TIMEOUT)",
                ran.as_secs_f64(),
                limit.as_secs()
            ),
            Why::ClientLeft => format!("{op}: cancelled after {:.1} s: its client left", ran.as_secs_f64()),
        }
    }
}

thread_local! {
    /// The watch of the worker running on this thread.
    static WATCH: RefCell<Option<Arc<Watch>>> = const { RefCell::new(None) };
}

/// Makes `watch` the calling (worker) thread's: the loops of the instructions it runs look
/// at it.
pub fn install(watch: Option<Arc<Watch>>) {
    WATCH.with(|w| *w.borrow_mut() = watch);
}

/// What a long loop looks at: taken on the worker's thread when the instruction starts its
/// work, then handed to any compute thread.
#[derive(Debug, Clone, Default)]
pub struct Token {
    watch: Option<Arc<Watch>>,
    n: u64,
}

impl Token {
    /// The calling thread's running instruction (a token that never stops where nothing is
    /// watched: tests, the reference interpreter on its own).
    pub fn current() -> Token {
        WATCH.with(|w| match w.borrow().as_ref() {
            Some(watch) => Token { n: watch.running.load(Ordering::Acquire), watch: Some(watch.clone()) },
            None => Token::default(),
        })
    }

    /// Whether the loop should stop: its instruction was cancelled.
    pub fn stop(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.is_cancelled(self.n))
    }

    /// Where a compiled kernel looks: a word that holds the cancelled instruction's number,
    /// and the number that means "stop" (a word that stays 0 and a number never given, where
    /// nothing is watched).
    pub fn flag(&self) -> (*const u64, u64) {
        static NEVER: AtomicU64 = AtomicU64::new(0);
        match &self.watch {
            Some(w) if self.n != 0 => (w.cancelled.as_ptr().cast_const(), self.n),
            _ => (NEVER.as_ptr().cast_const(), u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_running_instruction_is_cancelled() {
        let watch = Watch::new();
        install(Some(watch.clone()));
        let a = watch.begin(7, 100);
        let token = Token::current();
        assert_eq!(watch.running(), Some((a, 7, 100)));
        assert!(!token.stop());
        watch.cancel(a, Why::ClientLeft);
        assert!(token.stop());
        assert_eq!(watch.end(a, None), Some(Why::ClientLeft));
        // A cancel that arrives after the instruction ended touches nothing.
        let b = watch.begin(7, 200);
        watch.cancel(a, Why::Timeout(Duration::from_secs(1)));
        assert!(!Token::current().stop());
        assert_eq!(watch.end(b, None), None);
        assert_eq!(watch.running(), None);
        install(None);
        assert!(!Token::current().stop());
        assert_eq!(Token::current().flag().1, u64::MAX);
    }
}
