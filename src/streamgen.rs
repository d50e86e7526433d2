//! Random client streams for fuzzing the dispatcher: bytes in, the requests of several
//! clients out. Mostly well-typed (small shapes, values the client defined), with the things
//! a careless or hostile client sends mixed in: redefinitions of an operand, undefined and
//! freed operands, empty and huge shapes, unbalanced markers, compile signals, `fused`
//! kernels that do not fit, reads of failed values. The property test in `tests/it/hostile.rs`
//! and the `stream` fuzz target drive the dispatcher with it.

use gt_ir::kernel::samples;
use gt_ir::verify::shape;
use gt_ir::{BinaryOp, Instr, Operand, ReduceOp, SliceItem, SplitSpec, TensorType, UnaryOp, ValueId};

/// What a generated client does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Queue an instruction.
    Instr(Instr),
    /// Read a value (a wait).
    Read(ValueId),
    /// Wait for everything sent.
    Sync,
    /// Ask for the statistics.
    Stats,
}

/// The steps of `clients` clients, generated from `bytes` (the same bytes give the same
/// streams, always: minimised crashers stay reproducible; running out of bytes ends every
/// stream).
pub fn streams(bytes: &[u8], clients: usize) -> Vec<Vec<Step>> {
    generate(bytes, clients, false, false)
}

/// [`streams`] that also spread over workers: some clients open placed signals (now and
/// then naming missing workers), and clients write collectives.
pub fn spread_streams(bytes: &[u8], clients: usize) -> Vec<Vec<Step>> {
    generate(bytes, clients, true, false)
}

/// The streams the fuzz target and the property test drive: the first byte's bit 0 spreads
/// them over workers ([`spread_streams`]), its bit 1 mixes in every dtype (creations of any
/// dtype, casts), which [`streams`] and [`spread_streams`] leave out so that their
/// minimised crashers stay what they were.
pub fn fuzz_streams(bytes: &[u8], clients: usize) -> Vec<Vec<Step>> {
    let first = bytes.first().copied().unwrap_or(0);
    generate(bytes, clients, first & 1 == 1, first & 2 == 2)
}

fn generate(bytes: &[u8], clients: usize, spread: bool, typed: bool) -> Vec<Vec<Step>> {
    let mut g = Gen { bytes, at: 0, spread, typed };
    let mut out: Vec<Vec<Step>> = vec![Vec::new(); clients.max(1)];
    let mut known: Vec<Vec<(ValueId, Vec<usize>)>> = vec![Vec::new(); out.len()];
    // Half the clients work inside a compile signal, so the fuse pass sees their streams in
    // every setting.
    for stream in &mut out {
        if g.chance(128) {
            stream.push(Step::Instr(Instr::SignalStart {
                name: "s".into(),
                compile: true,
                backward: false,
                place: None,
            }));
        }
        // A quarter of the clients spread what they compute over workers (the shard pass,
        // collectives across workers), some with placements that name missing workers.
        if g.spread && g.chance(64) {
            let place = g.placement();
            stream.push(Step::Instr(Instr::SignalStart {
                name: "p".into(),
                compile: false,
                backward: false,
                place: Some(place),
            }));
        }
    }
    while g.at < g.bytes.len() {
        let c = g.below(out.len());
        let step = g.step(&mut known[c]);
        out[c].push(step);
    }
    out
}

/// How many value ids a generated client uses (small, so ids are redefined and freed often).
const IDS: u32 = 12;

struct Gen<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Placements and collectives too (they read bytes [`streams`] leaves to other steps).
    spread: bool,
    /// Every dtype too (likewise).
    typed: bool,
}

