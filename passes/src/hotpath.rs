//! `hotpath`: finds instruction sequences that repeat in a stream (a training loop's body)
//! and wraps each later repetition in `hotpath_start ID` / `hotpath_end ID`, so that a
//! compiler pass can treat it as one region.
//!
//! How it sees repetition: each instruction becomes a *token*, its structure hash
//! ([`gt_ir::structure`]: op, attributes and types, every value id erased), so iterations
//! that use fresh ids hash alike. The shortest sequence of `min_seq..=window` tokens that
//! the stream has just repeated `threshold` times back to back, with the same *dataflow* in
//! its last two copies (each operand either the result of the same earlier instruction of
//! the sequence, or an input from outside it), becomes the hot sequence. Its first and last ops may differ
//! (unlike the Python GT's detector). A sequence's id is FNV-1a over its tokens and dataflow;
//! both hashes are fixed mixes, so an id is the same in every process and every run.
//!
//! Once a sequence's dataflow is known, its repetitions stream: `hotpath_start` goes out
//! before a repetition's first instruction and each instruction as it comes, checked
//! against the sequence's next token and dataflow, so the worker (and the fuse pass's plan
//! of the sequence) need not wait for the repetition to end; one that breaks off, or that a
//! sync point cuts, gets its `hotpath_end` where it stops. A sync point inside a repetition
//! turns the sequence to start there; its dataflow is learned from the two turned
//! repetitions the stream just made when it made them, else the next one, which alone is
//! held. An inert sequence (below) that turning would not change is not turned.
//!
//! A hot sequence none of whose computing instructions reads what another of it computed (a
//! loop of unrelated small ops, each result dropped) is followed but not marked: compiling it
//! gains nothing, and holding its repetitions would only cost each instruction.
//!
//! Cost: O(`window`) token compares per instruction (over contiguous slices, vectorized), so
//! linear in the stream; while an inert sequence is followed, none: its tokens are known, and
//! the counters take at most `window * max(threshold, 2) + 2` of them when the stream leaves
//! it. Memory: two windows of tokens and one buffered repetition.

use crate::pipeline::{Emit, Meta, StreamPass};
use foldhash::{HashMap, HashMapExt};
use gt_ir::{Instr, InstrValues, UnaryOp, ValueId};

/// Detection settings (`GT_HOTPATH_WINDOW`, `GT_HOTPATH_THRESHOLD`, `GT_HOTPATH_MIN_SEQ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotPathConfig {
    /// Longest sequence considered.
    pub window: usize,
    /// Times a sequence must occur back to back before it is hot (at least 2).
    pub threshold: u32,
    /// Shortest sequence considered.
    pub min_seq: usize,
}

impl Default for HotPathConfig {
    fn default() -> Self {
        HotPathConfig { window: 64, threshold: 3, min_seq: 3 }
    }
}

/// What the pass found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HotPathStats {
    /// Instructions seen.
    pub instructions: u64,
    /// Distinct hot sequences found.
    pub sequences: u64,
    /// Repetitions wrapped in markers.
    pub repetitions: u64,
    /// Instructions inside wrapped repetitions.
    pub covered: u64,
}

/// One instruction as the detector remembers it.
#[derive(Debug, Clone, Default)]
struct Seen {
    token: u64,
    results: InstrValues,
    operands: InstrValues,
}

/// The last instructions as the detector remembers them, oldest first: a ring whose slots are
/// filled in place (the next instruction is staged in the slot it will take, then committed),
/// so that remembering one moves no `Seen` through calls and a `VecDeque` (what a profile on
/// an EPYC VM showed as store-forwarding stalls; no change measured on a Xeon VM).
#[derive(Debug)]
struct Recent {
    slots: Vec<Seen>,
    /// The slot of the staged instruction (the next to be committed).
    next: usize,
    len: usize,
}

impl Recent {
    fn new(capacity: usize) -> Recent {
        Recent { slots: vec![Seen::default(); capacity.max(1)], next: 0, len: 0 }
    }

    /// Fills the next slot with `instr` (as `token`), not yet remembered.
    fn stage(&mut self, token: u64, instr: &Instr) {
        let seen = &mut self.slots[self.next];
        seen.token = token;
        seen.results.clear();
        seen.operands.clear();
        instr.for_each_value(|v, is_result| if is_result { seen.results.push(v) } else { seen.operands.push(v) });
    }

    /// The staged instruction.
    fn staged(&self) -> &Seen {
        &self.slots[self.next]
    }

