//! Pass dumps (`GT_DUMP_PASSES=dir`): each pass's output stream, one `.gtir` file per pass
//! per client stream (`client-3.hotpath.gtir`), written as instructions flow.

use gt_ir::text::print::print_instr;
use gt_ir::Instr;
use gt_passes::pipeline::DumpHook;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

/// A hook that appends each pass's output to `dir/STREAM.PASS.gtir` (opened on first use;
/// a write error is logged once and that file is dropped).
pub fn hook(dir: PathBuf, stream: String) -> DumpHook {
    let mut files: HashMap<&'static str, Option<BufWriter<File>>> = HashMap::new();
    Box::new(move |pass: &'static str, instr: &Instr| {
        let file = files.entry(pass).or_insert_with(|| {
            let path = dir.join(format!("{stream}.{pass}.gtir"));
            match File::create(&path) {
                Ok(f) => {
                    let mut w = BufWriter::new(f);
                    let _ = writeln!(w, "; {stream} after pass `{pass}`");
                    Some(w)
                }
                Err(e) => {
                    tracing::error!(target: "gt::dispatcher", "pass dump {}: {e}", path.display());
                    None
                }
            }
        });
        if let Some(w) = file {
            if let Err(e) = writeln!(w, "{}", print_instr(instr)) {
                tracing::error!(target: "gt::dispatcher", "pass dump of {stream} after {pass}: {e}");
                *file = None;
            }
        }
    })
}
