//! probe: tiny ops issued in the modes ZZ_CONFIGS gives, ZZ_ROUNDS interleaved.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;
use gt::Runtime;
use std::time::Instant;
fn main() {
    let n: usize = std::env::var("ZZ_N").ok().and_then(|s| s.parse().ok()).unwrap_or(20000);
    let configs = std::env::var("ZZ_CONFIGS").unwrap_or_else(|_| "".into());
    let rounds: usize = std::env::var("ZZ_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mode = std::env::var("ZZ_MODE").unwrap_or_else(|_| "issue".into());
    let cfgs: Vec<&str> = configs.split(';').collect();
    let mut all: Vec<Vec<f64>> = vec![vec![]; cfgs.len()];
    for _ in 0..rounds {
        for (ci, cfg) in cfgs.iter().enumerate() {
            let kv: Vec<(String, String)> = cfg
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let (k, v) = s.split_once('=').unwrap();
                    (k.into(), v.into())
                })
                .collect();
            for (k, v) in &kv {
                std::env::set_var(k, v);
            }
            let gt = Runtime::embedded(1).unwrap();
            for (k, _) in &kv {
                std::env::remove_var(k);
            }
            if std::env::var("ZZ_PRE").is_ok_and(|v| v == "mlp") {
                use gt::nn::{self, Optimizer};
                gt::manual_seed(0).unwrap();
                let x = gt::randn(&[64, 784]).unwrap();
                let y = gt::randn(&[64, 10]).unwrap();
                let w1 = gt::randn(&[784, 256]).unwrap().mul(0.05).unwrap().requires_grad_(true).unwrap();
                let w2 = gt::randn(&[256, 10]).unwrap().mul(0.05).unwrap().requires_grad_(true).unwrap();
                let mut opt = nn::Sgd::new(vec![w1.clone(), w2.clone()], 0.01);
                for _ in 0..300 {
                    let loss = {
                        let h = x.matmul(&w1).unwrap().relu().unwrap();
                        nn::mse_loss(&h.matmul(&w2).unwrap(), &y).unwrap()
                    };
                    opt.zero_grad();
                    loss.backward().unwrap();
                    opt.step().unwrap();
                    let _ = loss.item().unwrap();
                }
            }
            let t = gt::ones(&[1]).unwrap();
            gt.sync().unwrap();
            let mut ts = vec![];
            for rep in 0..23 {
                let s = Instant::now();
                for _ in 0..n {
                    if mode == "sync" {
                        let _r = t.neg().unwrap();
                        gt.sync().unwrap();
                    } else {
                        let _r = t.neg().unwrap();
                    }
                }
                gt.sync().unwrap();
                if rep >= 2 {
                    ts.push(s.elapsed().as_secs_f64() * 1e6 / n as f64);
                }
            }
            ts.sort_by(f64::total_cmp);
            all[ci].push(ts[ts.len() / 2]);
        }
    }
    for (ci, cfg) in cfgs.iter().enumerate() {
        let mut m = all[ci].clone();
        m.sort_by(f64::total_cmp);
        let r: Vec<f64> = all[ci].iter().zip(&all[0]).map(|(a, b)| a / b).collect();
        let mut rs = r.clone();
        rs.sort_by(f64::total_cmp);
        println!(
            "{cfg:<40} median {:.3} µs  ratio {:.3}  rounds {:?}",
            m[m.len() / 2],
            rs[rs.len() / 2],
            all[ci].iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>()
        );
    }
}
