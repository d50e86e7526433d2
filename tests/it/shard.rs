//! The shard pass: every run filetest, spread over workers by a placement around the whole
//! script (random axis, 2-4 workers, split or replicated), reads what the interpreter reads
//! (within rounding where a reduction's order changes); plans as dumps.

use crate::cluster::run_filetests;
use gt::ir::{DType, HostTensor, Instr, Placement, Program, SliceItem, Stmt, StmtKind, ValueId};
use gt::passes::pipeline::Emitted;
use gt::passes::{registry, PassOptions, Pipeline};
use gt::runtime::Interpreter;
use proptest::prelude::*;

/// One step of a flattened script: an instruction, or a read.
enum Step {
    Run(Instr),
    Read(ValueId),
}

/// The script's instructions and reads in order, loops unrolled; `None` when it has
/// statements other than instructions, reads, loops and signal blocks (training).
fn flatten(stmts: &[Stmt], q: &mut Vec<Step>) -> Option<()> {
    for s in stmts {
        match &s.kind {
            StmtKind::Const { .. } => {}
            StmtKind::Instr(i) => q.push(Step::Run(i.clone())),
            StmtKind::Print { src } | StmtKind::Expect { src, .. } => q.push(Step::Read(*src)),
            StmtKind::Repeat { count, body } => {
                for _ in 0..*count {
                    flatten(body, q)?;
                }
            }
            StmtKind::Signal { name, body } => {
                q.push(Step::Run(Instr::SignalStart {
                    name: name.clone(),
                    compile: false,
                    backward: false,
                    place: None,
                }));
                flatten(body, q)?;
                q.push(Step::Run(Instr::SignalEnd { name: name.clone() }));
            }
            _ => return None,
        }
    }
    Some(())
}

/// Runs `program` (after `prologue`) through `pipeline` when given, on the interpreter;
/// every `print` and `expect` reads its value (assembled at home first). `None` when the
/// program is not a plain stream or fails.
fn reads(program: &Program, mut pipeline: Option<&mut Pipeline>, prologue: &[Instr]) -> Option<Vec<HostTensor>> {
    let mut steps: Vec<Step> = prologue.iter().cloned().map(Step::Run).collect();
    flatten(&program.body, &mut steps)?;
    let mut interp = Interpreter::new();
    let mut out = Vec::new();
    for (seq, step) in (1u64..).zip(steps) {
        let mut emitted: Vec<Emitted> = Vec::new();
        let read = match (&mut pipeline, step) {
            (Some(p), Step::Run(instr)) => {
                p.run(instr, seq, &mut emitted);
                None
            }
            (None, Step::Run(instr)) => {
                emitted.push((instr, Default::default()));
                None
            }
            (Some(p), Step::Read(v)) => {
                p.flush(seq, &mut emitted);
                p.materialize(v, seq, &mut emitted);
                Some(v)
            }
            (None, Step::Read(v)) => Some(v),
        };
        if let Some(p) = &mut pipeline {
            let errors = p.take_errors();
            assert!(errors.is_empty(), "pass errors: {errors:?}");
            assert!(p.take_refusals().is_empty(), "refusals");
        }
        for (i, _) in emitted {
            interp.execute(&i).ok()?;
        }
        if let Some(v) = read {
            out.push(interp.read(v).ok()?);
        }
    }
    Some(out)
}

/// Equal within rounding where a reduction's order changes: 1e-4 relative, or one unit in
/// the last place of a half (its sums round once, from an `f32` whose order changed).
fn close(a: &[HostTensor], b: &[HostTensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let rel = match x.ty.dtype {
                DType::F16 => 2f32.powi(-10),
                DType::BF16 => 2f32.powi(-7),
                _ => 1e-4,
            };
            x.ty == y.ty
                && x.to_f32().iter().zip(&y.to_f32()).all(|(p, q)| {
                    (p.is_nan() && q.is_nan()) || p == q || (p - q).abs() <= rel * (1e-3 + p.abs().max(q.abs()))
                })
        })
}

/// The shard pass (and, `compile`, the fuse pass compiling every region of each worker)
/// with the dead pass, on `workers` workers.
fn sharded_pipeline(workers: usize, compile: bool) -> Pipeline {
    let passes: &[&str] = if compile { &["shard", "hotpath", "fuse", "dead"] } else { &["shard", "dead"] };
    let mut p = registry::pipeline(passes, &PassOptions::default()).unwrap();
    p.set_workers(workers);
    p
}

