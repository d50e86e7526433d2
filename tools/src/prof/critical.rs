//! The critical path of a profile: what the run's end waited on, walked back from the record
//! that ended last through each worker's records in the order they ran and, at every collective, to the
//! part that arrived last; told as kernels, copies, transfers and idle time, per worker.
//!
//! The graph (a petgraph `DiGraph`): a node per record, a part of a collective split in two
//! (its arrival, when its worker reached the collective, and its completion), and a node per
//! collective; an edge from each record to the next one its worker ran, from every part's
//! arrival to its collective and from the collective to each part's completion, since a
//! collective completes only once every part has arrived. From each
//! node the walk follows the predecessor that released it last. Collectives that ran in
//! different orders on two workers (a garbled profile) make a cycle, refused by name.

use super::chart::format_ns;
use super::load::Profile;
use gt_transport::profile::{Record, RecordKind};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction::Incoming;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

/// What a stretch of the critical path was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentKind {
    /// An instruction or fused kernel ran.
    Kernel,
    /// Data between the host and the worker (an upload, a read).
    Copy,
    /// A collective moved data, after its last part arrived.
    Transfer,
    /// The worker on the path ran nothing: it waited for work from its client or the
    /// dispatcher (the host side was the bottleneck), or had not started yet.
    Idle,
}

impl SegmentKind {
    /// Its name in text and CSV.
    pub fn name(self) -> &'static str {
        match self {
            SegmentKind::Kernel => "kernel",
            SegmentKind::Copy => "copy",
            SegmentKind::Transfer => "transfer",
            SegmentKind::Idle => "idle",
        }
    }
}

/// One stretch of the critical path: a record, or idle time, on one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// What it was.
    pub kind: SegmentKind,
    /// The worker it was on.
    pub worker: String,
    /// The record (an index into the profile's `records`; `None` for idle time).
    pub record: Option<usize>,
    /// Where it starts, ns on the dispatcher's clock.
    pub start_ns: u64,
    /// Where it ends.
    pub end_ns: u64,
}

impl Segment {
    /// Its length, ns.
    pub fn ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

/// How the parts of every collective across workers waited for each other (on the path or
/// not): time a worker spent in a collective before its last part arrived is slack, lost to
/// the slowest worker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CollectiveWaits {
    /// Collectives with parts on two workers or more.
    pub collectives: usize,
    /// Summed time parts waited for the last part to arrive, ns.
    pub waited_ns: u64,
    /// Per worker, how often its part arrived last (the straggler), most often first.
    pub last_arrivals: Vec<(String, usize)>,
}

/// A profile's critical path: contiguous segments, in time order, from the first record's
/// start to the last record's end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CriticalPath {
    /// The stretches, in time order; each starts where the one before ends.
    pub segments: Vec<Segment>,
    /// The collectives' waits.
    pub waits: CollectiveWaits,
    /// The record that ended last, where the walk began (an index into `records`).
    pub last: Option<usize>,
}

impl CriticalPath {
    /// Where the path starts (the profile's first record's start), ns.
    pub fn start_ns(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.start_ns)
    }

    /// Where it ends (the last record's end), ns.
    pub fn end_ns(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.end_ns)
    }

    /// Its length, ns.
    pub fn span_ns(&self) -> u64 {
        self.end_ns() - self.start_ns()
    }

    /// Its time in segments of `kind`, ns.
    pub fn total_ns(&self, kind: SegmentKind) -> u64 {
        self.segments.iter().filter(|s| s.kind == kind).map(Segment::ns).fold(0, u64::saturating_add)
    }

    /// Its time on each worker, longest first (ties by name).
    pub fn per_worker(&self) -> Vec<(String, u64)> {
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for s in &self.segments {
            let ns = by.entry(&s.worker).or_default();
            *ns = ns.saturating_add(s.ns());
        }
        let mut out: Vec<(String, u64)> = by.into_iter().map(|(w, ns)| (w.to_string(), ns)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// How often the path changes worker (at a collective whose last part came from another
    /// worker).
    pub fn worker_changes(&self) -> usize {
        self.segments.windows(2).filter(|w| w[0].worker != w[1].worker).count()
    }
}

/// Why a profile has no critical path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CriticalError {
    /// Two parts of one collective on one worker: a garbled profile.
    #[error("collective #{id} has two parts on {worker}: the profile is garbled, so it has no critical path")]
    TwoParts {
        /// The worker.
        worker: String,
        /// The collective.
        id: u64,
    },
    /// The records make a cycle: collectives that ran in different orders on two workers.
    #[error(
        "the records of this profile wait on each other in a cycle through {worker}'s `{name}` (starting at {start_ns} ns): its collectives are in different orders on different workers, so it has no critical path"
    )]
    Cycle {
        /// The worker of a record on the cycle.
        worker: String,
        /// That record's name.
        name: String,
        /// Its start.
        start_ns: u64,
    },
}