impl Gen<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        self.byte() as usize % n
    }

    fn chance(&mut self, in_256: u8) -> bool {
        self.byte() < in_256
    }

    /// Mostly `f32`; in typed streams a quarter of the time any dtype (bools and integers
    /// meet the f32-only kernels, sharding and collectives that way). Untyped streams take no
    /// byte for it.
    fn dtype(&mut self) -> gt_ir::DType {
        if self.typed && self.chance(64) {
            gt_ir::DType::ALL[self.below(gt_ir::DType::ALL.len())]
        } else {
            gt_ir::DType::F32
        }
    }

    fn id(&mut self) -> ValueId {
        ValueId(self.below(IDS as usize) as u32)
    }

    fn dims(&mut self) -> Vec<usize> {
        if self.chance(4) {
            // Rarely: empty or large (still within the worker's limits) extents.
            return match self.below(3) {
                0 => vec![0, 3],
                1 => vec![1 << 20],
                _ => vec![3, 0, 2],
            };
        }
        let rank = self.below(4);
        (0..rank).map(|_| 1 + self.below(3)).collect()
    }

    /// An operand: usually a value the client defined, sometimes any id.
    fn operand(&mut self, known: &[(ValueId, Vec<usize>)]) -> (ValueId, Vec<usize>) {
        if known.is_empty() || self.chance(16) {
            return (self.id(), Vec::new());
        }
        known[self.below(known.len())].clone()
    }

    /// A second operand: usually one of the same shape as `dims` (so it broadcasts).
    fn partner(&mut self, known: &[(ValueId, Vec<usize>)], dims: &[usize]) -> ValueId {
        let same: Vec<ValueId> = known.iter().filter(|(_, d)| d == dims).map(|(v, _)| *v).collect();
        if same.is_empty() || self.chance(32) {
            return self.operand(known).0;
        }
        same[self.below(same.len())]
    }

    /// A placement: split along an axis or copied, over a few workers (now and then one
    /// that does not exist, or one named twice).
    fn placement(&mut self) -> gt_ir::Placement {
        let workers: Vec<u32> =
            (0..self.below(4)).map(|_| if self.chance(16) { 7 } else { self.below(3) as u32 }).collect();
        if self.chance(96) {
            gt_ir::Placement::Replicated { workers }
        } else {
            gt_ir::Placement::Split { axis: self.below(3) as i64 - 1, workers }
        }
    }

    fn axis(&mut self, rank: usize) -> i64 {
        if self.chance(8) {
            return [i64::MIN, -100, 99, i64::MAX][self.below(4)];
        }
        self.below(rank.max(1)) as i64 - if self.chance(64) { rank as i64 } else { 0 }
    }

    fn scalar(&mut self) -> f64 {
        [0.0, 1.0, -2.5, 0.5, f64::INFINITY, f64::NAN, 1e30, -0.0][self.below(8)]
    }

    fn step(&mut self, known: &mut Vec<(ValueId, Vec<usize>)>) -> Step {
        match self.below(40) {
            0 => return Step::Sync,
            1 => return Step::Stats,
            2 | 3 => return Step::Read(self.operand(known).0),
            _ => {}
        }
        let instr = self.instr(known);
        // The dispatcher's view of the client's values, by the verifier's rules: what it
        // defines is known with its real shape, what fails or is freed is forgotten.
        let types = |v: ValueId| {
            known
                .iter()
                .find(|(k, _)| *k == v)
                .map(|(_, d)| TensorType::f32(d.clone()))
                .ok_or(shape::TypeError::UnknownValue(v))
        };
        let inferred = shape::infer(&instr, &types);
        if let Instr::Free { src } = instr {
            known.retain(|(v, _)| *v != src);
        }
        for r in instr.results() {
            known.retain(|(v, _)| *v != r);
        }
        if let Ok(tys) = inferred {
            for (r, t) in instr.results().into_iter().zip(tys) {
                known.push((r, t.shape.0.to_vec()));
            }
        }
        Step::Instr(instr)
    }

    fn instr(&mut self, known: &[(ValueId, Vec<usize>)]) -> Instr {
        // A result id: fresh-looking, or (hostile) one of the operands.
        let dst = self.id();
        let (src, sd) = self.operand(known);
        let dst_or_src = |g: &mut Gen| if g.chance(24) { src } else { dst };
        let rank = sd.len();
        match self.below(26) {
            0 => Instr::Zeros { dst, ty: TensorType::new(self.dtype(), self.dims()) },
            1 => Instr::Ones { dst, ty: TensorType::new(self.dtype(), self.dims()) },
            2 => Instr::Full { dst, ty: TensorType::new(self.dtype(), self.dims()), value: self.scalar() },
            3 => Instr::Randn { dst, ty: TensorType::f32(self.dims()), seed: self.byte() as u64 },
            4 => {
                let dims = self.dims();
                let n: usize = dims.iter().product();
                let len = if self.chance(16) { n + 1 } else { n.min(64) };
                let dtype = self.dtype();
                let data = gt_ir::data::Elements::F32((0..len).map(|i| i as f32 * 0.25).collect()).cast(dtype);
                Instr::Literal { dst, ty: TensorType::new(dtype, if n > 64 { vec![len] } else { dims }), data }
            }
            5 => Instr::Arange { dst, dtype: self.dtype(), start: 0.0, end: self.below(9) as f64, step: 1.0 },
            6 if self.typed && self.chance(128) => Instr::Cast { dst: dst_or_src(self), src, dtype: self.dtype() },
            6..=8 => {
                let op = UnaryOp::ALL[self.below(UnaryOp::ALL.len())];
                Instr::Unary { op, dst: dst_or_src(self), src }
            }
            9..=12 => {
                let op = BinaryOp::ALL[self.below(BinaryOp::ALL.len())];
                let rhs = if self.chance(64) {
                    Operand::Scalar(self.scalar())
                } else {
                    Operand::Value(self.partner(known, &sd))
                };
                Instr::Binary { op, dst: dst_or_src(self), lhs: Operand::Value(src), rhs }
            }
            13 => {
                let on_true = Operand::Value(self.partner(known, &sd));
                let on_false = if self.chance(128) {
                    Operand::Value(self.partner(known, &sd))
                } else {
                    Operand::Scalar(self.scalar())
                };
                Instr::Where { dst, cond: src, on_true, on_false }
            }
            14 => Instr::MatMul { dst: dst_or_src(self), lhs: src, rhs: self.operand(known).0 },
            15 | 16 => {
                let op = ReduceOp::ALL[self.below(ReduceOp::ALL.len())];
                let axes = if self.chance(96) { None } else { Some(vec![self.axis(rank)]) };
                Instr::Reduce { op, dst: dst_or_src(self), src, axes, keepdim: self.chance(128) }
            }
            17 => Instr::Transpose { dst: dst_or_src(self), src, dim0: self.axis(rank), dim1: self.axis(rank) },
            18 => {
                let mut shape: Vec<i64> = sd.iter().rev().map(|&d| d as i64).collect();
                if self.chance(64) {
                    shape = vec![-1];
                }
                Instr::Reshape { dst: dst_or_src(self), src, shape }
            }
            19 => {
                let shape = if self.chance(32) { vec![0, 0] } else { [vec![2], sd.clone()].concat() };
                Instr::BroadcastTo { dst: dst_or_src(self), src, shape }
            }
            20 => {
                let index = (0..rank.min(2))
                    .map(|_| match self.below(4) {
                        0 => SliceItem::Index(self.axis(2)),
                        1 => SliceItem::NewAxis,
                        _ => SliceItem::Range { start: Some(1), end: None, step: if self.chance(64) { -1 } else { 1 } },
                    })
                    .collect();
                Instr::Slice { dst: dst_or_src(self), src, index }
            }
            21 if !self.spread || self.chance(128) => {
                Instr::Concat { dst, srcs: vec![src, self.partner(known, &sd)], axis: self.axis(rank) }
            }
            21 => {
                // A collective written by the client (run where its operands are).
                let op = match self.below(5) {
                    0 => gt_ir::CollectiveOp::AllReduce(gt_ir::ReduceOp::ALL[self.below(4)]),
                    1 => gt_ir::CollectiveOp::AllGather { axis: self.axis(rank) },
                    2 => gt_ir::CollectiveOp::ReduceScatter { op: gt_ir::ReduceOp::Sum, axis: self.axis(rank) },
                    3 => gt_ir::CollectiveOp::Broadcast,
                    _ => gt_ir::CollectiveOp::Move,
                };
                let srcs = match op {
                    gt_ir::CollectiveOp::Broadcast | gt_ir::CollectiveOp::Move => vec![src],
                    _ => vec![src, self.partner(known, &sd)],
                };
                let n = if matches!(op, gt_ir::CollectiveOp::Move) { 1 } else { 2 };
                Instr::Collective { dsts: (0..n).map(|k| if k == 0 { dst } else { self.id() }).collect(), op, srcs }
            }
            22 => Instr::Split {
                dsts: vec![dst, self.id()],
                src,
                axis: self.axis(rank),
                spec: SplitSpec::Chunks(1 + self.below(3)),
            },
            23 => Instr::Free { src },
            24 => match self.below(if self.spread { 5 } else { 4 }) {
                0 => Instr::SignalStart { name: "s".into(), compile: self.chance(192), backward: false, place: None },
                4 => {
                    let place = Some(self.placement());
                    Instr::SignalStart { name: "s".into(), compile: self.chance(64), backward: false, place }
                }
                1 => Instr::SignalEnd { name: if self.chance(32) { "t".into() } else { "s".into() } },
                2 => Instr::HotPathStart { id: self.below(3) as u64 },
                _ => Instr::HotPathEnd { id: self.below(3) as u64 },
            },
            _ => {
                let kernel = match self.below(3) {
                    0 => samples::softmax(&[2, 3]),
                    1 => samples::gelu(&[3]),
                    _ => samples::linear_relu(2, 3, 2),
                };
                let srcs = (0..1 + self.below(3)).map(|_| self.operand(known).0).collect();
                Instr::Fused { dst, ty: TensorType::f32(self.dims()), srcs, kernel: Box::new(kernel) }
            }
        }
    }
}

