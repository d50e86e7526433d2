//! A worker's part of a collective across workers (a [`WorkerCommand::Exec`] exchange): read
//! the local operand from the backend, run the transport operation ([`Collectives`]) with the
//! peers, and write the local results back as literals. Collectives stage through host memory
//! for now, so every backend takes part the same way. Which workers take part and in which
//! order is the dispatcher's business; the bytes on the wire are `collective.rs`'s.
//!
//! [`WorkerCommand::Exec`]: gt_transport::message::WorkerCommand::Exec

use crate::backend::Backend;
use crate::collective::{CollectiveError, Collectives, Group};
use crate::RuntimeError;
use gt_ir::data::Elements;
use gt_ir::verify::shape::{array_split, normalize_axis};
use gt_ir::DType;
use gt_ir::{BinaryOp, CollectiveOp, Instr, ReduceOp, TensorType, TypeError, ValueId};
use gt_transport::message::{Exchange, FailureKind};
use thiserror::Error;

/// Why a worker's part of a collective failed.
#[derive(Debug, Error)]
pub enum ExchangeError {
    /// The transport failed (a peer timed out, gave up, or sent something wrong).
    #[error("{op}: {source}")]
    Collective {
        /// The op.
        op: &'static str,
        /// Why.
        #[source]
        source: CollectiveError,
    },
    /// The local operand could not be read or the result not written.
    #[error("{op}: {source}")]
    Local {
        /// The op.
        op: &'static str,
        /// Why.
        #[source]
        source: RuntimeError,
    },
    /// The part does not fit its instruction (a dispatcher bug or a garbled command).
    #[error("{op}: malformed collective part: {why}")]
    Malformed {
        /// The op.
        op: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// An axis the result type does not have.
    #[error("{op}: {source}")]
    Axis {
        /// The op.
        op: &'static str,
        /// Why.
        #[source]
        source: TypeError,
    },
    /// The peers' data does not add up to the result (peers that disagree on the shapes).
    #[error("{op}: the peers' data ({got} bytes) does not fit the result type {ty}")]
    PeerData {
        /// The op.
        op: &'static str,
        /// The result's type.
        ty: TensorType,
        /// Bytes received in all.
        got: usize,
    },
    /// The operand was not computed (an earlier instruction failed, or its client left).
    #[error("{op}: skipped: {why}")]
    Skipped {
        /// The op.
        op: &'static str,
        /// Why.
        why: &'static str,
    },
}

impl ExchangeError {
    /// The kind a client sees. A peer giving up or going silent counts as a lost worker: the
    /// peer that failed first reports the cause (the dispatcher prefers its failure).
    pub fn kind(&self) -> FailureKind {
        match self {
            ExchangeError::Collective { source, .. } => match source {
                CollectiveError::TooLarge { .. } => FailureKind::Limit,
                CollectiveError::InvalidCall { .. } | CollectiveError::Malformed { .. } => FailureKind::Internal,
                CollectiveError::LengthMismatch { .. } => FailureKind::Internal,
                _ => FailureKind::WorkerLost,
            },
            ExchangeError::Local { source, .. } => source.kind(),
            ExchangeError::Malformed { .. } | ExchangeError::PeerData { .. } => FailureKind::Internal,
            ExchangeError::Axis { .. } => FailureKind::Type,
            ExchangeError::Skipped { .. } => FailureKind::Undefined,
        }
    }
}

/// The group an exchange names.
pub fn group(ex: &Exchange) -> Group {
    Group { id: ex.id, rank: ex.rank as usize, peers: ex.peers.clone() }
}

/// Runs this worker's part `instr` of the collective `ex` describes. On a failure before the
/// transport ran, the other ranks are told (so none waits for this one); the transport tells
/// them of its own failures itself. With `consume`, the operand dies here (a `free` of it
/// follows): it is taken from a backend that can hand its buffer over rather than copied,
/// and the flag says whether it was (the free then has nothing left to do).
pub fn run(
    backend: &mut dyn Backend,
    net: &mut dyn Collectives,
    instr: &Instr,
    ex: &Exchange,
    consume: Option<&mut bool>,
) -> Result<(), ExchangeError> {
    let g = group(ex);
    let mut transported = false;
    let out = run_part(backend, net, (instr, ex, consume), &g, &mut transported);
    if out.is_err() && !transported {
        net.abort(&g);
    }
    out
}

fn run_part(
    backend: &mut dyn Backend,
    net: &mut dyn Collectives,
    (instr, ex, mut consume): (&Instr, &Exchange, Option<&mut bool>),
    g: &Group,
    transported: &mut bool,
) -> Result<(), ExchangeError> {
    let Instr::Collective { dsts, op, srcs } = instr else {
        return Err(ExchangeError::Malformed {
            op: instr.mnemonic(),
            why: "the exchange's instruction is not a collective",
        });
    };
    let name = op.mnemonic();
    let malformed = |why| ExchangeError::Malformed { op: name, why };
    let local = |source| ExchangeError::Local { op: name, source };
    let net_err = |source| ExchangeError::Collective { op: name, source };
    let n = ex.peers.len();
    if ex.rank as usize >= n || srcs.len() > 1 {
        return Err(malformed("this worker's rank or operands do not fit the group"));
    }
    let src = srcs.first().copied();
    let mut read = |backend: &mut dyn Backend| match (src, consume.take()) {
        (Some(v), Some(taken)) => match backend.take(v) {
            Some(data) => {
                let data = data.map_err(local)?;
                *taken = true;
                Ok(Some(data))
            }
            None => backend.read(v).map(Some).map_err(local),
        },
        (Some(v), None) => backend.read(v).map(Some).map_err(local),
        (None, _) => Ok(None),
    };
    match *op {
        CollectiveOp::AllReduce(reduce) => {
            let (Some(dst), Some(mine)) = (one(dsts), read(backend)?) else {
                return Err(malformed("an all_reduce part needs one operand and one result"));
            };
            let ty = ex.ty.clone().unwrap_or(mine.ty);
            *transported = true;
            let data = match mine.data {
                Elements::F32(data) => Elements::F32(net.all_reduce(g, reduce, data).map_err(net_err)?),
                // Other dtypes gather every rank's operand and fold it here (the ring
                // reduces f32 only): correct first, each link carrying every piece.
                other => {
                    let bytes = other.to_le_bytes();
                    let pieces = net.all_gather(g, &bytes).map_err(net_err)?;
                    fold(name, reduce, &pieces, &ty)?
                }
            };
            write(backend, dst, ty, data).map_err(local)
        }
        CollectiveOp::AllGather { axis } => {
            let (Some(dst), Some(mine), Some(ty)) = (one(dsts), read(backend)?, ex.ty.clone()) else {
                return Err(malformed("an all_gather part needs one operand, one result and its type"));
            };
            *transported = true;
            let bytes = mine.data.to_le_bytes();
            let pieces = net.all_gather(g, &bytes).map_err(net_err)?;
            let data = join(name, &pieces, &ty, axis)?;
            write(backend, dst, ty, data).map_err(local)
        }
        CollectiveOp::ReduceScatter { op: reduce, axis } => {
            let (Some(dst), Some(mine), Some(ty)) = (one(dsts), read(backend)?, ex.ty.clone()) else {
                return Err(malformed("a reduce_scatter part needs one operand, one result and its type"));
            };
            let dims = mine.ty.shape.dims().to_vec();
            let a = normalize_axis(axis, dims.len()).map_err(|source| ExchangeError::Axis { op: name, source })?;
            let (outer, len, inner) = around(&dims, a);
            let Elements::F32(data) = &mine.data else {
                // Other dtypes: the whole folded here from every rank's operand, then this
                // rank's piece of it.
                *transported = true;
                let bytes = mine.data.to_le_bytes();
                let pieces = net.all_gather(g, &bytes).map_err(net_err)?;
                let whole = fold(name, reduce, &pieces, &mine.ty)?;
                let (sizes, rank) = (array_split(len, n), ex.rank as usize);
                if rank >= sizes.len() {
                    return Err(malformed("a rank beyond the group"));
                }
                let start: usize = sizes[..rank].iter().sum();
                let piece = piece_along(&whole, outer, len, inner, start, sizes[rank]);
                if piece.len() != ty.shape.numel() || piece.dtype() != ty.dtype {
                    return Err(malformed("the result type is not this rank's piece"));
                }
                return write(backend, dst, ty, piece).map_err(local);
            };
            // The scattered axis goes first, so that each rank's piece is one contiguous run.
            let front = swap_outer(data, outer, len, inner);
            let counts: Vec<usize> = array_split(len, n).into_iter().map(|c| c * outer * inner).collect();
            *transported = true;
            let piece = net.reduce_scatter(g, reduce, &front, &counts).map_err(net_err)?;
            let piece_len = array_split(len, n)[ex.rank as usize];
            if ty.shape.numel() != piece.len() {
                return Err(malformed("the result type is not this rank's piece"));
            }
            write(backend, dst, ty, Elements::F32(swap_outer(&piece, piece_len, outer, inner))).map_err(local)
        }
        CollectiveOp::Broadcast | CollectiveOp::Move => {
            let root = ex.root as usize;
            let mine = read(backend)?;
            if (ex.rank as usize == root) != mine.is_some() || root >= n {
                return Err(malformed("only the root of a broadcast or move has its operand"));
            }
            let data = mine.as_ref().map(|m| m.data.to_le_bytes());
            let got = if *op == CollectiveOp::Move {
                if n != 2 {
                    return Err(malformed("a move has two ranks"));
                }
                *transported = true;
                net.transfer(g, root, 1 - root, data.as_deref()).map_err(net_err)?
            } else {
                *transported = true;
                Some(net.broadcast(g, root, data.as_deref()).map_err(net_err)?)
            };
            if dsts.is_empty() {
                return Ok(());
            }
            let (Some(bytes), Some(ty)) = (got, ex.ty.clone()) else {
                return Err(malformed("a receiving part needs its result type"));
            };
            if bytes.len() != ty.size_bytes() {
                return Err(ExchangeError::PeerData { op: name, ty, got: bytes.len() });
            }
            let data = Elements::from_le_bytes(ty.dtype, &bytes).map_err(|_| ExchangeError::PeerData {
                op: name,
                ty: ty.clone(),
                got: bytes.len(),
            })?;
            for &dst in dsts {
                write(backend, dst, ty.clone(), data.clone()).map_err(local)?;
            }
            Ok(())
        }
    }
}

fn one(dsts: &[ValueId]) -> Option<ValueId> {
    match dsts {
        [d] => Some(*d),
        _ => None,
    }
}

fn write(backend: &mut dyn Backend, dst: ValueId, ty: TensorType, data: Elements) -> Result<(), RuntimeError> {
    backend.write(dst, ty, data)
}

/// The ranks' operands (rank order, little-endian bytes of `ty`) folded left to right as the
/// interpreter folds them: floats in `f64` (a mean divides by the count), integers and
/// bools in `i64` wrapping, then back to `ty`'s dtype.
fn fold(
    op: &'static str,
    reduce: ReduceOp,
    pieces: &[impl AsRef<[u8]>],
    ty: &TensorType,
) -> Result<Elements, ExchangeError> {
    let bad = |got: usize| ExchangeError::PeerData { op, ty: ty.clone(), got };
    let mut values = Vec::with_capacity(pieces.len());
    for p in pieces.iter().map(AsRef::as_ref) {
        let e = Elements::from_le_bytes(ty.dtype, p).map_err(|_| bad(p.len()))?;
        if e.len() != ty.shape.numel() {
            return Err(bad(p.len()));
        }
        values.push(e);
    }
    let combine = match reduce {
        ReduceOp::Max => BinaryOp::Maximum,
        ReduceOp::Min => BinaryOp::Minimum,
        ReduceOp::Sum | ReduceOp::Mean => BinaryOp::Add,
    };
    let n = ty.shape.numel();
    if ty.dtype.is_float() {
        let mut acc = values.first().map_or_else(|| vec![0.0; n], Elements::to_f64);
        for v in values.iter().skip(1) {
            acc.iter_mut().zip(v.to_f64()).for_each(|(a, x)| *a = combine.apply_f64(*a, x));
        }
        if reduce == ReduceOp::Mean {
            acc.iter_mut().for_each(|a| *a /= pieces.len() as f64);
        }
        return Ok(Elements::from_f64s(ty.dtype, &acc));
    }
    let ints = |e: &Elements| -> Vec<i64> {
        match e.cast(DType::I64) {
            Elements::I64(v) => v,
            _ => unreachable!("cast to i64 gives i64"),
        }
    };
    let mut acc = values.first().map_or_else(|| vec![0; n], ints);
    for v in values.iter().skip(1) {
        acc.iter_mut().zip(ints(v)).for_each(|(a, x)| *a = combine.apply_int(*a, x).unwrap_or(*a));
    }
    Ok(Elements::I64(acc).cast(ty.dtype))
}

/// Elements `start..start + count` along the middle axis of `[outer, len, inner]` data.
fn piece_along(e: &Elements, outer: usize, len: usize, inner: usize, start: usize, count: usize) -> Elements {
    fn take<T: Copy>(v: &[T], outer: usize, len: usize, inner: usize, start: usize, count: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(outer * count * inner);
        for o in 0..outer {
            let at = (o * len + start) * inner;
            out.extend_from_slice(&v[at..at + count * inner]);
        }
        out
    }
    match e {
        Elements::F64(v) => Elements::F64(take(v, outer, len, inner, start, count)),
        Elements::F32(v) => Elements::F32(take(v, outer, len, inner, start, count)),
        Elements::F16(v) => Elements::F16(take(v, outer, len, inner, start, count)),
        Elements::BF16(v) => Elements::BF16(take(v, outer, len, inner, start, count)),
        Elements::I64(v) => Elements::I64(take(v, outer, len, inner, start, count)),
        Elements::I32(v) => Elements::I32(take(v, outer, len, inner, start, count)),
        Elements::Bool(v) => Elements::Bool(take(v, outer, len, inner, start, count)),
    }
}

/// The elements before axis `a`, along it, and after it.
fn around(dims: &[usize], a: usize) -> (usize, usize, usize) {
    (dims[..a].iter().product(), dims[a], dims[a + 1..].iter().product())
}

/// `[rows, cols, inner]` row-major to `[cols, rows, inner]`.
fn swap_outer(data: &[f32], rows: usize, cols: usize, inner: usize) -> Vec<f32> {
    if rows <= 1 || cols <= 1 {
        return data.to_vec();
    }
    let mut out = Vec::with_capacity(data.len());
    for c in 0..cols {
        for r in 0..rows {
            let at = (r * cols + c) * inner;
            out.extend_from_slice(&data[at..at + inner]);
        }
    }
    out
}

/// The ranks' pieces (rank order) joined along `axis` into `ty`: for each index before the
/// axis, each piece's block in turn. Each piece's extent along the axis follows from its size.
fn join(op: &'static str, pieces: &[impl AsRef<[u8]>], ty: &TensorType, axis: i64) -> Result<Elements, ExchangeError> {
    let pieces: Vec<&[u8]> = pieces.iter().map(AsRef::as_ref).collect();
    let dims = ty.shape.dims();
    let a = normalize_axis(axis, dims.len()).map_err(|source| ExchangeError::Axis { op, source })?;
    let (outer, len, inner) = around(dims, a);
    let got: usize = pieces.iter().map(|p| p.len()).sum();
    let bad = || ExchangeError::PeerData { op, ty: ty.clone(), got };
    if got != ty.size_bytes() {
        return Err(bad());
    }
    if outer * inner == 0 {
        return Ok(Elements::zeros(ty.dtype, 0));
    }
    // Bytes of one index along the axis, over every outer index.
    let size = ty.dtype.size_bytes();
    let block = outer * inner * size;
    let lens: Vec<usize> = pieces.iter().map(|p| p.len() / block).collect();
    if pieces.iter().any(|p| p.len() % block != 0) || lens.iter().sum::<usize>() != len {
        return Err(bad());
    }
    let runs = (0..outer).flat_map(|o| {
        pieces.iter().zip(&lens).map(move |(p, l)| {
            let run = l * inner * size;
            &p[o * run..(o + 1) * run]
        })
    });
    Elements::from_le_runs(ty.dtype, ty.size_bytes(), runs).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_transport::codec::le_bytes;

    /// Reducing collectives of other dtypes than f32 fold every rank's operand here, as the
    /// interpreter does: integers wrap in their dtype, a bool sum is an `or`, halves round
    /// once.
    #[test]
    fn folds_keep_the_dtype() {
        let bytes = |e: Elements| e.to_le_bytes().into_owned();
        let ty = TensorType::new(DType::I32, vec![2]);
        let pieces = [bytes(Elements::I32(vec![i32::MAX, -3])), bytes(Elements::I32(vec![1, 5]))];
        assert_eq!(fold("all_reduce", ReduceOp::Sum, &pieces, &ty).unwrap(), Elements::I32(vec![i32::MIN, 2]));
        assert_eq!(fold("all_reduce", ReduceOp::Min, &pieces, &ty).unwrap(), Elements::I32(vec![1, -3]));
        let ty = TensorType::new(DType::Bool, vec![3]);
        let pieces = [bytes(Elements::Bool(vec![true, false, false])), bytes(Elements::Bool(vec![true, true, false]))];
        assert_eq!(fold("all_reduce", ReduceOp::Sum, &pieces, &ty).unwrap(), Elements::Bool(vec![true, true, false]));
        let ty = TensorType::new(DType::F16, vec![1]);
        let h = |x: f32| bytes(Elements::F16(vec![half::f16::from_f32(x)]));
        let got = fold("all_reduce", ReduceOp::Mean, &[h(1.0), h(2.0)], &ty).unwrap();
        assert_eq!(got, Elements::F16(vec![half::f16::from_f32(1.5)]));
        // A peer's piece of the wrong length is the peers' disagreement, not a panic.
        let short = [bytes(Elements::F16(vec![half::f16::ONE; 2])), h(1.0)];
        assert!(matches!(fold("all_reduce", ReduceOp::Sum, &short, &ty), Err(ExchangeError::PeerData { .. })));
        // A piece along the middle axis of [2, 3, 1].
        let e = Elements::I64((0..6).collect());
        assert_eq!(piece_along(&e, 2, 3, 1, 1, 2), Elements::I64(vec![1, 2, 4, 5]));
    }

    #[test]
    fn join_puts_each_pieces_block_in_rank_order_per_outer_index() {
        // Two [2, 1] and [2, 2] pieces joined along axis 1 into [2, 3].
        let a = le_bytes(&[1.0, 2.0]);
        let b = le_bytes(&[10.0, 11.0, 20.0, 21.0]);
        let ty = TensorType::f32(vec![2, 3]);
        assert_eq!(
            join("all_gather", &[a.clone(), b.clone()], &ty, 1).unwrap(),
            Elements::F32(vec![1.0, 10.0, 11.0, 2.0, 20.0, 21.0])
        );
        assert_eq!(
            join("all_gather", &[a.clone(), b.clone()], &ty, -1).unwrap(),
            Elements::F32(vec![1.0, 10.0, 11.0, 2.0, 20.0, 21.0])
        );
        // Along axis 0: the pieces one after the other.
        let ty = TensorType::f32(vec![3, 2]);
        assert_eq!(
            join("all_gather", &[a.clone(), b.clone()], &ty, 0).unwrap(),
            Elements::F32(vec![1.0, 2.0, 10.0, 11.0, 20.0, 21.0])
        );
        // Pieces that do not add up are an error, not a panic.
        assert!(join("all_gather", &[a.clone(), a], &TensorType::f32(vec![2, 3]), 1).is_err());
        assert!(join("all_gather", &[b], &TensorType::f32(vec![3, 2]), 7).is_err());
    }

    #[test]
    fn swap_outer_moves_an_axis_to_the_front_and_back() {
        // [2, 3, 1]: rows 0..2, cols 0..3.
        let data: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let front = swap_outer(&data, 2, 3, 1);
        assert_eq!(front, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(swap_outer(&front, 3, 2, 1), data);
        assert_eq!(around(&[2, 3, 4], 1), (2, 3, 4));
    }
}
