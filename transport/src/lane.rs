//! Lanes: how an embedded client or worker and its dispatcher hand each other messages
//! through in-process queues instead of `inproc://` ZeroMQ, which costs a mailbox system
//! call or two per message and per empty poll (a lane costs none while its receiver spins).
//! The hot messages (a client's requests, the dispatcher's commands to a worker, a worker's
//! events) go through a lane as they are ([`Parcel`]): never encoded into msgpack and decoded
//! again, and a batch's literals stay in it, moved, not lent as frames.
//!
//! A peer in the dispatcher's process offers a lane ([`offer`]: its own [`Inbox`], under a
//! random [`LaneKey`]) and names the key in its `Hello` or `Register`, sent over its socket as
//! usual. The dispatcher, when it welcomes the peer, [`accept`]s: it takes the peer's
//! [`Outbox`], leaves its own inbox's outbox and the peer's routing id in the offer, and sends
//! the welcome over the socket. From the welcome on, every message either way goes by the lane
//! (the frames a socket would carry: from a peer its routing id first, as a ROUTER receives
//! them), so each direction keeps one order. The sockets stay: a receiver about to sleep says
//! so ([`Inbox::sleep`]) and sleeps on its socket, and a sender that finds it asleep
//! ([`Outbox::push`] answers `true`) sends it an empty message there to wake it. Both sides
//! fence between their store and their load, so either the sender sees the receiver asleep
//! or the receiver sees the message; a receiver also sleeps with a timeout (a wake that
//! could not be sent costs that much, never a hang).
//!
//! A key is 128 random bits, so a peer of another process (which cannot be given a lane)
//! cannot name another's.

use crate::doorbell::fresh_key;
use crate::message::{Inbound, WorkerCommand};
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The name a peer's lane offer is registered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LaneKey(pub [u64; 2]);

/// One message's frames, as a socket would carry them.
pub type Frames = Vec<zmq::Message>;

/// One message through a lane.
#[derive(Debug, PartialEq)]
pub enum Parcel {
    /// Its frames, as a socket would carry them (into the dispatcher's inbox, the sender's
    /// routing id first).
    Frames(Frames),
    /// A peer's message to the dispatcher, as it is: the peer's routing id and the message.
    Inbound(Vec<u8>, Inbound),
    /// The dispatcher's command to a worker, as it is.
    Command(WorkerCommand),
}

/// The other end is gone (its thread ended or let go of the lane).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the other end of the lane is gone")]
pub struct Gone;

#[derive(Debug, Default)]
struct Sleep {
    asleep: AtomicBool,
}

/// The receiving end of a lane; one thread at a time reads it.
#[derive(Debug)]
pub struct Inbox {
    rx: Receiver<Parcel>,
    sleep: Arc<Sleep>,
}

/// A sending end of someone's [`Inbox`] (clone it for more senders).
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: Sender<Parcel>,
    sleep: Arc<Sleep>,
}

/// A new inbox and its first outbox.
pub fn inbox() -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel();
    let sleep = Arc::new(Sleep::default());
    (Outbox { tx, sleep: Arc::clone(&sleep) }, Inbox { rx, sleep })
}

impl Outbox {
    /// Queues `parcel`, and wakes a receiver asleep on its socket by `wake` (which sends it
    /// an empty message there). A wake that cannot be sent is let go: the message is queued,
    /// and the receiver's sleep is bounded.
    pub fn send(&self, parcel: Parcel, wake: impl FnOnce() -> zmq::Result<()>) -> Result<(), Gone> {
        if self.push(parcel)? {
            let _ = wake();
        }
        Ok(())
    }

    /// Queues `parcel`; `Ok(true)` when the receiver was asleep, so the caller must wake it
    /// (an empty message on its socket). Only one sender is told so per sleep.
    pub fn push(&self, parcel: Parcel) -> Result<bool, Gone> {
        self.tx.send(parcel).map_err(|_| Gone)?;
        // The message is queued before the flag is read (see `Inbox::sleep`).
        fence(Ordering::SeqCst);
        Ok(self.sleep.asleep.load(Ordering::Relaxed) && self.sleep.asleep.swap(false, Ordering::SeqCst))
    }
}

