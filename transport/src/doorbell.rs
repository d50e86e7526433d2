//! Doorbells: how a worker in the client's own process answers its sync or read directly,
//! one hop instead of two back through the dispatcher.
//!
//! An embedded client (one on `inproc://`) registers a [`Doorbell`] under a random
//! [`DoorbellKey`] and names the key in its `Hello`. When the client waits (a sync, a read)
//! with all its work on one worker and nothing left unread, the dispatcher sends that worker
//! the wait with the key (`WorkerCommand::Exec`'s or `Get`'s `doorbell`). The worker, once
//! the batch ran (or the value was read) without a failure of the client's, rings the bell
//! ([`ring`]; a read's data goes with it, moved, not copied: [`ring_with`]) and tells the
//! dispatcher it did (`Done`'s `rang`, `WorkerEvent::Rung`), which then answers nothing.
//! Only workers that registered with the dispatcher's own [`process_key`] are given bells.
//! A client that stopped waiting and went to sleep on its socket declines the ring first
//! ([`Doorbell::decline`]), and a worker that finds no bell does not ring: either way the
//! worker says it did not ring and the dispatcher answers as before (a read's data comes
//! back to the worker and goes by the socket). A dispatcher that fails a wait it gave a bell
//! (its worker was lost) revokes the bell first ([`revoke`]) and sends nothing if it had
//! rung. So every wait is answered once: one compare-and-swap decides between the bell and
//! the socket. A client answered by the bell reads what its socket already holds before it
//! goes on: every reply the dispatcher sent before handing the wait over is there (the
//! failures of earlier instructions come first, as on the socket).
//!
//! The state is one atomic word: the wait's seq shifted left by two, and two bits saying
//! whether the client is waiting for it, it rang, or the client declined.

use gt_ir::data::Elements;
use gt_ir::TensorType;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The name a client's doorbell is registered under: 128 random bits, so that no other
/// client (a hostile one connected over TCP, say) can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DoorbellKey(pub [u64; 2]);

const WAITING: u64 = 1;
const RUNG: u64 = 2;
const DECLINED: u64 = 3;

fn word(seq: u64, tag: u64) -> u64 {
    seq.wrapping_shl(2) | tag
}

/// A client's doorbell, registered in this process while it lives.
#[derive(Debug)]
pub struct Doorbell {
    key: DoorbellKey,
    state: AtomicU64,
    /// A read's answer, put here before the ring that hands it over.
    answer: Mutex<Option<Answer>>,
}

/// A read's answer through a doorbell: what the dispatcher's `Data` reply would carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The value's type.
    pub ty: TensorType,
    /// Its data.
    pub data: Elements,
    /// The receipt the client sends back with its next read ([`crate::Request::Get`]'s `read`).
    pub receipt: u64,
}

/// Every doorbell of this process, by key (weak: a dropped client's bell is gone).
fn registry() -> &'static Mutex<HashMap<DoorbellKey, Weak<Doorbell>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<DoorbellKey, Weak<Doorbell>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<DoorbellKey, Weak<Doorbell>>> {
    // The map is consistent after every operation on it, so a poisoned lock is still usable.
    registry().lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// 64 unpredictable bits: SipHash of a counter under a randomly keyed `RandomState` (the
/// standard library seeds it from the operating system).
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// 128 fresh random bits that `taken` says no one holds (a doorbell's or a lane's key).
pub(crate) fn fresh_key(taken: impl Fn([u64; 2]) -> bool) -> [u64; 2] {
    loop {
        let key = [random_u64(), random_u64()];
        if !taken(key) {
            return key;
        }
    }
}

impl Doorbell {
    /// A new doorbell under a fresh random key, registered in this process.
    pub fn register() -> Arc<Doorbell> {
        let mut map = lock();
        let key = DoorbellKey(fresh_key(|k| map.contains_key(&DoorbellKey(k))));
        let bell = Arc::new(Doorbell { key, state: AtomicU64::new(0), answer: Mutex::new(None) });
        map.insert(key, Arc::downgrade(&bell));
        bell
    }