/// A node of the wait graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    /// A record that is not a part of a collective across workers.
    Run(usize),
    /// A part of a collective: its worker reached it (the record's start).
    Arrive(usize),
    /// A part of a collective: it completed (the record's end).
    Done(usize),
    /// A collective (by id): every part's arrival leads to it, and it to every part's
    /// completion (one node, so a collective of k parts costs 2k edges, not k²).
    All(u64),
}

/// The collective a transfer's `detail` names (`collective #ID rank R of W0;W1`).
fn collective_id(detail: &str) -> Option<u64> {
    let rest = detail.strip_prefix("collective #")?;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// The critical path of `profile` (empty when it has no records).
pub fn critical_path(profile: &Profile) -> Result<CriticalPath, CriticalError> {
    let records = &profile.records;
    // Parts of each collective, by id; one with a single part recorded (the others cut off)
    // waits for nobody.
    let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        if r.kind == RecordKind::Transfer {
            if let Some(id) = collective_id(&r.detail) {
                groups.entry(id).or_default().push(i);
            }
        }
    }
    groups.retain(|_, parts| parts.len() > 1);
    let mut in_group = vec![false; records.len()];
    for (&id, parts) in &groups {
        let mut workers: Vec<&str> = parts.iter().map(|&i| records[i].worker.as_str()).collect();
        workers.sort_unstable();
        if let Some(w) = workers.windows(2).find(|w| w[0] == w[1]) {
            return Err(CriticalError::TwoParts { worker: w[0].to_string(), id });
        }
        for &i in parts {
            in_group[i] = true;
        }
    }

    // Each record's first and last node (the same node unless it is a part).
    let mut graph: DiGraph<Node, ()> = DiGraph::with_capacity(records.len(), records.len());
    let mut entry = Vec::with_capacity(records.len());
    let mut exit = Vec::with_capacity(records.len());
    for (i, &part) in in_group.iter().enumerate() {
        if part {
            entry.push(graph.add_node(Node::Arrive(i)));
            exit.push(graph.add_node(Node::Done(i)));
        } else {
            let n = graph.add_node(Node::Run(i));
            entry.push(n);
            exit.push(n);
        }
    }
    // A worker's records in the order they ran: their order in its file (the dispatcher
    // writes each batch's as it comes back, and a read, timed from its request to its answer,
    // after the kernels it waited for). Not by time: each batch's times are mapped onto the
    // dispatcher's clock by an estimate that moves, so times can disagree with the order.
    let mut by_worker: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        by_worker.entry(&r.worker).or_default().push(i);
    }
    for order in by_worker.values() {
        for w in order.windows(2) {
            graph.add_edge(exit[w[0]], entry[w[1]], ());
        }
    }
    for (&id, parts) in &groups {
        let all = graph.add_node(Node::All(id));
        for &i in parts {
            graph.add_edge(entry[i], all, ());
            graph.add_edge(all, exit[i], ());
        }
    }
    if let Err(cycle) = petgraph::algo::toposort(&graph, None) {
        // A collective's node is on the cycle only between two parts', so a part names it.
        let on_cycle = |n: NodeIndex| match graph[n] {
            Node::Run(i) | Node::Arrive(i) | Node::Done(i) => Some(i),
            Node::All(_) => None,
        };
        let node = cycle.node_id();
        let i = on_cycle(node)
            .or_else(|| graph.neighbors_directed(node, Incoming).find_map(on_cycle))
            .expect("a collective's node has its parts' arrivals before it");
        let r = &records[i];
        return Err(CriticalError::Cycle { worker: r.worker.clone(), name: r.name.clone(), start_ns: r.start_ns });
    }

    let waits = collective_waits(records, &groups);
    let (Some(last), Some(first_start)) = (
        (0..records.len()).max_by_key(|&i| (records[i].end_ns(), std::cmp::Reverse(i))),
        records.iter().map(|r| r.start_ns).min(),
    ) else {
        return Ok(CriticalPath { segments: Vec::new(), waits, last: None });
    };
    // When a node was reached: a record's or completion's end, an arrival's start (a
    // collective's node is never a step of the walk).
    let end_of = |n: NodeIndex| match graph[n] {
        Node::Run(i) | Node::Done(i) => records[i].end_ns(),
        Node::Arrive(i) => records[i].start_ns,
        Node::All(_) => 0,
    };
    // The one node a record or arrival ran after on its worker (`None`: its first).
    let previous = |n: NodeIndex| graph.neighbors_directed(n, Incoming).next();

    let mut back: Vec<Segment> = Vec::new();
    let mut push = |kind: SegmentKind, worker: &str, record: Option<usize>, start_ns: u64, end_ns: u64| {
        if end_ns > start_ns {
            back.push(Segment { kind, worker: worker.to_string(), record, start_ns, end_ns });
        }
    };
    // The walk: `t` is how far back the path is explained; it only decreases, and each step
    // follows an edge backwards in a graph without cycles, so it ends.
    let (mut node, mut t) = (exit[last], records[last].end_ns());
    loop {
        let step = match graph[node] {
            Node::Done(i) => {
                // Released by the part that arrived last (itself when it was last).
                let all = graph
                    .neighbors_directed(node, Incoming)
                    .next()
                    .expect("a part's completion follows its collective");
                let arrivals = graph.neighbors_directed(all, Incoming);
                let released = arrivals.max_by_key(|&a| (end_of(a), a == entry[i])).expect("a collective has parts");
                let at = end_of(released).min(t);
                push(SegmentKind::Transfer, &records[i].worker, Some(i), at, t);
                Some((released, at))
            }
            Node::All(_) => unreachable!("the walk steps from a completion straight to an arrival"),
            Node::Run(i) | Node::Arrive(i) => {
                let r = &records[i];
                let before = previous(node);
                // Its own time: from its start, or from the end of what ran before it on
                // its worker when that overlaps it.
                let own = match graph[node] {
                    Node::Arrive(_) => t,
                    _ => r.start_ns.max(before.map_or(0, end_of)).min(t),
                };
                let kind = match r.kind {
                    RecordKind::Kernel => SegmentKind::Kernel,
                    RecordKind::Copy => SegmentKind::Copy,
                    RecordKind::Transfer => SegmentKind::Transfer,
                };
                push(kind, &r.worker, Some(i), own, t);
                let idle_from = before.map_or(first_start, end_of).min(own);
                push(SegmentKind::Idle, &r.worker, None, idle_from, own);
                before.map(|b| (b, idle_from))
            }
        };
        match step {
            Some((n, at)) => (node, t) = (n, at),
            None => break,
        }
    }
    back.reverse();
    Ok(CriticalPath { segments: merge_idle(back), waits, last: Some(last) })
}