/// Why a run of generated streams found a fault.
#[derive(Debug, thiserror::Error)]
pub enum Finding {
    /// A client could not connect.
    #[error("client {client} could not connect: {error}")]
    Connect {
        /// Which generated client (or `usize::MAX` for the well-behaved one).
        client: usize,
        /// The client's error.
        error: gt_frontend::ClientError,
    },
    /// A client lost the dispatcher, was rejected, or was told of an internal error.
    #[error("client {client}, step {step}: {error}")]
    Fault {
        /// Which generated client (or `usize::MAX` for the well-behaved one).
        client: usize,
        /// Its step.
        step: usize,
        /// The client's error.
        error: gt_frontend::ClientError,
    },
    /// The well-behaved client read wrong numbers.
    #[error("a well-behaved client read {got:?} instead of {want:?}")]
    Wrong {
        /// What it read.
        got: Vec<f32>,
        /// What it should have read.
        want: Vec<f32>,
    },
}

/// Whether a client's error means the cluster failed it (rather than refused its input).
fn is_fault(e: &gt_frontend::ClientError) -> bool {
    use gt_frontend::ClientError as E;
    match e {
        E::Op { failure, .. } => failure.kind == gt_ir::FailureKind::Internal,
        E::Codec(_) => false,
        _ => true,
    }
}

