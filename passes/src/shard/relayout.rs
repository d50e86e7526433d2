//! The shard pass's re-layouts along a split axis: a slice that cuts the split axis, a
//! `concat`, `split` or `chunk` along it, and a reshape that merges or divides it, each
//! assembled piece by piece from the stretches the workers hold instead of gathering the
//! whole value at home: each element moves at most once, straight to the worker whose piece
//! of the result it lands in (none where the pieces line up; for `x[::-1]`, every piece to
//! its mirror).

use super::{range_on, Dist, Shard, Split};
use crate::pipeline::Emit;
use gt_ir::verify::shape::{array_split, resolve_slice};
use gt_ir::{CollectiveOp, Instr, SliceItem, TensorType, ValueId};
use std::ops::Range;

/// A stretch of a value along an axis: `len` elements held as `id` on worker `at` (`None`:
/// whole at home); `own`: a temporary of the pass, freed once it is read.
#[derive(Debug, Clone, Copy)]
struct Run {
    at: Option<u32>,
    id: ValueId,
    len: usize,
    own: bool,
}

fn place(at: Option<u32>) -> Vec<u32> {
    at.into_iter().collect()
}

/// `index` with its ellipsis spelled out and a full range for every axis it leaves out, so
/// that the `i`-th item that consumes an axis is axis `i`'s.
fn spelled_out(index: &[SliceItem], rank: usize) -> Vec<SliceItem> {
    let full = SliceItem::Range { start: None, end: None, step: 1 };
    let consuming = index.iter().filter(|i| consumes(i)).count();
    let rest = std::iter::repeat_n(full, rank.saturating_sub(consuming));
    match index.iter().position(|i| matches!(i, SliceItem::Ellipsis)) {
        Some(e) => index[..e].iter().copied().chain(rest).chain(index[e + 1..].iter().copied()).collect(),
        None => index.iter().copied().chain(rest).collect(),
    }
}

fn consumes(item: &SliceItem) -> bool {
    matches!(item, SliceItem::Range { .. } | SliceItem::Index(_))
}

/// `index` (spelled out) with the item of input axis `axis` replaced by `item`.
fn with_axis_item(index: &[SliceItem], axis: usize, item: SliceItem) -> Vec<SliceItem> {
    let mut items = index.to_vec();
    if let Some(at) = (0..items.len()).filter(|&i| consumes(&items[i])).nth(axis) {
        items[at] = item;
    }
    items
}

/// The `k` in `0..len` whose index `start + k·step` falls in `piece`.
fn taken_from(start: usize, step: i64, len: usize, piece: &Range<usize>) -> Range<usize> {
    let (s, len) = (start as i64, len as i64);
    let (p0, p1) = (piece.start as i64, piece.end as i64);
    let (k0, k1) = if step > 0 {
        let ceil = |a: i64| -((-a).div_euclid(step));
        (ceil(p0 - s), ceil(p1 - s))
    } else {
        let m = -step;
        ((s - p1).div_euclid(m) + 1, (s - p0).div_euclid(m) + 1)
    };
    let (k0, k1) = (k0.clamp(0, len), k1.clamp(0, len));
    k0 as usize..k1.max(k0) as usize
}

/// Cumulative offsets of `sizes`: piece `i` is `at[i]..at[i + 1]`.
fn offsets(sizes: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(sizes.iter().scan(0, |acc, &n| {
            *acc += n;
            Some(*acc)
        }))
        .collect()
}

