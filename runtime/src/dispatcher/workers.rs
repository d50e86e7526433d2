//! The dispatcher's bookkeeping of each worker: the instructions queued for its next batch,
//! the batches it has not answered, its buffer ids (allocated and recycled here), its peer
//! address for collectives and its clock as seen from the dispatcher's ([`Clock`]). No I/O.

use super::namespace::{Buffer, Charge};
use super::profile::Facts;
use foldhash::{HashMap, HashMapExt};
use gt_ir::Instr;
use gt_transport::message::Exchange;
use std::collections::VecDeque;

/// A batch sent to a worker and not yet answered.
pub(super) struct Batch {
    pub number: u64,
    /// (client, seq) of each instruction.
    pub origins: Vec<(u64, u64)>,
    /// Per client, the instructions and literal bytes of the batch (credit given back when
    /// it is done).
    pub charges: HashMap<u64, Charge>,
    /// A wait (a `Sync`, or a read's barrier) that this batch being done counts towards.
    pub wait: Option<u64>,
    /// Its parts of collectives across workers: (index in the batch, collective id).
    pub exchanges: Vec<(u32, u64)>,
    /// For a timed batch (someone reads the log), what its EXEC events say of each
    /// instruction.
    pub notes: Option<Vec<ExecNote>>,
    /// When it was sent (the log's clock).
    pub sent: u64,
}

/// Instructions for a worker, in its buffer ids, with the (client, seq) each came from and,
/// while timing (someone reads the log, or a profile is written), its types and cost (else
/// nothing): a worker's queue, and a batch taken from it.
#[derive(Default)]
pub(super) struct Queued {
    pub instrs: Vec<Instr>,
    pub origins: Vec<(u64, u64)>,
    /// Empty while nothing is kept (no cost per instruction then); else one per instruction
    /// (defaults for those queued before facts were kept, and for frees).
    pub facts: Vec<Facts>,
    /// The instructions that are parts of collectives across workers (`index` into `instrs`:
    /// a queue only ever leaves whole, so the index is the batch's).
    pub exchanges: Vec<Exchange>,
    /// How many of `instrs` are literals that travel as frames of their own: a batch leaves
    /// before it holds more than one message carries.
    pub literal_frames: usize,
}

impl Queued {
    /// Keeps the facts of the instruction about to be queued: `None` (nothing kept, or a
    /// free) costs nothing until some instruction's facts are kept.
    fn keep(&mut self, facts: Option<Facts>) {
        match facts {
            Some(facts) => {
                self.facts.resize_with(self.instrs.len(), Facts::default);
                self.facts.push(facts);
            }
            None if !self.facts.is_empty() => self.facts.push(Facts::default()),
            None => {}
        }
    }
}

/// What an EXEC event says of an instruction besides its timing.
pub(super) struct ExecNote {
    pub op: &'static str,
    /// Its types and cost (no types for a free).
    pub facts: Facts,
    /// Its text, in buffer ids.
    pub text: String,
    /// For a part of a collective across workers, which one and with whom
    /// (`collective #ID rank R of W0, W1`).
    pub exchange: Option<String>,
}

pub(super) struct Worker {
    pub identity: Vec<u8>,
    pub name: String,
    pub backend: String,
    /// Where its peers reach it for collectives (its `Register`).
    pub peer: String,
    pub alive: bool,
    /// When (the log's clock) its last memory `STATUS` event was written: one per probe
    /// interval at most, as a gauge (a loop of tiny batches wrote one per batch).
    pub memory_logged_at: Option<u64>,
    /// It runs in the dispatcher's process (its `Register` named this process's key): it
    /// may answer clients' waits through their doorbells.
    pub local: bool,
    /// What goes in its next batch.
    pub pending: Queued,
    pub inflight: VecDeque<Batch>,
    next_batch: u64,
    free_bufs: Vec<Buffer>,
    next_buf: u32,
    /// Clients whose home it is.
    pub clients: usize,
    /// Its clock, for putting its timings on the dispatcher's timeline.
    pub clock: Clock,
}

impl Worker {
    pub fn new(identity: Vec<u8>, (name, backend, peer): (String, String, String), clock: Clock) -> Worker {
        Worker {
            identity,
            name,
            backend,
            peer,
            alive: true,
            memory_logged_at: None,
            local: false,
            pending: Queued::default(),
            inflight: VecDeque::new(),
            next_batch: 1,
            free_bufs: Vec::new(),
            next_buf: 0,
            clients: 0,
            clock,
        }
    }