/// Idle stretches next to each other on one worker as one (an arrival's and its record's).
fn merge_idle(segments: Vec<Segment>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::with_capacity(segments.len());
    for s in segments {
        match out.last_mut() {
            Some(l) if l.kind == SegmentKind::Idle && s.kind == SegmentKind::Idle && l.worker == s.worker => {
                l.end_ns = s.end_ns;
            }
            _ => out.push(s),
        }
    }
    out
}

/// How every collective's parts waited for its last one.
fn collective_waits(records: &[Record], groups: &BTreeMap<u64, Vec<usize>>) -> CollectiveWaits {
    let mut waits = CollectiveWaits { collectives: groups.len(), ..CollectiveWaits::default() };
    let mut last: BTreeMap<&str, usize> = BTreeMap::new();
    for parts in groups.values() {
        let Some(&late) = parts.iter().max_by_key(|&&i| (records[i].start_ns, std::cmp::Reverse(i))) else {
            continue;
        };
        let arrived = records[late].start_ns;
        let waited = parts.iter().map(|&i| arrived - records[i].start_ns).fold(0u64, u64::saturating_add);
        waits.waited_ns = waits.waited_ns.saturating_add(waited);
        *last.entry(&records[late].worker).or_default() += 1;
    }
    let mut last: Vec<(String, usize)> = last.into_iter().map(|(w, n)| (w.to_string(), n)).collect();
    last.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    waits.last_arrivals = last;
    waits
}

