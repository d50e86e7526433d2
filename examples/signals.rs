//! Signals: named scopes of the instruction stream, their backward signals, a YAML config,
//! and the instruction log that shows which signal each instruction belongs to.
//! Run: `cargo run --example signals` (it writes `target/signals-example.log`).

use gt::nn::{self, Module};

fn main() -> anyhow::Result<()> {
    let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/signals-example.log");
    std::env::set_var("GT_INSTRUCTION_LOG", &log);
    let _gt = gt::init()?;

    // The Python GT's config format: `backward` names the signal of a scope's gradient ops.
    gt::signal::set_config(gt::config::Config::parse(
        "forward_layer1:\n  shard: {axis: 0, workers: [0]}\n  backward: backward_layer1\n",
        "inline.yaml",
    )?);
    // A bad config names its line and field.
    if let Err(e) = gt::config::Config::parse("forward_layer1:\n  shards: {axis: 0}\n", "bad.yaml") {
        println!("as expected: {e}");
    }

    let layer1 = nn::Linear::new(8, 4)?;
    let x = gt::randn(&[16, 8])?;
    let h = {
        let _s = gt::signal::context("forward_layer1")?;
        println!("open signals: {:?}", gt::signal::stack());
        layer1.forward(&x)?.relu()?
    };
    let loss = h.pow(2.0)?.mean()?;
    loss.backward()?; // the gradient ops of layer1 run in signal `backward_layer1`
    println!("loss {:.4}", loss.item()?);

    // Every instruction in the log names its signal.
    drop(_gt);
    let text = std::fs::read_to_string(&log)?;
    for line in text.lines().filter(|l| l.contains("| SIGNAL") || l.contains("signal=")).take(8) {
        println!("{line}");
    }
    Ok(())
}
