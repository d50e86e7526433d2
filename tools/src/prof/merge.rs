//! `gt prof merge`: every worker's records of one profile as one Chrome trace-event JSON
//! timeline (Perfetto, `about:tracing`), in the conventions of [`crate::perfetto`].
//!
//! Worker `i` (manifest order by index, then workers only the records name, in file order)
//! gets two processes, as the seed's ranks did:
//!
//! ```text
//! pid i*1000        "[Wi] NAME"        threads: kernels, signals
//! pid i*1000+500    "[Wi] NAME host"   threads: copies (h2d/d2h), transfers (collective parts)
//! ```
//!
//! Copies and collective parts go with the host side because they move data through the
//! worker process (staging, sockets) rather than run as compute on the device, and keeping
//! them apart from kernels is what makes contention visible. Every slice's name starts with
//! `[Wi] `, so a search or a pinned track says which worker it came from. Slices on one
//! thread must nest, so concurrent records that overlap partly (a CPU worker running two
//! kernels at once, d2h reads timed from request to answer) spill onto extra threads of the
//! same kind (`kernels 2`, ...). Signal scopes become slices on `signals` of each worker they
//! ran on, lasting from the first start to the last end of that worker's records in the scope
//! or any scope inside it. Times are microseconds on the dispatcher's clock.

use super::load::Profile;
use gt_transport::profile::{Direction, Record, RecordKind, SignalRecord};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::Write;

/// What a merged trace holds, for the summary line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeCounts {
    /// Workers (each two processes).
    pub workers: usize,
    /// Record slices: one per record.
    pub records: usize,
    /// Signal scope slices (a scope that ran on two workers counts twice).
    pub signals: usize,
    /// Threads that exist only because records on one overlapped partly.
    pub spill_threads: usize,
}

/// The pid of worker `index`'s device side (kernels, signals).
pub fn device_pid(index: usize) -> u64 {
    index as u64 * 1000
}

/// The pid of worker `index`'s host side (copies, transfers).
pub fn host_pid(index: usize) -> u64 {
    device_pid(index) + 500
}

/// The label every name of worker `index` starts with: `[W0]`.
pub fn prefix(index: usize) -> String {
    format!("[W{index}]")
}

/// The merged trace of `profile`, as JSON, and what it holds.
pub fn merge(profile: &Profile) -> (Value, MergeCounts) {
    crate::perfetto::collect(|sink| each_event(profile, sink), other_data(profile))
}

/// Writes the merged trace of `profile` to `out`, one event at a time (the JSON of every
/// event never sits in memory at once).
pub fn write(profile: &Profile, out: impl Write) -> Result<MergeCounts, serde_json::Error> {
    crate::perfetto::stream(out, |sink| each_event(profile, sink), &other_data(profile))
}

fn other_data(profile: &Profile) -> Value {
    json!({
        "producer": "gt prof merge",
        "profile": profile.dir.display().to_string(),
        "complete": profile.is_complete(),
        "warnings": profile.warnings,
    })
}

/// The workers in trace order: the manifest's by index, then any only records name.
fn worker_order(profile: &Profile) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let Some(m) = &profile.manifest {
        let mut listed: Vec<_> = m.workers.iter().collect();
        listed.sort_by_key(|w| w.index);
        names.extend(listed.into_iter().map(|w| w.name.clone()));
    }
    for w in profile.workers() {
        if !names.contains(&w) {
            names.push(w);
        }
    }
    names
}

/// A slice before it has a thread: its times (µs, end as the checker computes it: ts + dur)
/// and what it shows.
struct Slice {
    ts: f64,
    dur: f64,
    name: String,
    cat: &'static str,
    args: Value,
}

impl Slice {
    fn end(&self) -> f64 {
        self.ts + self.dur
    }
}

