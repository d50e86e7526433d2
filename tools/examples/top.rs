//! Runs the live monitor until the gt CLI has a `gt top`:
//! `cargo run -p gt-tools --example top -- [--host H] [--port P] [--ema-alpha A] [--refresh-ms N]`.

use gt_tools::top::{run, TopOptions};
use std::time::Duration;

fn main() {
    let mut options = TopOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        let ok = match flag.as_str() {
            "--host" => {
                options.host = value.clone();
                true
            }
            "--port" => value.parse().map(|p| options.port = Some(p)).is_ok(),
            "--ema-alpha" => value.parse().map(|a| options.ema_alpha = a).is_ok(),
            "--refresh-ms" => value.parse().map(|ms| options.refresh = Duration::from_millis(ms)).is_ok(),
            _ => false,
        };
        if !ok {
            eprintln!("usage: top [--host H] [--port P] [--ema-alpha A] [--refresh-ms N] (bad `{flag} {value}`)");
            std::process::exit(2);
        }
    }
    if let Err(e) = run(&options) {
        eprintln!("gt top: {e}");
        std::process::exit(1);
    }
}