/// Runs `streams` as that many clients of the dispatcher at `endpoint` (steps interleaved
/// round-robin, each wait answered before the next step), with a well-behaved client beside
/// them that must read the right numbers before and after. Errors of the generated clients'
/// own ops are expected; a lost or rejected connection, an internal error or a wrong number
/// is a [`Finding`].
pub fn drive(
    ctx: &gt_transport::zmq::Context,
    endpoint: &gt_transport::Endpoint,
    streams: &[Vec<Step>],
) -> Result<(), Finding> {
    use gt_frontend::{Client, ClientOptions, Origin};
    let connect = |client: usize| {
        Client::connect_in(ctx, endpoint, ClientOptions::default()).map_err(|error| Finding::Connect { client, error })
    };
    let good = |c: &mut Client, step: usize| -> Result<(), Finding> {
        let fault = |error| Finding::Fault { client: usize::MAX, step, error };
        let at = |op| Origin { op, span: None };
        let ty = TensorType::f32(vec![3]);
        c.submit(Instr::Full { dst: ValueId(0), ty, value: step as f64 }, at("full")).map_err(fault)?;
        let (x, y) = (Operand::Value(ValueId(0)), Operand::Value(ValueId(1)));
        c.submit(Instr::Binary { op: BinaryOp::Add, dst: ValueId(1), lhs: x, rhs: x }, at("add")).map_err(fault)?;
        c.submit(Instr::Binary { op: BinaryOp::Mul, dst: ValueId(2), lhs: y, rhs: x }, at("mul")).map_err(fault)?;
        let got = c.read(ValueId(2)).map_err(fault)?.to_f32();
        let want = vec![2.0 * (step * step) as f32; 3];
        if got != want {
            return Err(Finding::Wrong { got, want });
        }
        Ok(())
    };
    let mut witness = connect(usize::MAX)?;
    good(&mut witness, 1)?;
    let mut clients = Vec::new();
    for c in 0..streams.len() {
        clients.push(connect(c)?);
    }
    let longest = streams.iter().map(Vec::len).max().unwrap_or(0);
    for step in 0..longest {
        for (c, stream) in streams.iter().enumerate() {
            let (Some(s), client) = (stream.get(step), &mut clients[c]) else { continue };
            let origin = Origin { op: "generated", span: None };
            let result = match s {
                Step::Instr(i) => client.submit(i.clone(), origin),
                Step::Read(v) => client.read(*v).map(|_| ()),
                Step::Sync => client.sync(),
                Step::Stats => client.stats().map(|_| ()),
            };
            match result {
                Err(error) if is_fault(&error) => return Err(Finding::Fault { client: c, step, error }),
                // An instruction too large to send is the client's own refusal; go on.
                _ => {}
            }
        }
        if step % 64 == 63 {
            good(&mut witness, 2 + step / 64)?;
        }
    }
    for (c, client) in clients.iter_mut().enumerate() {
        match client.sync() {
            Err(error) if is_fault(&error) => return Err(Finding::Fault { client: c, step: longest, error }),
            _ => {}
        }
    }
    // Clients leave (their values are freed); the witness carries on.
    drop(clients);
    good(&mut witness, 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_same_streams_and_every_byte_string_works() {
        let bytes: Vec<u8> = (0..4000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        // (Debug forms: NaN scalars are not equal to themselves.)
        assert_eq!(format!("{:?}", streams(&bytes, 3)), format!("{:?}", streams(&bytes, 3)));
        let all: Vec<Step> = streams(&bytes, 3).into_iter().flatten().collect();
        assert!(all.len() > 400, "{}", all.len());
        // Mostly instructions, with waits among them.
        assert!(all.iter().any(|s| matches!(s, Step::Read(_))) && all.iter().any(|s| matches!(s, Step::Sync)));
        assert!(streams(&[], 2).iter().all(|s| s.len() <= 1));
        // No bytes: at most the opening compile and placed signals.
        assert!(spread_streams(&[], 2).iter().all(|s| s.len() <= 2));
        let spread: Vec<Step> = spread_streams(&bytes, 3).into_iter().flatten().collect();
        assert!(spread.iter().any(|s| matches!(s, Step::Instr(Instr::Collective { .. }))));
    }
}