    /// Queues an instruction (already in this worker's buffer ids) for the next batch.
    pub fn queue(&mut self, instr: Instr, origin: (u64, u64), facts: Option<Facts>) {
        debug_assert!(!matches!(instr, Instr::Free { .. }), "frees go through queue_free");
        self.pending.literal_frames += usize::from(gt_transport::codec::is_detached_literal(&instr));
        self.pending.keep(facts);
        self.pending.instrs.push(instr);
        self.pending.origins.push(origin);
    }

    /// Queues its part of a collective across workers (in its buffer ids); `ex.index` is
    /// set here.
    pub fn queue_exchange(&mut self, instr: Instr, mut ex: Exchange, origin: (u64, u64), facts: Option<Facts>) {
        ex.index = u32::try_from(self.pending.instrs.len()).unwrap_or(u32::MAX);
        self.pending.exchanges.push(ex);
        self.queue(instr, origin, facts);
    }

    /// Queues freeing `buf` and gives it back for reuse (safe at once: the worker runs its
    /// stream in order).
    pub fn queue_free(&mut self, buf: Buffer, origin: (u64, u64)) {
        self.free_bufs.push(buf);
        self.pending.keep(None);
        self.pending.instrs.push(Instr::Free { src: buf.into() });
        self.pending.origins.push(origin);
    }

    pub fn alloc(&mut self) -> Buffer {
        self.free_bufs.pop().unwrap_or_else(|| {
            // 2^32 values live on one worker at once cannot happen within any memory; if it
            // did, ids must not wrap onto live buffers (the panic costs only this client).
            self.next_buf = self.next_buf.checked_add(1).expect("a worker's buffer ids ran out (2^32 live values)");
            Buffer(self.next_buf - 1)
        })
    }

    /// Takes what is queued as the next batch, with its number.
    pub fn take_batch(&mut self) -> (u64, Queued) {
        let number = self.next_batch;
        self.next_batch += 1;
        // The next queue sized as this one was: a burst of small ops fills it without the
        // copies of doubling (bounded, so one large batch does not stay reserved).
        let size = self.pending.instrs.len().min(4096);
        let facts = if self.pending.facts.is_empty() { 0 } else { size };
        let next = Queued {
            instrs: Vec::with_capacity(size),
            origins: Vec::with_capacity(size),
            facts: Vec::with_capacity(facts),
            exchanges: Vec::new(),
            literal_frames: 0,
        };
        (number, std::mem::replace(&mut self.pending, next))
    }
}

/// A worker's clock as seen from the dispatcher's: the offset to add to a worker time
/// (nanoseconds since the worker started) to get dispatcher time (nanoseconds since the
/// dispatcher started). Estimated as NTP does from each ping's round trip (the worker's
/// reading is taken to be halfway), keeping the sample with the shortest round trip, whose
/// error bound is smallest, unless it is old (clocks drift; a worker busy with a long batch
/// answers late, so its slow samples are passed over). The first estimate comes from the
/// registration, whose one-way delay is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    offset: i128,
    /// The round trip of the sample in use (`u64::MAX`: only the registration's).
    rtt: u64,
    /// When (dispatcher time) that sample was taken.
    at: u64,
    /// When the unanswered ping went out.
    ping: Option<u64>,
}

impl Clock {
    /// A sample older than this (ns) is replaced by the next one, however slow.
    const STALE: u64 = 10_000_000_000;

    /// The estimate from a registration: sent at `worker` time, received at `now`.
    pub fn registered(worker: u64, now: u64) -> Clock {
        Clock { offset: now as i128 - worker as i128, rtt: u64::MAX, at: now, ping: None }
    }

    /// A ping went out at `now`.
    pub fn pinged(&mut self, now: u64) {
        self.ping.get_or_insert(now);
    }

    /// The answer to the last ping, read at `worker` time, arrived at `now`.
    pub fn ponged(&mut self, worker: u64, now: u64) {
        let Some(sent) = self.ping.take() else { return };
        let rtt = now.saturating_sub(sent);
        if rtt <= self.rtt || now.saturating_sub(self.at) > Clock::STALE {
            let midpoint = sent as i128 + rtt as i128 / 2;
            *self = Clock { offset: midpoint - worker as i128, rtt, at: now, ping: None };
        }
    }

    /// A batch sent at `sent` and answered at `done` (dispatcher times) ran from `first`
    /// to `last` (worker times): the worker's clock cannot be so far off that it ran before
    /// it was sent or ended after its answer came. The estimate moves (least) into those
    /// bounds, so the log never shows an instruction outside its batch.
    pub fn bound(&mut self, (sent, done): (u64, u64), (first, last): (u64, u64)) {
        let lowest = sent as i128 - first as i128;
        let highest = done as i128 - last as i128;
        if self.offset < lowest {
            self.offset = lowest;
        } else if self.offset > highest && highest >= lowest {
            self.offset = highest;
        }
    }

