//! One client's value namespace: which worker buffer holds each of its values, what they
//! weigh, and the credit it has in flight. Pure bookkeeping (no I/O); the dispatcher turns
//! what it answers into replies and worker commands.
//!
//! # Invariants
//! - A client can only name its own values: every id it sends is looked up here, in a map
//!   no other client reaches, and renamed to a [`Buffer`] only once found live.
//! - `bytes` is the sum of the sizes of the live values; only `Namespace::set` changes
//!   either, so the two cannot drift apart (and the count cannot underflow).

use foldhash::HashMap;
use gt_ir::{TensorType, ValueId};
use std::fmt;

/// A buffer on a worker: the worker's own value id, which a client's [`ValueId`] is renamed
/// to. A separate type so the two id spaces cannot be confused; it becomes a `ValueId` only
/// in an instruction renamed for the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer(pub u32);

impl From<Buffer> for ValueId {
    fn from(buf: Buffer) -> ValueId {
        ValueId(buf.0)
    }
}

impl fmt::Display for Buffer {
    /// As the worker prints it (its stream's value id).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        ValueId::from(*self).fmt(f)
    }
}

/// Where a live value is: its worker (an index into the dispatcher's workers) and buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub worker: usize,
    pub buf: Buffer,
}

/// Instructions and literal bytes sent to workers and not yet run: a client's credit used,
/// or what one batch charged it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    pub instrs: u64,
    pub bytes: u64,
}

/// What a client may hold and have in flight.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes its live values may hold (`GT_CLIENT_MEMORY`).
    pub memory: u64,
    /// Instructions in flight (`GT_CLIENT_CREDIT`).
    pub credit: u64,
    /// Literal bytes in flight.
    pub credit_bytes: u64,
}

/// A value an instruction names that it cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("value {value} is not defined (never created, or freed)")]
    Undefined { value: ValueId },
    #[error("reads {value}, which was not computed because instruction #{seq} failed")]
    NotComputed { value: ValueId, seq: u64 },
}

/// Why an instruction may not run now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("results need {needed} bytes with {held} bytes held, over this client's memory quota of {quota} (GT_CLIENT_MEMORY)")]
    Memory { needed: u64, held: u64, quota: u64 },
    #[error("this client has {instrs} instructions ({bytes} bytes of data) sent and not yet run, over its credit of {credit} instructions or {credit_bytes} bytes (GT_CLIENT_CREDIT): wait for results (a read or a sync) before sending more")]
    Credit { instrs: u64, bytes: u64, credit: u64, credit_bytes: u64 },
}

/// What [`Namespace::define`] did.
#[derive(Debug, Default)]
pub struct Defined {
    /// Each result's buffer, in result order.
    pub bufs: smallvec::SmallVec<[Buffer; 2]>,
    /// Buffers the redefined values held on another worker: to be freed there.
    pub stale: Vec<Location>,
}

/// Where an instruction's operands are (inline for up to four: no allocation per small op).
pub type Locations = smallvec::SmallVec<[Location; 4]>;

/// A client value's state.
#[derive(Debug, Clone)]
enum Slot {
    Live {
        at: Location,
        ty: TensorType,
        /// The client seq of the instruction that defined it.
        seq: u64,
        /// Its buffer held the value this one replaced (a redefinition): if the worker fails
        /// to compute it, that value is still there and must be freed.
        replaced: bool,
    },
    /// The instruction that should have defined it failed (client seq).
    Failed { seq: u64 },
}

/// What a value costs the dispatcher and its worker whatever its size (their bookkeeping:
/// about 900 bytes together, measured): a value is charged at least this against its
/// client's quota, so that a client making empty or tiny values is bounded too.
pub const VALUE_COST: u64 = 1024;

/// The bytes a value of type `ty` is charged against its client's quota.
fn charged(ty: &TensorType) -> u64 {
    (ty.size_bytes() as u64).max(VALUE_COST)
}

impl Slot {
    /// Bytes the value is charged ([`charged`]).
    fn bytes(&self) -> u64 {
        match self {
            Slot::Live { ty, .. } => charged(ty),
            Slot::Failed { .. } => 0,
        }
    }
}

