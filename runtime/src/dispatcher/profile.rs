//! The profile writer (`GT_PROFILE=DIR`, `gt-run --profile DIR`): one CSV row per executed
//! instruction, copy and transfer on each worker, one per signal scope, and the run's
//! manifest, in the format of `gt_transport::profile`. The dispatcher feeds it what only it
//! knows together: each client's script lines and signal scopes (at the stream's entry),
//! hot-path repetitions (after the passes), types and costs (when an instruction is placed)
//! and the workers' timings on its own clock. Frees and markers are not recorded.

use super::log::{now_rfc3339, private_file};
use super::workers::ExecNote;
use foldhash::{HashMap, HashMapExt};
use gt_ir::{Instr, TensorType};
use gt_transport::profile::{
    worker_file, Direction, Machine, Manifest, ManifestClient, ManifestWorker, Record, RecordKind, SignalRecord,
    FORMAT_VERSION, MANIFEST, RECORD_COLUMNS, SIGNALS, SIGNAL_COLUMNS,
};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Per client, what is remembered of its stream for its records (each map at most this
/// many entries: the oldest go first, so an endless stream cannot grow them without bound).
const MAX_REMEMBERED: usize = 1 << 20;

/// The git revision this build came from (`build.rs`), empty when unknown.
const GIT_REVISION: &str = match option_env!("GT_GIT_REVISION") {
    Some(r) => r,
    None => "",
};

type CsvFile = csv::Writer<BufWriter<File>>;

/// Writes one profile folder.
pub struct Profiler {
    dir: PathBuf,
    manifest: Manifest,
    /// Each worker's file, by worker name (a worker that registers again appends).
    files: HashMap<String, CsvFile>,
    signals: CsvFile,
    clients: HashMap<u64, ClientTrack>,
    /// Per worker, when the last instruction it reported ended (dispatcher clock): a read
    /// starts after it, as the worker answers reads in order after the batches before them.
    busy_until: HashMap<String, u64>,
    /// Set by the first write that failed: profiling stops (the run goes on), and says so.
    broken: bool,
}

/// What is kept of one client's stream.
#[derive(Default)]
struct ClientTrack {
    /// seq → script line.
    lines: BTreeMap<u64, u32>,
    /// seq → the scope open around it (only instructions inside a scope).
    tags: BTreeMap<u64, Tag>,
    /// The open scopes, innermost last.
    open: Vec<OpenScope>,
    next_scope: u64,
    /// The hot path being released, and which repetition.
    hot: Option<(u64, u64)>,
    /// Repetitions seen per hot path (bounded as the maps above: a client can name hot
    /// paths itself).
    repetitions: BTreeMap<u64, u64>,
}

#[derive(Clone)]
struct Tag {
    scope: u64,
    signal: Arc<str>,
    direction: Direction,
}

struct OpenScope {
    tag: Tag,
    depth: u32,
    parent: Option<u64>,
    opened_ns: u64,
}

/// What the dispatcher knows of an instruction when it places it (kept only while timing).
#[derive(Debug, Clone, Default)]
pub(super) struct Facts {
    /// Its result types.
    pub types: Vec<TensorType>,
    /// Its operand types.
    pub inputs: Vec<TensorType>,
    /// Its cost.
    pub cost: gt_ir::cost::Cost,
    /// Its structure with value ids erased, and its operand types.
    pub hash: u64,
    /// The hot path it was released in, and which repetition.
    pub hotpath: Option<(u64, u64)>,
}

impl Profiler {
    /// Starts a profile in `dir` (created if missing; files there of an earlier profile are
    /// replaced). `settings`: the effective settings for the manifest (`GT_*` environment
    /// settings are added).
    pub fn create(dir: &Path, mut settings: BTreeMap<String, String>) -> std::io::Result<Profiler> {
        std::fs::create_dir_all(dir)?;
        for (k, v) in std::env::vars() {
            if k.starts_with("GT_") {
                settings.entry(k).or_insert(v);
            }
        }
        let manifest = Manifest {
            format: FORMAT_VERSION,
            gt_version: env!("CARGO_PKG_VERSION").to_string(),
            git_revision: GIT_REVISION.to_string(),
            started: now_rfc3339(),
            ended: None,
            complete: false,
            settings,
            machine: machine(),
            workers: Vec::new(),
            clients: Vec::new(),
        };
        let signals = csv_file(&dir.join(SIGNALS), &SIGNAL_COLUMNS)?;
        let profiler = Profiler {
            dir: dir.to_path_buf(),
            manifest,
            files: HashMap::new(),
            signals,
            clients: HashMap::new(),
            busy_until: HashMap::new(),
            broken: false,
        };
        profiler.write_manifest()?;
        Ok(profiler)
    }

    fn write_manifest(&self) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(&self.manifest).map_err(std::io::Error::other)?;
        std::fs::write(self.dir.join(MANIFEST), text + "\n")
    }

    fn failed(&mut self, what: &str, e: impl std::fmt::Display) {
        if !self.broken {
            tracing::error!(target: "gt::dispatcher", "profile {}: {what} failed, profiling stops: {e}", self.dir.display());
            self.broken = true;
        }
    }

    /// A worker registered as `index`.
    pub(super) fn worker_joined(&mut self, index: usize, name: &str, backend: &str) {
        let mut file = worker_file(name);
        // Two names that make one file name (`worker-0`, `0`) get files of their own.
        if self.manifest.workers.iter().any(|w| w.file == file && w.name != name) {
            file = worker_file(&format!("{index}-{name}"));
        }
        self.manifest.workers.push(ManifestWorker {
            index: index as u32,
            name: name.to_string(),
            backend: backend.to_string(),
            file: file.clone(),
        });
        if !self.files.contains_key(name) {
            match csv_file(&self.dir.join(&file), &RECORD_COLUMNS) {
                Ok(f) => {
                    self.files.insert(name.to_string(), f);
                }
                Err(e) => self.failed(&format!("creating {file}"), e),
            }
        }
        if let Err(e) = self.write_manifest() {
            self.failed("writing the manifest", e);
        }
    }

    /// A client connected.
    pub(super) fn client_joined(&mut self, c: u64, name: &str) {
        self.manifest.clients.push(ManifestClient { client: c, name: name.to_string() });
        self.clients.insert(c, ClientTrack::default());
    }

    /// A client's batch said its instructions' script lines.
    pub(super) fn lines(&mut self, c: u64, first_seq: u64, lines: &[u32], instrs: usize) {
        let Some(track) = self.clients.get_mut(&c) else { return };
        // One line per instruction: a client sending more gets no more remembered.
        for (k, &line) in lines.iter().take(instrs).enumerate() {
            if line != 0 {
                remember(&mut track.lines, first_seq.saturating_add(k as u64), line);
            }
        }
    }

    /// A client's instruction entered the stream at `now`: scopes open and close here, and
    /// every other instruction remembers the scope around it.
    pub(super) fn entered(&mut self, c: u64, seq: u64, instr: &Instr, now: u64) {
        let Some(track) = self.clients.get_mut(&c) else { return };
        match instr {
            Instr::SignalStart { name, backward, .. } => {
                let scope = track.next_scope;
                track.next_scope += 1;
                let direction = if *backward { Direction::Backward } else { Direction::Forward };
                let parent = track.open.last().map(|o| o.tag.scope);
                let depth = track.open.len() as u32 + 1;
                let tag = Tag { scope, signal: name.as_str().into(), direction };
                track.open.push(OpenScope { tag, depth, parent, opened_ns: now });
            }
            Instr::SignalEnd { name } => {
                // A close that does not match the innermost scope changes nothing (as the
                // pipeline's own tracking).
                if track.open.last().is_some_and(|o| &*o.tag.signal == name.as_str()) {
                    let open = track.open.pop().expect("checked");
                    let row = signal_row(c, open, Some(now));
                    if let Err(e) = self.signals.serialize(row) {
                        self.failed("writing signals.csv", e);
                    }
                }
            }
            _ => {
                if let Some(open) = track.open.last() {
                    remember(&mut track.tags, seq, open.tag.clone());
                }
            }
        }
    }

    /// Every instruction of client `c` before `seq` has run and reported its time (a sync
    /// was answered): what was kept for them goes.
    pub(super) fn synced(&mut self, c: u64, seq: u64) {
        let Some(track) = self.clients.get_mut(&c) else { return };
        track.lines = track.lines.split_off(&seq);
        track.tags = track.tags.split_off(&seq);
    }

    /// An instruction left the client's passes: hot-path repetitions are counted here.
    pub(super) fn released(&mut self, c: u64, instr: &Instr) {
        let Some(track) = self.clients.get_mut(&c) else { return };
        match instr {
            Instr::HotPathStart { id } => {
                let n = track.repetitions.get(id).map_or(1, |n| n.saturating_add(1));
                remember(&mut track.repetitions, *id, n);
                track.hot = Some((*id, n));
            }
            Instr::HotPathEnd { .. } => track.hot = None,
            _ => {}
        }
    }

    /// The hot path (and repetition) instructions released now belong to.
    pub(super) fn hotpath(&self, c: u64) -> Option<(u64, u64)> {
        self.clients.get(&c).and_then(|t| t.hot)
    }

    /// Worker `worker` ran an instruction of client `c` (`seq`: `None` for the dispatcher's
    /// own) from `start` for `nanos`, both on the dispatcher's clock.
    pub(super) fn executed(
        &mut self,
        worker: &str,
        (c, seq): (u64, Option<u64>),
        note: &ExecNote,
        (start, nanos): (u64, u64),
    ) {
        let end = start.saturating_add(nanos);
        match self.busy_until.get_mut(worker) {
            Some(until) => *until = (*until).max(end),
            None => {
                self.busy_until.insert(worker.to_string(), end);
            }
        }
        if self.broken || matches!(note.op, "free" | "hotpath_start" | "hotpath_end") {
            return;
        }
        let track = self.clients.get(&c);
        let tag = seq.and_then(|s| track.and_then(|t| t.tags.get(&s)));
        let line = seq.and_then(|s| track.and_then(|t| t.lines.get(&s))).copied();
        let facts = &note.facts;
        // A part of a collective across workers says which one and with whom; a collective
        // whose values all live on one worker moves nothing between workers: a kernel there.
        let (kind, detail) = match (note.op, &note.exchange) {
            ("literal", _) => (RecordKind::Copy, "h2d".to_string()),
            (_, Some(exchange)) => (RecordKind::Transfer, exchange.replace(", ", ";")),
            _ => (RecordKind::Kernel, String::new()),
        };
        let name = if note.op == "fused" { format!("fused.{:08x}", facts.hash >> 32) } else { note.op.to_string() };
        let record = Record {
            client: c,
            seq,
            op: note.op.to_string(),
            kernel_hash: format!("{:016x}", facts.hash),
            line,
            hotpath: facts.hotpath.map(|h| h.0),
            iteration: facts.hotpath.map(|h| h.1),
            inputs: types_text(&facts.inputs),
            outputs: types_text(&facts.types),
            bytes_read: facts.cost.bytes_read,
            bytes_written: facts.cost.bytes_written,
            flops: facts.cost.flops,
            start_ns: start,
            duration_ns: nanos,
            detail,
            ..scoped(Record::new(kind, worker, &name), tag)
        };
        self.write(worker, &record);
    }

    /// A read of a `ty` value for client `c` (`seq`) was asked of `worker` at `sent` and
    /// answered at `answered` (dispatcher clock): a device-to-host copy, from when the worker
    /// could start it (asked, and done with the work sent before) to its answer's arrival.
    pub(super) fn read(&mut self, worker: &str, (c, seq): (u64, u64), ty: &TensorType, (sent, answered): (u64, u64)) {
        if self.broken {
            return;
        }
        // A read is a request, not an instruction of a batch: it has no script line.
        let tag = self.clients.get(&c).and_then(|t| t.open.last()).map(|o| &o.tag);
        let bytes = ty.size_bytes() as u64;
        let start = sent.max(self.busy_until.get(worker).copied().unwrap_or(0)).min(answered);
        let record = Record {
            client: c,
            seq: Some(seq),
            op: "get".to_string(),
            inputs: types_text(std::slice::from_ref(ty)),
            bytes_read: bytes,
            bytes_written: bytes,
            start_ns: start,
            duration_ns: answered - start,
            detail: "d2h".to_string(),
            ..scoped(Record::new(RecordKind::Copy, worker, "read"), tag)
        };
        self.write(worker, &record);
    }

    fn write(&mut self, worker: &str, record: &Record) {
        let Some(file) = self.files.get_mut(worker) else { return };
        if let Err(e) = file.serialize(record) {
            self.failed(&format!("writing {}", worker_file(worker)), e);
        }
    }

    /// A client left at `now`: its scopes still open are written unclosed.
    pub(super) fn client_left(&mut self, c: u64) {
        let Some(track) = self.clients.remove(&c) else { return };
        for open in track.open {
            if let Err(e) = self.signals.serialize(signal_row(c, open, None)) {
                self.failed("writing signals.csv", e);
            }
        }
    }

    /// Writes buffered rows out (when the dispatcher idles), so a crash loses little.
    pub(super) fn flush(&mut self) {
        let mut failure = None;
        for (name, f) in self.files.iter_mut().map(|(n, f)| (n.as_str(), f)).chain([("signals", &mut self.signals)]) {
            if let Err(e) = f.flush() {
                failure = Some((name.to_string(), e));
            }
        }
        if let Some((name, e)) = failure {
            self.failed(&format!("flushing {name}"), e);
        }
    }

    /// The dispatcher stops: every file is flushed and the manifest says the profile is
    /// complete.
    pub(super) fn finish(mut self) {
        let clients: Vec<u64> = self.clients.keys().copied().collect();
        for c in clients {
            self.client_left(c);
        }
        self.flush();
        self.manifest.ended = Some(now_rfc3339());
        self.manifest.complete = !self.broken;
        if let Err(e) = self.write_manifest() {
            self.failed("writing the manifest", e);
        }
    }
}

