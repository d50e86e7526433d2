//! gt-passes: composable stream passes over the IR (shard, hotpath, fuse); filled by the pass-pipeline issue.