/// One client's values, the bytes they hold, its credit used, its home worker and the
/// workers it has sent work to.
#[derive(Debug, Default)]
pub struct Namespace {
    values: HashMap<ValueId, Slot>,
    /// Bytes its live values are charged (their data, at least [`VALUE_COST`] each;
    /// checked against [`Limits::memory`]).
    bytes: u64,
    inflight: Charge,
    home: Option<usize>,
    /// Every worker it has sent work to, ascending: a wait (sync, read) covers them all.
    workers: Vec<usize>,
}

impl Namespace {
    pub fn new() -> Namespace {
        Namespace::default()
    }

    /// The worker its values live on, once it has one.
    pub fn home(&self) -> Option<usize> {
        self.home
    }

    pub fn set_home(&mut self, worker: usize) {
        self.home = Some(worker);
    }

    /// Work of this client's goes to `worker`.
    pub fn touch(&mut self, worker: usize) {
        if let Err(at) = self.workers.binary_search(&worker) {
            self.workers.insert(at, worker);
        }
    }

    /// The workers it has sent work to, ascending.
    pub fn workers(&self) -> &[usize] {
        &self.workers
    }

    /// Bytes its live values hold.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Its credit used: what it sent to its worker that has not run yet.
    pub fn inflight(&self) -> Charge {
        self.inflight
    }

    /// Values it has named and not freed (live or failed).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Where a live value is, and its type.
    pub fn lookup(&self, value: ValueId) -> Result<(Location, &TensorType), Unavailable> {
        match self.values.get(&value) {
            Some(Slot::Live { at, ty, .. }) => Ok((*at, ty)),
            Some(Slot::Failed { seq }) => Err(Unavailable::NotComputed { value, seq: *seq }),
            None => Err(Unavailable::Undefined { value }),
        }
    }

    /// The type of a live value.
    pub fn type_of(&self, value: ValueId) -> Option<&TensorType> {
        self.lookup(value).ok().map(|(_, ty)| ty)
    }

    /// The instruction whose failure left `value` uncomputed, if it did.
    pub fn failed_by(&self, value: ValueId) -> Option<u64> {
        match self.values.get(&value) {
            Some(Slot::Failed { seq }) => Some(*seq),
            _ => None,
        }
    }

    /// Where each operand is (in order); the first that is not live is the error.
    pub fn operands(&self, operands: &[ValueId]) -> Result<Locations, Unavailable> {
        operands.iter().map(|v| self.lookup(*v).map(|(at, _)| at)).collect()
    }

    /// Whether an instruction defining `results` with `types` may run: within the memory
    /// quota (what the results replace counts as given back) and the credit.
    pub fn admit(&self, results: &[ValueId], types: &[TensorType], limits: &Limits) -> Result<(), Refusal> {
        let replaced: u64 = results.iter().map(|v| self.values.get(v).map_or(0, Slot::bytes)).sum();
        let needed = types.iter().fold(0u64, |n, t| n.saturating_add(charged(t)));
        let after = self.bytes.saturating_sub(replaced).saturating_add(needed);
        if after > limits.memory {
            return Err(Refusal::Memory { needed, held: self.bytes, quota: limits.memory });
        }
        let Charge { instrs, bytes } = self.inflight;
        if instrs >= limits.credit || bytes >= limits.credit_bytes {
            return Err(Refusal::Credit { instrs, bytes, credit: limits.credit, credit_bytes: limits.credit_bytes });
        }
        Ok(())
    }

    /// Defines `results` (typed `types`) on `worker` by instruction `seq`: a value redefined
    /// on the same worker keeps its buffer (repeat loops), any other gets one from `alloc`.
    pub fn define(
        &mut self,
        worker: usize,
        seq: u64,
        results: &[ValueId],
        types: impl IntoIterator<Item = TensorType>,
        alloc: &mut dyn FnMut() -> Buffer,
    ) -> Defined {
        let mut defined = Defined { bufs: smallvec::SmallVec::new(), stale: Vec::new() };
        for (dst, ty) in results.iter().zip(types) {
            let (buf, replaced) = match self.values.get(dst) {
                Some(Slot::Live { at, .. }) if at.worker == worker => (at.buf, true),
                Some(Slot::Live { at, .. }) => {
                    defined.stale.push(*at);
                    (alloc(), false)
                }
                _ => (alloc(), false),
            };
            self.set(*dst, Some(Slot::Live { at: Location { worker, buf }, ty, seq, replaced }));
            defined.bufs.push(buf);
        }
        defined
    }

