//! The dispatcher's bookkeeping of each worker: the instructions queued for its next batch,
//! the batches it has not answered, and its buffer ids (allocated and recycled here). No I/O.

use super::namespace::{Buffer, Charge};
use gt_ir::Instr;
use std::collections::{HashMap, VecDeque};

/// A batch sent to a worker and not yet answered.
pub(super) struct Batch {
    pub number: u64,
    /// (client, seq) of each instruction.
    pub origins: Vec<(u64, u64)>,
    /// Per client, the instructions and literal bytes of the batch (credit given back when
    /// it is done).
    pub charges: HashMap<u64, Charge>,
    /// A `Sync` to answer when the batch is done.
    pub sync: Option<(u64, u64)>,
}

pub(super) struct Worker {
    pub identity: Vec<u8>,
    pub name: String,
    pub backend: String,
    pub alive: bool,
    pub pending: Vec<Instr>,
    pub pending_origins: Vec<(u64, u64)>,
    pub inflight: VecDeque<Batch>,
    next_batch: u64,
    free_bufs: Vec<Buffer>,
    next_buf: u32,
    /// Clients whose home it is.
    pub clients: usize,
}

impl Worker {
    pub fn new(identity: Vec<u8>, name: String, backend: String) -> Worker {
        Worker {
            identity,
            name,
            backend,
            alive: true,
            pending: Vec::new(),
            pending_origins: Vec::new(),
            inflight: VecDeque::new(),
            next_batch: 1,
            free_bufs: Vec::new(),
            next_buf: 0,
            clients: 0,
        }
    }

    /// Queues an instruction (already in this worker's buffer ids) for the next batch.
    pub fn queue(&mut self, instr: Instr, origin: (u64, u64)) {
        debug_assert!(!matches!(instr, Instr::Free { .. }), "frees go through queue_free");
        self.pending.push(instr);
        self.pending_origins.push(origin);
    }

    /// Queues freeing `buf` and gives it back for reuse (safe at once: the worker runs its
    /// stream in order).
    pub fn queue_free(&mut self, buf: Buffer, origin: (u64, u64)) {
        self.free_bufs.push(buf);
        self.pending.push(Instr::Free { src: buf.into() });
        self.pending_origins.push(origin);
    }

    pub fn alloc(&mut self) -> Buffer {
        self.free_bufs.pop().unwrap_or_else(|| {
            // 2^32 values live on one worker at once cannot happen within any memory; if it
            // did, ids must not wrap onto live buffers (the panic costs only this client).
            self.next_buf = self.next_buf.checked_add(1).expect("a worker's buffer ids ran out (2^32 live values)");
            Buffer(self.next_buf - 1)
        })
    }

    /// Takes what is queued as the next batch: its number, instructions and origins.
    pub fn take_batch(&mut self) -> (u64, Vec<Instr>, Vec<(u64, u64)>) {
        let number = self.next_batch;
        self.next_batch += 1;
        (number, std::mem::take(&mut self.pending), std::mem::take(&mut self.pending_origins))
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
        let literal = if let Instr::Literal { data, .. } = instr { data.len() as u64 * 4 } else { 0 };
        let charge = charges.entry(*c).or_default();
        charge.instrs += 1;
        charge.bytes += literal;
    }
    charges
}
