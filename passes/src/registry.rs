//! The passes by name: what `GT_PASSES`, `GT_HOTPATH`, `--dump-after` and `--pass-stats`
//! refer to, in pipeline order.

use crate::fuse::{Fuse, FuseConfig};
use crate::hotpath::{HotPath, HotPathConfig};
use crate::pipeline::{Pipeline, UnknownPass};

/// Every pass, in the order a pipeline runs them.
pub const KNOWN_PASSES: &[&str] = &["hotpath", "fuse"];

/// Settings of the passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassOptions {
    /// The hotpath pass's.
    pub hotpath: HotPathConfig,
    /// The fuse pass's.
    pub fuse: FuseConfig,
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
                "hotpath" => p.push(Box::new(HotPath::new(options.hotpath))),
                "fuse" => p.push(Box::new(Fuse::new(options.fuse))),
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
        let e = pipeline(&["shard"], &PassOptions::default()).err().unwrap();
        assert_eq!(e.to_string(), "unknown pass `shard` (known passes: hotpath, fuse)");
    }
}