/// One kind of thread of one process: its slices, to be spread over as many threads as
/// nesting needs.
struct Track {
    pid: u64,
    name: &'static str,
    slices: Vec<Slice>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// Makes the trace's events in order, handing each to `sink`.
fn each_event(
    profile: &Profile,
    sink: &mut dyn FnMut(Value) -> Result<(), serde_json::Error>,
) -> Result<MergeCounts, serde_json::Error> {
    let workers = worker_order(profile);
    let index_of: HashMap<&str, usize> = workers.iter().enumerate().map(|(i, w)| (w.as_str(), i)).collect();
    let mut counts = MergeCounts { workers: workers.len(), ..MergeCounts::default() };
    let mut signals = signal_intervals(profile, &index_of);
    let mut by_worker: Vec<Vec<&Record>> = vec![Vec::new(); workers.len()];
    for r in &profile.records {
        by_worker[index_of[r.worker.as_str()]].push(r);
    }
    for (i, name) in workers.iter().enumerate() {
        let tag = prefix(i);
        let (device, host) = (device_pid(i), host_pid(i));
        sink(meta("process_name", device, None, json!({ "name": format!("{tag} {name}") })))?;
        sink(meta("process_sort_index", device, None, json!({ "sort_index": 2 * i })))?;
        sink(meta("process_name", host, None, json!({ "name": format!("{tag} {name} host") })))?;
        sink(meta("process_sort_index", host, None, json!({ "sort_index": 2 * i + 1 })))?;
        let mut tracks = [
            Track { pid: device, name: "kernels", slices: Vec::new() },
            Track { pid: device, name: "signals", slices: Vec::new() },
            Track { pid: host, name: "copies", slices: Vec::new() },
            Track { pid: host, name: "transfers", slices: Vec::new() },
        ];
        for r in &by_worker[i] {
            let track = match r.kind {
                RecordKind::Kernel => 0,
                RecordKind::Copy => 2,
                RecordKind::Transfer => 3,
            };
            tracks[track].slices.push(record_slice(r, &tag));
            counts.records += 1;
        }
        for (scope, start, end) in signals.remove(&i).unwrap_or_default() {
            tracks[1].slices.push(signal_slice(scope, start, end, &tag));
            counts.signals += 1;
        }
        // Thread ids count up within each process, in track order.
        let mut next_tid: HashMap<u64, u64> = HashMap::new();
        for track in tracks {
            let lanes = lanes(&track.slices);
            let width = lanes.iter().copied().max().map_or(0, |m| m + 1);
            // A kind of thread with nothing on it still gets its first thread named, so
            // every worker's tracks look alike.
            let width = width.max(1);
            counts.spill_threads += width - 1;
            let tid0 = *next_tid.get(&track.pid).unwrap_or(&0);
            next_tid.insert(track.pid, tid0 + width as u64);
            for lane in 0..width {
                let tid = tid0 + lane as u64;
                let name = if lane == 0 { track.name.to_string() } else { format!("{} {}", track.name, lane + 1) };
                sink(meta("thread_name", track.pid, Some(tid), json!({ "name": name })))?;
                sink(meta("thread_sort_index", track.pid, Some(tid), json!({ "sort_index": tid })))?;
            }
            for (slice, lane) in track.slices.into_iter().zip(lanes) {
                sink(json!({
                    "name": slice.name, "cat": slice.cat, "ph": "X", "ts": slice.ts, "dur": slice.dur,
                    "pid": track.pid, "tid": tid0 + lane as u64, "args": slice.args,
                }))?;
            }
        }
    }
    Ok(counts)
}

fn meta(name: &str, pid: u64, tid: Option<u64>, args: Value) -> Value {
    json!({ "name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid.unwrap_or(0), "args": args })
}

fn direction(d: Direction) -> &'static str {
    match d {
        Direction::Forward => "forward",
        Direction::Backward => "backward",
    }
}

fn record_slice(r: &Record, tag: &str) -> Slice {
    let mut args = Map::new();
    args.insert("op".into(), json!(r.op));
    args.insert("client".into(), json!(r.client));
    let optional = [
        ("seq", r.seq),
        ("line", r.line.map(u64::from)),
        ("scope", r.scope),
        ("hotpath", r.hotpath),
        ("iteration", r.iteration),
    ];
    for (key, value) in optional {
        if let Some(v) = value {
            args.insert(key.into(), json!(v));
        }
    }
    for (key, value) in [("inputs", &r.inputs), ("outputs", &r.outputs), ("kernel_hash", &r.kernel_hash)] {
        args.insert(key.into(), json!(value));
    }
    args.insert("flops".into(), json!(r.flops));
    args.insert("bytes_read".into(), json!(r.bytes_read));
    args.insert("bytes_written".into(), json!(r.bytes_written));
    if !r.signal.is_empty() {
        args.insert("signal".into(), json!(r.signal));
    }
    if let Some(d) = r.direction {
        args.insert("direction".into(), json!(direction(d)));
    }
    if !r.detail.is_empty() {
        args.insert("detail".into(), json!(r.detail));
    }
    let cat = match r.kind {
        RecordKind::Kernel => "kernel",
        RecordKind::Copy => "copy",
        RecordKind::Transfer => "transfer",
    };
    Slice {
        ts: us(r.start_ns),
        dur: us(r.duration_ns),
        name: format!("{tag} {}", r.name),
        cat,
        args: Value::Object(args),
    }
}

fn signal_slice(scope: &SignalRecord, start: u64, end: u64, tag: &str) -> Slice {
    let mut args = json!({
        "client": scope.client, "scope": scope.scope, "direction": direction(scope.direction),
        "depth": scope.depth, "opened_ns": scope.opened_ns,
    });
    if let Some(p) = scope.parent {
        args["parent"] = json!(p);
    }
    if let Some(c) = scope.closed_ns {
        args["closed_ns"] = json!(c);
    }
    let cat = match scope.direction {
        Direction::Forward => "signal",
        Direction::Backward => "signal.backward",
    };
    Slice { ts: us(start), dur: us(end - start), name: format!("{tag} {}", scope.name), cat, args }
}

/// Each scope's execution interval on each worker it ran on: worker index → `(scope, first
/// start, last end)` of the worker's records in the scope or any scope inside it, in
/// `signals.csv` order. Scopes no record of a worker names (directly or through a scope
/// inside) are not on that worker.
fn signal_intervals<'p>(
    profile: &'p Profile,
    index_of: &HashMap<&str, usize>,
) -> HashMap<usize, Vec<(&'p SignalRecord, u64, u64)>> {
    let position: HashMap<(u64, u64), usize> =
        profile.signals.iter().enumerate().map(|(i, s)| ((s.client, s.scope), i)).collect();
    let mut spans: HashMap<(usize, usize), (u64, u64)> = HashMap::new();
    for r in &profile.records {
        let worker = index_of[r.worker.as_str()];
        let mut at = r.scope.and_then(|s| position.get(&(r.client, s)).copied());
        // Up through the parents; the bound stops a cycle a damaged file could hold.
        for _ in 0..profile.signals.len() {
            let Some(i) = at else { break };
            let span = spans.entry((worker, i)).or_insert((r.start_ns, r.end_ns()));
            *span = (span.0.min(r.start_ns), span.1.max(r.end_ns()));
            let scope = &profile.signals[i];
            at = scope.parent.and_then(|p| position.get(&(scope.client, p)).copied());
        }
    }
    let mut keys: Vec<(usize, usize)> = spans.keys().copied().collect();
    keys.sort_unstable();
    let mut out: HashMap<usize, Vec<(&SignalRecord, u64, u64)>> = HashMap::new();
    for (worker, i) in keys {
        let (start, end) = spans[&(worker, i)];
        out.entry(worker).or_default().push((&profile.signals[i], start, end));
    }
    out
}

/// The thread (0-based lane) of each slice so that slices on one lane nest, by the rule
/// [`crate::perfetto::violations`] checks, computed on the same floating-point times: taken
/// in start order (longest first among equal starts), a slice joins the first lane where it
/// fits inside the innermost slice still open there, or where none is open.
fn lanes(slices: &[Slice]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..slices.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&slices[a], &slices[b]);
        a.ts.total_cmp(&b.ts).then(b.end().total_cmp(&a.end()))
    });
    let mut open: Vec<Vec<f64>> = Vec::new();
    let mut lane_of = vec![0; slices.len()];
    for i in order {
        let (start, end) = (slices[i].ts, slices[i].end());
        let lane = open.iter_mut().position(|stack| {
            while stack.last().is_some_and(|&e| e <= start) {
                stack.pop();
            }
            stack.last().is_none_or(|&e| end <= e + 1e-6)
        });
        let lane = lane.unwrap_or_else(|| {
            open.push(Vec::new());
            open.len() - 1
        });
        open[lane].push(end);
        lane_of[i] = lane;
    }
    lane_of
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perfetto::violations;
    use gt_transport::profile::{Manifest, ManifestWorker};
    use std::path::PathBuf;

    fn record(
        kind: RecordKind,
        worker: &str,
        seq: u64,
        name: &str,
        scope: Option<u64>,
        start_ns: u64,
        duration_ns: u64,
    ) -> Record {
        Record {
            seq: Some(seq),
            kernel_hash: "0123456789abcdef".into(),
            line: Some(seq as u32),
            signal: if scope.is_some() { "layer".into() } else { String::new() },
            direction: scope.map(|_| Direction::Forward),
            scope,
            inputs: "f32[4]".into(),
            outputs: "f32[4]".into(),
            bytes_read: 16,
            bytes_written: 16,
            flops: 4,
            start_ns,
            duration_ns,
            detail: match kind {
                RecordKind::Copy => "h2d".into(),
                RecordKind::Transfer => "collective #1 rank 0 of w0;w1".into(),
                RecordKind::Kernel => String::new(),
            },
            ..Record::new(kind, worker, name)
        }
    }

    fn scope(scope: u64, name: &str, depth: u32, parent: Option<u64>) -> SignalRecord {
        SignalRecord {
            client: 1,
            scope,
            name: name.into(),
            direction: Direction::Forward,
            depth,
            parent,
            opened_ns: 0,
            closed_ns: Some(100_000),
        }
    }

    /// Two workers, listed in the manifest in the order opposite to their files; w0 runs two
    /// kernels that overlap partly (a spill thread), a copy and a transfer; scope 1 (`model`)
    /// holds scope 2 (`layer`), whose records ran on both workers.
    fn two_workers() -> Profile {
        use RecordKind::*;
        let worker = |index, name: &str| ManifestWorker {
            index,
            name: name.into(),
            backend: "cpu".into(),
            file: gt_transport::profile::worker_file(name),
        };
        Profile {
            dir: PathBuf::from("prof"),
            manifest: Some(Manifest { workers: vec![worker(1, "w1"), worker(0, "w0")], ..Manifest::default() }),
            records: vec![
                record(Copy, "w0", 1, "literal", None, 1_000, 2_000),
                record(Kernel, "w0", 2, "matmul", Some(2), 10_000, 5_000),
                record(Kernel, "w0", 3, "relu", Some(1), 12_000, 5_000),
                record(Transfer, "w0", 4, "all_reduce", Some(2), 11_000, 20_000),
                record(Kernel, "w1", 2, "matmul", Some(2), 10_500, 4_000),
                record(Transfer, "w1", 4, "all_reduce", Some(2), 11_000, 19_000),
                // A zero-length record right where another ends.
                record(Kernel, "w1", 5, "add", None, 14_500, 0),
            ],
            signals: vec![scope(1, "model", 1, None), scope(2, "layer", 2, Some(1))],
            warnings: Vec::new(),
        }
    }

    fn slices(trace: &Value) -> Vec<&Value> {
        trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect()
    }

    #[test]
    fn two_workers_merge_into_one_valid_trace() {
        let profile = two_workers();
        let (trace, counts) = merge(&profile);
        assert_eq!(violations(&trace), vec![]);
        assert_eq!(counts, MergeCounts { workers: 2, records: 7, signals: 4, spill_threads: 1 });
        let events = trace["traceEvents"].as_array().unwrap();
        let processes: Vec<(u64, &str)> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(processes, [(0, "[W0] w0"), (500, "[W0] w0 host"), (1000, "[W1] w1"), (1500, "[W1] w1 host")]);
        for s in slices(&trace) {
            let pid = s["pid"].as_u64().unwrap();
            let tag = if pid < 1000 { "[W0] " } else { "[W1] " };
            assert!(s["name"].as_str().unwrap().starts_with(tag), "{s}");
            let host = matches!(s["cat"].as_str(), Some("copy" | "transfer"));
            assert_eq!(pid % 1000 == 500, host, "{s}");
        }
        // Every record once: (worker pid, seq) pairs of the record slices.
        let mut seen: Vec<(u64, u64)> = slices(&trace)
            .iter()
            .filter(|s| s["args"]["seq"].is_u64())
            .map(|s| (s["pid"].as_u64().unwrap() / 1000, s["args"]["seq"].as_u64().unwrap()))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 4), (1, 5)]);
        let relu = slices(&trace).into_iter().find(|s| s["name"] == "[W0] relu").unwrap();
        assert_eq!((relu["ts"].as_f64(), relu["dur"].as_f64()), (Some(12.0), Some(5.0)));
        assert_eq!((&relu["args"]["op"], &relu["args"]["signal"]), (&json!("relu"), &json!("layer")));
        assert_eq!((&relu["args"]["direction"], &relu["args"]["line"]), (&json!("forward"), &json!(3)));
        assert_eq!((&relu["args"]["flops"], &relu["args"]["bytes_read"]), (&json!(4), &json!(16)));
        // matmul and relu overlap partly on w0: relu spills onto a second kernels thread.
        let threads: Vec<(u64, u64, &str)> = events
            .iter()
            .filter(|e| e["name"] == "thread_name" && e["pid"] == 0)
            .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(threads, [(0, 0, "kernels"), (0, 1, "kernels 2"), (0, 2, "signals")]);
        assert_eq!(relu["tid"], 1);
    }

    #[test]
    fn scopes_last_from_first_start_to_last_end_of_their_records_and_those_inside() {
        let (trace, _) = merge(&two_workers());
        let signal = |name: &str| {
            let s = slices(&trace).into_iter().find(|s| s["name"] == name).unwrap();
            (s["pid"].as_u64().unwrap(), s["ts"].as_f64().unwrap(), s["dur"].as_f64().unwrap())
        };
        // On w0, layer: matmul 10..15 and all_reduce 11..31 µs; model adds relu 12..17.
        assert_eq!(signal("[W0] layer"), (0, 10.0, 21.0));
        assert_eq!(signal("[W0] model"), (0, 10.0, 21.0));
        // On w1 only layer's records ran; model holds them through layer.
        assert_eq!(signal("[W1] layer"), (1000, 10.5, 19.5));
        assert_eq!(signal("[W1] model"), (1000, 10.5, 19.5));
    }

    #[test]
    fn the_streamed_file_is_the_trace() {
        let profile = two_workers();
        let mut out = Vec::new();
        let counts = write(&profile, &mut out).unwrap();
        let (trace, expected) = merge(&profile);
        assert_eq!(counts, expected);
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), trace);
    }

    #[test]
    fn workers_without_a_manifest_follow_the_files_and_an_empty_profile_is_empty() {
        let mut profile = two_workers();
        profile.manifest = None;
        profile.records.reverse();
        let (trace, _) = merge(&profile);
        assert_eq!(violations(&trace), vec![]);
        let first = trace["traceEvents"].as_array().unwrap().iter().find(|e| e["name"] == "process_name").unwrap();
        assert_eq!(first["args"]["name"], "[W0] w1");
        let (empty, counts) = merge(&Profile::default());
        assert_eq!(violations(&empty), vec![]);
        assert_eq!(counts, MergeCounts::default());
    }

    #[test]
    fn many_concurrent_records_nest_or_spill() {
        // Identical intervals nest; staggered ones spill; a long one holds short ones.
        let mut profile = Profile::default();
        for i in 0..50u64 {
            profile.records.push(record(RecordKind::Copy, "w", i, "d2h", None, 1_000 + (i % 5) * 300, 1_000));
        }
        profile.records.push(record(RecordKind::Kernel, "w", 99, "long", None, 0, 1_000_000));
        for i in 0..10u64 {
            profile.records.push(record(RecordKind::Kernel, "w", 100 + i, "short", None, i * 1_000, 1_000));
        }
        let (trace, counts) = merge(&profile);
        assert_eq!(violations(&trace), vec![]);
        assert_eq!(counts.records, 61);
        // Kernels nest on one thread; copies staggered by 0.3 µs need four.
        assert_eq!(counts.spill_threads, 3);
    }
}