/// `record` in the signal scope `tag` (if any).
fn scoped(record: Record, tag: Option<&Tag>) -> Record {
    Record {
        signal: tag.map_or(String::new(), |t| t.signal.to_string()),
        direction: tag.map(|t| t.direction),
        scope: tag.map(|t| t.scope),
        ..record
    }
}

fn signal_row(c: u64, open: OpenScope, closed_ns: Option<u64>) -> SignalRecord {
    SignalRecord {
        client: c,
        scope: open.tag.scope,
        name: open.tag.signal.to_string(),
        direction: open.tag.direction,
        depth: open.depth,
        parent: open.parent,
        opened_ns: open.opened_ns,
        closed_ns,
    }
}

/// Remembers `value` for `key`, forgetting the oldest entry past [`MAX_REMEMBERED`].
fn remember<V>(map: &mut BTreeMap<u64, V>, key: u64, value: V) {
    map.insert(key, value);
    if map.len() > MAX_REMEMBERED {
        map.pop_first();
    }
}

fn types_text(types: &[TensorType]) -> String {
    types.iter().map(|t| t.to_string().replace(' ', "")).collect::<Vec<_>>().join(";")
}

/// A CSV file created (or emptied) for writing, with its header, readable by this user only
/// (records hold shapes and script lines, not data, but the folder may sit in a shared place).
fn csv_file(path: &Path, header: &[&str]) -> std::io::Result<CsvFile> {
    let mut writer = csv::WriterBuilder::new().has_headers(false).from_writer(BufWriter::new(private_file(path)?));
    writer.write_record(header)?;
    Ok(writer)
}

