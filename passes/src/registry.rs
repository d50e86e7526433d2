//! The passes by name: what `GT_PASSES`, `GT_HOTPATH`, `--dump-after` and `--pass-stats`
//! refer to, in pipeline order.

use crate::dead::{Dead, DeadConfig};
use crate::fuse::{Fuse, FuseConfig, Regions};
use crate::hotpath::{HotPath, HotPathConfig};
use crate::pipeline::{Pipeline, UnknownPass};
use crate::shard::{Shard, ShardConfig};

/// Every pass, in the order a pipeline runs them.
pub const KNOWN_PASSES: &[&str] = &["shard", "hotpath", "fuse", "dead"];

/// The passes a stream runs through when nothing says otherwise: `shard` (which touches
/// only what signal placements spread), `fuse` (compiling only the scopes of compile
/// signals, see [`default_options`]) and `dead`.
pub const DEFAULT_PASSES: &[&str] = &["shard", "fuse", "dead"];

/// The settings a runtime starts from: [`PassOptions::default`] with the fuse pass
/// compiling compile signals only (`GT_COMPILE`, `GT_AUTO_COMPILE` widen it).
pub fn default_options() -> PassOptions {
    let mut o = PassOptions::default();
    o.fuse.regions = Regions::Signals;
    o
}

/// Settings of the passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassOptions {
    /// The shard pass's.
    pub shard: ShardConfig,
    /// The hotpath pass's.
    pub hotpath: HotPathConfig,
    /// The fuse pass's.
    pub fuse: FuseConfig,
    /// The dead-value pass's.
    pub dead: DeadConfig,
}

/// Checks a pass name.
pub fn check(name: &str) -> Result<&'static str, UnknownPass> {
    KNOWN_PASSES
        .iter()
        .find(|k| **k == name)
        .copied()
        .ok_or_else(|| UnknownPass { name: name.to_string(), known: KNOWN_PASSES.to_vec() })
}

/// Sorts pass names into pipeline ([`KNOWN_PASSES`]) order and drops repeats.
pub fn in_pipeline_order(names: &mut Vec<&'static str>) {
    names.sort_by_key(|p| KNOWN_PASSES.iter().position(|k| k == p));
    names.dedup();
}

/// A pipeline of the named passes, in [`KNOWN_PASSES`] order whatever the order given.
pub fn pipeline(names: &[&str], options: &PassOptions) -> Result<Pipeline, UnknownPass> {
    for n in names {
        check(n)?;
    }
    let mut p = Pipeline::new();
    for &k in KNOWN_PASSES {
        if names.contains(&k) {
            match k {
                "shard" => p.push(Box::new(Shard::new(options.shard))),
                "hotpath" => p.push(Box::new(HotPath::new(options.hotpath))),
                "fuse" => p.push(Box::new(Fuse::new(options.fuse))),
                "dead" => p.push(Box::new(Dead::new(options.dead))),
                _ => unreachable!("every known pass is built here"),
            }
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_known_passes_and_names_the_known_ones_otherwise() {
        assert_eq!(pipeline(&["hotpath"], &PassOptions::default()).unwrap().names(), ["hotpath"]);
        assert!(pipeline(&[], &PassOptions::default()).unwrap().is_empty());
        let e = pipeline(&["shards"], &PassOptions::default()).err().unwrap();
        assert_eq!(e.to_string(), "unknown pass `shards` (known passes: shard, hotpath, fuse, dead)");
    }
}
