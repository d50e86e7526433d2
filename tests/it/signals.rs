//! Signals: scopes travel with the instruction stream as `signal_start`/`signal_end`
//! markers (from `signal::context`, `enter`/`exit`, `.gtir` `signal` blocks), gradient ops run
//! in a scope's backward signal, configs load from YAML (bad ones are refused with line and
//! field), and the instruction log names each instruction's signal.

use crate::cli::{code, gt_run_env, stderr};
use gt::frontend::tensor::Context;
use gt::ir::{Executor, HostTensor, Instr, ValueId};
use gt::runtime::Interpreter;
use gt::signal;
use std::cell::RefCell;
use std::rc::Rc;

/// Runs on the interpreter and keeps the stream.
struct Recording {
    inner: Interpreter,
    stream: Rc<RefCell<Vec<Instr>>>,
}

impl Executor for Recording {
    type Error = gt::runtime::RuntimeError;
    fn error_kind(error: &Self::Error) -> gt::ir::FailureKind {
        error.kind()
    }
    fn execute(&mut self, instr: &Instr) -> Result<(), Self::Error> {
        self.stream.borrow_mut().push(instr.clone());
        self.inner.execute(instr)
    }
    fn read(&mut self, value: ValueId) -> Result<HostTensor, Self::Error> {
        self.inner.read(value)
    }
}

fn recording() -> (Rc<Context>, gt::frontend::tensor::ContextGuard, Rc<RefCell<Vec<Instr>>>) {
    let stream = Rc::new(RefCell::new(Vec::new()));
    let ctx = Context::new(Recording { inner: Interpreter::new(), stream: stream.clone() });
    let guard = ctx.install();
    (ctx, guard, stream)
}

/// The stream as mnemonics, with signal names.
fn ops(stream: &[Instr]) -> Vec<String> {
    stream
        .iter()
        .filter(|i| !matches!(i, Instr::Free { .. }))
        .map(|i| match i {
            Instr::SignalStart { name, compile, .. } => {
                format!("start {name}{}", if *compile { " compile" } else { "" })
            }
            Instr::SignalEnd { name } => format!("end {name}"),
            i => i.mnemonic().to_string(),
        })
        .collect()
}

#[test]
fn scopes_become_markers_around_their_ops() {
    let (_ctx, _g, stream) = recording();
    let x = gt::ones(&[2]).unwrap();
    {
        let _outer = signal::context("outer").unwrap();
        let y = x.add(1.0).unwrap();
        signal::enter("inner").unwrap();
        assert_eq!(signal::stack(), vec!["outer", "inner"]);
        let _z = y.exp().unwrap();
        assert!(signal::exit("outer").unwrap_err().to_string().contains("\"inner\" is the innermost"));
        signal::exit("inner").unwrap();
    }
    assert!(signal::current().is_none());
    assert!(signal::exit("outer").unwrap_err().to_string().contains("no open signal"));
    assert_eq!(ops(&stream.borrow()), ["ones", "start outer", "add", "start inner", "exp", "end inner", "end outer"]);
}

#[test]
fn guards_dropped_out_of_order_keep_the_stream_nested() {
    let (_ctx, _g, stream) = recording();
    let outer = signal::context("outer").unwrap();
    let inner = signal::context("inner").unwrap();
    drop(outer); // closes inner first, then outer
    assert!(signal::stack().is_empty());
    drop(inner); // already closed: nothing
    assert_eq!(ops(&stream.borrow()), ["start outer", "start inner", "end inner", "end outer"]);
}

#[test]
fn gradient_ops_run_in_the_backward_signal() {
    let (_ctx, _g, stream) = recording();
    let w = gt::tensor(&[1.0, 2.0]).unwrap().requires_grad_(true).unwrap();
    let loss = {
        let _s = signal::context_with_backward("stage1", Some("stage1_bwd")).unwrap();
        w.mul(&w).unwrap().sum().unwrap()
    };
    stream.borrow_mut().clear();
    loss.backward().unwrap();
    let ops = ops(&stream.borrow());
    assert_eq!(ops.first().map(String::as_str), Some("ones"), "{ops:?}");
    assert_eq!(ops[1], "start stage1_bwd", "{ops:?}");
    assert_eq!(ops.iter().filter(|o| o.starts_with("end ")).count(), 1, "{ops:?}");
    let end = ops.iter().position(|o| o == "end stage1_bwd").unwrap();
    assert!(ops[2..end].iter().all(|o| !o.starts_with("start")), "{ops:?}");
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn a_config_gives_the_backward_signal_and_tensor_copies_into_a_signal() {
    let (_ctx, _g, stream) = recording();
    let config = gt::config::Config::parse("pipe:\n  backward: pipe_bwd\n  compile: true\n", "test.yaml").unwrap();
    signal::set_config(config);
    assert!(signal::config("pipe").unwrap().compile);
    let w = gt::tensor(&[3.0]).unwrap().requires_grad_(true).unwrap();
    let placed = signal::tensor(&w, "params").unwrap();
    let loss = {
        let _s = signal::context("pipe").unwrap();
        placed.mul(2.0).unwrap().sum().unwrap()
    };
    loss.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![2.0]);
    let ops = ops(&stream.borrow());
    assert!(ops.windows(3).any(|w| w == ["start params", "reshape", "end params"]), "{ops:?}");
    assert!(ops.contains(&"start pipe_bwd".to_string()), "{ops:?}");
    signal::set_config(Default::default());
}

#[test]
fn bad_configs_name_line_and_field() {
    let dir = std::env::temp_dir().join(format!("gt-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(&path, "layer1:\n  shard:\n    axis: x\n").unwrap();
    let e = signal::load_config(&path).unwrap_err().to_string();
    assert!(e.contains("bad.yaml:3") && e.contains("layer1.shard.axis"), "{e}");
    // gt-run refuses to start with it.
    let out = gt_run_env(&["examples/elementwise.gtir"], &[("GT_CONFIG", path.as_os_str())]);
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    assert!(err.contains("bad.yaml:3") && err.contains("axis"), "{err}");
}

#[test]
fn the_instruction_log_names_each_instructions_signal() {
    let dir = std::env::temp_dir().join(format!("gt-signal-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log.txt");
    let out = gt_run_env(&["--quiet", "examples/mlp.gtir"], &[("GT_INSTRUCTION_LOG", log.as_os_str())]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    let line = |pat: &str| text.lines().find(|l| l.contains(pat)).unwrap_or_else(|| panic!("no `{pat}` in\n{text}"));
    assert!(line("| SIGNAL").contains("layer1"));
    assert!(line("matmul").contains("signal=layer1"));
    assert!(text.lines().any(|l| l.contains("| SIGNAL") && l.contains("exit") && l.contains("layer2")));
    // Instructions after the blocks belong to no signal.
    let softmax = text.lines().find(|l| l.contains("| RECV") && l.contains(" max ")).unwrap();
    assert!(!softmax.contains("signal="), "{softmax}");
}
