//! `gt prof` on profiles no dispatcher would write but a damaged or hostile file can hold:
//! times and sizes at the ends of `u64`, zero durations, scopes that name missing or looping
//! parents, absurd depths. Every tool must finish without panicking.

use gt_tools::prof::load::{SweepAxis, SweepManifest, SweepRun};
use gt_tools::prof::{merge, report, variance, Profile, Sweep};
use gt_transport::profile::{Direction, Record, RecordKind, SignalRecord};
use std::collections::BTreeMap;

fn extreme_profile() -> Profile {
    let mut records = Vec::new();
    let values = [0, 1, u64::MAX - 1, u64::MAX];
    for (i, &start) in values.iter().enumerate() {
        for (j, &duration) in [0, 1, u64::MAX].iter().enumerate() {
            for kind in [RecordKind::Kernel, RecordKind::Copy, RecordKind::Transfer] {
                records.push(Record {
                    worker: format!("w{}", (i + j) % 2),
                    scope: Some((i * 3 + j) as u64 % 4),
                    signal: "s".into(),
                    direction: Some(if j % 2 == 0 { Direction::Forward } else { Direction::Backward }),
                    kernel_hash: "ff".into(),
                    bytes_read: values[(i + j) % 4],
                    bytes_written: u64::MAX,
                    flops: values[j % 4],
                    start_ns: start,
                    duration_ns: duration,
                    ..Record::new(kind, "w0", "op")
                });
            }
        }
    }
    let scope = |scope: u64, parent: Option<u64>, depth: u32| SignalRecord {
        client: 1,
        scope,
        name: format!("s{scope}"),
        direction: Direction::Forward,
        depth,
        parent,
        opened_ns: u64::MAX,
        closed_ns: Some(0),
    };
    // 0 and 1 are each other's parent; 2 names a missing one; 3 is absurdly deep.
    let signals = vec![scope(0, Some(1), 1), scope(1, Some(0), 2), scope(2, Some(99), 3), scope(3, None, u32::MAX)];
    Profile { records, signals, ..Profile::default() }
}

#[test]
fn extreme_profiles_are_drawn_summarised_merged_and_ranked() {
    let p = extreme_profile();
    let dir = std::env::temp_dir().join(format!("gt-prof-extremes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let drawn = report::report(&p, &dir.join("report"), &report::ReportOptions::default());
    assert!(drawn.is_ok(), "{drawn:?}");
    assert!(report::summary_text(&p, 5).contains("Top"));
    let (trace, _) = merge::merge(&p);
    assert!(trace["traceEvents"].is_array());
    let sweep = Sweep {
        dir: dir.clone(),
        manifest: SweepManifest {
            axes: vec![SweepAxis { name: "GT_X".into(), values: vec!["1".into()] }],
            repeat: 1,
            runs: vec![SweepRun {
                dir: "r".into(),
                settings: BTreeMap::from([("GT_X".into(), "1".into())]),
                repetition: 1,
                ok: true,
                error: None,
                seconds: 0.0,
            }],
            ..SweepManifest::default()
        },
        profiles: vec![(0, p)],
        warnings: Vec::new(),
    };
    let rows = variance::variance(&sweep, 3).unwrap();
    assert!(!rows.is_empty());
    variance::plots(&rows, &sweep.manifest.axes, &dir.join("variance")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
