//! Interval arithmetic on half-open `[start, end)` nanosecond intervals: merging a set,
//! and how much of one interval a set covers, counted once however many members overlap.
//! Pure functions; `variance` uses them for the collectives that overlapped a slow kernel.

/// A half-open `[start, end)` interval in nanoseconds. An interval with `end <= start`
/// covers nothing.
pub type Interval = (u64, u64);

/// The length of `interval` (0 when `end <= start`).
pub fn length(interval: Interval) -> u64 {
    interval.1.saturating_sub(interval.0)
}

/// How much `a` and `b` share. Intervals that only touch (`a.1 == b.0`) share nothing.
pub fn overlap(a: Interval, b: Interval) -> u64 {
    a.1.min(b.1).saturating_sub(a.0.max(b.0))
}

/// The union of `intervals` as sorted, disjoint intervals. Nested, overlapping and touching
/// intervals become one; empty ones (`end <= start`) are dropped, since they cover nothing and
/// would otherwise split or extend a union by a point.
pub fn merge(intervals: &[Interval]) -> Vec<Interval> {
    let mut sorted: Vec<Interval> = intervals.iter().copied().filter(|&i| length(i) > 0).collect();
    sorted.sort_unstable();
    let mut out: Vec<Interval> = Vec::with_capacity(sorted.len());
    for (start, end) in sorted {
        match out.last_mut() {
            // Touching counts as joined: the union has no gap there.
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

/// The total length of `intervals`' union (each nanosecond counted once).
pub fn union_length(intervals: &[Interval]) -> u64 {
    merge(intervals).into_iter().map(length).sum()
}

/// How many nanoseconds of `target` at least one of `others` covers: the others are merged
/// first, so concurrent others are not counted twice.
pub fn covered(target: Interval, others: &[Interval]) -> u64 {
    let clipped: Vec<Interval> = others.iter().map(|&(s, e)| (s.max(target.0), e.min(target.1))).collect();
    union_length(&clipped)
}

/// One other interval's overlap with a target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Its index in the `others` given.
    pub index: usize,
    /// Nanoseconds it shares with the target.
    pub ns: u64,
    /// That as a percentage of the target's length (0 for an empty target).
    pub percent: f64,
}

/// The overlap of each of `others` with `target`, for those that overlap it at all (touching
/// is not overlapping), in the order given.
pub fn shares(target: Interval, others: &[Interval]) -> Vec<Share> {
    let len = length(target);
    others
        .iter()
        .enumerate()
        .filter_map(|(index, &o)| {
            let ns = overlap(target, o);
            (ns > 0).then(|| Share { index, ns, percent: if len == 0 { 0.0 } else { ns as f64 * 100.0 / len as f64 } })
        })
        .collect()
}

/// The share with the largest overlap; the first given among equals, so the answer does not
/// depend on sort stability.
pub fn largest(shares: &[Share]) -> Option<Share> {
    shares.iter().copied().fold(None, |best, s| match best {
        Some(b) if b.ns >= s.ns => Some(b),
        _ => Some(s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_intervals_merge_into_the_outer_one() {
        assert_eq!(merge(&[(0, 100), (10, 20), (30, 90), (40, 50)]), [(0, 100)]);
        assert_eq!(union_length(&[(10, 20), (0, 100)]), 100);
    }

    #[test]
    fn disjoint_intervals_stay_apart_and_sorted() {
        assert_eq!(merge(&[(50, 60), (0, 10), (20, 30)]), [(0, 10), (20, 30), (50, 60)]);
        assert_eq!(union_length(&[(50, 60), (0, 10), (20, 30)]), 30);
    }

    #[test]
    fn touching_intervals_join_but_do_not_overlap() {
        assert_eq!(merge(&[(0, 10), (10, 20)]), [(0, 20)]);
        assert_eq!(overlap((0, 10), (10, 20)), 0);
        assert_eq!(covered((0, 10), &[(10, 20), (20, 30)]), 0);
        assert_eq!(shares((10, 20), &[(0, 10), (20, 30)]), []);
    }

    #[test]
    fn many_concurrent_identical_intervals_count_once() {
        let same = vec![(100, 200); 1000];
        assert_eq!(merge(&same), [(100, 200)]);
        assert_eq!(covered((150, 250), &same), 50);
        let each = shares((150, 250), &same);
        assert_eq!(each.len(), 1000);
        assert!(each.iter().all(|s| s.ns == 50 && s.percent == 50.0));
        assert_eq!(largest(&each).map(|s| s.index), Some(0));
    }

    #[test]
    fn partial_overlaps_are_counted_without_double_counting() {
        // Two others overlap each other inside the target: 20..60 covered once, 40 ns.
        let others = [(20, 50), (30, 60), (90, 200)];
        assert_eq!(covered((0, 100), &others), 40 + 10);
        let each = shares((0, 100), &others);
        assert_eq!(each.iter().map(|s| (s.index, s.ns)).collect::<Vec<_>>(), [(0, 30), (1, 30), (2, 10)]);
        assert_eq!(each[2].percent, 10.0);
        // Equal overlaps: the first given wins.
        assert_eq!(largest(&each).map(|s| s.index), Some(0));
    }

    #[test]
    fn empty_sets_cover_nothing() {
        assert_eq!(merge(&[]), []);
        assert_eq!(union_length(&[]), 0);
        assert_eq!(covered((0, 100), &[]), 0);
        assert_eq!(shares((0, 100), &[]), []);
        assert_eq!(largest(&[]), None);
    }

    #[test]
    fn zero_length_intervals_cover_nothing() {
        assert_eq!(merge(&[(5, 5), (7, 3)]), []);
        assert_eq!(merge(&[(0, 10), (10, 10), (20, 20), (20, 30)]), [(0, 10), (20, 30)]);
        assert_eq!(covered((0, 100), &[(50, 50)]), 0);
        // A zero-length target has nothing to overlap, and no percentage to divide by.
        assert_eq!(covered((50, 50), &[(0, 100)]), 0);
        assert_eq!(shares((50, 50), &[(0, 100)]), []);
        assert_eq!(length((9, 3)), 0);
    }

    #[test]
    fn others_reaching_outside_the_target_are_clipped() {
        assert_eq!(covered((100, 200), &[(0, 1000)]), 100);
        assert_eq!(shares((100, 200), &[(0, 150)])[0].percent, 50.0);
    }
}