impl Shard {
    /// Elements `range` along `axis` of the value laid out as `runs`, made on `at` (as
    /// `dst`, or a fresh id): the overlapping stretches sliced where they are, moved, and
    /// joined. An own run taken whole where it already is, with no name asked, is the
    /// result itself (the caller must then not free it).
    fn assemble(
        &mut self,
        out: &mut Emit,
        runs: &[Run],
        axis: usize,
        range: Range<usize>,
        at: Option<u32>,
        dst: Option<ValueId>,
    ) -> ValueId {
        let mut taken = Vec::new();
        let mut offset = 0;
        for r in runs {
            let (lo, hi) = (range.start.max(offset) - offset, range.end.min(offset + r.len).saturating_sub(offset));
            offset += r.len;
            if lo < hi {
                taken.push((*r, lo..hi));
            }
        }
        // Nothing taken (an empty stretch): an empty cut of the first run, for its type.
        if let (true, Some(r)) = (taken.is_empty(), runs.first()) {
            taken.push((*r, 0..0));
        }
        if let [(r, part)] = taken.as_slice() {
            let whole = *part == (0..r.len);
            if whole && r.at == at && r.own && dst.is_none() {
                return r.id;
            }
        }
        let single = taken.len() == 1;
        let target = dst.unwrap_or_else(|| self.fresh());
        let mut pieces = Vec::new();
        for (r, part) in taken {
            let whole = part == (0..r.len);
            let last = single.then_some(target);
            let moves = r.at != at;
            let mut id = r.id;
            if !whole || (!moves && single) {
                // A cut (or a copy, where a single stretch that is kept is the result).
                let p = if moves { self.fresh() } else { last.unwrap_or_else(|| self.fresh()) };
                self.emit(
                    out,
                    Instr::Slice { dst: p, src: r.id, index: range_on(axis, part.start, part.end) },
                    place(r.at),
                );
                id = p;
            }
            if moves {
                let q = last.unwrap_or_else(|| self.fresh());
                self.emit(out, Instr::Collective { dsts: vec![q], op: CollectiveOp::Move, srcs: vec![id] }, place(at));
                self.stats.moves += 1;
                if id != r.id {
                    self.free_own(out, id);
                }
                id = q;
            }
            pieces.push((id, id != r.id));
        }
        if !single {
            let srcs = pieces.iter().map(|p| p.0).collect();
            self.emit(out, Instr::Concat { dst: target, srcs, axis: axis as i64 }, place(at));
            for (id, temporary) in pieces {
                if temporary {
                    self.free_own(out, id);
                }
            }
        }
        target
    }

    /// Elements `range` along `axis` of `runs`, split in `sizes` over `workers`.
    fn resplit(
        &mut self,
        out: &mut Emit,
        runs: &[Run],
        axis: usize,
        range: Range<usize>,
        sizes: &[usize],
        workers: &[u32],
    ) -> Vec<(u32, ValueId)> {
        let at = offsets(sizes);
        (0..sizes.len())
            .map(|j| {
                let piece = range.start + at[j]..range.start + at[j + 1];
                (workers[j], self.assemble(out, runs, axis, piece, Some(workers[j]), None))
            })
            .collect()
    }

    /// Frees the own runs that did not become a result (`assemble` hands an own run back
    /// as a piece when it is that piece whole, where it already is).
    fn free_runs(&mut self, out: &mut Emit, runs: &[Run], kept: &[(u32, ValueId)]) {
        for r in runs {
            if r.own && !kept.iter().any(|k| k.1 == r.id) {
                self.free_own(out, r.id);
            }
        }
    }

    /// Elements `range` along `axis` of `runs` as `dst`: split over `workers` (array_split
    /// sizes; one worker holds it whole as its one piece) where there is at least one element
    /// per worker, else whole at home.
    fn lay_out(
        &mut self,
        out: &mut Emit,
        runs: &[Run],
        axis: usize,
        range: Range<usize>,
        dst: ValueId,
        workers: &[u32],
    ) {
        if range.len() >= workers.len() && !range.is_empty() {
            let sizes = array_split(range.len(), workers.len());
            let parts = self.resplit(out, runs, axis, range, &sizes, workers);
            self.free_runs(out, runs, &parts);
            self.produced.push((dst, Dist::pieces(axis, parts)));
        } else {
            self.assemble(out, runs, axis, range, None, Some(dst));
            self.free_runs(out, runs, &[]);
        }
    }

    /// `v` along `axis` as stretches: its pieces where it is split along it, else its home
    /// value or one copy whole; `None` where it has neither (split along another axis only).
    fn runs_along(&self, v: ValueId, axis: usize) -> Option<Vec<Run>> {
        let len = self.ty(v)?.shape.0.get(axis).copied()?;
        let Some(d) = self.dist.get(&v) else { return Some(vec![Run { at: None, id: v, len, own: false }]) };
        if let Some(s) = d.split.as_ref().filter(|s| s.axis == axis) {
            let sizes = array_split(len, s.parts.len());
            return Some(
                s.parts.iter().zip(sizes).map(|(&(w, id), len)| Run { at: Some(w), id, len, own: false }).collect(),
            );
        }
        if d.home {
            return Some(vec![Run { at: None, id: v, len, own: false }]);
        }
        d.replicas.first().map(|&(w, id)| vec![Run { at: Some(w), id, len, own: false }])
    }