/// The machine's facts, from what the OS says (Linux's `/proc`; elsewhere, what std says).
fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let field = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let memory_kb: u64 = field(&read("/proc/meminfo"), "MemTotal").trim_end_matches(" kB").parse().unwrap_or(0);
    Machine {
        hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
        cpu_model: field(&cpuinfo, "model name"),
        memory_bytes: memory_kb.saturating_mul(1024),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::text::parse;

    fn instr(text: &str) -> Instr {
        match &parse(text).unwrap().body[0].kind {
            gt_ir::StmtKind::Instr(i) => i.clone(),
            other => panic!("{other:?}"),
        }
    }

    fn note(op: &'static str, text: &str) -> ExecNote {
        let exchange = text.split_once(" ; ").map(|(_, e)| e.to_string());
        ExecNote { op, facts: Facts::default(), text: text.to_string(), exchange }
    }

    #[test]
    fn rows_carry_lines_and_scopes_and_the_manifest_ends_complete() {
        let dir = std::env::temp_dir().join(format!("gt-profile-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut p = Profiler::create(&dir, BTreeMap::new()).unwrap();
        p.worker_joined(0, "w0", "cpu");
        p.client_joined(1, "test");
        // A batch of three instructions: lines for two, and more lines than instructions.
        p.lines(1, 0, &[7, 0, 9, 99], 3);
        p.entered(1, 0, &instr("signal_start \"fc1\" backward"), 10);
        p.entered(1, 1, &instr("%a = zeros f32[2]"), 11);
        p.entered(1, 2, &instr("signal_end \"fc1\""), 12);
        p.executed("w0", (1, Some(1)), &note("zeros", "%0 = zeros f32[2]"), (100, 5));
        p.executed("w0", (1, Some(2)), &note("exp", "%1 = exp %0"), (105, 5));
        p.executed("w0", (1, None), &note("free", "free %0"), (110, 1));
        p.executed("w0", (1, Some(1)), &note("move", "%2 = move %0 ; collective #4 rank 0 of w0, w1"), (120, 3));
        // Instructions before a sync are forgotten once it is answered; later ones are kept.
        p.synced(1, 2);
        assert_eq!(p.clients[&1].lines.keys().copied().collect::<Vec<_>>(), vec![2]);
        p.finish();
        let rows: Vec<Record> =
            csv::Reader::from_path(dir.join("worker-w0.csv")).unwrap().deserialize().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 3, "frees are not recorded: {rows:?}");
        assert_eq!(
            (rows[0].line, rows[0].signal.as_str(), rows[0].direction),
            (None, "fc1", Some(Direction::Backward))
        );
        assert_eq!((rows[1].line, rows[1].signal.as_str()), (Some(9), ""), "outside the scope");
        assert_eq!((rows[2].kind, rows[2].detail.as_str()), (RecordKind::Transfer, "collective #4 rank 0 of w0;w1"));
        let signals: Vec<SignalRecord> =
            csv::Reader::from_path(dir.join(SIGNALS)).unwrap().deserialize().map(Result::unwrap).collect();
        assert_eq!(signals.len(), 1);
        assert_eq!((signals[0].opened_ns, signals[0].closed_ns, signals[0].depth), (10, Some(12), 1));
        let manifest: Manifest = serde_json::from_str(&std::fs::read_to_string(dir.join(MANIFEST)).unwrap()).unwrap();
        assert!(manifest.complete && manifest.ended.is_some());
        assert_eq!(manifest.workers[0].file, "worker-w0.csv");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
