//! `gt-run --dump-after PASS`: the client's instruction stream, recorded as it is sent, is
//! replayed through the same passes in this process (passes are pure stream transformers, so
//! this is the stream the dispatcher saw), and each requested pass's output is printed as
//! `.gtir` text. Sync points flush the passes, as in the dispatcher.

use gt_ir::text::print::print_instr;
use gt_ir::{Executor, HostTensor, Instr, Span, ValueId};
use gt_passes::registry::{self, PassOptions};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// An executor that records what goes through it, then forwards it.
pub struct Recorder<E> {
    /// What it records for (owned, or `&mut` borrowed).
    pub inner: E,
    /// The stream: instructions, and `None` at each sync point.
    pub stream: Vec<Option<Instr>>,
}

impl<E> Recorder<E> {
    /// Records what is sent to `inner`.
    pub fn new(inner: E) -> Self {
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
pub fn dumps(
    stream: &[Option<Instr>],
    passes: &[&'static str],
    options: &PassOptions,
    dump: &[&'static str],
) -> Result<Vec<(&'static str, String)>, gt_passes::UnknownPass> {
    let mut pipeline = registry::pipeline(passes, options)?;
    let texts: Arc<Mutex<BTreeMap<&'static str, String>>> = Arc::default();
    let sink = texts.clone();
    pipeline.set_dump(Box::new(move |pass, instr| {
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
