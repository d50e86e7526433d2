//! Pass dumps (`GT_DUMP_PASSES=dir`): each pass's output stream, one `.gtir` file per pass
//! per client stream (`client-3.hotpath.gtir`), written as instructions flow; the CLIF the
//! CPU JIT makes of each `fused` kernel goes next to it (`client-3.fuse.clif`).

use foldhash::{HashMap, HashMapExt};
use gt_ir::text::print::print_instr;
use gt_ir::Instr;
use gt_passes::pipeline::{DumpHook, Meta};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

/// A hook that appends each pass's output to `dir/STREAM.PASS.gtir`, and the CLIF of each
/// `fused` kernel to `dir/STREAM.PASS.clif` (opened on first use; a write error is logged
/// once and that file is dropped).
pub fn hook(dir: PathBuf, stream: String) -> DumpHook {
    let mut files: HashMap<(&'static str, &'static str), Option<BufWriter<File>>> = HashMap::new();
    Box::new(move |pass: &'static str, instr: &Instr, meta: &Meta| {
        let mut text = vec![("gtir", print_instr(instr) + &placement(&meta.place))];
        if let Instr::Fused { dst, kernel, .. } = instr {
            let clif = crate::backend::cpu::jit::clif(kernel).unwrap_or_else(|e| format!("; no CLIF: {e}"));
            let header: String = format!("%{} = fused\n{kernel}", dst.0).lines().map(|l| format!("; {l}\n")).collect();
            text.push(("clif", format!("{header}{clif}")));
        }
        for (ext, text) in text {
            write(&mut files, &dir, &stream, pass, ext, &text);
        }
    })
}

/// Where a placed instruction's results go, as a trailing comment (` ; on w1`, ` ; on w0, w1`).
pub fn placement(place: &[u32]) -> String {
    if place.is_empty() {
        return String::new();
    }
    let workers: Vec<String> = place.iter().map(|w| format!("w{w}")).collect();
    format!("  ; on {}", workers.join(", "))
}

fn write(
    files: &mut HashMap<(&'static str, &'static str), Option<BufWriter<File>>>,
    dir: &std::path::Path,
    stream: &str,
    pass: &'static str,
    ext: &'static str,
    text: &str,
) {
    {
        let file = files.entry((pass, ext)).or_insert_with(|| {
            let path = dir.join(format!("{stream}.{pass}.{ext}"));
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
            if let Err(e) = writeln!(w, "{text}") {
                tracing::error!(target: "gt::dispatcher", "pass dump of {stream} after {pass}: {e}");
                *file = None;
            }
        }
    }
}