impl Inbox {
    /// The next message, if one is here.
    pub fn try_recv(&self) -> Result<Option<Parcel>, Gone> {
        match self.rx.try_recv() {
            Ok(parcel) => Ok(Some(parcel)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(Gone),
        }
    }

    /// Before sleeping on the socket: says so, then looks once more. A message found (one
    /// pushed before the sender could see the flag) ends the sleep before it began.
    pub fn sleep(&self) -> Result<Option<Parcel>, Gone> {
        self.sleep.asleep.store(true, Ordering::SeqCst);
        // The flag is set before the queue is read (see `Outbox::push`).
        fence(Ordering::SeqCst);
        let got = self.try_recv();
        if !matches!(got, Ok(None)) {
            self.woke();
        }
        got
    }

    /// Awake again (the sleep on the socket ended): senders need not wake it.
    pub fn woke(&self) {
        self.sleep.asleep.store(false, Ordering::SeqCst);
    }
}

/// A peer's offer of a lane, registered in this process while it lives.
#[derive(Debug)]
pub struct Offer {
    key: LaneKey,
    /// The way into the peer's inbox, for the dispatcher.
    to_peer: Outbox,
    /// Filled by [`accept`]: the way into the dispatcher's inbox, and the routing id the
    /// peer's messages are to start with.
    accepted: Mutex<Option<(Outbox, Vec<u8>)>>,
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<LaneKey, Weak<Offer>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<LaneKey, Weak<Offer>>>> = OnceLock::new();
    // The map is whole after every operation on it, so a poisoned lock is still usable.
    REGISTRY.get_or_init(Mutex::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Offers a lane into a fresh inbox, registered under a fresh key: the offer (its key goes
/// in the peer's first message) and the inbox the peer reads from the welcome on.
pub fn offer() -> (Arc<Offer>, Inbox) {
    let (to_peer, inbox) = inbox();
    let mut map = registry();
    let key = LaneKey(fresh_key(|k| map.contains_key(&LaneKey(k))));
    let offer = Arc::new(Offer { key, to_peer, accepted: Mutex::new(None) });
    map.insert(key, Arc::downgrade(&offer));
    (offer, inbox)
}

impl Offer {
    /// Its key, for the peer's `Hello` or `Register`.
    pub fn key(&self) -> LaneKey {
        self.key
    }

    /// After the welcome: the way into the dispatcher's inbox and the peer's routing id,
    /// when the dispatcher took the lane (else the peer goes on by its socket).
    pub fn accepted(&self) -> Option<(Outbox, Vec<u8>)> {
        self.accepted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        let mut map = registry();
        if map.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&self.key);
        }
    }
}

/// The dispatcher takes the lane offered under `key` by the peer whose routing id is
/// `identity`, giving it `to_dispatcher`: the way into the peer's inbox, or `None` when no
/// such offer lives in this process (a peer of another process, or one that left). An offer
/// is taken once.
pub fn accept(key: LaneKey, to_dispatcher: &Outbox, identity: &[u8]) -> Option<Outbox> {
    let offer = registry().remove(&key)?.upgrade()?;
    *offer.accepted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
        Some((to_dispatcher.clone(), identity.to_vec()));
    Some(offer.to_peer.clone())
}

/// The frames of one message into a lane: `head` (an encoded message) and `data` frames
/// after it, each a ZeroMQ message as a socket would carry them, moved, not copied.
pub fn frames(first: Option<&[u8]>, head: Vec<u8>, data: impl IntoIterator<Item = zmq::Message>) -> Parcel {
    let mut frames = Vec::with_capacity(3);
    frames.extend(first.map(zmq::Message::from));
    frames.push(zmq::Message::from(head));
    frames.extend(data);
    Parcel::Frames(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(text: &str) -> Parcel {
        Parcel::Frames(vec![zmq::Message::from(text.as_bytes())])
    }

    fn frames_of(parcel: Option<Parcel>) -> Frames {
        match parcel {
            Some(Parcel::Frames(frames)) => frames,
            other => panic!("expected frames, got {other:?}"),
        }
    }

    #[test]
    fn an_offer_is_taken_once_and_carries_messages_both_ways() {
        let (offer, peer_inbox) = offer();
        let (to_dispatcher, dispatcher_inbox) = inbox();
        // Another process's key, or a made-up one, finds nothing.
        assert!(accept(LaneKey([1, 2]), &to_dispatcher, b"x").is_none());
        let to_peer = accept(offer.key(), &to_dispatcher, b"peer-1").expect("offered here");
        assert!(accept(offer.key(), &to_dispatcher, b"peer-1").is_none(), "taken once");
        let (back, identity) = offer.accepted().expect("accepted");
        assert_eq!(identity, b"peer-1");
        assert!(!to_peer.push(msg("welcome")).unwrap());
        assert_eq!(&frames_of(peer_inbox.try_recv().unwrap())[0][..], b"welcome");
        assert!(!back.push(frames(Some(&identity), b"hi".to_vec(), [zmq::Message::from(&b"data"[..])])).unwrap());
        let got = frames_of(dispatcher_inbox.try_recv().unwrap());
        assert_eq!(got.iter().map(|f| f.to_vec()).collect::<Vec<_>>(), [&b"peer-1"[..], b"hi", b"data"]);
        assert!(peer_inbox.try_recv().unwrap().is_none());
        // A message handed over as it is arrives as it was sent.
        let batch = Inbound::Client(crate::message::Request::Sync { seq: 7 });
        assert!(!back.push(Parcel::Inbound(identity.clone(), batch.clone())).unwrap());
        assert_eq!(dispatcher_inbox.try_recv().unwrap(), Some(Parcel::Inbound(identity, batch)));
        assert!(!to_peer.push(Parcel::Command(WorkerCommand::Ping)).unwrap());
        assert_eq!(peer_inbox.try_recv().unwrap(), Some(Parcel::Command(WorkerCommand::Ping)));
        // A dropped offer is gone from the registry.
        let (other, _inbox) = self::offer();
        let key = other.key();
        drop(other);
        assert!(accept(key, &to_dispatcher, b"y").is_none());
    }

    #[test]
    fn a_sender_is_told_to_wake_a_sleeping_receiver_once() {
        let (out, inbox) = inbox();
        let second = out.clone();
        assert!(inbox.sleep().unwrap().is_none());
        assert!(out.push(msg("a")).unwrap(), "asleep: wake it");
        assert!(!second.push(msg("b")).unwrap(), "woken already");
        inbox.woke();
        assert_eq!(&frames_of(inbox.try_recv().unwrap())[0][..], b"a");
        // A message already there ends the sleep before it begins, and nobody must wake it.
        assert!(inbox.sleep().unwrap().is_some());
        assert!(!out.push(msg("c")).unwrap());
        drop((out, second));
        assert!(inbox.try_recv().unwrap().is_some());
        assert_eq!(inbox.try_recv(), Err(Gone));
        let (out, inbox) = self::inbox();
        drop(inbox);
        assert_eq!(out.push(msg("d")), Err(Gone));
    }

    /// The sleeper's protocol under races: a receiver that sleeps (here: waits on a channel
    /// standing for its socket) whenever its inbox looks empty is always woken or finds the
    /// message, over many messages from two senders.
    #[test]
    fn no_message_is_left_unseen_by_a_sleeping_receiver() {
        let (out, inbox) = inbox();
        let (wake_tx, wake_rx) = mpsc::channel::<()>();
        let n = 20_000;
        let senders: Vec<_> = (0..2)
            .map(|_| {
                let (out, wake) = (out.clone(), wake_tx.clone());
                std::thread::spawn(move || {
                    for i in 0..n {
                        if out.push(msg("m")).unwrap() {
                            wake.send(()).unwrap();
                        }
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        drop((out, wake_tx));
        let mut got = 0;
        while got < 2 * n {
            match inbox.try_recv().unwrap() {
                Some(_) => got += 1,
                None => match inbox.sleep().unwrap() {
                    Some(_) => got += 1,
                    None => {
                        // A lost wake would hang here: the bound makes it a failure instead.
                        wake_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("woken");
                        inbox.woke();
                    }
                },
            }
        }
        for s in senders {
            s.join().unwrap();
        }
    }
}
