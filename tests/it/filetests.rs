//! Runs every `tests/gtir/**.gtir` filetest and snapshots its output under `snapshots/`,
//! named after the file's path (`run/slice.gtir` -> `snapshots/run__slice.snap`), so names
//! never depend on which other files exist. `INSTA_GLOB_FILTER=run/slice` runs a subset.

use gt::ir::text::print::print_instr;
use gt::ir::{Executor, HostTensor, Instr, Span, ValueId};
use gt::passes::registry::{self, PassOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Checks `text` against `snapshots/NAME.snap` (recording it for review when it differs).
fn snapshot_matches(name: &str, input: &Path, text: &str) -> bool {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.set_input_file(input);
    let check = || settings.bind(|| insta::assert_snapshot!(name, text));
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)).is_ok()
}

/// The `.gtir` files under `base` whose name (`prefix` + path below `base`, `/`-separated)
/// contains `filter` (`INSTA_GLOB_FILTER`, a trailing `*` ignored), with that name.
fn selected(base: &Path, prefix: &str, filter: &str) -> Vec<(PathBuf, String)> {
    gt::filetest::gtir_files(base)
        .into_iter()
        .map(|path| {
            let rel = format!("{prefix}{}", path.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/"));
            (path, rel)
        })
        .filter(|(_, rel)| rel.contains(filter.trim_end_matches('*')))
        .collect()
}

#[test]
fn filetests() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gtir");
    let filter = std::env::var("INSTA_GLOB_FILTER").unwrap_or_default();
    let mut failures = Vec::new();
    let mut ran = 0;
    for (path, rel) in selected(&base, "", &filter) {
        ran += 1;
        let name = rel.trim_end_matches(".gtir").replace('/', "__");
        let snapshot = match gt::filetest::run_file(&path) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{rel}: {e:#}"));
                continue;
            }
        };
        if !snapshot_matches(&name, &path, &snapshot) {
            failures.push(format!("{rel}: snapshot differs (review with `cargo insta review`)"));
        }
    }
    assert!(ran > 0, "no filetest matched {filter:?}");
    assert!(failures.is_empty(), "{} filetest(s) failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// The stream of a script recorded on the interpreter, replayed through the passes (pure
/// stream transformers, so the replay is the stream a dispatcher's passes would emit with no
/// idle releases): deterministic snapshots of every pass on every run filetest.
/// An executor that records what goes through it, then forwards it.
pub(crate) struct Recorder<E> {
    /// What it records for.
    inner: E,
    /// The stream: instructions, and `None` at each sync point.
    pub(crate) stream: Vec<Option<Instr>>,
}

impl<E> Recorder<E> {
    /// Records what is sent to `inner`.
    pub(crate) fn new(inner: E) -> Self {
        Recorder { inner, stream: Vec::new() }
    }
}

impl<E: Executor> Executor for Recorder<E> {
    type Error = E::Error;

    fn error_kind(error: &E::Error) -> gt_ir::FailureKind {
        E::error_kind(error)
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), E::Error> {
        self.execute_at(instr, None)
    }

    fn execute_at(&mut self, instr: &Instr, span: Option<Span>) -> Result<(), E::Error> {
        self.stream.push(Some(instr.clone()));
        self.inner.execute_at(instr, span)
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, E::Error> {
        self.stream.push(None);
        self.inner.read(value)
    }

    fn sync(&mut self) -> Result<(), E::Error> {
        self.inner.sync()
    }

    fn error_span(error: &E::Error) -> Option<(Span, &'static str)> {
        E::error_span(error)
    }

    fn error_op(error: &E::Error) -> Option<&'static str> {
        E::error_op(error)
    }
}

/// Each of `dump` (pass names) as text: the stream after that pass, in a pipeline of `passes`
/// (which must include them).
fn dumps(
    stream: &[Option<Instr>],
    passes: &[&'static str],
    options: &PassOptions,
    dump: &[&'static str],
) -> Result<Vec<(&'static str, String)>, gt_passes::UnknownPass> {
    let mut pipeline = registry::pipeline(passes, options)?;
    let texts: Arc<Mutex<BTreeMap<&'static str, String>>> = Arc::default();
    let sink = texts.clone();
    pipeline.set_dump(Box::new(move |pass, instr, _| {
        let mut t = sink.lock().expect("not poisoned");
        let text = t.entry(pass).or_default();
        text.push_str(&print_instr(instr));
        text.push('\n');
    }));
    let mut out = Vec::new();
    for (seq, item) in (0u64..).zip(stream) {
        match item {
            Some(i) => pipeline.run(i.clone(), seq, &mut out),
            None => pipeline.flush(seq, &mut out),
        }
    }
    pipeline.flush(stream.len() as u64, &mut out);
    let texts = texts.lock().expect("not poisoned");
    Ok(dump.iter().map(|p| (*p, texts.get(p).cloned().unwrap_or_default())).collect())
}

/// For every run filetest: the instruction stream after each pass, as an insta snapshot
/// (`snapshots/passes__run__NAME__PASS.snap`), by [`dumps`].
/// The CLIF of every `fused` instruction of a dumped stream, in order.
/// Each kernel over the dtypes of its buffers, as the stream types them.
fn clif_of_kernels(dump: &str) -> String {
    use gt::ir::kernel::{BufferStorage, Storage};
    let Ok(program) = gt::ir::text::parse(dump) else { return String::new() };
    let mut types: std::collections::HashMap<ValueId, gt::ir::TensorType> = Default::default();
    let mut out = String::new();
    for (instr, _) in program.instrs() {
        let ty = |v| types.get(&v).cloned().ok_or(gt::ir::verify::shape::TypeError::UnknownValue(v));
        let results = gt::ir::verify::shape::infer(instr, &ty).unwrap_or_default();
        if let gt::ir::Instr::Fused { dst, kernel, srcs, ty } = instr {
            let storage = |v: &ValueId| types.get(v).map(|t| Storage::of(t.dtype));
            let inputs: Option<Vec<Storage>> = srcs.iter().map(storage).collect();
            let storage = inputs.map(|inputs| BufferStorage { output: Storage::of(ty.dtype), inputs });
            let clif =
                gt_runtime::backend::cpu::jit::clif_over(kernel, storage.as_ref()).unwrap_or_else(|e| format!("; {e}"));
            out.push_str(&format!("; %{}\n{clif}\n", program.name(*dst)));
        }
        types.extend(instr.results().into_iter().zip(results));
    }
    out
}

#[test]
fn stream_after_each_pass() {
    use gt::passes::KNOWN_PASSES;
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gtir/run");
    let filter = std::env::var("INSTA_GLOB_FILTER").unwrap_or_default();
    let mut failures = Vec::new();
    for (path, rel) in selected(&base, "run/", &filter) {
        let loaded = match gt::script::load(&std::fs::read(&path).unwrap()) {
            Ok(l) => l,
            Err(_) => continue,
        };
        let recorder = Recorder::new(gt::runtime::Interpreter::new());
        // Failing scripts still have a stream up to the failure.
        let (_, recorder) = gt::script::run_any(&loaded, recorder, &mut std::io::sink(), Default::default());
        let stream = recorder.map(|r| r.stream).unwrap_or_default();
        let dumps = dumps(&stream, KNOWN_PASSES, &PassOptions::default(), KNOWN_PASSES).unwrap();
        for (pass, text) in dumps {
            let name = format!("passes__{}__{pass}", rel.trim_end_matches(".gtir").replace('/', "__"));
            if !snapshot_matches(&name, &path, &text) {
                failures.push(format!("{name}: snapshot differs (review with `cargo insta review`)"));
            }
            // The CLIF the CPU JIT makes of each kernel the fuse pass made.
            if pass == "fuse" {
                let clif = clif_of_kernels(&text);
                let name = format!("clif__{}", rel.trim_end_matches(".gtir").replace('/', "__"));
                if !clif.is_empty() && !snapshot_matches(&name, &path, &clif) {
                    failures.push(format!("{name}: snapshot differs (review with `cargo insta review`)"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
