//! `gt-run` as a user runs it: exit codes, output and diagnostics for good and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn gt_run(args: &[&str]) -> Output {
    gt_run_env(args, &[])
}

/// `gt-run` with these environment variables set (run from the repository root).
pub(crate) fn gt_run_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gt-run"));
    cmd.args(args).current_dir(root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("gt-run starts")
}

pub(crate) fn code(o: &Output) -> i32 {
    o.status.code().expect("gt-run exits normally, not by a signal")
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes a script into a fresh temporary directory and returns its path.
pub(crate) fn script(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gt-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn run_script(name: &str, src: &[u8], flags: &[&str]) -> Output {
    let path = script(name, src);
    let mut args: Vec<&str> = flags.to_vec();
    let p = path.to_str().unwrap().to_string();
    args.push(&p);
    gt_run(&args)
}

#[test]
fn every_example_runs() {
    let mut n = 0;
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gtir") {
            let o = gt_run(&[path.to_str().unwrap()]);
            assert_eq!(code(&o), 0, "{}:\n{}", path.display(), stderr(&o));
            assert!(!stdout(&o).is_empty(), "{} prints something", path.display());
            n += 1;
        }
    }
    assert!(n >= 4, "the four required examples exist");
}

#[test]
fn readme_tour_is_an_example_and_prints_what_it_says() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let tour = std::fs::read_to_string(root().join("examples/tour.gtir")).unwrap();
    assert!(readme.contains(&tour), "README's tour block must equal examples/tour.gtir");
    let o = gt_run(&["examples/tour.gtir"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "%y = f32[2] [2, 4]\n");
}

#[test]
fn quiet_suppresses_values_but_checks_expectations() {
    let o = run_script("quiet.gtir", b"%x = ones f32[2]\nprint %x\nexpect %x == [1, 1]\n", &["--quiet"]);
    assert_eq!((code(&o), stdout(&o)), (0, String::new()));
    let o = run_script("quiet-fail.gtir", b"%x = ones f32[2]\nexpect %x == [1, 2]\n", &["-q"]);
    assert_eq!(code(&o), 1);
}

#[test]
fn failed_expectation_exits_1_naming_line_and_index() {
    let src = b"%x = arange f32 start=0 end=4\n%y = mul %x, 2.0\nexpect %y ~= [0, 2, 5, 6] tol=1e-6\n";
    let o = run_script("expect.gtir", src, &[]);
    assert_eq!(code(&o), 1);
    let err = stderr(&o);
    assert!(err.contains("expect.gtir:3:1"), "{err}");
    assert!(err.contains("1 of 4 elements differ; first at index [2]: found 4, expected 5 (tol 1e-6)"), "{err}");
}

#[test]
fn runtime_error_exits_1() {
    // Verifies (the shape is representable) but is far over the interpreter's memory limit.
    let o = run_script("huge.gtir", b"%x = zeros f32[100000, 100000, 100]\nprint %x\n", &[]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("huge.gtir:1:1"), "{}", stderr(&o));
    assert!(stderr(&o).contains("limit"), "{}", stderr(&o));
}

#[test]
fn empty_file_is_a_diagnostic() {
    for (name, src) in [("empty.gtir", &b""[..]), ("comments.gtir", b"; nothing here\n\n")] {
        let o = run_script(name, src, &[]);
        assert_eq!(code(&o), 2, "{name}");
        assert!(stderr(&o).contains("program has no instructions"), "{}", stderr(&o));
        assert!(stderr(&o).contains(name), "{}", stderr(&o));
    }
}

