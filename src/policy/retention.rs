//! Retention arithmetic: given one file's versions, which of them to keep.

use std::collections::HashSet;

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// One version of one file, as the cleaner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub seq: u64,
    pub time_ns: i64,
    /// Logical size in bytes.
    pub size: u64,
    pub pinned: bool,
}

/// The effective retention settings for one file. Durations are seconds,
/// spaces bytes; `None` = not set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub protect_secs: u64,
    pub min_count: Option<u64>,
    pub max_count: Option<u64>,
    pub min_age_secs: Option<u64>,
    pub max_age_secs: Option<u64>,
    pub min_space: Option<u64>,
    pub max_space: Option<u64>,
    pub keep_last: Option<u64>,
    pub keep_hourly: Option<u64>,
    pub keep_daily: Option<u64>,
    pub keep_weekly: Option<u64>,
    pub keep_monthly: Option<u64>,
    pub keep_yearly: Option<u64>,
    pub keep_within_secs: Option<u64>,
}

/// A version's place in the newest-first order, with the figures every
/// rule looks at.
struct Ranked {
    /// Index in the caller's slice.
    input: usize,
    position: u64,
    age_ns: u64,
    /// Sizes of this and all newer versions.
    running_size: u64,
    time_ns: i64,
    pinned: bool,
}

/// A calendar period that the staggered keep-* rules keep one version of.
type Bucket = (i16, i16, i8, i8);
type BucketOf = fn(DateTime) -> Bucket;

impl Retention {
    /// For each candidate (in the order given), whether it is kept.
    pub fn keep(&self, versions: &[Candidate], now_ns: i64, tz: &TimeZone) -> Vec<bool> {
        self.evaluate(versions, now_ns, tz, true)
    }

    /// Whether a deleted object has expired entirely: with its newest
    /// version (the deletion record) not forced, no version would be kept.
    pub fn expired(&self, versions: &[Candidate], now_ns: i64, tz: &TimeZone) -> bool {
        !self.evaluate(versions, now_ns, tz, false).contains(&true)
    }

    /// Whether every version is kept regardless of its figures: nothing
    /// limits the history, so callers can skip the work.
    pub fn keeps_all(&self) -> bool {
        self.max_count.is_none()
            && self.max_age_secs.is_none()
            && self.max_space.is_none()
            && !self.has_staggered()
    }

    fn has_staggered(&self) -> bool {
        self.keep_last.is_some()
            || self.keep_within_secs.is_some()
            || self.calendar_counts().iter().any(|(n, _)| n.is_some())
    }

    fn evaluate(
        &self,
        versions: &[Candidate],
        now_ns: i64,
        tz: &TimeZone,
        force_newest: bool,
    ) -> Vec<bool> {
        let ranked = rank(versions, now_ns);
        let staggered = self.has_staggered().then(|| self.staggered(&ranked, tz));
        let mut kept = vec![false; versions.len()];
        for (i, r) in ranked.iter().enumerate() {
            let selected = staggered.as_ref().is_none_or(|s| s[i]);
            kept[r.input] = (force_newest && r.position == 0)
                || self.protected(r)
                || (selected && self.within_maximums(r));
        }
        kept
    }

    /// The minimums: versions no maximum may remove.
    fn protected(&self, r: &Ranked) -> bool {
        r.pinned
            || r.age_ns < secs_to_ns(self.protect_secs)
            || self.min_count.is_some_and(|n| r.position < n)
            || self.min_age_secs.is_some_and(|s| r.age_ns < secs_to_ns(s))
            || self.min_space.is_some_and(|b| r.running_size <= b)
    }

    fn within_maximums(&self, r: &Ranked) -> bool {
        self.max_count.is_none_or(|n| r.position < n)
            && self.max_age_secs.is_none_or(|s| r.age_ns <= secs_to_ns(s))
            && self.max_space.is_none_or(|b| r.running_size <= b)
    }

    /// Which versions (in ranked order) some keep-* rule selects.
    fn staggered(&self, ranked: &[Ranked], tz: &TimeZone) -> Vec<bool> {
        let mut selected: Vec<bool> = ranked
            .iter()
            .map(|r| {
                self.keep_last.is_some_and(|n| r.position < n)
                    || self
                        .keep_within_secs
                        .is_some_and(|s| r.age_ns < secs_to_ns(s))
            })
            .collect();
        let civil: Vec<Option<DateTime>> = ranked.iter().map(|r| local(r.time_ns, tz)).collect();
        for (count, bucket) in self.calendar_counts() {
            if let Some(count) = count {
                select_per_bucket(&civil, count, bucket, &mut selected);
            }
        }
        selected
    }

    fn calendar_counts(&self) -> [(Option<u64>, BucketOf); 5] {
        [
            (self.keep_hourly, |t| {
                (t.year(), t.month().into(), t.day(), t.hour())
            }),
            (self.keep_daily, |t| {
                (t.year(), t.month().into(), t.day(), 0)
            }),
            (self.keep_weekly, |t| {
                let week = t.date().iso_week_date();
                (week.year(), week.week().into(), 0, 0)
            }),
            (self.keep_monthly, |t| (t.year(), t.month().into(), 0, 0)),
            (self.keep_yearly, |t| (t.year(), 0, 0, 0)),
        ]
    }
}

/// Sorts newest first (ties: higher seq first) and computes each version's
/// position, age and running size.
fn rank(versions: &[Candidate], now_ns: i64) -> Vec<Ranked> {
    let mut order: Vec<usize> = (0..versions.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&versions[a], &versions[b]);
        (b.time_ns, b.seq).cmp(&(a.time_ns, a.seq))
    });
    let mut running_size: u64 = 0;
    let mut ranked = Vec::with_capacity(order.len());
    for (position, input) in (0u64..).zip(order) {
        let v = &versions[input];
        running_size = running_size.saturating_add(v.size);
        ranked.push(Ranked {
            input,
            position,
            // Versions from the future (clock skew) count as brand new.
            age_ns: now_ns.saturating_sub(v.time_ns).max(0).unsigned_abs(),
            running_size,
            time_ns: v.time_ns,
            pinned: v.pinned,
        });
    }
    ranked
}

/// Restic's rule: walking newest first, the first version met in each of
/// the `count` most recent buckets that have versions is selected.
fn select_per_bucket(
    civil: &[Option<DateTime>],
    count: u64,
    bucket_of: BucketOf,
    selected: &mut [bool],
) {
    let mut seen = HashSet::new();
    for (i, time) in civil.iter().enumerate() {
        if seen.len() as u64 >= count {
            break;
        }
        // A time outside the calendar's range (year 10000 and on) belongs
        // to no bucket.
        if let Some(time) = time {
            if seen.insert(bucket_of(*time)) {
                selected[i] = true;
            }
        }
    }
}

fn local(time_ns: i64, tz: &TimeZone) -> Option<DateTime> {
    let ts = Timestamp::from_nanosecond(i128::from(time_ns)).ok()?;
    Some(tz.to_datetime(ts))
}

fn secs_to_ns(secs: u64) -> u64 {
    secs.saturating_mul(1_000_000_000)
}