    /// Remembers the staged instruction, forgetting the oldest when full.
    fn commit(&mut self) {
        let cap = self.slots.len();
        self.next = if self.next + 1 == cap { 0 } else { self.next + 1 };
        self.len = (self.len + 1).min(cap);
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The instruction committed last.
    fn newest(&self) -> &Seen {
        self.get(self.len - 1)
    }

    /// The `i`th remembered instruction, oldest first (the newest is in the slot before the
    /// staged one).
    fn get(&self, i: usize) -> &Seen {
        debug_assert!(i < self.len);
        let cap = self.slots.len();
        &self.slots[(self.next + cap - self.len + i) % cap]
    }
}

/// A hot sequence: its id, tokens and dataflow (`None` after a flush turned it to start
/// elsewhere, until its next whole repetition gives it).
#[derive(Debug, Clone)]
struct Hot {
    id: u64,
    tokens: Vec<u64>,
    flow: Option<Vec<u32>>,
    /// No instruction of it that computes something reads what another one computed (a loop
    /// of unrelated small ops): it is followed but not marked, as compiling it gains nothing,
    /// and holding and marking each repetition would cost every instruction. `at` is where the
    /// stream is in it.
    inert: Option<usize>,
}

/// A sequence's id: FNV-1a over its tokens and dataflow.
fn sequence_id(tokens: &[u64], flow: &[u32]) -> u64 {
    tokens.iter().copied().chain(flow.iter().map(|f| u64::from(*f))).fold(FNV_OFFSET, |h, t| fnv1a(&t.to_le_bytes(), h))
}

/// The hot-path pass.
#[derive(Debug)]
pub struct HotPath {
    config: HotPathConfig,
    /// The last `2 * window + 1` instructions' tokens and value ids.
    recent: Recent,
    /// The last `window + 1` tokens' low halves, oldest first, as one contiguous slice: a
    /// ring of `window + 1` written twice over (`tokens[i]` and `tokens[i + window + 1]`), so
    /// the per-instruction compares below run over plain slices of 32-bit lanes and vectorize
    /// (a candidate is then confirmed on whole tokens).
    tokens: Vec<u32>,
    /// Tokens seen so far.
    pushed: usize,
    /// Where the next token goes in the ring (`pushed % (window + 1)`).
    slot: usize,
    /// `run[window - len]`: instructions in a row equal to the one `len` before (reversed, to
    /// line up with `tokens`), saturating.
    run: Vec<u32>,
    /// `need[window - len]`: the run at which the last `len` instructions repeated
    /// `threshold` times back to back (`len * (threshold - 1)`).
    need: Vec<u32>,
    /// Every free's token; each unary op's (by [`UnaryOp`] index); every matmul's: the
    /// commonest small ops cost no hash.
    free_token: u64,
    unary_tokens: Vec<u64>,
    matmul_token: u64,
    /// The hot sequence.
    hot: Option<Hot>,
    /// Instructions of a repetition in progress (a prefix of the hot sequence) while its
    /// dataflow is still to be learned.
    pending: Vec<(Instr, Meta)>,
    /// Instructions of a repetition in progress that went out already (a sequence whose
    /// dataflow is known: its repetitions stream, checked as they come), and where its check
    /// is in the sequence's dataflow.
    streamed: usize,
    flow_at: usize,
    /// Instructions of an inert hot sequence followed since the run counters last took a
    /// token, and where the first of them is in the sequence (see `catch_up`).
    deferred: usize,
    deferred_from: usize,
    /// Whether those tokens wait for the stream to leave the sequence (always, but in the
    /// test that checks waiting changes nothing).
    defer_while_inert: bool,
    /// Scratch for a repetition's dataflow.
    defined: HashMap<ValueId, u32>,
    /// What the current repetition of an inert sequence computed.
    inert_values: Vec<ValueId>,
    flow: Vec<u32>,
    found: Vec<u64>,
    stats: HotPathStats,
}

impl HotPath {
    /// A detector with these settings (a zero window or threshold is taken as 1).
    pub fn new(config: HotPathConfig) -> HotPath {
        let config = HotPathConfig {
            window: config.window.max(1),
            threshold: config.threshold.max(1),
            min_seq: config.min_seq.clamp(1, config.window.max(1)),
        };
        HotPath {
            config,
            recent: Recent::new(2 * config.window + 1),
            tokens: vec![0; 2 * (config.window + 1)],
            pushed: 0,
            slot: 0,
            run: vec![0; config.window + 1],
            need: (0..=config.window)
                .map(|i| {
                    let len = (config.window - i) as u64;
                    let repeats = u64::from(config.threshold.max(2) - 1);
                    u32::try_from(len * repeats).unwrap_or(u32::MAX)
                })
                .collect(),
            free_token: token(&Instr::Free { src: ValueId(0) }),
            unary_tokens: UnaryOp::ALL
                .iter()
                .map(|&op| token(&Instr::Unary { op, dst: ValueId(0), src: ValueId(0) }))
                .collect(),
            matmul_token: token(&Instr::MatMul { dst: ValueId(0), lhs: ValueId(0), rhs: ValueId(0) }),
            hot: None,
            pending: Vec::new(),
            streamed: 0,
            flow_at: 0,
            deferred: 0,
            deferred_from: 0,
            defer_while_inert: true,
            defined: HashMap::new(),
            inert_values: Vec::new(),
            flow: Vec::new(),
            found: Vec::new(),
            stats: HotPathStats::default(),
        }
    }

    /// What it found so far.
    pub fn stats(&self) -> HotPathStats {
        self.stats
    }

    /// Takes the newest instruction and returns a newly hot sequence, when `want`.
    ///
    /// `run[w - len]` counts how many instructions in a row equalled the one `len` earlier, so
    /// the last `len` instructions have repeated `threshold` times back to back exactly when
    /// it is `>= len * (threshold - 1)`: O(window) compares per instruction over contiguous
    /// slices (vectorized), no tables.
    fn observe(&mut self, want: bool) -> Option<Hot> {
        debug_assert_eq!(self.deferred, 0, "the detector caught up before it looks");
        let newest = self.recent.staged().token as u32;
        self.recent.commit();
        let any = self.advance(newest);
        if !want || !any {
            return None;
        }
        let (w, n) = (self.config.window, self.recent.len());
        for len in self.config.min_seq..=w.min(n / 2) {
            if self.run[w - len] < self.need[w - len] {
                continue;
            }
            // The tokens repeat (their low halves: whole ones are checked here); so must the
            // dataflow, or it is another computation.
            let last: Vec<&Seen> = (n - len..n).map(|i| self.recent.get(i)).collect();
            let before: Vec<&Seen> = (n - 2 * len..n - len).map(|i| self.recent.get(i)).collect();
            if last.iter().zip(&before).any(|(a, b)| a.token != b.token) {
                continue;
            }
            let flow = dataflow(last.iter().map(|s| (&s.results, &s.operands)));
            if flow == dataflow(before.iter().map(|s| (&s.results, &s.operands))) {
                let tokens: Vec<u64> = last.iter().map(|s| s.token).collect();
                let inert = (!feeds_itself(&flow, last.iter().map(|s| s.results.len()))).then_some(0);
                return Some(Hot { id: sequence_id(&tokens, &flow), tokens, flow: Some(flow), inert });
            }
        }
        None
    }

    /// Takes the newest token into the ring and the run counters; whether some length has
    /// now repeated `threshold` times back to back.
    fn advance(&mut self, newest: u32) -> bool {
        let w = self.config.window;
        // The last w + 1 tokens, oldest first: `last[w - len]` is the one `len` before the newest.
        let cap = w + 1;
        let slot = self.slot;
        self.tokens[slot] = newest;
        self.tokens[slot + cap] = newest;
        self.pushed += 1;
        // `pushed % cap`, without a division per instruction.
        self.slot = if slot + 1 == cap { 0 } else { slot + 1 };
        let last = &self.tokens[slot + 1..slot + 1 + cap];
        // Entries before `first` are not tokens yet (fewer than w + 1 seen).
        let first = cap - self.pushed.min(cap);
        let hi = w - self.config.min_seq;
        self.run[..first.min(hi + 1)].fill(0);
        if first > hi {
            return false;
        }
        let (run, need) = (&mut self.run[first..=hi], &self.need[first..=hi]);
        let mut any = false;
        for ((r, t), k) in run.iter_mut().zip(&last[first..=hi]).zip(need) {
            // Branch-free (`0` or `r + 1`, saturating), so the loop vectorizes.
            *r = r.saturating_add(1) & u32::from(*t == newest).wrapping_neg();
            any |= *r >= *k;
        }
        any
    }