#[test]
fn non_utf8_file_is_a_diagnostic() {
    let o = run_script("latin1.gtir", b"%x = ones f32[2]\n; caf\xe9\n", &[]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(err.contains("not valid UTF-8 (first bad byte at offset 22)"), "{err}");
    assert!(err.contains("latin1.gtir:2:"), "{err}");
}

#[test]
fn ten_megabyte_line_gives_a_short_diagnostic() {
    let mut src = b"%x = tensor f32[4] [".to_vec();
    while src.len() < 10 << 20 {
        src.extend_from_slice(b"1, ");
    }
    src.extend_from_slice(b"1]\n");
    let o = run_script("long.gtir", &src, &[]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(err.contains("type f32[4] needs 4 values, found"), "{}", &err[..err.len().min(2000)]);
    assert!(err.len() < 4000, "diagnostic is {} bytes", err.len());

    // A syntax error at the far end of the line is shown clipped around the error.
    let at = src.len() - 3;
    src[at] = b'?';
    let o = run_script("long2.gtir", &src, &[]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(err.contains("unexpected character '?'") && err.contains("bytes long"), "{}", &err[..err.len().min(2000)]);
    assert!(err.len() < 4000, "diagnostic is {} bytes", err.len());
}

#[test]
fn type_errors_name_place_expected_and_found() {
    let src = b"%a = ones f32[2, 3]\n%b = ones f32[4]\n%c = add %a, %b\n%d = matmul %a, %a\n%e = reshape %a shape=[4, 2]\n%f = sum %a axes=[2]\n";
    let o = run_script("types.gtir", src, &[]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    for needle in [
        "types.gtir:3:1",
        "cannot broadcast [2, 3] with [4]: dimension 3 does not match 4",
        "types.gtir:4:1",
        "matmul: inner dimensions differ: left [2, 3] has 3 columns, right [2, 3] has 2 rows",
        "types.gtir:5:1",
        "cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)",
        "types.gtir:6:1",
        "axis 2 is out of range for rank 2 (expected -2..=1)",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
}

#[test]
fn unknown_op_and_wrong_arity_are_parse_errors() {
    let o = run_script("op.gtir", b"%a = ones f32[2]\n%b = ad %a, %a\n", &[]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("unknown op `ad`") && stderr(&o).contains("did you mean `add`?"), "{}", stderr(&o));
    let o = run_script("arity.gtir", b"%a = ones f32[2]\n%b = add %a, %a, %a\n", &[]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("`add` takes 2 operand(s), found 3"), "{}", stderr(&o));
    assert!(stderr(&o).contains("arity.gtir:2:10"), "{}", stderr(&o));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(code(&gt_run(&[])), 2);
    assert_eq!(code(&gt_run(&["--no-such-flag", "x.gtir"])), 2);
    let o = gt_run(&["--dump-after", "shards", "examples/tour.gtir"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("parse") && stderr(&o).contains("verify"), "lists the stages: {}", stderr(&o));
    let o = gt_run(&["does/not/exist.gtir"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("cannot read does/not/exist.gtir"), "{}", stderr(&o));
}

#[test]
fn dump_after_prints_gtir_that_parses() {
    let o = gt_run(&["--dump-after", "all", "--quiet", "examples/mlp.gtir"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("; after parse\n") && out.contains("; after verify\n"), "{out}");
    assert!(out.contains("%logits = add %hw2s, %b2  ; f32[8, 4]"), "{out}");
    // Each stage's dump is a program of its own (the passes' too: `all` dumps the passes
    // that run by default, shard, fuse and dead).
    let mut stages: Vec<&str> = out.split("; after ").skip(1).collect();
    let names: Vec<&str> = stages.iter().map(|s| s.lines().next().unwrap_or_default()).collect();
    assert_eq!(names, ["parse", "verify", "shard", "fuse", "dead"], "{out}");
    for stage in stages.drain(..) {
        let program = gt::ir::text::parse(stage.split_once('\n').unwrap().1).expect("the dump is .gtir");
        gt::ir::verify(&program).expect("and it verifies");
    }
}

#[test]
fn filetest_mode_reports_pass_and_fail() {
    let ok = run_script("ok.gtir", b"; test run\n%x = ones f32[1]\nprint %x\n; out: %x = f32[1] [1]\n", &["--test"]);
    assert_eq!(code(&ok), 0, "{}", stderr(&ok));
    let bad = run_script("bad.gtir", b"; test run\n%x = ones f32[1]\nprint %x\n; out: %x = f32[1] [2]\n", &["--test"]);
    assert_eq!(code(&bad), 1);
    assert!(stderr(&bad).contains("stdout differs"), "{}", stderr(&bad));
}

#[test]
fn workers_from_the_environment_and_their_statistics() {
    let o = gt_run_env(&["--quiet", "--worker-stats", "examples/mlp.gtir"], &[("GT_WORKERS", "3".as_ref())]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.matches("worker worker-").count(), 3, "{err}");
    // The one client ran everything on one worker: its table lists matmul.
    assert!(err.contains("matmul"), "{err}");
}

#[test]
fn bad_settings_are_errors_naming_the_variable() {
    for (var, value) in [("GT_WORKERS", "many"), ("GT_WORKER_BATCH_SIZE", "0"), ("GT_CLIENT_BATCH_SIZE", "x")] {
        let o = gt_run_env(&["examples/tour.gtir"], &[(var, value.as_ref())]);
        assert_eq!(code(&o), 1, "{var}");
        assert!(stderr(&o).contains(&format!("{var}=\"{value}\"")), "{var}: {}", stderr(&o));
    }
}

#[test]
fn reference_and_embedded_runs_print_the_same() {
    for example in ["examples/tour.gtir", "examples/mlp.gtir"] {
        let reference = gt_run(&["--reference", example]);
        let embedded = gt_run(&["--workers", "2", example]);
        assert_eq!((code(&reference), code(&embedded)), (0, 0));
        assert_eq!(stdout(&reference), stdout(&embedded), "{example}");
    }
}

#[test]
fn hot_path_detection_marks_a_loop_and_changes_no_number() {
    let src = b"%w = randn f32[16, 16] seed=1\n%x = randn f32[8, 16] seed=2\n\
                repeat 20 {\n  %h = matmul %x, %w\n  %r = relu %h\n  %s = sum %r\n}\nprint %s\n";
    let path = script("loop.gtir", src);
    let p = path.to_str().unwrap();
    let reference = gt_run(&["--reference", p]);
    let o = gt_run_env(&["--worker-stats", p], &[("GT_HOTPATH", "1".as_ref())]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&reference));
    let err = stderr(&o);
    let starts = err.lines().find(|l| l.trim_start().starts_with("hotpath_start")).expect("markers ran on the worker");
    let count: u64 = starts.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!((10..=20).contains(&count), "{err}");
}

#[test]
fn dump_after_a_pass_prints_the_stream_it_made_and_pass_stats_count() {
    let src = b"%x = randn f32[4] seed=1\nrepeat 8 {\n  %a = exp %x\n  %b = neg %a\n  %c = sum %b\n}\nprint %c\n";
    let path = script("dump.gtir", src);
    let o = gt_run(&["--dump-after", "hotpath", "--pass-stats", path.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let dump = out.split("; after hotpath\n").nth(1).expect("the dump follows the values");
    assert!(dump.contains("hotpath_start") && dump.contains("%2 = neg %1"), "{out}");
    // 8 iterations of 3 instructions and 2 frees (each value dies after its last use).
    assert!(stderr(&o).contains("pass hotpath: instructions=43 sequences=1"), "{}", stderr(&o));
}

#[test]
fn unknown_pass_names_list_the_known_ones() {
    let o = gt_run(&["--dump-after", "shards", "examples/tour.gtir"]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("expected parse, verify, all or a pass (shard, hotpath, fuse, dead)"),
        "{}",
        stderr(&o)
    );
    let o = gt_run_env(&["examples/tour.gtir"], &[("GT_PASSES", "hotpath,shards".as_ref())]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("unknown pass `shards` (known passes: shard, hotpath, fuse, dead)"), "{}", stderr(&o));
}

#[test]
fn pass_dumps_go_to_a_directory_and_an_unwritable_one_is_an_error_at_start() {
    let dir = std::env::temp_dir().join(format!("gt-dumps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = gt_run_env(&["-q", "examples/mlp.gtir"], &[("GT_HOTPATH", "1".as_ref()), ("GT_DUMP_PASSES", dir.as_ref())]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = std::fs::read_to_string(dir.join("client-1.hotpath.gtir")).unwrap();
    assert!(text.starts_with("; client-1 after pass `hotpath`\nsignal_start \"layer1\"\n%0 = randn"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
    let file = script("not-a-dir", b"x");
    let o = gt_run_env(&["examples/tour.gtir"], &[("GT_DUMP_PASSES", file.as_ref())]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("GT_DUMP_PASSES=") && stderr(&o).contains("cannot write there"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "nothing ran");
}

#[test]
fn dump_kernels_writes_kernel_ir_and_ptx() {
    let dir = std::env::temp_dir().join(format!("gt-cli-{}-kernels", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = gt_run(&["--quiet", "--dump-kernels", dir.to_str().unwrap(), "examples/mlp.gtir"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("kernels to"), "{}", stderr(&o));
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let matmul = names.iter().find(|n| n.ends_with("-matmul.ptx")).expect("a matmul kernel");
    let ptx = std::fs::read_to_string(dir.join(matmul)).unwrap();
    assert!(ptx.contains(".entry gt_kernel") && ptx.contains("fma.rn.f32"), "{ptx}");
    let kernel = std::fs::read_to_string(dir.join(matmul.replace(".ptx", ".kernel"))).unwrap();
    assert!(kernel.starts_with("kernel matmul"), "{kernel}");
    // A file where the directory should be: a clear error, exit 2.
    let file = script("not-a-dir", b"");
    let o = gt_run(&["--quiet", "--dump-kernels", file.to_str().unwrap(), "examples/mlp.gtir"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("cannot write kernels"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dump_kernels_says_how_buffers_are_stored() {
    // A bf16 matmul is generated for tensor cores over bf16 buffers; an i32 add computes in
    // i64 over i32 buffers; an f64 `erf` in f64; an i64 matmul, which the CUDA backend does
    // not compute, gets the generator's error instead of PTX.
    let dir = std::env::temp_dir().join(format!("gt-cli-{}-kernels-bf16", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let source = b"%a = randn bf16[64, 32] seed=1\n%w = randn bf16[32, 16] seed=2\n%m = matmul %a, %w\n\
                   %i = tensor i32[2] [1, 2]\n%j = add %i, %i\n%d = tensor f64[2] [1, 2]\n%e = erf %d\n\
                   %k = tensor i64[2, 2] [1, 2, 3, 4]\n%p = matmul %k, %k\n";
    let path = script("bf16-kernels", source);
    let o = gt_run(&["--quiet", "--dump-kernels", dir.to_str().unwrap(), path.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let matmul = names.iter().find(|n| n.ends_with("-matmul.ptx")).expect("a matmul kernel");
    let ptx = std::fs::read_to_string(dir.join(matmul)).unwrap();
    let header = ptx.lines().next().unwrap();
    assert!(header.contains("bf16 tensor cores") && header.ends_with("; buffers: out bf16, in bf16 bf16"), "{header}");
    assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    let read = |n: &String| std::fs::read_to_string(dir.join(n)).unwrap();
    let add = names.iter().find(|n| n.ends_with(".kernel") && read(n).contains("add %0, %0")).expect("the add");
    assert!(read(add).starts_with("kernel map [2] as i64 {"), "{}", read(add));
    let add_ptx = read(&add.replace(".kernel", ".ptx"));
    assert!(add_ptx.lines().next().unwrap().ends_with("; buffers: out i32, in i32"), "{add_ptx}");
    assert!(add_ptx.contains("ld.global.nc.s32") && add_ptx.contains("add.s64"), "{add_ptx}");
    let erf = names.iter().find(|n| n.ends_with(".kernel") && read(n).contains("erf %0")).expect("the erf");
    assert!(read(erf).starts_with("kernel map [2] as f64 {"), "{}", read(erf));
    let erf_ptx = read(&erf.replace(".kernel", ".ptx"));
    assert!(erf_ptx.lines().next().unwrap().ends_with("; buffers: out f64, in f64"), "{erf_ptx}");
    assert!(erf_ptx.contains("fma.rn.f64") && !erf_ptx.contains(".f32"), "{erf_ptx}");
    let refused = names.iter().find(|n| n.ends_with(".ptx-error")).expect("the i64 matmul's error");
    assert!(read(refused).contains("matmul of i64 has no CUDA kernel"), "{}", read(refused));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn backend_setting_is_checked() {
    let o = gt_run_env(&["examples/mlp.gtir"], &[("GT_BACKEND", "tpu".as_ref())]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("GT_BACKEND") && stderr(&o).contains("known: cpu, cuda"), "{}", stderr(&o));
    // A build without the cuda feature says how to get one (tests/cuda covers the other).
    if cfg!(feature = "cuda") {
        return;
    }
    let o = gt_run_env(&["examples/mlp.gtir"], &[("GT_BACKEND", "cuda".as_ref())]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--features cuda"), "{}", stderr(&o));
}

#[test]
fn a_hot_loop_compiles_once_with_auto_compile() {
    // 40 iterations of a 4-op body: the hotpath pass finds it, the fuse pass compiles each
    // later repetition to the same kernel, and the worker's JIT compiles it once.
    let src = b"%x = randn f32[64, 64] seed=1\n%w = randn f32[64] seed=2\nrepeat 40 {\n  %a = mul %x, %w\n  %b = tanh %a\n  %c = add %b, 1.0\n  %s = sum %c axes=[-1] keepdim\n}\nprint %s\n";
    let path = script("hot.gtir", src);
    let env = [("GT_AUTO_COMPILE", "1".as_ref()), ("GT_DEBUG_COMPILE", "1".as_ref())];
    let o = gt_run_env(&["--quiet", path.to_str().unwrap()], &env);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let log = stderr(&o);
    let regions = log.matches("fuse: region").count();
    let compiles = log.matches("jit: compiled").count();
    assert!(regions >= 30, "hot repetitions compiled as regions: {regions}\n{log}");
    assert_eq!(compiles, 1, "one kernel, compiled once:\n{log}");
    // The same numbers as without compiling.
    let fused = gt_run_env(&[path.to_str().unwrap()], &[("GT_AUTO_COMPILE", "1".as_ref())]);
    let plain = gt_run(&["--reference", path.to_str().unwrap()]);
    assert_eq!(stdout(&fused), stdout(&plain));
}

/// A hand-written kernel whose oracle would hold 10^12 elements per node: on the reference
/// interpreter and on a worker evaluating kernels with the oracle (`GT_JIT=0`), in `f32` and
/// `f64`, an out-of-memory error at its line naming the budget, not an abort (or a process
/// eating the machine) on a failed allocation.
#[test]
fn a_kernel_the_oracle_cannot_hold_is_out_of_memory_everywhere() {
    for dtype in ["f32", "f64"] {
        let compute = if dtype == "f64" { " as f64" } else { "" };
        let src = format!(
            "%x = tensor {dtype}[1] [1.0]\n%y = fused %x : {dtype}[1] kernel map [1000000, 1000000] rows [0, 1] sum{compute} {{\n  in0 +0 strides [0, 0]\n  %0 = load in0\n  %1 = exp %0\n  out +0 strides [0, 0]\n}}\nprint %y\n"
        );
        let path = script(&format!("huge_{dtype}.gtir"), src.as_bytes());
        let budget = [("GT_WORKER_MEMORY", "1000000000".as_ref()), ("GT_JIT", "0".as_ref())];
        for args in [&["--reference", path.to_str().unwrap()][..], &[path.to_str().unwrap()][..]] {
            let o = gt_run_env(args, &budget);
            assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
            let err = stderr(&o);
            assert!(err.contains("over the worker's memory budget of 1000000000"), "{args:?}: {err}");
            assert!(err.contains(&format!("huge_{dtype}.gtir:2:1")), "{args:?}: {err}");
        }
    }
}