    /// A slice of `src` (split along `axis` over its pieces) that cuts the split axis: each
    /// worker takes what the slice selects of its piece, and the selection is laid out over
    /// the same workers (or, an index into the axis, moved home whole).
    pub(super) fn slice_across(&mut self, out: &mut Emit, instr: &Instr, split: &Split, ty: &TensorType) -> bool {
        let Instr::Slice { dst, index, .. } = instr else { return false };
        let Ok(r) = resolve_slice(index, &ty.shape) else { return false };
        let items = spelled_out(index, ty.shape.rank());
        let cut = r.axes[split.axis];
        let bounds = offsets(&array_split(ty.shape.0[split.axis], split.parts.len()));
        let Some(kept) = r.kept[split.axis] else {
            // An index: one worker holds it.
            let Some(k) = (0..split.parts.len()).find(|&k| (bounds[k]..bounds[k + 1]).contains(&cut.start)) else {
                return false;
            };
            let local = with_axis_item(&items, split.axis, SliceItem::Index((cut.start - bounds[k]) as i64));
            let (w, part) = split.parts[k];
            let p = self.fresh();
            self.emit(out, Instr::Slice { dst: p, src: part, index: local }, vec![w]);
            self.emit(out, Instr::Collective { dsts: vec![*dst], op: CollectiveOp::Move, srcs: vec![p] }, Vec::new());
            self.stats.moves += 1;
            self.free_own(out, p);
            self.stats.sharded += 1;
            return true;
        };
        let mut runs = Vec::new();
        for (k, &(w, part)) in split.parts.iter().enumerate() {
            let ks = taken_from(cut.start, cut.step, cut.len, &(bounds[k]..bounds[k + 1]));
            if ks.is_empty() {
                continue;
            }
            let first = (cut.start as i64 + ks.start as i64 * cut.step) as usize - bounds[k];
            let end = first as i64 + ks.len() as i64 * cut.step;
            let item = SliceItem::Range { start: Some(first as i64), end: (end >= 0).then_some(end), step: cut.step };
            let p = self.fresh();
            self.emit(
                out,
                Instr::Slice { dst: p, src: part, index: with_axis_item(&items, split.axis, item) },
                vec![w],
            );
            runs.push((ks.start, Run { at: Some(w), id: p, len: ks.len(), own: true }));
        }
        if runs.is_empty() {
            return false;
        }
        runs.sort_by_key(|r| r.0);
        let runs: Vec<Run> = runs.into_iter().map(|r| r.1).collect();
        self.lay_out(out, &runs, kept, 0..cut.len, *dst, &split.workers());
        self.stats.sharded += 1;
        true
    }

    /// A `concat` along the axis `split` splits (over `workers`): the operands' stretches
    /// in order, laid out over the same workers.
    pub(super) fn concat_along(&mut self, out: &mut Emit, instr: &Instr, axis: usize, workers: &[u32]) -> bool {
        let Instr::Concat { dst, srcs, .. } = instr else { return false };
        let mut runs = Vec::new();
        for &v in srcs {
            match self.runs_along(v, axis) {
                Some(r) => runs.extend(r),
                None => return false,
            }
        }
        let total = runs.iter().map(|r| r.len).sum();
        self.lay_out(out, &runs, axis, 0..total, *dst, workers);
        self.stats.sharded += 1;
        true
    }

    /// A `split` (or `chunk`) along the axis its source is split along: each result is its
    /// stretch of the source, laid out over the same workers.
    pub(super) fn split_along(&mut self, out: &mut Emit, instr: &Instr, split: &Split, results: &[TensorType]) -> bool {
        let Instr::Split { dsts, src, .. } = instr else { return false };
        let Some(runs) = self.runs_along(*src, split.axis) else { return false };
        let workers = split.workers();
        let mut start = 0;
        for (&dst, ty) in dsts.iter().zip(results) {
            let len = ty.shape.0[split.axis];
            self.lay_out(out, &runs, split.axis, start..start + len, dst, &workers);
            start += len;
        }
        self.stats.sharded += 1;
        true
    }