fn programs() -> Vec<(String, Program)> {
    let mut examples: Vec<std::path::PathBuf> = std::fs::read_dir("examples")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gtir"))
        .collect();
    examples.sort();
    run_filetests()
        .into_iter()
        .chain(examples)
        .filter_map(|path| {
            let source = std::fs::read_to_string(&path).ok()?;
            if source.contains("; error:") {
                return None;
            }
            let loaded = gt::script::load(source.as_bytes()).ok()?;
            Some((path.display().to_string(), loaded.program))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_run_filetest_and_example_spread_over_workers_reads_what_the_interpreter_reads(
        axis in -2i64..3,
        workers in 2usize..5,
        replicated in any::<bool>(),
        first in 0u32..2,
        compile in any::<bool>(),
    ) {
        let listed: Vec<u32> = (first..first + workers as u32).collect();
        let place = if replicated {
            Placement::Replicated { workers: listed }
        } else {
            Placement::Split { axis, workers: listed }
        };
        let prologue = [Instr::SignalStart { name: "spread".into(), compile: false, backward: false, place: Some(place.clone()) }];
        let (mut spread, mut kernels, mut examples) = (0, 0, 0);
        for (path, program) in programs() {
            let Some(reference) = reads(&program, None, &[]) else { continue };
            examples += usize::from(path.starts_with("examples"));
            let mut p = sharded_pipeline(workers + 2, compile);
            let got = reads(&program, Some(&mut p), &prologue);
            let stats = p.stats();
            spread += stats[0].1.iter().filter(|(k, _)| *k == "sharded" || *k == "replicated").map(|(_, v)| v).sum::<u64>();
            kernels += stats.iter().filter(|(pass, _)| *pass == "fuse").flat_map(|(_, c)| c).filter(|(k, _)| *k == "kernels").map(|(_, v)| v).sum::<u64>();
            prop_assert!(got.is_some(), "{path} under {place:?} (compiled: {compile}): failed to run");
            let got = got.unwrap();
            prop_assert!(close(&got, &reference), "{path} under {place:?} (compiled: {compile}): reads differ\n{got:?}\n{reference:?}");
        }
        prop_assert!(spread > 0, "the placement spread only {spread} instructions");
        prop_assert!(examples >= 5, "only {examples} examples ran");
        prop_assert!(!compile || kernels > 0, "compiled, but no kernel was made");
    }
}

/// The stream the shard pass makes of `src` (each line with the workers its results go
/// to), its reads assembled, and its counters.
fn plan(src: &str, workers: usize) -> String {
    let program = gt::script::load(src.as_bytes()).unwrap().program;
    let mut p = registry::pipeline(&["shard"], &PassOptions::default()).unwrap();
    p.set_workers(workers);
    let mut steps = Vec::new();
    flatten(&program.body, &mut steps).unwrap();
    let mut text = String::new();
    for (seq, step) in (1..).zip(steps) {
        let mut out = Vec::new();
        match step {
            Step::Run(i) => p.run(i, seq, &mut out),
            Step::Read(v) => {
                p.flush(seq, &mut out);
                p.materialize(v, seq, &mut out);
                text.push_str(&format!("; read %{}\n", program.name(v)));
            }
        }
        for (i, meta) in out {
            let at = match meta.place.as_slice() {
                [] => "home".to_string(),
                w => w.iter().map(|w| format!("w{w}")).collect::<Vec<_>>().join(", "),
            };
            text.push_str(&format!("{:<64} ; {at}\n", gt::ir::text::print_instr(&i)));
        }
    }
    let stats = p.stats().remove(0).1;
    text.push_str(&format!(
        "; {}\n",
        stats.iter().filter(|(_, v)| *v > 0).map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    ));
    text
}

/// `snapshots/shard__NAME.snap`: a plan.
fn snapshot(name: &str, text: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(format!("shard__{name}"), text));
}

#[test]
fn data_parallel_plan() {
    snapshot(
        "data_parallel",
        &plan(
            "%w = randn f32[3, 2] seed=2
signal_start \"batch\" shard axis=0 workers=[0, 1]
%x = randn f32[4, 3] seed=1
%y = matmul %x, %w
%z = relu %y
signal_end \"batch\"
%loss = mean %z
print %loss
",
            2,
        ),
    );
}

/// One data-parallel training step as autograd issues it: the batch split, the weight copied,
/// the weight's gradient (`x^T @ dy`, contracting the batch) computed in the backward signal.
/// The transpose of the split batch stays split (along its new axis), the gradient is one
/// `all_reduce` and stays copied like its weight, and the updated weight stays copied: no
/// gather, in this step or the next one's forward.
#[test]
fn data_parallel_training_step_plan() {
    let backward = "signal_end \"batch\"\nsignal_start \"batch_bwd\" backward shard axis=0 workers=[0, 1]";
    let text = data_parallel_step(backward, "signal_end \"batch_bwd\"");
    snapshot("data_parallel_training_step", &text);
    // The step run inside the forward scope, autograd's backward signal without a placement
    // of its own: the same plan.
    let nested = data_parallel_step("signal_start \"batch\" backward", "signal_end \"batch\"\nsignal_end \"batch\"");
    let body = |t: &str| t.lines().filter(|l| !l.contains("signal_")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(body(&nested), body(&text), "{nested}");
}

/// [`data_parallel_training_step_plan`]'s step, its backward signal opened by `open` and
/// closed by `close`; checks that nothing is gathered or moved and the gradient is one
/// `all_reduce`.
fn data_parallel_step(open: &str, close: &str) -> String {
    let text = plan(
        &"signal_start \"params\" replicated workers=[0, 1]
%w = randn f32[3, 2] seed=2
signal_end \"params\"
signal_start \"batch\" shard axis=0 workers=[0, 1]
%x = randn f32[4, 3] seed=1
%y = matmul %x, %w
OPEN
%dy = ones f32[4, 2]
%xt = transpose %x
%dw = matmul %xt, %dy
CLOSE
%step = mul %dw, 0.1
%w2 = sub %w, %step
%y2 = matmul %x, %w2
print %y2
"
        .replace("OPEN", open)
        .replace("CLOSE", close),
        2,
    );
    // Moves only split the batch, made whole at home, before the step, and assemble the read.
    let step = &text[text.find("matmul").unwrap()..text.find("; read").unwrap()];
    assert!(!text.contains("all_gather") && !text.contains("reduce_scatter") && !step.contains("move"), "{text}");
    assert_eq!(text.matches("all_reduce").count(), 1, "{text}");
    text
}

#[test]
fn column_and_row_parallel_plans() {
    snapshot(
        "column_and_row_parallel",
        &plan(
            "%x = randn f32[4, 6] seed=1
signal_start \"columns\" shard axis=1 workers=[0, 1]
%w = randn f32[6, 4] seed=2
signal_end \"columns\"
%h = matmul %x, %w
%h2 = tanh %h
signal_start \"rows\" shard axis=0 workers=[0, 1]
%v = ones f32[4, 3]
signal_end \"rows\"
%o = matmul %h2, %v
print %o
",
            2,
        ),
    );
}

#[test]
fn pipeline_stages_and_replicated_parameters_plan() {
    snapshot(
        "pipeline_and_replicated",
        &plan(
            "signal_start \"params\" replicated workers=[0, 1, 2]
%w = ones f32[3, 3]
signal_end \"params\"
signal_start \"stage1\" shard axis=0 workers=[0]
%x = full f32[2, 3] 0.5
%h = matmul %x, %w
signal_end \"stage1\"
signal_start \"stage2\" shard axis=0 workers=[2]
%y = exp %h
%s = sum %y
signal_end \"stage2\"
print %s
",
            3,
        ),
    );
}

#[test]
fn every_worker_means_the_workers_that_are_up() {
    // Worker 0 is gone (the dispatcher keeps its index): "every worker" is 1 and 2, and a
    // placement naming 0 is refused by name instead of failing later at a move.
    let mut p = registry::pipeline(&["shard"], &PassOptions::default()).unwrap();
    p.set_alive_workers(&[false, true, true]);
    let mut out = Vec::new();
    let every = Placement::Split { axis: 0, workers: vec![] };
    p.run(Instr::SignalStart { name: "dp".into(), compile: false, backward: false, place: Some(every) }, 1, &mut out);
    assert!(p.take_refusals().is_empty());
    p.run(Instr::Ones { dst: ValueId(0), ty: gt::ir::TensorType::f32(vec![4]) }, 2, &mut out);
    let mut placed: Vec<u32> = out.iter().flat_map(|(_, m)| m.place.iter().copied()).collect();
    placed.sort_unstable();
    placed.dedup();
    assert_eq!(placed, [1, 2], "{out:?}");
    let named = Placement::Replicated { workers: vec![0, 1] };
    p.run(Instr::SignalStart { name: "gone".into(), compile: false, backward: false, place: Some(named) }, 3, &mut out);
    assert_eq!(
        p.take_refusals()[0].error.to_string(),
        "signal `gone` places values on worker 0, which is gone (its process ended or its connection broke)"
    );
}

#[test]
fn a_placement_naming_a_missing_worker_is_refused_and_ignored() {
    let mut p = registry::pipeline(&["shard"], &PassOptions::default()).unwrap();
    p.set_workers(4);
    let mut out = Vec::new();
    let place = Placement::Split { axis: 0, workers: vec![0, 7] };
    p.run(Instr::SignalStart { name: "far".into(), compile: false, backward: false, place: Some(place) }, 1, &mut out);
    let refused = p.take_refusals();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        refused[0].error.to_string(),
        "signal `far` places values on worker 7, but there are 4 workers (indices 0 to 3)"
    );
    let dup = Placement::Replicated { workers: vec![1, 1] };
    p.run(Instr::SignalStart { name: "twice".into(), compile: false, backward: false, place: Some(dup) }, 2, &mut out);
    assert_eq!(p.take_refusals()[0].error.to_string(), "signal `twice` names worker 1 twice");
    // The scopes stay open without a placement: what they compute stays home.
    let ones = Instr::Ones { dst: ValueId(0), ty: gt::ir::TensorType::f32(vec![4]) };
    p.run(ones, 3, &mut out);
    assert!(out.iter().all(|(_, m)| m.place.is_empty()));
}

#[test]
fn auto_shard_splits_large_work_and_reads_what_the_interpreter_reads() {
    let options =
        PassOptions { shard: gt::passes::ShardConfig { auto: true, threshold: 16 }, ..PassOptions::default() };
    let mut auto = 0;
    for workers in 2..5 {
        for (path, program) in programs() {
            let Some(reference) = reads(&program, None, &[]) else { continue };
            let mut p = registry::pipeline(&["shard", "dead"], &options).unwrap();
            p.set_workers(workers);
            let got = reads(&program, Some(&mut p), &[]).unwrap_or_else(|| panic!("{path}: failed to run"));
            assert!(close(&got, &reference), "{path} on {workers} workers: reads differ\n{got:?}\n{reference:?}");
            auto += p.stats()[0].1.iter().find(|(k, _)| *k == "auto").map_or(0, |(_, v)| *v);
        }
    }
    assert!(auto > 20, "GT_AUTO_SHARD split only {auto} instructions");
}

/// An executor that runs a client's stream through a pipeline with the shard pass (on
/// `workers` workers) and then the interpreter, as a dispatcher with one process would.
struct Sharded {
    pipeline: Pipeline,
    interp: Interpreter,
    seq: u64,
    /// The shard pass's counters as of the last read.
    stats: std::rc::Rc<std::cell::RefCell<Vec<(String, u64)>>>,
}

impl gt::ir::Executor for Sharded {
    type Error = gt::runtime::RuntimeError;
    fn error_kind(error: &Self::Error) -> gt::ir::FailureKind {
        error.kind()
    }
    fn execute(&mut self, instr: &Instr) -> Result<(), Self::Error> {
        self.seq += 1;
        let mut out = Vec::new();
        self.pipeline.run(instr.clone(), self.seq, &mut out);
        assert!(self.pipeline.take_errors().is_empty());
        for (i, _) in out {
            self.interp.execute(&i)?;
        }
        Ok(())
    }
    fn read(&mut self, value: ValueId) -> Result<HostTensor, Self::Error> {
        self.seq += 1;
        let mut out = Vec::new();
        self.pipeline.flush(self.seq, &mut out);
        self.pipeline.materialize(value, self.seq, &mut out);
        for (i, _) in out {
            self.interp.execute(&i)?;
        }
        // Every pass's counters, as `pass.counter`.
        *self.stats.borrow_mut() = self
            .pipeline
            .stats()
            .into_iter()
            .flat_map(|(pass, c)| c.into_iter().map(move |(k, v)| (format!("{pass}.{k}"), v)))
            .collect();
        self.interp.read(value)
    }
}

/// Losses of a 784-256-10 MLP trained with SGD, data parallel when `config` says so.
/// A 784-256-10 MLP's losses over 4 SGD steps on `workers` workers under `config` (the
/// pipeline's counters with them); with `heads`, the hidden layer is cut in two halves by
/// slices, and they are joined back swapped (a slice's gradient is a pad, a join's a cut).
fn mlp_losses_with(config: Option<&str>, workers: usize, heads: bool) -> (Vec<f32>, Vec<(String, u64)>) {
    use gt::nn::{self, Module, Optimizer};
    // As GT_AUTO_COMPILE=1 runs: hot paths found, and each repetition compiled.
    let mut options = registry::default_options();
    options.fuse.regions = gt::passes::Regions::HotPaths;
    let mut pipeline = registry::pipeline(&["shard", "hotpath", "fuse", "dead"], &options).unwrap();
    pipeline.set_workers(workers);
    let stats = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let ctx = gt::frontend::tensor::Context::new(Sharded {
        pipeline,
        interp: Interpreter::new(),
        seq: 0,
        stats: stats.clone(),
    });
    let _guard = ctx.install();
    let yaml = config.unwrap_or("");
    gt::signal::set_config(gt::config::Config::parse(yaml, "test.yaml").unwrap());
    gt::manual_seed(7).unwrap();
    let labels: Vec<usize> = (0..64).map(|i| (i * 7) % 10).collect();
    let t = nn::one_hot(&labels, 10).unwrap();
    let centres = gt::randn(&[10, 784]).unwrap();
    let (l1, l2) = {
        let _p = gt::signal::context("params").unwrap();
        (nn::Linear::new(784, 256).unwrap(), nn::Linear::new(256, 10).unwrap())
    };
    let forward = |x: &gt::Tensor| {
        let h = l1.forward(x)?;
        let h = if heads {
            let cols = |start: Option<i64>, end: Option<i64>| {
                [SliceItem::Range { start: None, end: None, step: 1 }, SliceItem::Range { start, end, step: 1 }]
            };
            let (a, b) = (h.slice(&cols(None, Some(128)))?, h.slice(&cols(Some(128), None))?);
            gt::frontend::tensor::cat(&[&b.relu()?, &a.relu()?], 1)?
        } else {
            h.relu()?
        };
        l2.forward(&h)
    };
    let mut params = l1.parameters();
    params.extend(l2.parameters());
    let mut sgd = nn::Sgd::new(params, 0.05);
    let mut losses = Vec::new();
    for _ in 0..4 {
        let loss = {
            let _b = gt::signal::context("batch").unwrap();
            let x = t.matmul(&centres).unwrap().add(&gt::randn(&[64, 784]).unwrap().mul(0.5).unwrap()).unwrap();
            nn::cross_entropy(&forward(&x).unwrap(), &t).unwrap()
        };
        sgd.zero_grad();
        loss.backward().unwrap();
        sgd.step().unwrap();
        losses.push(loss.item().unwrap());
    }
    gt::signal::set_config(Default::default());
    let stats = stats.borrow().clone();
    (losses, stats)
}

fn mlp_losses(config: Option<&str>, workers: usize) -> (Vec<f32>, Vec<(String, u64)>) {
    mlp_losses_with(config, workers, false)
}

#[test]
fn an_mlp_trained_data_parallel_gives_one_workers_losses() {
    let (reference, _) = mlp_losses(None, 1);
    let config = "batch:\n  shard:\n    axis: 0\n  backward: batch_bwd\nbatch_bwd:\n  shard:\n    axis: 0\nparams:\n  shard:\n    replicated: true\n";
    for workers in [2, 3, 4] {
        let (losses, stats) = mlp_losses(Some(config), workers);
        let stat = |k: &str| stats.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
        assert!(stat("shard.sharded") > 20 && stat("shard.collectives") > 8, "{workers} workers: {stats:?}");
        assert_eq!(stat("shard.gathers"), 0, "{workers} workers: {stats:?}");
        // The sharded step is still one hot path, and its repetitions compile.
        assert!(stat("hotpath.sequences") >= 1 && stat("fuse.kernels") > 0, "{workers} workers: {stats:?}");
        for (a, b) in losses.iter().zip(&reference) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{workers} workers: {losses:?} vs {reference:?}");
        }
    }
}