/// What a record is called on the path: its name and operand types.
fn label(r: &Record) -> String {
    if r.inputs.is_empty() {
        r.name.clone()
    } else {
        format!("{} {}", r.name, r.inputs)
    }
}

/// The text `gt prof critical` prints and `gt prof report` includes: the path's time by kind
/// and worker, the `top_n` records on it by time, and the collectives' waits.
pub fn summary_text(profile: &Profile, top_n: usize) -> String {
    match critical_path(profile) {
        Ok(path) => path_text(profile, &path, top_n),
        Err(e) => format!("Critical path: none: {e}\n"),
    }
}

/// [`summary_text`] of a path already walked.
pub fn path_text(profile: &Profile, path: &CriticalPath, top_n: usize) -> String {
    let mut s = String::new();
    let Some(last) = path.last else {
        let _ = writeln!(s, "Critical path: none (the profile has no records)");
        return s;
    };
    let span = path.span_ns();
    let share = |ns: u64| if span > 0 { 100.0 * ns as f64 / span as f64 } else { 0.0 };
    let r = &profile.records[last];
    let _ = writeln!(
        s,
        "Critical path: {} from the first record to the last ({}'s `{}`), walked back through each worker's order and, at each collective, to the part that arrived last",
        format_ns(span as f64),
        r.worker,
        r.name
    );
    let notes = [
        (SegmentKind::Kernel, ""),
        (SegmentKind::Copy, ""),
        (SegmentKind::Transfer, "  collectives, after their last part arrived"),
        (SegmentKind::Idle, "  nothing ran on the path's worker: it waited for its client or the dispatcher"),
    ];
    for (kind, note) in notes {
        let ns = path.total_ns(kind);
        let _ = writeln!(s, "  {:<10} {:>10} {:6.1}%{note}", kind.name(), format_ns(ns as f64), share(ns));
    }
    let workers: Vec<String> =
        path.per_worker().iter().map(|(w, ns)| format!("{w} {}", format_ns(*ns as f64))).collect();
    let _ = writeln!(
        s,
        "  on {}; {} change{} of worker",
        workers.join(", "),
        path.worker_changes(),
        if path.worker_changes() == 1 { "" } else { "s" }
    );
    // The records on the path by label: what to make faster first.
    let mut by: HashMap<String, (u64, usize)> = HashMap::new();
    for seg in &path.segments {
        if let Some(i) = seg.record {
            let e = by.entry(label(&profile.records[i])).or_default();
            e.0 = e.0.saturating_add(seg.ns());
            e.1 += 1;
        }
    }
    let mut top: Vec<(String, (u64, usize))> = by.into_iter().filter(|(_, (ns, _))| *ns > 0).collect();
    top.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
    let _ = writeln!(s, "  Top {} of {} on the path", top_n.min(top.len()), top.len());
    for (name, (ns, n)) in top.iter().take(top_n) {
        let _ = writeln!(s, "    {name:<56} {n:>6}x {:>10} {:6.1}%", format_ns(*ns as f64), share(*ns));
    }
    let w = &path.waits;
    if w.collectives > 0 {
        let last: Vec<String> = w.last_arrivals.iter().map(|(w, n)| format!("{w} {n}x")).collect();
        let _ = writeln!(
            s,
            "  Collectives across workers: {}; their parts waited {} in all for the last to arrive (last: {})",
            w.collectives,
            format_ns(w.waited_ns as f64),
            last.join(", ")
        );
    }
    s
}