    /// A reshape that merges the split axis with the axes after it, or divides it: viewing
    /// the source as `[L, M·K]` (L the elements before the split axis, M its length, K after
    /// it) and the result alike along one of its axes `b` with the same L, piece `i` is a
    /// stretch of columns. Where the stretches are the result's `array_split` pieces each
    /// piece reshapes where it is; else each worker's columns are re-cut and moved to their
    /// workers first.
    pub(super) fn reshape_across(
        &mut self,
        out: &mut Emit,
        instr: &Instr,
        split: &Split,
        (from, to): (&[usize], &[usize]),
    ) -> bool {
        let Instr::Reshape { dst, .. } = instr else { return false };
        let n = split.parts.len();
        let lead: usize = from[..split.axis].iter().product();
        let inner: usize = from[split.axis + 1..].iter().product();
        let Some(b) = (0..to.len()).find(|&b| to[..b].iter().product::<usize>() == lead && to[b] >= n) else {
            return false;
        };
        let inner_to: usize = to[b + 1..].iter().product();
        let sizes: Vec<usize> = array_split(from[split.axis], n).iter().map(|s| s * inner).collect();
        let target = array_split(to[b], n);
        let columns: Vec<usize> = target.iter().map(|t| t * inner_to).collect();
        let piece_shape = |t: usize| -> Vec<i64> {
            let mut shape: Vec<i64> = to.iter().map(|&d| d as i64).collect();
            shape[b] = t as i64;
            shape
        };
        if sizes == columns {
            let adapt = |k: usize, i: &Instr| match i {
                Instr::Reshape { dst, src, .. } => {
                    Instr::Reshape { dst: *dst, src: *src, shape: piece_shape(target[k]) }
                }
                other => other.clone(),
            };
            self.sharded_with(out, instr, &split.workers(), &[Some(split.axis)], b, &adapt);
            return true;
        }
        let runs: Vec<Run> = split
            .parts
            .iter()
            .zip(&sizes)
            .map(|(&(w, part), &len)| {
                let p = self.fresh();
                let shape = vec![lead as i64, len as i64];
                self.emit(out, Instr::Reshape { dst: p, src: part, shape }, vec![w]);
                Run { at: Some(w), id: p, len, own: true }
            })
            .collect();
        let workers = split.workers();
        let flat = self.resplit(out, &runs, 1, 0..sizes.iter().sum(), &columns, &workers);
        self.free_runs(out, &runs, &flat);
        let mut parts = Vec::new();
        for (&(w, p), &t) in flat.iter().zip(&target) {
            let q = self.fresh();
            self.emit(out, Instr::Reshape { dst: q, src: p, shape: piece_shape(t) }, vec![w]);
            self.free_own(out, p);
            parts.push((w, q));
        }
        self.produced.push((*dst, Dist::pieces(b, parts)));
        self.stats.sharded += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `taken_from` says against counting the indices one by one.
    #[test]
    fn a_slice_takes_from_each_piece_the_indices_that_fall_in_it() {
        for start in 0..9usize {
            for step in [-3i64, -2, -1, 1, 2, 3] {
                for len in 0..6usize {
                    let idx: Vec<i64> = (0..len as i64).map(|k| start as i64 + k * step).collect();
                    if idx.iter().any(|&i| !(0..9).contains(&i)) {
                        continue;
                    }
                    for piece in [0..3usize, 3..6, 6..9, 2..7, 0..0] {
                        let want: Vec<usize> = (0..len).filter(|&k| piece.contains(&(idx[k] as usize))).collect();
                        let got: Vec<usize> = taken_from(start, step, len, &piece).collect();
                        assert_eq!(got, want, "start {start} step {step} len {len} piece {piece:?}");
                    }
                }
            }
        }
    }

    /// Steps far larger than the axis take at most the first index, whatever their sign.
    #[test]
    fn huge_steps_take_one_index() {
        for step in [i64::MAX / 4, 1 << 62, -(1 << 62), i64::MIN / 4] {
            assert_eq!(taken_from(5, step, 1, &(3..6)), 0..1);
            assert!(taken_from(5, step, 1, &(0..3)).is_empty());
            assert!(taken_from(5, step, 1, &(6..9)).is_empty());
        }
    }

    #[test]
    fn an_index_is_spelled_out_axis_by_axis() {
        let full = SliceItem::Range { start: None, end: None, step: 1 };
        let index = [SliceItem::NewAxis, SliceItem::Ellipsis, SliceItem::Index(2)];
        let items = spelled_out(&index, 3);
        assert_eq!(items, vec![SliceItem::NewAxis, full, full, SliceItem::Index(2)]);
        let cut = with_axis_item(&items, 1, SliceItem::Index(0));
        assert_eq!(cut, vec![SliceItem::NewAxis, full, SliceItem::Index(0), SliceItem::Index(2)]);
    }
}