    /// Gives the ring and the run counters the tokens of an inert sequence's repetitions that
    /// were only followed (`deferred` of them, the first at `deferred_from` in `tokens`).
    ///
    /// Their tokens are the sequence's, in order, so they need not be kept. Of a long stretch
    /// only the last `need + window + 2` are replayed: the first `window + 1` of those refill
    /// the ring, and after `need + 1` more updates over a true ring a counter is either exact
    /// (its streak broke within them) or past every `need`, where it stays exactly as long
    /// as the true one (both grow and reset together): the detector answers the same.
    fn catch_up(&mut self, tokens: &[u64]) {
        let count = std::mem::take(&mut self.deferred);
        if count == 0 {
            return;
        }
        let cap = self.config.window + 1;
        let bound = (self.need.iter().copied().max().unwrap_or(0) as usize).saturating_add(1 + cap);
        let skipped = count.saturating_sub(bound);
        self.pushed = self.pushed.saturating_add(skipped);
        for i in skipped..count {
            self.advance(tokens[(self.deferred_from + i) % tokens.len()] as u32);
        }
    }

    /// The turned sequence `tokens`, its dataflow learned, when the stream's last two
    /// stretches of its length are both it with one dataflow (what [`HotPath::observe`]
    /// asks of a newly hot one); else `tokens` back.
    fn turned(&self, tokens: Vec<u64>) -> Result<Hot, Vec<u64>> {
        let (len, n) = (tokens.len(), self.recent.len());
        if n < 2 * len {
            return Err(tokens);
        }
        let last = || (n - len..n).map(|i| self.recent.get(i));
        let before = || (n - 2 * len..n - len).map(|i| self.recent.get(i));
        if !last().map(|s| s.token).eq(tokens.iter().copied()) || !before().map(|s| s.token).eq(tokens.iter().copied())
        {
            return Err(tokens);
        }
        let flow = dataflow(last().map(|s| (&s.results, &s.operands)));
        if flow != dataflow(before().map(|s| (&s.results, &s.operands))) {
            return Err(tokens);
        }
        let inert = (!feeds_itself(&flow, last().map(|s| s.results.len()))).then_some(0);
        Ok(Hot { id: sequence_id(&tokens, &flow), tokens, flow: Some(flow), inert })
    }

    /// Counts a sequence the first time it is hot.
    fn note_found(&mut self, id: u64) {
        if !self.found.contains(&id) {
            self.found.push(id);
            self.stats.sequences += 1;
        }
    }

    fn release(&mut self, out: &mut Emit) {
        for (i, origin) in self.pending.drain(..) {
            out.keep_from(i, origin);
        }
    }

    /// Stages an instruction as the detector remembers it; returns its token.
    fn stage(&mut self, instr: &Instr) -> u64 {
        let token = match instr {
            Instr::Free { .. } => self.free_token,
            // Value ids are erased: a unary op's structure is its op, a product's nothing.
            Instr::Unary { op, .. } => self.unary_tokens[*op as usize],
            Instr::MatMul { .. } => self.matmul_token,
            _ => token(instr),
        };
        self.recent.stage(token, instr);
        token
    }

    /// Whether the stream is following an inert sequence.
    fn following(&self) -> bool {
        matches!(self.hot, Some(Hot { inert: Some(_), .. }))
    }

    /// Takes the staged instruction as the next of the inert sequence the stream follows,
    /// when it is the sequence's next and reads nothing the repetition computed; otherwise
    /// leaves it staged and returns false.
    fn follow(&mut self) -> bool {
        let Some(Hot { tokens, inert: Some(at), .. }) = &mut self.hot else { return false };
        if *at == 0 {
            self.inert_values.clear();
        }
        let seen = self.recent.staged();
        let feeds = !seen.results.is_empty() && seen.operands.iter().any(|v| self.inert_values.contains(v));
        if tokens[*at] != seen.token || feeds {
            return false;
        }
        self.inert_values.extend_from_slice(&seen.results);
        if self.deferred == 0 {
            self.deferred_from = *at;
        }
        *at = (*at + 1) % tokens.len();
        // Nothing is looked for while a sequence is hot; the detector still counts, but its
        // counters take these tokens when the stream leaves the sequence (they are the
        // sequence's): following costs no scan of the window.
        let token = seen.token;
        self.recent.commit();
        if self.defer_while_inert {
            self.deferred += 1;
        } else {
            self.advance(token as u32);
        }
        true
    }
}

impl StreamPass for HotPath {
    fn name(&self) -> &'static str {
        "hotpath"
    }

    /// What follows an inert sequence goes on as it came.
    fn pass_through(&mut self, items: &[(Instr, Meta)]) -> usize {
        let mut taken = 0;
        for (instr, _) in items {
            if !self.following() {
                break;
            }
            self.stage(instr);
            if !self.follow() {
                break;
            }
            self.stats.instructions += 1;
            taken += 1;
        }
        taken
    }