/// Columns of [`write_csv`].
pub const SEGMENT_COLUMNS: [&str; 9] =
    ["kind", "worker", "start_ns", "duration_ns", "name", "op", "inputs", "client", "seq"];

/// Writes the path's segments to `path` as CSV ([`SEGMENT_COLUMNS`]; a record's fields empty
/// for idle time).
pub fn write_csv(profile: &Profile, critical: &CriticalPath, path: &Path) -> Result<(), csv::Error> {
    let mut out = csv::Writer::from_path(path)?;
    out.write_record(SEGMENT_COLUMNS)?;
    for s in &critical.segments {
        let r = s.record.map(|i| &profile.records[i]);
        let field = |f: fn(&Record) -> String| r.map(f).unwrap_or_default();
        out.write_record([
            s.kind.name().to_string(),
            s.worker.clone(),
            s.start_ns.to_string(),
            s.ns().to_string(),
            field(|r| r.name.clone()),
            field(|r| r.op.clone()),
            field(|r| r.inputs.clone()),
            field(|r| r.client.to_string()),
            field(|r| r.seq.map(|q| q.to_string()).unwrap_or_default()),
        ])?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(kind: RecordKind, worker: &str, name: &str, start: u64, end: u64) -> Record {
        let mut r = Record::new(kind, worker, name);
        r.start_ns = start;
        r.duration_ns = end - start;
        r
    }

    fn part(worker: &str, id: u64, start: u64, end: u64) -> Record {
        let mut r = rec(RecordKind::Transfer, worker, "all_reduce", start, end);
        r.detail = format!("collective #{id} rank 0 of w0;w1");
        r
    }

    fn profile(records: Vec<Record>) -> Profile {
        Profile { records, ..Profile::default() }
    }

    /// Segments are contiguous and cover the first start to the last end.
    fn assert_covers(p: &Profile, path: &CriticalPath) {
        let first = p.records.iter().map(|r| r.start_ns).min().unwrap();
        let last = p.records.iter().map(Record::end_ns).max().unwrap();
        if first == last {
            return assert!(path.segments.is_empty(), "{path:#?}");
        }
        assert_eq!((path.start_ns(), path.end_ns()), (first, last), "{path:#?}");
        for w in path.segments.windows(2) {
            assert_eq!(w[0].end_ns, w[1].start_ns, "{path:#?}");
        }
        assert!(path.segments.iter().all(|s| s.end_ns > s.start_ns));
    }

    fn kinds(path: &CriticalPath) -> Vec<(SegmentKind, &str, u64, u64)> {
        path.segments.iter().map(|s| (s.kind, s.worker.as_str(), s.start_ns, s.end_ns)).collect()
    }

    #[test]
    fn one_worker_runs_its_records_and_the_gaps_between_them() {
        let p = profile(vec![
            rec(RecordKind::Kernel, "w0", "a", 0, 10),
            rec(RecordKind::Kernel, "w0", "b", 15, 30),
            rec(RecordKind::Kernel, "w0", "c", 30, 32),
        ]);
        let path = critical_path(&p).unwrap();
        assert_covers(&p, &path);
        use SegmentKind::*;
        assert_eq!(
            kinds(&path),
            [(Kernel, "w0", 0, 10), (Idle, "w0", 10, 15), (Kernel, "w0", 15, 30), (Kernel, "w0", 30, 32)]
        );
        assert_eq!((path.total_ns(Kernel), path.total_ns(Idle), path.worker_changes()), (27, 5, 0));
    }

    #[test]
    fn a_collective_hands_the_path_to_its_last_part() {
        // w1 reaches the all_reduce 30 ns after w0: w0's wait is slack, w1's kernel is on the path.
        let p = profile(vec![
            rec(RecordKind::Kernel, "w0", "short", 0, 10),
            part("w0", 7, 10, 50),
            rec(RecordKind::Kernel, "w0", "after", 50, 60),
            rec(RecordKind::Kernel, "w1", "long", 0, 40),
            part("w1", 7, 40, 52),
        ]);
        let path = critical_path(&p).unwrap();
        assert_covers(&p, &path);
        use SegmentKind::*;
        assert_eq!(kinds(&path), [(Kernel, "w1", 0, 40), (Transfer, "w0", 40, 50), (Kernel, "w0", 50, 60)]);
        assert_eq!(path.per_worker(), [("w1".to_string(), 40), ("w0".to_string(), 20)]);
        assert_eq!(path.worker_changes(), 1);
        assert_eq!(
            path.waits,
            CollectiveWaits { collectives: 1, waited_ns: 30, last_arrivals: vec![("w1".to_string(), 1)] }
        );
        let text = summary_text(&p, 5);
        assert!(text.contains("Critical path: 60 ns"), "{text}");
        assert!(text.contains("long") && text.contains("last: w1 1x"), "{text}");
    }

    #[test]
    fn a_read_overlapping_the_kernels_it_waited_for_counts_only_its_tail() {
        let mut read = rec(RecordKind::Copy, "w0", "read", 5, 25);
        read.detail = "d2h".into();
        // In file order: the read's row comes when its answer did, after the kernels.
        let p =
            profile(vec![rec(RecordKind::Kernel, "w0", "a", 0, 10), rec(RecordKind::Kernel, "w0", "b", 10, 20), read]);
        let path = critical_path(&p).unwrap();
        assert_covers(&p, &path);
        use SegmentKind::*;
        assert_eq!(kinds(&path), [(Kernel, "w0", 0, 10), (Kernel, "w0", 10, 20), (Copy, "w0", 20, 25)]);
    }

    #[test]
    fn a_worker_runs_in_file_order_whatever_its_mapped_times_say() {
        // w1's clock was mapped 30 ns late for its second batch: its part of #2 seems to start
        // before its part of #1 ended. The order still holds, and the path stays contiguous.
        let p = profile(vec![part("w0", 1, 0, 10), part("w0", 2, 10, 20), part("w1", 1, 5, 40), part("w1", 2, 8, 20)]);
        let path = critical_path(&p).unwrap();
        assert_covers(&p, &path);
    }

    #[test]
    fn garbled_collectives_are_refused_or_summed_without_overflow() {
        // Two parts of one collective on one worker.
        let p = profile(vec![part("w0", 1, 0, 10), part("w0", 1, 10, 20)]);
        assert_eq!(critical_path(&p).unwrap_err(), CriticalError::TwoParts { worker: "w0".into(), id: 1 });
        // Waits near the clock's end saturate instead of overflowing.
        let far = u64::MAX - 10;
        let p = profile(vec![part("w0", 1, 0, 1), part("w1", 1, far, far + 1), part("w2", 1, 0, 1)]);
        let path = critical_path(&p).unwrap();
        assert_eq!(path.waits.waited_ns, u64::MAX);
        // Many parts of one collective (one per worker): linear in edges, a path all the same.
        let many: Vec<Record> = (0..2000).map(|w| part(&format!("w{w}"), 9, w, w + 5)).collect();
        let path = critical_path(&profile(many)).unwrap();
        assert_eq!(path.waits.collectives, 1);
    }

    #[test]
    fn collectives_in_different_orders_are_refused_by_name() {
        let p = profile(vec![part("w0", 1, 0, 10), part("w0", 2, 10, 20), part("w1", 2, 0, 10), part("w1", 1, 10, 20)]);
        let e = critical_path(&p).unwrap_err();
        assert!(e.to_string().contains("different orders"), "{e}");
        assert!(summary_text(&p, 5).starts_with("Critical path: none: "));
    }

    #[test]
    fn an_empty_profile_or_a_lone_part_has_a_plain_path() {
        let empty = critical_path(&Profile::default()).unwrap();
        assert!(empty.segments.is_empty() && empty.waits.collectives == 0);
        assert!(summary_text(&Profile::default(), 5).contains("no records"));
        // The other part was cut off, and a detail that names no collective: plain records.
        let mut odd = rec(RecordKind::Transfer, "w1", "move", 0, 4);
        odd.detail = "collective #x".into();
        let p = profile(vec![part("w0", 3, 0, 5), odd]);
        let path = critical_path(&p).unwrap();
        assert_covers(&p, &path);
        assert_eq!(path.waits.collectives, 0);
    }

    #[test]
    fn the_csv_has_a_row_per_segment() {
        let p = profile(vec![rec(RecordKind::Kernel, "w0", "a", 0, 10), rec(RecordKind::Kernel, "w0", "b", 12, 20)]);
        let path = critical_path(&p).unwrap();
        let file = std::env::temp_dir().join(format!("gt-critical-{}.csv", std::process::id()));
        write_csv(&p, &path, &file).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        let _ = std::fs::remove_file(&file);
        assert_eq!(text.lines().count(), 1 + 3, "{text}");
        assert!(text.starts_with("kind,worker,start_ns,duration_ns,name") && text.contains("idle,w0,10,2,"), "{text}");
    }

    /// Random workers' timelines with collectives met in one order by every worker.
    fn timelines() -> impl Strategy<Value = Vec<Record>> {
        let worker = prop::collection::vec((0u64..20, 1u64..30, 0u8..4), 0..12);
        (1usize..4, prop::collection::vec(worker, 3)).prop_map(|(n, steps)| {
            let mut records = Vec::new();
            for (w, steps) in steps.into_iter().take(n).enumerate() {
                let (mut t, mut collective) = (0, 0);
                for (gap, len, what) in steps {
                    let start = t + gap;
                    let name = format!("w{w}");
                    let r = match what {
                        0 => {
                            collective += 1;
                            part(&name, collective, start, start + len)
                        }
                        1 => rec(RecordKind::Copy, &name, "read", start.saturating_sub(len), start + len),
                        _ => rec(RecordKind::Kernel, &name, "k", start, start + len),
                    };
                    t = start + len;
                    records.push(r);
                }
            }
            records
        })
    }

    proptest! {
        #[test]
        fn every_path_covers_the_run(records in timelines()) {
            let p = profile(records);
            let path = critical_path(&p).unwrap();
            if p.records.is_empty() {
                prop_assert!(path.segments.is_empty());
            } else {
                assert_covers(&p, &path);
            }
            let _ = summary_text(&p, 3);
        }

        #[test]
        fn garbage_never_panics(rows in prop::collection::vec((0u8..3, 0u8..3, "[ -~]{0,24}", 0u64..100, 0u64..100), 0..16)) {
            let records = rows.into_iter().map(|(kind, w, detail, start, len)| {
                let kind = [RecordKind::Kernel, RecordKind::Copy, RecordKind::Transfer][kind as usize];
                let mut r = rec(kind, &format!("w{w}"), "x", start, start + len);
                r.detail = detail;
                r
            }).collect();
            let p = profile(records);
            if let Ok(path) = critical_path(&p) {
                if !p.records.is_empty() { assert_covers(&p, &path); }
            }
            let _ = summary_text(&p, 3);
        }
    }
}