    /// Marks `results` as not computed because instruction `seq` failed before it was sent;
    /// returns the buffers they held, to be freed.
    pub fn fail(&mut self, results: &[ValueId], seq: u64) -> Vec<Location> {
        let mut freed = Vec::new();
        for dst in results {
            if let Some(Slot::Live { at, .. }) = self.set(*dst, Some(Slot::Failed { seq })) {
                freed.push(at);
            }
        }
        freed
    }

    /// A worker could not run instruction `seq`: its results were never made. Returns the
    /// buffers of those that were redefinitions (they still hold the replaced value, to be
    /// freed).
    pub fn computation_failed(&mut self, seq: u64) -> Vec<Location> {
        let made: Vec<ValueId> = self
            .values
            .iter()
            .filter(|(_, slot)| matches!(slot, Slot::Live { seq: s, .. } if *s == seq))
            .map(|(v, _)| *v)
            .collect();
        let mut freed = Vec::new();
        for v in made {
            if let Some(Slot::Live { at, replaced: true, .. }) = self.set(v, Some(Slot::Failed { seq })) {
                freed.push(at);
            }
        }
        freed
    }

    /// Forgets `value`: returns its buffer if it was live (to be freed), `None` if it was
    /// never computed; an error if it is not defined.
    pub fn free(&mut self, value: ValueId) -> Result<Option<Location>, Unavailable> {
        match self.set(value, None) {
            Some(Slot::Live { at, .. }) => Ok(Some(at)),
            Some(Slot::Failed { .. }) => Ok(None),
            None => Err(Unavailable::Undefined { value }),
        }
    }

    /// The buffers of every live value (the client is gone; they are to be freed).
    pub fn into_buffers(self) -> impl Iterator<Item = Location> {
        self.values.into_values().filter_map(|slot| match slot {
            Slot::Live { at, .. } => Some(at),
            Slot::Failed { .. } => None,
        })
    }

    /// A batch carrying `charge` of this client's work was sent.
    pub fn take_credit(&mut self, charge: Charge) {
        self.inflight.instrs = self.inflight.instrs.saturating_add(charge.instrs);
        self.inflight.bytes = self.inflight.bytes.saturating_add(charge.bytes);
    }

    /// A batch carrying `charge` was done (or lost).
    pub fn return_credit(&mut self, charge: Charge) {
        self.inflight.instrs = self.inflight.instrs.saturating_sub(charge.instrs);
        self.inflight.bytes = self.inflight.bytes.saturating_sub(charge.bytes);
    }