    fn run(&mut self, instr: Instr, out: &mut Emit) {
        self.stats.instructions += 1;
        let token = self.stage(&instr);
        if self.following() {
            // An inert sequence is only followed, nothing held, while the stream repeats it
            // and it stays inert (the same ops may start to read each other's results).
            if !self.follow() {
                if let Some(hot) = self.hot.take() {
                    self.catch_up(&hot.tokens);
                }
                self.observe(false);
            }
            out.keep(instr);
            return;
        }
        let newly_hot = self.observe(self.hot.is_none());
        if let Some(Hot { id, tokens, flow: Some(flow), .. }) = &self.hot {
            // A sequence whose dataflow is known streams: each instruction goes out as it
            // comes, checked against the sequence's next token and dataflow, so whatever
            // follows (the worker, the fuse pass's plan of the sequence) can start on it
            // before the repetition is over. One that breaks off ends at once.
            let (id, len) = (*id, tokens.len());
            let at = self.streamed;
            if at == 0 {
                self.defined.clear();
                self.flow_at = 0;
            }
            // The instruction's values as `observe` just remembered them (one walk of it).
            let Seen { results, operands, .. } = self.recent.newest();
            let expected = flow.get(self.flow_at..self.flow_at + operands.len() + 1);
            let follows = tokens[at] == token
                && expected.is_some_and(|e| {
                    e[operands.len()] == u32::MAX
                        && operands.iter().zip(e).all(|(v, f)| self.defined.get(v).map_or(0, |i| i + 1) == *f)
                });
            if follows {
                self.flow_at += operands.len() + 1;
                for &r in results {
                    self.defined.insert(r, at as u32);
                }
                if at == 0 {
                    out.inject(Instr::HotPathStart { id });
                }
                out.keep(instr);
                self.streamed = at + 1;
                if self.streamed == len {
                    out.inject(Instr::HotPathEnd { id });
                    self.streamed = 0;
                    self.stats.repetitions += 1;
                    self.stats.covered += len as u64;
                }
                return;
            }
            // It broke off: a repetition begun ends here, and the sequence is forgotten
            // until it is hot again.
            if at > 0 {
                out.inject(Instr::HotPathEnd { id });
            }
            self.streamed = 0;
            self.hot = None;
            out.keep(instr);
            return;
        }
        if let Some(hot) = &self.hot {
            if hot.tokens[self.pending.len()] == token {
                self.pending.push((instr, out.take_meta()));
                if self.pending.len() < hot.tokens.len() {
                    return;
                }
                // A whole repetition: marked if its dataflow is the sequence's too (the first
                // one after a flush turned the sequence gives it: the stream repeated it in the
                // other turn, with the same dataflow).
                let (defined, flow) = (&mut self.defined, &mut self.flow);
                dataflow_into(self.pending.iter().map(|(i, _)| (i.results(), i.operands())), defined, flow);
                let Some(hot) = self.hot.as_mut() else { return };
                let learned = hot.flow.is_none();
                let matches = if learned {
                    hot.id = sequence_id(&hot.tokens, &self.flow);
                    hot.flow = Some(self.flow.clone());
                    let results = self.pending.iter().map(|(i, _)| i.results().len());
                    if !feeds_itself(&self.flow, results) {
                        hot.inert = Some(0);
                        let id = hot.id;
                        self.note_found(id);
                        self.release(out);
                        return;
                    }
                    true
                } else {
                    hot.flow.as_deref() == Some(&self.flow[..])
                };
                let (id, len) = (hot.id, hot.tokens.len() as u64);
                if learned {
                    self.note_found(id);
                }
                if matches {
                    out.inject(Instr::HotPathStart { id });
                    self.release(out);
                    out.inject(Instr::HotPathEnd { id });
                    self.stats.repetitions += 1;
                    self.stats.covered += len;
                } else {
                    self.release(out);
                    self.hot = None;
                }
                return;
            }
            // The repetition broke off: what was held goes out unmarked, and the sequence is
            // forgotten until it is hot again.
            self.release(out);
            self.hot = None;
            out.keep(instr);
            return;
        }
        out.keep(instr);
        if let Some(hot) = newly_hot {
            self.note_found(hot.id);
            // This instruction ended a repetition; the next one starts the next.
            self.hot = Some(hot);
        }
    }

    /// A flush (a read or a sync) inside a repetition cuts it: what was held goes out unmarked.
    /// The stream's period is the same, so the sequence is kept, turned to start where the cut
    /// left it: a training loop that reads its loss at each step then has its repetitions
    /// between the reads instead of across them.
    fn flush(&mut self, out: &mut Emit) {
        let held = self.pending.len() + self.streamed;
        self.release(out);
        if self.streamed > 0 {
            // A streamed repetition is cut here.
            if let Some(hot) = &self.hot {
                out.inject(Instr::HotPathEnd { id: hot.id });
            }
            self.streamed = 0;
        }
        if let Some(mut hot) = self.hot.take() {
            // An inert sequence cut between repetitions, or that turning would leave as it is
            // (its tokens repeat with a period the cut is a multiple of: a loop shorter than
            // the shortest sequence), is followed on from where the stream is; its counters
            // catch up when the stream leaves it.
            let tokens = &hot.tokens;
            let unturned = |at: usize| tokens.iter().eq(tokens.iter().cycle().skip(at).take(tokens.len()));
            if hot.inert.is_some_and(|at| at == 0 || unturned(at)) {
                self.hot = Some(hot);
                return;
            }
            self.catch_up(&hot.tokens);
            // Where the stream is in the sequence (an inert one holds nothing).
            let cut = hot.inert.unwrap_or(held);
            if cut > 0 {
                hot.tokens.rotate_left(cut);
                // Turned, an inert sequence may feed itself (across the cut): learned again,
                // from the two turned repetitions the stream has just made when it made them
                // (a loop that reads at every repetition, or at every other one, would
                // otherwise hold and learn a repetition at each read, never finishing one),
                // else from the next one.
                hot = self.turned(hot.tokens).unwrap_or_else(|tokens| Hot {
                    id: hot.id,
                    tokens,
                    flow: None,
                    inert: None,
                });
                if hot.flow.is_some() {
                    self.note_found(hot.id);
                }
            }
            self.hot = Some(hot);
        }
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats;
        vec![
            ("instructions", s.instructions),
            ("sequences", s.sequences),
            ("repetitions", s.repetitions),
            ("covered", s.covered),
        ]
    }
}

/// An instruction's token: its structure, every value id erased.
fn token(instr: &Instr) -> u64 {
    gt_ir::structure::structure_hash(instr, &[])
}

/// A sequence's dataflow: for each operand, 1 + the index of the instruction of the sequence
/// that defined it last, or 0 for an input from outside; `u32::MAX` ends each instruction.
fn dataflow<R, O>(seq: impl Iterator<Item = (R, O)>) -> Vec<u32>
where
    R: AsRef<[ValueId]>,
    O: AsRef<[ValueId]>,
{
    let mut flow = Vec::new();
    dataflow_into(seq, &mut HashMap::new(), &mut flow);
    flow
}