/// Opens a placement before the client's first instruction (as if the whole script were
/// in one placed signal).
struct Prologue(Option<Placement>);

impl gt::passes::StreamPass for Prologue {
    fn name(&self) -> &'static str {
        "prologue"
    }
    fn run(&mut self, instr: Instr, out: &mut gt::passes::Emit) {
        if let Some(place) = self.0.take() {
            out.inject(Instr::SignalStart {
                name: "spread".into(),
                compile: false,
                backward: false,
                place: Some(place),
            });
        }
        out.keep(instr);
    }
}

/// A cluster of `workers` embedded workers whose client `k` runs under `places[k - 1]`,
/// compiling every region of each worker when its `bool` says so.
fn placed_cluster(workers: usize, places: Vec<(Placement, bool)>) -> gt::runtime::Cluster {
    let mut o = gt::runtime::ClusterOptions::embedded(workers);
    let n = places.len() as u64;
    o.dispatcher.pipeline = std::sync::Arc::new(move |client| {
        let (place, compile) = places[((client - 1) % n) as usize].clone();
        let mut fuse = registry::default_options().fuse;
        if compile {
            fuse.regions = gt::passes::Regions::All;
        }
        let mut p = Pipeline::new();
        p.push(Box::new(Prologue(Some(place))));
        p.push(Box::new(gt::passes::Shard::default()));
        p.push(Box::new(gt::passes::Fuse::new(fuse)));
        p.push(Box::new(gt::passes::Dead::new(Default::default())));
        p
    });
    gt::runtime::Cluster::start(o).unwrap()
}