    /// A worker time on the dispatcher's clock, in nanoseconds (0 at the earliest).
    pub fn to_dispatcher(self, worker: u64) -> u64 {
        (worker as i128 + self.offset).clamp(0, u64::MAX as i128) as u64
    }
}

/// The live worker with the fewest clients (a new client's home).
pub(super) fn least_loaded(workers: &[Worker]) -> Option<usize> {
    (0..workers.len()).filter(|&w| workers[w].alive).min_by_key(|&w| workers[w].clients)
}

/// What a batch charges each client: its instructions and their literal bytes.
pub(super) fn charges(instrs: &[Instr], origins: &[(u64, u64)]) -> HashMap<u64, Charge> {
    let mut charges: HashMap<u64, Charge> = HashMap::new();
    for (instr, (c, _)) in instrs.iter().zip(origins) {
        let literal = if let Instr::Literal { data, .. } = instr { data.size_bytes() as u64 } else { 0 };
        let charge = charges.entry(*c).or_default();
        charge.instrs += 1;
        charge.bytes += literal;
    }
    charges
}

#[cfg(test)]
mod tests {
    use super::{Clock, Facts, Queued};
    use gt_ir::{Instr, TensorType, ValueId};

    /// A queue keeps no facts while none are given, and one per instruction from the first
    /// given on (defaults for those before it and for the rest without), so that a log
    /// starting mid-batch still finds each instruction's facts at its index.
    #[test]
    fn facts_cost_nothing_until_kept_and_then_follow_the_instructions() {
        let mut q = Queued::default();
        let zeros = |n: u32| Instr::Zeros { dst: ValueId(n), ty: TensorType::f32(vec![1]) };
        let push = |q: &mut Queued, n: u32, facts: Option<Facts>| {
            q.keep(facts);
            q.instrs.push(zeros(n));
        };
        push(&mut q, 0, None);
        push(&mut q, 1, None);
        assert!(q.facts.is_empty());
        let kept = Facts { hash: 7, ..Facts::default() };
        push(&mut q, 2, Some(kept));
        push(&mut q, 3, None);
        let hashes: Vec<u64> = q.facts.iter().map(|f| f.hash).collect();
        assert_eq!(hashes, [0, 0, 7, 0]);
    }

    #[test]
    fn the_clock_keeps_the_sample_with_the_shortest_round_trip() {
        // The worker started 5 ms after the dispatcher: worker t = dispatcher t - 5 ms.
        let truth = |worker: u64| worker + 5_000_000;
        // Registration: one-way delay of 300 us, counted as offset error.
        let mut c = Clock::registered(1_000_000, 6_300_000);
        assert_eq!(c.to_dispatcher(1_000_000), 6_300_000);
        // A ping answered in 100 us, the worker reading taken halfway: exact.
        c.pinged(10_000_000);
        c.ponged(5_050_000, 10_100_000);
        assert_eq!(c.to_dispatcher(2_000_000), truth(2_000_000));
        // A slow answer (a busy worker: it read its clock 4 ms after the ping came) is not used.
        c.pinged(20_000_000);
        c.ponged(19_000_000, 24_000_000);
        assert_eq!(c.to_dispatcher(2_000_000), truth(2_000_000));
        // An answer with no ping out is ignored; so is a second answer.
        c.ponged(0, 30_000_000);
        assert_eq!(c.to_dispatcher(2_000_000), truth(2_000_000));
        // Once the sample is stale, the next one replaces it even if slower.
        c.pinged(20_000_000_000);
        c.ponged(19_995_100_000, 20_000_400_000);
        assert_eq!(c.to_dispatcher(0), 5_100_000);
        // A batch sent at 30 ms that the worker says began at 24.9 ms: the clock is 0.1 ms
        // behind at least.
        let mut c = Clock::registered(0, 5_000_000);
        c.bound((30_000_000, 31_000_000), (24_900_000, 25_000_000));
        assert_eq!(c.to_dispatcher(24_900_000), 30_000_000);
        // Inside the bounds: unchanged.
        c.bound((0, 100_000_000), (1_000, 2_000));
        assert_eq!(c.to_dispatcher(24_900_000), 30_000_000);
        // A clock estimated 1 ms ahead: a batch answered at 41 ms that ended at 35.5 ms.
        let mut c = Clock::registered(0, 6_500_000);
        c.bound((40_000_000, 41_000_000), (34_500_000, 35_500_000));
        assert_eq!(c.to_dispatcher(35_500_000), 41_000_000);
        // Times before the dispatcher started clamp to 0.
        assert_eq!(Clock::registered(10, 0).to_dispatcher(0), 0);
    }
}