/// Whether an instruction of a sequence that computes something (has results) reads a value
/// that the sequence computed, from its dataflow and the number of results of each instruction.
fn feeds_itself(flow: &[u32], results: impl Iterator<Item = usize>) -> bool {
    let mut results = results;
    flow.split(|f| *f == u32::MAX).zip(&mut results).any(|(operands, n)| n > 0 && operands.iter().any(|f| *f > 0))
}

/// [`dataflow`] into `flow`, with `defined` as scratch (both emptied first): a repetition's
/// check allocates nothing.
fn dataflow_into<R, O>(seq: impl Iterator<Item = (R, O)>, defined: &mut HashMap<ValueId, u32>, flow: &mut Vec<u32>)
where
    R: AsRef<[ValueId]>,
    O: AsRef<[ValueId]>,
{
    defined.clear();
    flow.clear();
    for (k, (results, operands)) in seq.enumerate() {
        flow.extend(operands.as_ref().iter().map(|v| defined.get(v).map_or(0, |i| i + 1)));
        flow.push(u32::MAX);
        for r in results.as_ref() {
            defined.insert(*r, k as u32);
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, 64-bit: tiny, and fixed forever (std's hashers may change between releases).
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::{BinaryOp, Operand, ReduceOp, TensorType, UnaryOp};
    use proptest::prelude::*;

    fn v(n: u32) -> ValueId {
        ValueId(n)
    }

    /// One training-loop-like iteration with fresh ids: matmul -> relu -> sum.
    fn iteration(base: u32) -> Vec<Instr> {
        vec![
            Instr::MatMul { dst: v(base), lhs: v(0), rhs: v(1) },
            Instr::Unary { op: UnaryOp::Relu, dst: v(base + 1), src: v(base) },
            Instr::Reduce { op: ReduceOp::Sum, dst: v(base + 2), src: v(base + 1), axes: None, keepdim: false },
        ]
    }

    impl HotPath {
        /// What the detector answers from: the ring's tokens, oldest first, and each run
        /// counter up to the largest `need` and one (beyond it, every counter answers alike).
        fn detector(&self) -> (Vec<u32>, Vec<u32>, usize) {
            let cap = self.config.window + 1;
            let ring = self.tokens[self.slot..self.slot + cap].to_vec();
            let top = self.need.iter().copied().max().unwrap_or(0).saturating_add(1);
            (ring, self.run.iter().map(|r| *r.min(&top)).collect(), self.pushed.min(cap))
        }
    }

    fn run(pass: &mut HotPath, input: Vec<Instr>) -> Vec<Instr> {
        let mut out = Emit::new("hotpath");
        for i in input {
            pass.run(i, &mut out);
        }
        pass.flush(&mut out);
        instrs(out)
    }

    fn instrs(out: Emit) -> Vec<Instr> {
        out.into_items().into_iter().map(|(i, _)| i).collect()
    }

    fn unmarked(out: &[Instr]) -> Vec<Instr> {
        out.iter().filter(|i| !matches!(i, Instr::HotPathStart { .. } | Instr::HotPathEnd { .. })).cloned().collect()
    }

    /// The setup, then `n` iterations with fresh ids.
    fn looped(n: u32) -> Vec<Instr> {
        let mut input = setup();
        for k in 0..n {
            input.extend(iteration(10 + 3 * k));
        }
        input
    }

    fn setup() -> Vec<Instr> {
        vec![
            Instr::Randn { dst: v(0), ty: TensorType::f32(vec![4, 4]), seed: 1 },
            Instr::Randn { dst: v(1), ty: TensorType::f32(vec![4, 4]), seed: 2 },
        ]
    }

    #[test]
    fn a_loop_whose_first_and_last_ops_differ_is_found_and_wrapped() {
        let input = looped(10);
        let mut pass = HotPath::new(HotPathConfig::default());
        let out = run(&mut pass, input.clone());
        assert_eq!(unmarked(&out), input, "markers only; nothing lost, moved or changed");
        let starts: Vec<usize> =
            out.iter().enumerate().filter(|(_, i)| matches!(i, Instr::HotPathStart { .. })).map(|(k, _)| k).collect();
        assert!(starts.len() >= 5, "{out:#?}");
        for &s in &starts {
            // Each marked repetition is exactly matmul, relu, sum, then the end marker.
            assert!(matches!(out[s + 1], Instr::MatMul { .. }), "{:?}", out[s + 1]);
            assert!(matches!(out[s + 3], Instr::Reduce { .. }));
            assert!(
                matches!((&out[s], &out[s + 4]), (Instr::HotPathStart { id: a }, Instr::HotPathEnd { id: b }) if a == b)
            );
        }
        let stats = pass.stats();
        assert_eq!(
            (stats.sequences, stats.repetitions, stats.covered),
            (1, starts.len() as u64, 3 * starts.len() as u64)
        );
    }

    #[test]
    fn ids_are_stable_across_runs_and_processes() {
        let input = looped(6);
        let out = run(&mut HotPath::new(HotPathConfig::default()), input);
        let id = out.iter().find_map(|i| if let Instr::HotPathStart { id } = i { Some(*id) } else { None }).unwrap();
        // Fixed hashes of the structure: a constant, whatever the process or run.
        assert_eq!(id, 0x180e_7cf9_9b45_6b86, "{id:#x}");
    }

    #[test]
    fn a_broken_repetition_ends_where_it_breaks() {
        let mut input = looped(6);
        // Two thirds of an iteration, then something else.
        input.extend(iteration(100).into_iter().take(2));
        input.push(Instr::Binary {
            op: BinaryOp::Add,
            dst: v(200),
            lhs: Operand::Value(v(0)),
            rhs: Operand::Scalar(1.0),
        });
        let mut pass = HotPath::new(HotPathConfig::default());
        let before = pass.stats().repetitions;
        let out = run(&mut pass, input.clone());
        assert_eq!(unmarked(&out), input);
        // The two instructions streamed, then their repetition ended; what broke it is not in it.
        let tail = &out[out.len() - 5..];
        assert!(
            matches!(
                tail,
                [Instr::HotPathStart { id: a }, Instr::MatMul { .. }, Instr::Unary { .. }, Instr::HotPathEnd { id: b }, Instr::Binary { .. }]
                    if a == b
            ),
            "{tail:?}"
        );
        // A repetition cut short is not counted as one.
        let whole = run(&mut HotPath::new(HotPathConfig::default()), looped(6));
        let starts = whole.iter().filter(|i| matches!(i, Instr::HotPathStart { .. })).count() as u64;
        assert_eq!(pass.stats().repetitions - before, starts);
    }

    #[test]
    fn a_repetition_streams_as_it_comes_and_a_flush_ends_it() {
        let mut input = looped(6);
        input.extend(iteration(100).into_iter().take(2));
        let mut pass = HotPath::new(HotPathConfig::default());
        let mut out = Emit::new("hotpath");
        for i in input.clone() {
            pass.run(i, &mut out);
        }
        let before_flush = out.len();
        pass.flush(&mut out);
        assert_eq!(out.len() - before_flush, 1, "nothing was held; the end marker came");
        let out = instrs(out);
        assert!(matches!(out.last(), Some(Instr::HotPathEnd { .. })));
        assert_eq!(unmarked(&out), input);
    }

    #[test]
    fn the_same_ops_with_another_dataflow_are_not_the_sequence() {
        let mut input = looped(6);
        // matmul, relu, sum again, but relu reads an input instead of the matmul.
        input.push(Instr::MatMul { dst: v(500), lhs: v(0), rhs: v(1) });
        input.push(Instr::Unary { op: UnaryOp::Relu, dst: v(501), src: v(0) });
        input.push(Instr::Reduce { op: ReduceOp::Sum, dst: v(502), src: v(501), axes: None, keepdim: false });
        let out = run(&mut HotPath::new(HotPathConfig::default()), input.clone());
        assert_eq!(unmarked(&out), input);
        assert!(!matches!(out.last(), Some(Instr::HotPathEnd { .. })), "{:?}", &out[out.len() - 4..]);
    }

    /// One step of an MLP training loop as a client streams it: forward, loss, backward,
    /// SGD updates that redefine the weights (fresh ids every step, as an API would make).
    fn mlp_step(ids: &mut u32, w1: &mut ValueId, w2: &mut ValueId) -> Vec<Instr> {
        let x = v(0);
        let mut next = || {
            *ids += 1;
            v(*ids)
        };
        let (h, a, y, d, l, g2, dh, g1, nw1, nw2) =
            (next(), next(), next(), next(), next(), next(), next(), next(), next(), next());
        let step = vec![
            Instr::MatMul { dst: h, lhs: x, rhs: *w1 },
            Instr::Unary { op: UnaryOp::Relu, dst: a, src: h },
            Instr::MatMul { dst: y, lhs: a, rhs: *w2 },
            Instr::Binary { op: BinaryOp::Sub, dst: d, lhs: Operand::Value(y), rhs: Operand::Value(v(1)) },
            Instr::Reduce { op: ReduceOp::Mean, dst: l, src: d, axes: None, keepdim: false },
            Instr::MatMul { dst: g2, lhs: a, rhs: d },
            Instr::MatMul { dst: dh, lhs: d, rhs: *w2 },
            Instr::MatMul { dst: g1, lhs: x, rhs: dh },
            Instr::Binary { op: BinaryOp::Sub, dst: nw1, lhs: Operand::Value(*w1), rhs: Operand::Value(g1) },
            Instr::Binary { op: BinaryOp::Sub, dst: nw2, lhs: Operand::Value(*w2), rhs: Operand::Value(g2) },
            Instr::Free { src: *w1 },
            Instr::Free { src: *w2 },
        ];
        (*w1, *w2) = (nw1, nw2);
        step
    }

    #[test]
    fn an_mlp_training_loop_is_found_as_one_hot_path() {
        let (mut ids, mut w1, mut w2) = (10, v(2), v(3));
        let mut input = Vec::new();
        let mut steps = 0;
        let out = {
            let mut pass = HotPath::new(HotPathConfig::default());
            let mut out = Emit::new("hotpath");
            for _ in 0..20 {
                for i in mlp_step(&mut ids, &mut w1, &mut w2) {
                    input.push(i.clone());
                    pass.run(i, &mut out);
                }
                steps += 1;
            }
            pass.flush(&mut out);
            let stats = pass.stats();
            // One sequence, the whole 12-instruction step, wrapped from the first few steps on.
            assert_eq!(stats.sequences, 1, "{stats:?}");
            assert_eq!(stats.covered, 12 * stats.repetitions);
            assert!(stats.repetitions >= steps - 4, "{stats:?}");
            instrs(out)
        };
        assert!(unmarked(&out) == input, "markers only");
    }

    #[test]
    fn a_loop_that_reads_at_each_step_is_wrapped_between_the_reads() {
        // The client reads the loss after each step: the dispatcher flushes the passes there.
        let (mut ids, mut w1, mut w2) = (10, v(2), v(3));
        let mut pass = HotPath::new(HotPathConfig::default());
        let mut input = Vec::new();
        let mut marked_steps = 0;
        for step in 0..20 {
            let mut out = Emit::new("hotpath");
            let mut instrs_of_step = mlp_step(&mut ids, &mut w1, &mut w2);
            if step == 0 {
                // The first step starts otherwise, so the stream repeats from its second
                // instruction on, and the sequence is first found out of step with the reads.
                let Instr::MatMul { dst, lhs, .. } = instrs_of_step[0] else { unreachable!() };
                instrs_of_step[0] = Instr::Unary { op: UnaryOp::Neg, dst, src: lhs };
            }
            for i in instrs_of_step {
                input.push(i.clone());
                pass.run(i, &mut out);
            }
            pass.flush(&mut out);
            let out = instrs(out);
            let wrapped = matches!(
                (out.first(), out.last()),
                (Some(Instr::HotPathStart { id: a }), Some(Instr::HotPathEnd { id: b })) if a == b
            );
            if wrapped {
                assert_eq!(out.len(), 12 + 2, "step {step}: the whole step, once: {out:#?}");
                marked_steps += 1;
            }
        }
        let stats = pass.stats();
        assert!(marked_steps >= 20 - 5, "{marked_steps} steps wrapped; {stats:?}");
        assert_eq!(stats.covered, 12 * stats.repetitions, "{stats:?}");
    }

    #[test]
    fn a_loop_read_at_every_step_and_shorter_than_a_sequence_is_never_held() {
        // `t.neg().item()` in a loop: a free and a neg between reads, a period of two, shorter
        // than the shortest sequence: the sequence found spans two steps, and every other read
        // cuts it in the middle. Turned there, it is learned from the steps already seen, so
        // no step waits in the pass for the next (which the read would cut again).
        let mut pass = HotPath::new(HotPathConfig::default());
        let mut held = Vec::new();
        for k in 0..40u32 {
            let mut out = Emit::new("hotpath");
            let step =
                vec![Instr::Free { src: v(100 + k) }, Instr::Unary { op: UnaryOp::Neg, dst: v(101 + k), src: v(0) }];
            for i in step.clone() {
                pass.run(i, &mut out);
            }
            if out.len() < step.len() {
                held.push(k);
            }
            pass.flush(&mut out);
            assert_eq!(unmarked(&instrs(out)), step, "step {k}");
        }
        assert_eq!(pass.stats().sequences, 1, "{:?}", pass.stats());
        assert_eq!(held, Vec::<u32>::new(), "steps held");
    }

    #[test]
    fn a_loop_of_unrelated_ops_is_followed_but_not_marked() {
        // A tiny op whose result is dropped at once, again and again: nothing to compile.
        let mut input = Vec::new();
        for k in 0..40 {
            input.push(Instr::Unary { op: UnaryOp::Neg, dst: v(10 + k), src: v(0) });
            input.push(Instr::Free { src: v(10 + k) });
        }
        let mut pass = HotPath::new(HotPathConfig::default());
        let mut out = Emit::new("hotpath");
        for (k, i) in input.iter().cloned().enumerate() {
            pass.run(i, &mut out);
            // Nothing is held: each instruction goes out as it comes.
            assert_eq!(out.len(), k + 1);
        }
        assert_eq!(instrs(out), input);
        assert_eq!((pass.stats().sequences, pass.stats().repetitions), (1, 0));
        // When the loop starts to feed itself, it is marked.
        let mut input = looped(8);
        let mut out = Emit::new("hotpath");
        input.push(Instr::Free { src: v(3) });
        for i in input {
            pass.run(i, &mut out);
        }
        pass.flush(&mut out);
        assert!(pass.stats().repetitions > 0, "{:?}", pass.stats());
    }

    /// Run through a default pass, `input` comes out whole with some repetitions marked.
    fn assert_repetitions_marked(input: &[Instr]) {
        let mut pass = HotPath::new(HotPathConfig::default());
        let out = run(&mut pass, input.to_vec());
        assert_eq!(unmarked(&out), input);
        assert!(pass.stats().repetitions > 0, "{:?}", pass.stats());
    }

    #[test]
    fn frees_in_a_row_at_each_step_do_not_hide_the_loop() {
        // Each step drops many values at its end: the frees alone repeat (an inert sequence),
        // and the step around them must still be found.
        let mut input = setup();
        for k in 0..20 {
            let base = 100 + 10 * k;
            input.extend(iteration(base));
            input.extend((0..9).map(|j| Instr::Free { src: v(base + j % 3) }));
        }
        assert_repetitions_marked(&input);
    }

    #[test]
    fn an_inert_loop_whose_ops_start_to_chain_is_found_again() {
        // `neg x` again and again, then the same op reading its own result: same tokens, but
        // now a computation worth compiling.
        let mut input = Vec::new();
        for k in 0..20 {
            input.push(Instr::Unary { op: UnaryOp::Neg, dst: v(10 + k), src: v(0) });
        }
        for k in 30..60 {
            input.push(Instr::Unary { op: UnaryOp::Neg, dst: v(k + 1), src: v(k) });
        }
        assert_repetitions_marked(&input);
    }

    #[test]
    fn the_tokens_kept_ahead_are_the_structure_hashes() {
        let pass = HotPath::new(HotPathConfig::default());
        for &op in UnaryOp::ALL {
            assert_eq!(pass.unary_tokens[op as usize], token(&Instr::Unary { op, dst: v(7), src: v(3) }), "{op:?}");
        }
        assert_eq!(pass.matmul_token, token(&Instr::MatMul { dst: v(4), lhs: v(2), rhs: v(9) }));
        assert_eq!(pass.free_token, token(&Instr::Free { src: v(5) }));
    }

    #[test]
    fn below_the_threshold_nothing_is_marked() {
        let input = looped(2);
        let config = HotPathConfig { threshold: 5, ..Default::default() };
        let out = run(&mut HotPath::new(config), input.clone());
        assert_eq!(out, input);
    }

    /// `out` is `input` with balanced, unnested markers added.
    fn marked_copy_of(out: &[Instr], input: &[Instr]) -> Result<(), TestCaseError> {
        prop_assert_eq!(unmarked(out), input.to_vec());
        let mut open = None;
        for i in out {
            match i {
                Instr::HotPathStart { id } => {
                    prop_assert!(open.is_none());
                    open = Some(*id);
                }
                Instr::HotPathEnd { id } => prop_assert_eq!(open.take(), Some(*id)),
                _ => {}
            }
        }
        prop_assert!(open.is_none());
        Ok(())
    }

    proptest! {
        /// Whatever the stream, the pass only adds balanced markers.
        #[test]
        fn only_balanced_markers_are_added(ops in proptest::collection::vec(0u8..4, 0..300), window in 1usize..12) {
            let mut input = setup();
            for (k, op) in ops.iter().enumerate() {
                let dst = v(10 + k as u32);
                let src = if k == 0 { v(0) } else { v(9 + k as u32) };
                input.push(match op {
                    0 => Instr::Unary { op: UnaryOp::Relu, dst, src },
                    1 => Instr::Unary { op: UnaryOp::Exp, dst, src },
                    2 => Instr::MatMul { dst, lhs: src, rhs: v(1) },
                    _ => Instr::Binary { op: BinaryOp::Mul, dst, lhs: Operand::Value(src), rhs: Operand::Scalar(0.5) },
                });
            }
            let config = HotPathConfig { window, threshold: 2, min_seq: 1 };
            let out = run(&mut HotPath::new(config), input.clone());
            marked_copy_of(&out, &input)?;
        }

        /// Following an inert sequence without scanning the window (the counters catch up
        /// when the stream leaves it), and letting a pipeline pass what it follows through
        /// by the batch, marks exactly what scanning at each instruction marks:
        /// long inert stretches of several periods, training steps whose frees repeat alone,
        /// broken repetitions and flushes anywhere, in windows small enough that a stretch
        /// outlasts the replay bound.
        #[test]
        fn following_an_inert_sequence_lazily_marks_what_scanning_marks(
            segments in proptest::collection::vec((0u8..6, 1usize..400), 1..12),
            window in 1usize..20,
            threshold in 1u32..5,
            min_seq in 1usize..4,
            batch in 1usize..80,
        ) {
            let config = HotPathConfig { window, threshold, min_seq };
            let mut lazy = HotPath::new(config);
            let mut eager = HotPath::new(config);
            eager.defer_while_inert = false;
            let (mut lazy_out, mut eager_out) = (Emit::new("hotpath"), Emit::new("hotpath"));
            // The same pass in a pipeline, taking the stream `batch` instructions at a time:
            // what it only follows goes through `pass_through`, not `run`.
            let mut pipeline = crate::pipeline::Pipeline::new();
            pipeline.push(Box::new(HotPath::new(config)));
            let (mut piped, mut waiting, mut seq) = (Vec::new(), Vec::new(), 0u64);
            let mut next = 10u32;
            let mut fresh = || { next += 1; v(next) };
            for (kind, count) in segments {
                let mut input = Vec::new();
                for k in 0..count {
                    match kind {
                        // A tiny op, its result dropped: period 2.
                        0 => {
                            let dst = fresh();
                            input.extend([Instr::Unary { op: UnaryOp::Neg, dst, src: v(0) }, Instr::Free { src: dst }]);
                        }
                        // Three unrelated ops on an input, then their frees: period 6.
                        1 => {
                            let d: Vec<ValueId> = (0..3).map(|_| fresh()).collect();
                            input.push(Instr::Unary { op: UnaryOp::Neg, dst: d[0], src: v(0) });
                            input.push(Instr::Unary { op: UnaryOp::Exp, dst: d[1], src: v(1) });
                            input.push(Instr::MatMul { dst: d[2], lhs: v(0), rhs: v(1) });
                            input.extend(d.iter().map(|&src| Instr::Free { src }));
                        }
                        // A step that computes, then frees in a row.
                        2 => {
                            let base = fresh().0;
                            for _ in 0..3 { fresh(); }
                            input.extend(iteration(base));
                            input.extend((0..3 + k % 2).map(|j| Instr::Free { src: v(base + j as u32 % 3) }));
                        }
                        // Frees alone (period 1).
                        3 => input.push(Instr::Free { src: fresh() }),
                        // A chain: each op reads the last result.
                        4 => {
                            let dst = fresh();
                            input.push(Instr::Unary { op: UnaryOp::Neg, dst, src: ValueId(dst.0 - 1) });
                        }
                        // A flush every `count % 7 + 1` tiny ops.
                        _ => {
                            let dst = fresh();
                            input.extend([Instr::Unary { op: UnaryOp::Neg, dst, src: v(0) }, Instr::Free { src: dst }]);
                            if k % (count % 7 + 1) == 0 {
                                input.push(Instr::HotPathEnd { id: u64::MAX });
                            }
                        }
                    }
                }
                for instr in input {
                    // A stand-in marks a flush.
                    if instr == (Instr::HotPathEnd { id: u64::MAX }) {
                        lazy.flush(&mut lazy_out);
                        eager.flush(&mut eager_out);
                        pipeline.run_many(std::mem::take(&mut waiting), &mut piped);
                        pipeline.flush(seq, &mut piped);
                        continue;
                    }
                    seq += 1;
                    waiting.push((instr.clone(), seq));
                    if waiting.len() == batch {
                        pipeline.run_many(std::mem::take(&mut waiting), &mut piped);
                    }
                    lazy.run(instr.clone(), &mut lazy_out);
                    eager.run(instr, &mut eager_out);
                    if lazy.deferred == 0 {
                        prop_assert_eq!(lazy.detector(), eager.detector());
                    }
                }
            }
            lazy.flush(&mut lazy_out);
            eager.flush(&mut eager_out);
            pipeline.run_many(waiting, &mut piped);
            pipeline.flush(seq + 1, &mut piped);
            prop_assert_eq!(lazy.stats(), eager.stats());
            prop_assert_eq!(&pipeline.stats()[0].1, &StreamPass::stats(&lazy));
            let lazy_out = instrs(lazy_out);
            prop_assert_eq!(&lazy_out, &instrs(eager_out));
            prop_assert_eq!(&lazy_out, &piped.into_iter().map(|(i, _)| i).collect::<Vec<_>>());
        }

        /// With inert stretches (ops on an outside value, results freed) and flushes anywhere,
        /// the stream still goes out whole and in order, with balanced markers.
        #[test]
        fn inert_stretches_and_flushes_keep_the_stream(
            ops in proptest::collection::vec(0u8..7, 0..300),
            window in 1usize..12,
            threshold in 1u32..4,
        ) {
            let mut pass = HotPath::new(HotPathConfig { window, threshold, min_seq: 1 });
            let mut out = Emit::new("hotpath");
            let mut input = Vec::new();
            for (k, op) in ops.iter().enumerate() {
                let dst = v(10 + k as u32);
                let src = if k == 0 { v(0) } else { v(9 + k as u32) };
                let instr = match op {
                    0 => Instr::Unary { op: UnaryOp::Relu, dst, src },
                    1 => Instr::Binary { op: BinaryOp::Mul, dst, lhs: Operand::Value(src), rhs: Operand::Scalar(0.5) },
                    2 | 3 => Instr::Unary { op: UnaryOp::Neg, dst, src: v(0) },
                    4 | 5 => Instr::Free { src },
                    _ => {
                        pass.flush(&mut out);
                        continue;
                    }
                };
                input.push(instr.clone());
                pass.run(instr, &mut out);
            }
            pass.flush(&mut out);
            let out = instrs(out);
            marked_copy_of(&out, &input)?;
        }
    }
}