    /// Replaces (or, with `None`, removes) a value's slot, keeping `bytes` the sum of the
    /// live values' sizes; the only place either changes.
    fn set(&mut self, value: ValueId, slot: Option<Slot>) -> Option<Slot> {
        let added = slot.as_ref().map_or(0, Slot::bytes);
        let old = match slot {
            Some(slot) => self.values.insert(value, slot),
            None => self.values.remove(&value),
        };
        let removed = old.as_ref().map_or(0, Slot::bytes);
        self.bytes = self.bytes.saturating_sub(removed).saturating_add(added);
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_LIMITS: Limits = Limits { memory: u64::MAX, credit: u64::MAX, credit_bytes: u64::MAX };

    #[test]
    fn the_workers_a_client_used_are_kept_once_in_order() {
        let mut ns = Namespace::new();
        for w in [2, 0, 2, 1, 0] {
            ns.touch(w);
        }
        assert_eq!(ns.workers(), &[0, 1, 2]);
    }

    fn v(n: u32) -> ValueId {
        ValueId(n)
    }

    /// `n` f32s: `4 * n` bytes.
    fn f32s(n: usize) -> TensorType {
        TensorType::f32(vec![n])
    }

    /// A worker's allocator: fresh buffers from `next`.
    fn counter(mut next: u32) -> impl FnMut() -> Buffer {
        move || {
            next += 1;
            Buffer(next - 1)
        }
    }

    fn define_one(ns: &mut Namespace, value: u32, seq: u64, elems: usize, alloc: &mut dyn FnMut() -> Buffer) -> Buffer {
        let defined = ns.define(0, seq, &[v(value)], vec![f32s(elems)], alloc);
        assert!(defined.stale.is_empty());
        defined.bufs[0]
    }

    #[test]
    fn quota_counts_a_redefinition_as_given_back() {
        let mut ns = Namespace::new();
        let mut alloc = counter(0);
        let limits = Limits { memory: 6000, ..NO_LIMITS };
        assert_eq!(ns.admit(&[v(1)], &[f32s(1000)], &limits), Ok(()));
        let first = define_one(&mut ns, 1, 1, 1000, &mut alloc);
        assert_eq!(ns.bytes(), 4000);
        // Redefining %1 with as much again fits: its old value goes.
        assert_eq!(ns.admit(&[v(1)], &[f32s(1000)], &limits), Ok(()));
        let again = define_one(&mut ns, 1, 2, 1000, &mut alloc);
        assert_eq!(again, first, "a redefinition on the same worker keeps its buffer");
        assert_eq!(ns.bytes(), 4000);
        // A new value does not.
        assert_eq!(
            ns.admit(&[v(2)], &[f32s(1000)], &limits),
            Err(Refusal::Memory { needed: 4000, held: 4000, quota: 6000 })
        );
        assert_eq!(ns.admit(&[v(2)], &[f32s(500)], &limits), Ok(()));
    }

    #[test]
    fn empty_and_tiny_values_are_charged_their_bookkeeping() {
        // A client making empty values holds no data, but each costs the dispatcher and its
        // worker their bookkeeping: a quota bounds how many it may make.
        let mut ns = Namespace::new();
        let mut alloc = counter(0);
        let limits = Limits { memory: 3 * VALUE_COST, ..NO_LIMITS };
        for i in 0..3 {
            assert_eq!(ns.admit(&[v(i)], &[f32s(0)], &limits), Ok(()));
            define_one(&mut ns, i, u64::from(i), 0, &mut alloc);
        }
        assert_eq!(ns.bytes(), 3 * VALUE_COST);
        assert_eq!(
            ns.admit(&[v(9)], &[f32s(1)], &limits),
            Err(Refusal::Memory { needed: VALUE_COST, held: 3 * VALUE_COST, quota: 3 * VALUE_COST })
        );
    }

    #[test]
    fn quota_message_names_bytes_and_limit() {
        let e = Refusal::Memory { needed: 8, held: 4, quota: 10 };
        assert_eq!(
            e.to_string(),
            "results need 8 bytes with 4 bytes held, over this client's memory quota of 10 (GT_CLIENT_MEMORY)"
        );
    }

    #[test]
    fn credit_is_taken_and_given_back() {
        let mut ns = Namespace::new();
        let limits = Limits { credit: 3, credit_bytes: 100, ..NO_LIMITS };
        ns.take_credit(Charge { instrs: 2, bytes: 8 });
        assert_eq!(ns.admit(&[v(1)], &[f32s(1)], &limits), Ok(()));
        ns.take_credit(Charge { instrs: 1, bytes: 0 });
        assert_eq!(
            ns.admit(&[v(1)], &[f32s(1)], &limits),
            Err(Refusal::Credit { instrs: 3, bytes: 8, credit: 3, credit_bytes: 100 })
        );
        ns.return_credit(Charge { instrs: 1, bytes: 0 });
        assert_eq!(ns.admit(&[v(1)], &[f32s(1)], &limits), Ok(()));
        // Literal bytes alone can use the credit up.
        ns.take_credit(Charge { instrs: 0, bytes: 92 });
        assert!(matches!(ns.admit(&[v(1)], &[f32s(1)], &limits), Err(Refusal::Credit { bytes: 100, .. })));
        // The memory quota is checked first.
        let tight = Limits { memory: 0, ..limits };
        assert!(matches!(ns.admit(&[v(1)], &[f32s(1)], &tight), Err(Refusal::Memory { .. })));
    }

    #[test]
    fn failed_operands_name_the_failed_instruction() {
        let mut ns = Namespace::new();
        let mut alloc = counter(7);
        let buf = define_one(&mut ns, 1, 1, 4, &mut alloc);
        assert_eq!(ns.fail(&[v(2)], 5), Vec::new());
        assert_eq!(ns.operands(&[v(1), v(1)]), Ok(smallvec::smallvec![Location { worker: 0, buf }; 2]));
        assert_eq!(ns.operands(&[v(1), v(2), v(3)]), Err(Unavailable::NotComputed { value: v(2), seq: 5 }));
        assert_eq!(ns.operands(&[v(3), v(2)]), Err(Unavailable::Undefined { value: v(3) }));
        assert_eq!(ns.failed_by(v(2)), Some(5));
        assert_eq!(
            Unavailable::NotComputed { value: v(2), seq: 5 }.to_string(),
            "reads %2, which was not computed because instruction #5 failed"
        );
        // Failing a live value's redefinition hands back its buffer.
        assert_eq!(ns.fail(&[v(1)], 6), vec![Location { worker: 0, buf }]);
        assert_eq!(ns.bytes(), 0);
    }

    #[test]
    fn a_worker_failure_frees_only_redefinitions() {
        let mut ns = Namespace::new();
        let mut alloc = counter(0);
        let a = define_one(&mut ns, 1, 1, 2, &mut alloc);
        define_one(&mut ns, 1, 2, 2, &mut alloc);
        define_one(&mut ns, 2, 2, 3, &mut alloc);
        define_one(&mut ns, 3, 3, 1, &mut alloc);
        assert_eq!(ns.bytes(), 3 * VALUE_COST);
        assert_eq!(ns.computation_failed(2), vec![Location { worker: 0, buf: a }]);
        assert_eq!(ns.failed_by(v(1)), Some(2));
        assert_eq!(ns.failed_by(v(2)), Some(2));
        assert_eq!(ns.bytes(), VALUE_COST);
        assert_eq!(ns.computation_failed(9), Vec::new());
    }

    #[test]
    fn redefinition_on_another_worker_frees_the_old_buffer() {
        let mut ns = Namespace::new();
        let mut alloc = counter(0);
        let old = define_one(&mut ns, 1, 1, 2, &mut alloc);
        let defined = ns.define(1, 2, &[v(1)], vec![f32s(2)], &mut alloc);
        assert_eq!(defined.stale, vec![Location { worker: 0, buf: old }]);
        assert_ne!(defined.bufs[0], old);
        assert_eq!(ns.lookup(v(1)).map(|(at, _)| at), Ok(Location { worker: 1, buf: defined.bufs[0] }));
    }

    #[test]
    fn frees() {
        let mut ns = Namespace::new();
        let mut alloc = counter(0);
        let buf = define_one(&mut ns, 1, 1, 2, &mut alloc);
        ns.fail(&[v(2)], 2);
        assert_eq!(ns.len(), 2);
        assert_eq!(ns.free(v(1)), Ok(Some(Location { worker: 0, buf })));
        assert_eq!(ns.free(v(1)), Err(Unavailable::Undefined { value: v(1) }));
        assert_eq!(ns.free(v(2)), Ok(None), "a value never computed is freed quietly");
        assert_eq!(ns.free(v(3)), Err(Unavailable::Undefined { value: v(3) }));
        assert_eq!(ns.len(), 0);
        assert_eq!(ns.bytes(), 0);
    }

    #[test]
    fn into_buffers_lists_live_values_only() {
        let mut ns = Namespace::new();
        let mut alloc = counter(0);
        let buf = define_one(&mut ns, 1, 1, 2, &mut alloc);
        ns.fail(&[v(2)], 2);
        assert_eq!(ns.into_buffers().collect::<Vec<_>>(), vec![Location { worker: 0, buf }]);
    }

    #[test]
    fn byte_accounting_never_underflows() {
        let mut ns = Namespace::new();
        let mut alloc = counter(0);
        // Every way out of a slot, repeated: bytes stay the live sizes' sum, never wrap.
        define_one(&mut ns, 1, 1, 10, &mut alloc);
        ns.fail(&[v(1)], 2);
        ns.fail(&[v(1)], 3);
        assert_eq!(ns.computation_failed(1), Vec::new());
        assert_eq!(ns.free(v(1)), Ok(None));
        assert_eq!(ns.free(v(1)), Err(Unavailable::Undefined { value: v(1) }));
        assert_eq!(ns.bytes(), 0);
        define_one(&mut ns, 2, 4, 3, &mut alloc);
        ns.computation_failed(4);
        ns.computation_failed(4);
        assert_eq!(ns.bytes(), 0);
        // Credit given back twice saturates at zero.
        ns.take_credit(Charge { instrs: 1, bytes: 4 });
        ns.return_credit(Charge { instrs: 1, bytes: 4 });
        ns.return_credit(Charge { instrs: 1, bytes: 4 });
        assert_eq!(ns.inflight(), Charge::default());
        // A quota check on huge types saturates instead of wrapping.
        let huge = TensorType::f32(vec![usize::MAX]);
        let limits = Limits { memory: u64::MAX - 1, ..NO_LIMITS };
        assert!(matches!(ns.admit(&[v(3), v(4)], &[huge.clone(), huge], &limits), Err(Refusal::Memory { .. })));
    }
}