#[test]
fn every_run_filetest_on_four_workers_under_placements_prints_what_the_interpreter_prints() {
    let places = vec![
        (Placement::Split { axis: 0, workers: vec![] }, false),
        (Placement::Split { axis: -1, workers: vec![3, 1] }, true),
        (Placement::Replicated { workers: vec![0, 2, 3] }, false),
        (Placement::Split { axis: 1, workers: vec![2, 0, 1] }, false),
        (Placement::Split { axis: 0, workers: vec![1, 2] }, true),
    ];
    let cluster = placed_cluster(4, places.clone());
    let mut failures = Vec::new();
    for path in run_filetests() {
        let source = std::fs::read_to_string(&path).unwrap();
        // Size limits are per worker: a value over one worker's limit fits split over four.
        if source.contains("over the limit") {
            continue;
        }
        let reference = gt::filetest::run_file(&path).unwrap();
        for (place, compile) in &places {
            let mut client = Some(
                gt::frontend::Client::connect_in(cluster.context(), cluster.endpoint(), Default::default()).unwrap(),
            );
            let got = gt::filetest::run_file_on(&path, &mut |loaded, out| {
                gt::script::run_any(loaded, client.take().expect("one run per file"), out, Default::default()).0
            });
            match got {
                Ok(text) if text == reference => {}
                // Sums over split axes are added in another order: within rounding.
                Ok(text) if !source.contains("; error:") && close_text(&text, &reference) => {}
                // A failure inside a fused region is reported as the region's kernel.
                Err(e) if *compile && source.contains("; error:") && format!("{e:#}").contains("fused: ") => {}
                Ok(text) => {
                    failures.push(format!("{} under {place:?} ({compile}):\n{text}\nvs\n{reference}", path.display()))
                }
                Err(e) => failures.push(format!("{} under {place:?} ({compile}): {e:#}", path.display())),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Two filetest outputs equal but for the last digits of their numbers (a line of halves
/// within a unit in their last place, as [`close`]).
fn close_text(a: &str, b: &str) -> bool {
    let words = |s: &str| {
        s.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let line_close = |a: &str, b: &str| {
        let rel = if a.contains("bf16[") {
            2f64.powi(-7)
        } else if a.contains("f16[") {
            2f64.powi(-10)
        } else {
            1e-3
        };
        let (a, b) = (words(a), words(b));
        a.len() == b.len()
            && a.iter().zip(&b).all(|(x, y)| {
                x == y
                    || match (x.parse::<f64>(), y.parse::<f64>()) {
                        (Ok(p), Ok(q)) => (p - q).abs() <= rel * (1.0 + p.abs().max(q.abs())),
                        _ => false,
                    }
            })
    };
    a.lines().count() == b.lines().count() && a.lines().zip(b.lines()).all(|(x, y)| line_close(x, y))
}

/// Losses of a data-parallel MLP on an embedded cluster of `workers` (`config`: the
/// placements, as a GT_CONFIG file would give them), and how many instructions each worker
/// ran.
fn cluster_mlp_losses(workers: usize, config: &str) -> (Vec<f32>, Vec<u64>) {
    use gt::nn::{self, Module, Optimizer};
    let gt = gt::Runtime::embedded(workers).unwrap();
    gt::signal::set_config(gt::config::Config::parse(config, "test.yaml").unwrap());
    gt::manual_seed(11).unwrap();
    let labels: Vec<usize> = (0..64).map(|i| (i * 3) % 10).collect();
    let t = nn::one_hot(&labels, 10).unwrap();
    let model = {
        let _p = gt::signal::context("params").unwrap();
        nn::Sequential::new()
            .push(nn::Linear::new(784, 256).unwrap())
            .push(nn::ReLU)
            .push(nn::Linear::new(256, 10).unwrap())
    };
    let x = {
        let _b = gt::signal::context("batch").unwrap();
        t.matmul(&gt::randn(&[10, 784]).unwrap()).unwrap().add(&gt::randn(&[64, 784]).unwrap()).unwrap()
    };
    let mut sgd = nn::Sgd::new(model.parameters(), 0.05).with_momentum(0.9);
    let losses = (0..5)
        .map(|_| {
            let loss = {
                let _b = gt::signal::context("batch").unwrap();
                nn::cross_entropy(&model.forward(&x).unwrap(), &t).unwrap()
            };
            sgd.zero_grad();
            loss.backward().unwrap();
            sgd.step().unwrap();
            loss.item().unwrap()
        })
        .collect();
    gt::signal::set_config(Default::default());
    let ran = gt.worker_stats().unwrap().unwrap().iter().map(|w| w.instructions).collect();
    (losses, ran)
}

#[test]
fn a_784_256_10_mlp_trained_data_parallel_on_four_workers_gives_one_workers_losses() {
    let config = "batch:\n  shard:\n    axis: 0\n    workers: [0, 1, 2, 3]\n  backward: batch_bwd\nbatch_bwd:\n  shard:\n    axis: 0\nparams:\n  shard:\n    replicated: true\n";
    let (one, _) = cluster_mlp_losses(1, "");
    let (four, ran) = cluster_mlp_losses(4, config);
    assert!(ran.iter().all(|&n| n > 50), "every worker computes: {ran:?}");
    assert!(one[4] < one[0], "it learns: {one:?}");
    for (a, b) in four.iter().zip(&one) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{four:?} vs {one:?}");
    }
}

#[test]
fn gt_run_spreads_a_script_over_workers_from_a_yaml_config() {
    use crate::cli::{code, gt_run_env, stderr, stdout};
    let dir = std::env::temp_dir().join(format!("gt-shard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The GT README's configuration: data parallel over 4 workers, pipeline stages.
    let yaml = dir.join("shard.yaml");
    std::fs::write(
        &yaml,
        "layer1:\n  shard:\n    axis: 0\n    workers: [0, 1, 2, 3]\n  backward: layer1_bwd\nstage_2:\n  shard:\n    axis: 0\n    workers: [2, 3]\n",
    )
    .unwrap();
    let script = dir.join("spread.gtir");
    std::fs::write(
        &script,
        "%w = arange f32 end=12\n%w2 = reshape %w shape=[4, 3]\nsignal \"layer1\" {\n  %x = arange f32 end=40\n  %x2 = reshape %x shape=[10, 4]\n  %y = matmul %x2, %w2\n}\nsignal \"stage_2\" {\n  %z = relu %y\n  %s = sum %z axes=[0]\n  %m = mean %z\n}\nprint %s\nprint %m\n",
    )
    .unwrap();
    let one = gt_run_env(&[script.to_str().unwrap()], &[]);
    assert_eq!(code(&one), 0, "{}", stderr(&one));
    let four =
        gt_run_env(&["--workers", "4", "--pass-stats", script.to_str().unwrap()], &[("GT_CONFIG", yaml.as_os_str())]);
    assert_eq!(code(&four), 0, "{}", stderr(&four));
    assert_eq!(stdout(&four), stdout(&one));
    assert!(stderr(&four).contains("pass shard: sharded="), "{}", stderr(&four));
    assert!(!stderr(&four).contains("pass shard: sharded=0 "), "{}", stderr(&four));
    // A config naming worker 7 when 4 exist: an error naming the signal and the worker.
    std::fs::write(&yaml, "layer1:\n  shard:\n    axis: 0\n    workers: [0, 7]\n").unwrap();
    let bad = gt_run_env(&["--workers", "4", script.to_str().unwrap()], &[("GT_CONFIG", yaml.as_os_str())]);
    assert_eq!(code(&bad), 1, "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("signal `layer1` places values on worker 7, but there are 4 workers"),
        "{}",
        stderr(&bad)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn dump_after_shard_shows_the_plan_across_workers() {
    use crate::cli::{code, gt_run_env, stderr, stdout};
    let o = gt_run_env(&["--workers", "2", "--quiet", "--dump-after", "shard", "examples/sharded.gtir"], &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let dump = stdout(&o);
    assert!(dump.contains("; after shard"), "{dump}");
    // Per-shard instructions on each worker, and the collectives between them.
    assert!(dump.contains("; on w0") && dump.contains("; on w1"), "{dump}");
    assert!(dump.contains("= all_reduce sum ") && dump.contains("; on w0, w1"), "{dump}");
    assert!(dump.contains("= all_gather "), "{dump}");
}

#[test]
fn placements_that_cannot_apply_keep_values_whole_and_say_so_in_the_log_and_stats() {
    use crate::cli::{code, gt_run_env, stderr, stdout};
    let dir = std::env::temp_dir().join(format!("gt-unplaced-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = dir.join("shard.yaml");
    // An axis out of range for a 2-d value, and a value smaller than its worker count.
    std::fs::write(
        &yaml,
        "wide:\n  shard:\n    axis: 2\n    workers: [0, 1]\ntiny:\n  shard:\n    axis: 0\n    workers: [0, 1]\n",
    )
    .unwrap();
    let script = dir.join("unplaced.gtir");
    std::fs::write(
        &script,
        "signal \"wide\" {\n  %a = arange f32 end=6\n  %b = reshape %a shape=[2, 3]\n  %c = relu %b\n}\nsignal \"tiny\" {\n  %d = arange f32 end=1\n  %e = exp %d\n}\nprint %c\nprint %e\n",
    )
    .unwrap();
    let one = gt_run_env(&[script.to_str().unwrap()], &[]);
    assert_eq!(code(&one), 0, "{}", stderr(&one));
    let log = dir.join("ops.log");
    let env = [("GT_CONFIG", yaml.as_os_str()), ("GT_INSTRUCTION_LOG", log.as_os_str())];
    let two = gt_run_env(&["--workers", "2", "--pass-stats", script.to_str().unwrap()], &env);
    assert_eq!(code(&two), 0, "{}", stderr(&two));
    assert_eq!(stdout(&two), stdout(&one), "the values are the one worker's");
    assert!(stderr(&two).contains("pass shard: sharded=0 "), "{}", stderr(&two));
    assert!(!stderr(&two).contains("unsplit=0"), "{}", stderr(&two));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("signal `wide` splits along axis 2, but %0 is f32[6] (rank 1)"), "{text}");
    assert!(text.contains("signal `tiny` splits along axis 0 over 2 workers, but %3 is f32[1]"), "{text}");
    // Once per signal and reason, not per value.
    assert_eq!(text.matches("signal `wide` splits").count(), 1, "{text}");
    // A sharded program with one worker up runs whole on it, and says so.
    std::fs::write(&yaml, "wide:\n  shard:\n    axis: 0\n").unwrap();
    std::fs::remove_file(&log).unwrap();
    let alone = gt_run_env(&["--workers", "1", "--pass-stats", script.to_str().unwrap()], &env);
    assert_eq!(code(&alone), 0, "{}", stderr(&alone));
    assert_eq!(stdout(&alone), stdout(&one));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("signal `wide` splits its values, but only one worker is up"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_sharded_script_runs_on_four_gt_worker_processes() {
    use crate::distributed::{free_port, gt_run, server, worker};
    let port = free_port();
    let (_server, _) = server(port, "127.0.0.1", &[]);
    let _workers: Vec<_> = (0..4).map(|_| worker(port)).collect();
    // Wait until all four have registered.
    let endpoint = gt::transport::Endpoint::parse(&format!("127.0.0.1:{port}")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut c = gt::frontend::Client::connect(&endpoint, Default::default()).unwrap();
        if c.stats().unwrap().0.len() == 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "four workers register");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let embedded = gt_run(&["examples/sharded.gtir"]);
    assert!(embedded.status.success(), "{}", String::from_utf8_lossy(&embedded.stderr));
    let remote = gt_run(&["--connect", &format!("127.0.0.1:{port}"), "--pass-stats", "examples/sharded.gtir"]);
    assert!(remote.status.success(), "{}", String::from_utf8_lossy(&remote.stderr));
    assert_eq!(remote.stdout, embedded.stdout);
    let stats = String::from_utf8_lossy(&remote.stderr);
    assert!(stats.contains("collectives=") && !stats.contains("collectives=0 "), "{stats}");
    // The 784-256-10 MLP trained data parallel (the batch split 4 ways, the parameters
    // replicated) on the four processes and on four embedded workers: one worker's losses.
    let (script, yaml) = data_parallel_mlp();
    let env = [("GT_CONFIG", yaml.as_os_str())];
    let one = crate::cli::gt_run_env(&[script.to_str().unwrap()], &[]);
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    let address = format!("127.0.0.1:{port}");
    for args in [vec!["--connect", address.as_str()], vec!["--workers", "4"]] {
        let args: Vec<&str> = args.into_iter().chain(["--pass-stats", script.to_str().unwrap()]).collect();
        let spread = crate::cli::gt_run_env(&args, &env);
        assert!(spread.status.success(), "{args:?}: {}", String::from_utf8_lossy(&spread.stderr));
        let stats = String::from_utf8_lossy(&spread.stderr);
        assert!(stats.contains("collectives=") && !stats.contains("collectives=0 "), "{args:?}: {stats}");
        let (a, b) = (losses(&one.stdout), losses(&spread.stdout));
        assert_eq!(a.len(), 20);
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-3 * x.abs().max(1.0), "{args:?}: one worker {a:?}, spread {b:?}");
        }
    }
    // Every piece, copy and temporary was freed on every worker once the clients left.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut c = gt::frontend::Client::connect(&endpoint, Default::default()).unwrap();
        let held: Vec<(u64, u64)> = c.stats().unwrap().0.iter().map(|w| (w.live_values, w.live_bytes)).collect();
        if held.iter().all(|&h| h == (0, 0)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "workers still hold (values, bytes) {held:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `examples/train_mlp.gtir` with its data in a `batch` signal and its parameters in a
/// `params` signal, and the GT README's config for them (data parallel over 4 workers).
fn data_parallel_mlp() -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("gt-dp-mlp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string("examples/train_mlp.gtir").unwrap();
    let text = text
        .replace("%x = randn", "signal \"batch\" {\n%x = randn")
        .replace("%y = randn f32[batch, outputs] seed=2\n", "%y = randn f32[batch, outputs] seed=2\n}\n")
        .replace("%w1r = randn", "signal \"params\" {\n%w1r = randn")
        .replace("requires_grad %w1, %w2\n", "}\nrequires_grad %w1, %w2\n")
        .replace("repeat 20 {\n", "repeat 20 {\nsignal \"batch\" {\n")
        .replace("  print %loss\n}", "  print %loss\n}\n}");
    let script = dir.join("train_dp.gtir");
    std::fs::write(&script, text).unwrap();
    let yaml = dir.join("dp.yaml");
    std::fs::write(
        &yaml,
        "batch:\n  shard:\n    axis: 0\n    workers: [0, 1, 2, 3]\nparams:\n  shard:\n    replicated: true\n",
    )
    .unwrap();
    (script, yaml)
}

/// The values of `print %loss` lines.
fn losses(stdout: &[u8]) -> Vec<f64> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with("%loss"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn the_readme_pipeline_forward_on_workers_0_1_backward_on_2_3_gives_one_workers_losses() {
    // The GT README's pipeline example: the forward pass split over workers 0-1, its
    // gradients computed on workers 2-3.
    let config = "batch:\n  shard:\n    axis: 0\n    workers: [0, 1]\n  backward: batch_bwd\nbatch_bwd:\n  shard:\n    axis: 0\n    workers: [2, 3]\n";
    let (one, _) = cluster_mlp_losses(1, "");
    let (piped, ran) = cluster_mlp_losses(4, config);
    assert!(ran.iter().all(|&n| n > 20), "every worker computes: {ran:?}");
    for (a, b) in piped.iter().zip(&one) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{piped:?} vs {one:?}");
    }
}

#[test]
fn a_row_parallel_product_in_a_split_scope_reduce_scatters() {
    let text = plan(
        "%x = randn f32[4, 6] seed=1
%w = randn f32[6, 4] seed=2
signal_start \"k\" shard axis=1 workers=[0, 1]
%xs = relu %x
signal_end \"k\"
signal_start \"rows\" shard axis=0 workers=[0, 1]
%y = matmul %xs, %w
signal_end \"rows\"
print %y
",
        2,
    );
    assert!(text.contains("reduce_scatter sum"), "{text}");
    snapshot("row_parallel_reduce_scatter", &text);
}

/// Halves shard like `f32`: a data-parallel product runs shard by shard; a row-parallel
/// product and a sum or mean over the split axis compute their partials in `f32`, sum them
/// in `f32` and round once, as the interpreter's (and PyTorch's) accumulation in `f32` does;
/// a max over the split axis combines halves (exact). Nothing is gathered, and the reads are
/// one worker's within a unit in the last place.
#[test]
fn halves_shard_with_partials_summed_in_f32_and_rounded_once() {
    for dtype in ["f16", "bf16"] {
        let src = "signal_start \"params\" replicated workers=[0, 1]
%w = randn DT[64, 32] seed=2
signal_end \"params\"
signal_start \"batch\" shard axis=0 workers=[0, 1]
%x = randn DT[48, 64] seed=1
%y = matmul %x, %w
signal_end \"batch\"
%s = sum %y axes=[0]
%m = mean %y
%xt = transpose %x
%g = matmul %xt, %y
%top = max %y axes=[0]
print %s
print %m
print %g
print %top
"
        .replace("DT", dtype);
        let text = plan(&src, 2);
        assert!(!text.contains("gathers"), "{text}");
        // Three sums across workers (sum, mean, the row-parallel product) in f32, each copy
        // rounded once; the max in the half itself.
        assert_eq!(text.matches("all_reduce sum").count(), 3, "{text}");
        assert_eq!(text.matches("all_reduce max").count(), 1, "{text}");
        let casts = |to: &str| {
            text.lines()
                .filter(|l| l.contains("= cast %") && l.split(';').next().unwrap().trim_end().ends_with(to))
                .count()
        };
        // Widened: each worker's piece for the sum and the mean, both operands of the product.
        assert_eq!(casts(" f32"), 2 + 2 + 4, "{text}");
        assert_eq!(casts(&format!(" {dtype}")), 3 * 2, "{text}");
        let program = gt::script::load(src.as_bytes()).unwrap().program;
        let one = reads(&program, None, &[]).unwrap();
        let spread = reads(&program, Some(&mut sharded_pipeline(2, false)), &[]).unwrap();
        assert!(close(&spread, &one), "{dtype}: {spread:?}\n{one:?}");
        // On two embedded workers, through the collectives' transport (the f32 sums round
        // the ring, the max of halves is gathered and folded).
        let file = |name: &str, text: &str| {
            let path = std::env::temp_dir().join(format!("gt-shard-halves-{}-{dtype}-{name}.gtir", std::process::id()));
            std::fs::write(&path, text).unwrap();
            path
        };
        // One worker runs the script without its placements (they name worker 1).
        let unplaced: String = src.lines().filter(|l| !l.starts_with("signal_")).map(|l| format!("{l}\n")).collect();
        let (spread, whole) = (file("spread", &src), file("whole", &unplaced));
        let one = crate::cli::gt_run_env(&[whole.to_str().unwrap()], &[]);
        let two = crate::cli::gt_run_env(&["--workers", "2", "--pass-stats", spread.to_str().unwrap()], &[]);
        std::fs::remove_file(&spread).ok();
        std::fs::remove_file(&whole).ok();
        assert_eq!(crate::cli::code(&two), 0, "{}", crate::cli::stderr(&two));
        let stats = crate::cli::stderr(&two);
        assert!(stats.contains("collectives=4"), "{stats}");
        let (one, two) = (crate::cli::stdout(&one), crate::cli::stdout(&two));
        assert!(one.contains(&format!("{dtype}[32]")) && close_text(&two, &one), "{two}\nvs\n{one}");
        if dtype == "bf16" {
            snapshot("halves_partials_in_f32", &text);
        }
    }
}

/// The MLP trained data parallel under autocast (`dtype: bf16` in the batch's config): its
/// bf16 products and sums shard like `f32` ones (nothing gathered), and the losses are one
/// worker's within bf16 rounding.
#[test]
fn an_mlp_trained_data_parallel_in_bf16_gathers_nothing() {
    let config = "batch:\n  shard:\n    axis: 0\n  dtype: bf16\n  backward: batch_bwd\nbatch_bwd:\n  shard:\n    axis: 0\nparams:\n  shard:\n    replicated: true\n";
    let (reference, _) = mlp_losses(Some(config), 1);
    let (losses, stats) = mlp_losses(Some(config), 2);
    let stat = |k: &str| stats.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
    assert!(stat("shard.sharded") > 20 && stat("shard.collectives") > 8, "{stats:?}");
    assert_eq!(stat("shard.gathers"), 0, "{stats:?}");
    eprintln!("{losses:?} vs {reference:?}");
    for (a, b) in losses.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-2 * (1.0 + b.abs()), "{losses:?} vs {reference:?}");
    }
}

/// What a data-parallel transformer block does to batch-split activations runs shard by
/// shard: a batched product split along its batch (attention's `q @ k^T` and `p @ v` per
/// head), slices of other axes (one projection's columns), joins and cuts along other axes
/// (heads). Nothing is gathered, and the reads are one worker's.
#[test]
fn batched_products_slices_joins_and_cuts_along_other_axes_shard() {
    let src = "signal_start \"batch\" shard axis=0 workers=[0, 1]
%x = randn f32[4, 3, 8] seed=1
signal_end \"batch\"
%w = randn f32[8, 24] seed=2
%qkv = matmul %x, %w
%q = slice %qkv [:, :, 0:8]
%k = slice %qkv [..., 8:16]
%v = slice %qkv [:, :, 16:]
%qh = reshape %q shape=[4, 3, 2, 4]
%kh = reshape %k shape=[4, 3, 2, 4]
%vh = reshape %v shape=[4, 3, 2, 4]
%qt = permute %qh perm=[0, 2, 1, 3]
%kt = permute %kh perm=[0, 2, 3, 1]
%vt = permute %vh perm=[0, 2, 1, 3]
%s = matmul %qt, %kt
%e = exp %s
%z = sum %e axes=[-1] keepdim
%p = div %e, %z
%o = matmul %p, %vt
%h0, %h1 = split %o size=1 axis=1
%joined = concat %h1, %h0 axis=-1
%first = slice %joined [:, 0]
print %joined
print %first
";
    let text = plan(src, 2);
    assert!(!text.contains("gathers"), "{text}");
    assert!(!text.contains("all_gather") && !text.contains("all_reduce"), "{text}");
    let program = gt::script::load(src.as_bytes()).unwrap().program;
    let one = reads(&program, None, &[]).unwrap();
    let spread = reads(&program, Some(&mut sharded_pipeline(2, false)), &[]).unwrap();
    assert!(close(&spread, &one), "{spread:?}\n{one:?}");
    snapshot("transformer_block_data_parallel", &text);
}

/// Cuts, joins, reshapes and products along the split axis (`split_axis_relayouts.gtir`,
/// three workers, uneven pieces): each result piece is assembled from the stretches the
/// workers hold (slices where they are, moves between neighbours, joins), so nothing is
/// gathered at home but the one row an index takes, and the values are one worker's.
#[test]
fn cuts_joins_reshapes_and_vector_products_along_the_split_axis_gather_nothing() {
    let src = std::fs::read_to_string("tests/gtir/run/split_axis_relayouts.gtir").unwrap();
    let body: String = src.lines().filter(|l| !l.starts_with("expect")).map(|l| format!("{l}\n")).collect();
    let prints: String = ["a", "b", "c", "d", "j", "p", "q", "r", "flat", "back", "mv", "sq", "dot", "vm"]
        .iter()
        .map(|v| format!("print %{v}\n"))
        .collect();
    let src = body + &prints;
    let text = plan(&src, 3);
    assert!(!text.contains("gathers"), "{text}");
    let program = gt::script::load(src.as_bytes()).unwrap().program;
    let one = reads(&program, None, &[]).unwrap();
    let spread = reads(&program, Some(&mut sharded_pipeline(3, false)), &[]).unwrap();
    assert_eq!(spread, one);
    snapshot("split_axis_relayouts", &text);
}

/// The MLP's hidden layer cut by slices and joined back, trained data parallel: the slices,
/// the join and their gradients (pads and cuts) run piece by piece, nothing is gathered, and
/// the losses are one worker's.
#[test]
fn an_mlp_with_slices_and_a_join_trained_data_parallel_gathers_nothing() {
    let config = "batch:\n  shard:\n    axis: 0\n  backward: batch_bwd\nbatch_bwd:\n  shard:\n    axis: 0\nparams:\n  shard:\n    replicated: true\n";
    let (reference, _) = mlp_losses_with(None, 1, true);
    let (losses, stats) = mlp_losses_with(Some(config), 2, true);
    let stat = |k: &str| stats.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
    assert_eq!(stat("shard.gathers"), 0, "{stats:?}");
    for (a, b) in losses.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{losses:?} vs {reference:?}");
    }
}