    /// Its key, for the client's `Hello`.
    pub fn key(&self) -> DoorbellKey {
        self.key
    }

    /// The client is about to ask for sync `seq`: a ring for it is taken from now on.
    pub fn arm(&self, seq: u64) {
        let mut slot = self.slot();
        // (Empty unless an answer was rung and never taken.)
        *slot = None;
        self.state.store(word(seq, WAITING), Ordering::SeqCst);
    }

    /// Whether sync `seq` was rung.
    pub fn rung(&self, seq: u64) -> bool {
        self.state.load(Ordering::Acquire) == word(seq, RUNG)
    }

    /// The client stops watching the bell for `seq` (it is going to sleep on its socket):
    /// from now on the worker cannot ring it, so the dispatcher answers. `true` when it was
    /// rung already (the sync is done).
    pub fn decline(&self, seq: u64) -> bool {
        match self.state.compare_exchange(word(seq, WAITING), word(seq, DECLINED), Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => false,
            Err(now) => now == word(seq, RUNG),
        }
    }

    /// The answer of read `seq`, once it was rung ([`ring_with`]); `None` before, or for a
    /// sync.
    pub fn take_answer(&self, seq: u64) -> Option<Answer> {
        if !self.rung(seq) {
            return None;
        }
        self.slot().take()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Answer>> {
        // An `Option` is whole after every operation on it, so a poisoned lock is still usable.
        self.answer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn ring(&self, seq: u64) -> bool {
        self.state.compare_exchange(word(seq, WAITING), word(seq, RUNG), Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// Declines `seq` for the dispatcher: `true` when it had rung (its client has the answer).
    /// A client armed for a later wait is past `seq`: it waits for one thing at a time, and
    /// the dispatcher, revoking, never answered `seq`, so the bell did (or the client gave up
    /// on it).
    fn revoke(&self, seq: u64) -> bool {
        let now =
            self.state.compare_exchange(word(seq, WAITING), word(seq, DECLINED), Ordering::SeqCst, Ordering::SeqCst);
        match now {
            Ok(_) => false,
            Err(now) => now == word(seq, RUNG) || now >> 2 > word(seq, 0) >> 2,
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        let mut map = lock();
        // Only this bell's entry: a dead weak under its key is this one.
        if map.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&self.key);
        }
    }
}

fn find(key: DoorbellKey) -> Option<Arc<Doorbell>> {
    lock().get(&key).and_then(Weak::upgrade)
}

/// This process's own key: a worker names it when it registers, and the dispatcher hands
/// doorbells only to workers that name its own (so in its process), and believes only them
/// when they say they rang one. Never sent anywhere else, so nobody outside can name it.
pub fn process_key() -> DoorbellKey {
    static KEY: OnceLock<DoorbellKey> = OnceLock::new();
    *KEY.get_or_init(|| DoorbellKey([random_u64(), random_u64()]))
}

/// Rings the doorbell `key` for sync `seq`, if it is in this process and its client still
/// waits for that sync: `true` when the client now has its answer.
pub fn ring(key: DoorbellKey, seq: u64) -> bool {
    find(key).is_some_and(|b| b.ring(seq))
}

/// Rings the doorbell `key` for read `seq` with its answer, as [`ring`]; the answer comes
/// back when the bell did not ring (it goes by the dispatcher then).
pub fn ring_with(key: DoorbellKey, seq: u64, answer: Answer) -> Result<(), Answer> {
    let Some(bell) = find(key) else { return Err(answer) };
    // The slot is held across the ring, and filled only by the ring that won: a client that
    // sees the ring waits on the lock for the answer, and no other ring (a stale worker's,
    // for another seq) can touch it.
    let mut slot = bell.slot();
    if bell.ring(seq) {
        *slot = Some(answer);
        Ok(())
    } else {
        Err(answer)
    }
}

/// For a dispatcher about to answer wait `seq` itself (it fails it): makes sure the bell
/// `key` cannot ring for it any more. `true` when it had rung already: the client has its
/// answer, and nothing more is sent.
pub fn revoke(key: DoorbellKey, seq: u64) -> bool {
    find(key).is_some_and(|b| b.revoke(seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_is_answered_once_by_the_bell_or_by_the_socket() {
        let bell = Doorbell::register();
        let key = bell.key();
        // Rung while the client waits: the client sees it, and a decline after says so.
        bell.arm(7);
        assert!(!bell.rung(7));
        assert!(ring(key, 7));
        assert!(bell.rung(7));
        assert!(bell.decline(7));
        // A second ring of the same sync, or a ring of another, does nothing.
        assert!(!ring(key, 7));
        bell.arm(8);
        assert!(!ring(key, 7));
        assert!(!ring(key, 9));
        // Declined first: the ring fails, so the dispatcher answers.
        assert!(!bell.decline(8));
        assert!(!ring(key, 8));
        assert!(!bell.rung(8));
        // Not armed (a fresh bell): nothing rings.
        let other = Doorbell::register();
        assert_ne!(other.key(), key);
        assert!(!ring(other.key(), 0));
    }

    #[test]
    fn a_dropped_or_unknown_bell_does_not_ring() {
        assert_eq!(process_key(), process_key());
        assert_ne!(process_key(), DoorbellKey([0, 0]));
        let bell = Doorbell::register();
        let key = bell.key();
        bell.arm(1);
        drop(bell);
        assert!(!ring(key, 1));
        assert!(!lock().contains_key(&key));
        assert!(!ring(DoorbellKey([1, 2]), 1));
    }

    #[test]
    fn a_reads_answer_goes_with_its_ring_or_comes_back() {
        let bell = Doorbell::register();
        let answer = Answer { ty: TensorType::f32(vec![2]), data: Elements::F32(vec![1.0, 2.0]), receipt: 9 };
        bell.arm(3);
        assert_eq!(bell.take_answer(3), None, "not rung yet");
        assert_eq!(ring_with(bell.key(), 3, answer.clone()), Ok(()));
        assert_eq!(bell.take_answer(3), Some(answer.clone()));
        assert_eq!(bell.take_answer(3), None, "taken once");
        // Declined, or another seq: the answer comes back whole and the slot stays empty.
        bell.arm(4);
        assert!(!bell.decline(4));
        assert_eq!(ring_with(bell.key(), 4, answer.clone()), Err(answer.clone()));
        assert_eq!(ring_with(bell.key(), 5, answer.clone()), Err(answer.clone()));
        assert_eq!(ring_with(DoorbellKey([0, 0]), 4, answer.clone()), Err(answer));
        assert!(bell.slot().is_none());
        // Revoked by the dispatcher: before a ring, the ring fails; after one, it says so.
        bell.arm(6);
        assert!(!revoke(bell.key(), 6));
        assert!(!ring(bell.key(), 6));
        bell.arm(7);
        assert!(ring(bell.key(), 7));
        assert!(revoke(bell.key(), 7));
        assert!(!revoke(DoorbellKey([0, 0]), 7));
        // Rung, and the client already waits for a later one: still rung for the dispatcher.
        bell.arm(9);
        assert!(revoke(bell.key(), 7));
        assert!(!revoke(bell.key(), 9));
        assert!(!ring(bell.key(), 9));
    }

    #[test]
    fn rings_race_declines_and_exactly_one_wins() {
        for seq in 0..2000u64 {
            let bell = Doorbell::register();
            bell.arm(seq);
            let key = bell.key();
            let ringer = std::thread::spawn(move || ring(key, seq));
            let rung_first = bell.decline(seq);
            let rang = ringer.join().unwrap();
            assert_eq!(rang, rung_first, "seq {seq}: the worker and the client disagree on who answered");
        }
    }
}
