use jiff::civil::date;
use jiff::tz::{self, TimeZone};

use crate::policy::{Candidate, Retention};

const MINUTE: i64 = 60_000_000_000;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

/// Nanoseconds since the epoch of a UTC wall time.
fn utc(y: i16, m: i8, d: i8, h: i8, min: i8) -> i64 {
    let ts = date(y, m, d)
        .at(h, min, 0, 0)
        .to_zoned(TimeZone::UTC)
        .map(|z| z.timestamp().as_nanosecond());
    ts.ok()
        .and_then(|ns| i64::try_from(ns).ok())
        .unwrap_or_default()
}

/// 2024-06-03 (a Monday) 12:00 UTC.
fn now() -> i64 {
    utc(2024, 6, 3, 12, 0)
}

fn version(seq: u64, time_ns: i64) -> Candidate {
    Candidate {
        seq,
        time_ns,
        size: 10,
        pinned: false,
    }
}

/// Versions 1..=n, one hour apart, version n made at `now()`.
fn hourly(n: u64) -> Vec<Candidate> {
    (1..=n)
        .map(|seq| version(seq, now() - (n - seq) as i64 * HOUR))
        .collect()
}

/// Seqs of the kept versions, in input order.
fn kept_at(r: &Retention, versions: &[Candidate], now: i64, tz: &TimeZone) -> Vec<u64> {
    let flags = r.keep(versions, now, tz);
    assert_eq!(flags.len(), versions.len());
    versions
        .iter()
        .zip(flags)
        .filter(|(_, k)| *k)
        .map(|(v, _)| v.seq)
        .collect()
}

fn kept(r: &Retention, versions: &[Candidate]) -> Vec<u64> {
    kept_at(r, versions, now(), &TimeZone::UTC)
}

#[test]
fn by_default_everything_is_kept() {
    let r = Retention::default();
    assert!(r.keeps_all());
    assert_eq!(kept(&r, &hourly(10)), (1..=10).collect::<Vec<_>>());
    assert_eq!(kept(&r, &[]), Vec::<u64>::new());
}

#[test]
fn max_count() {
    let r = Retention {
        max_count: Some(3),
        ..Retention::default()
    };
    assert!(!r.keeps_all());
    assert_eq!(kept(&r, &hourly(10)), [8, 9, 10]);
}

#[test]
fn minimums_beat_maximums() {
    let count = Retention {
        min_count: Some(5),
        max_count: Some(3),
        ..Retention::default()
    };
    assert_eq!(kept(&count, &hourly(10)), [6, 7, 8, 9, 10]);
    // max-age 4h keeps ages 0h..=4h (versions 6..=10); min-count 6 adds 5.
    let age = Retention {
        max_age_secs: Some(4 * 3600),
        min_count: Some(6),
        ..Retention::default()
    };
    assert_eq!(kept(&age, &hourly(10)), [5, 6, 7, 8, 9, 10]);
    let min_age = Retention {
        min_age_secs: Some(3 * 3600),
        max_count: Some(1),
        ..Retention::default()
    };
    assert_eq!(kept(&min_age, &hourly(10)), [8, 9, 10]);
}

#[test]
fn protection_window() {
    let r = Retention {
        protect_secs: 2 * 3600,
        max_count: Some(1),
        ..Retention::default()
    };
    assert_eq!(kept(&r, &hourly(10)), [9, 10]);
}

#[test]
fn pinned_versions_stay() {
    let mut versions = hourly(10);
    versions[0].pinned = true;
    let r = Retention {
        max_count: Some(3),
        ..Retention::default()
    };
    assert_eq!(kept(&r, &versions), [1, 8, 9, 10]);
}

#[test]
fn the_newest_version_always_stays() {
    let stale = Retention {
        max_age_secs: Some(3600),
        ..Retention::default()
    };
    assert_eq!(
        kept_at(&stale, &hourly(5), now() + 5 * HOUR, &TimeZone::UTC),
        [5]
    );
    let none = Retention {
        max_count: Some(0),
        ..Retention::default()
    };
    assert_eq!(kept(&none, &hourly(5)), [5]);
}

#[test]
fn space() {
    // Each version is 10 bytes: running sums 10, 20, 30, 40, ...
    let max = Retention {
        max_space: Some(35),
        ..Retention::default()
    };
    assert_eq!(kept(&max, &hourly(10)), [8, 9, 10]);
    let min = Retention {
        min_space: Some(40),
        max_count: Some(1),
        ..Retention::default()
    };
    assert_eq!(kept(&min, &hourly(10)), [7, 8, 9, 10]);
    let mut sized = hourly(4);
    sized[3].size = 100;
    let tight = Retention {
        max_space: Some(50),
        ..Retention::default()
    };
    assert_eq!(
        kept(&tight, &sized),
        [4],
        "the newest alone exceeds max-space"
    );
}

/// Two versions a day over three days; the newest at `now()`.
fn three_days() -> Vec<Candidate> {
    vec![
        version(1, utc(2024, 6, 1, 10, 0)),
        version(2, utc(2024, 6, 1, 20, 0)),
        version(3, utc(2024, 6, 2, 9, 0)),
        version(4, utc(2024, 6, 2, 18, 0)),
        version(5, utc(2024, 6, 3, 8, 0)),
        version(6, utc(2024, 6, 3, 12, 0)),
    ]
}

#[test]
fn keep_daily_takes_the_newest_of_each_day() {
    let r = Retention {
        keep_daily: Some(2),
        ..Retention::default()
    };
    assert_eq!(kept(&r, &three_days()), [4, 6]);
    // At UTC-10 the days fall differently: local 06-01 23:00 (3), 06-02
    // 08:00 (4), 06-02 22:00 (5), 06-03 02:00 (6).
    let hawaii = tz::offset(-10).to_time_zone();
    assert_eq!(kept_at(&r, &three_days(), now(), &hawaii), [5, 6]);
}

#[test]
fn keep_hourly() {
    let versions: Vec<Candidate> = (1..=6)
        .map(|seq| version(seq, utc(2024, 6, 3, 10, 0) + (seq as i64 - 1) * 20 * MINUTE))
        .collect();
    let r = Retention {
        keep_hourly: Some(2),
        ..Retention::default()
    };
    // 10:00 10:20 10:40 | 11:00 11:20 11:40
    assert_eq!(
        kept_at(&r, &versions, utc(2024, 6, 3, 11, 40), &TimeZone::UTC),
        [3, 6]
    );
}

/// One version a day at noon, 2024-05-20 (seq 1) to 2024-06-03 (seq 15):
/// ISO weeks 21 (seqs 1-7), 22 (8-14) and 23 (15).
fn fifteen_days() -> Vec<Candidate> {
    (1..=15)
        .map(|seq| version(seq, now() - (15 - seq) as i64 * DAY))
        .collect()
}

#[test]
fn keep_last_with_weekly() {
    let r = Retention {
        keep_last: Some(2),
        keep_weekly: Some(1),
        ..Retention::default()
    };
    assert_eq!(kept(&r, &fifteen_days()), [14, 15]);
    let r = Retention {
        keep_last: Some(1),
        keep_weekly: Some(3),
        ..Retention::default()
    };
    assert_eq!(kept(&r, &fifteen_days()), [7, 14, 15]);
}

#[test]
fn keep_monthly_and_yearly() {
    let monthly = Retention {
        keep_monthly: Some(2),
        ..Retention::default()
    };
    // Seq 12 is 2024-05-31, the last of May.
    assert_eq!(kept(&monthly, &fifteen_days()), [12, 15]);
    let mut versions = fifteen_days();
    versions.push(version(0, utc(2023, 12, 31, 23, 0)));
    let yearly = Retention {
        keep_yearly: Some(5),
        ..Retention::default()
    };
    assert_eq!(kept(&yearly, &versions), [15, 0]);
}

#[test]
fn keep_within() {
    let r = Retention {
        keep_within_secs: Some(3 * 3600),
        ..Retention::default()
    };
    assert!(!r.keeps_all());
    assert_eq!(kept(&r, &hourly(10)), [8, 9, 10]);
}

#[test]
fn staggered_selection_is_still_bounded_by_maximums() {
    let bounded = Retention {
        keep_daily: Some(3),
        max_count: Some(2),
        ..Retention::default()
    };
    // keep-daily picks 6, 4 and 2 (positions 0, 2 and 4).
    assert_eq!(kept(&bounded, &three_days()), [6]);
    let roomy = Retention {
        max_count: Some(5),
        ..bounded.clone()
    };
    assert_eq!(kept(&roomy, &three_days()), [2, 4, 6]);
    let protected = Retention {
        min_count: Some(2),
        ..bounded
    };
    assert_eq!(kept(&protected, &three_days()), [5, 6]);
}

#[test]
fn future_versions_count_as_new() {
    let versions = [
        version(1, now() - 3 * HOUR),
        version(2, now() - 30 * MINUTE),
        version(3, now() + 2 * HOUR),
    ];
    let r = Retention {
        protect_secs: 3600,
        max_count: Some(1),
        ..Retention::default()
    };
    assert_eq!(kept(&r, &versions), [2, 3]);
    let young = Retention {
        max_age_secs: Some(60),
        ..Retention::default()
    };
    assert_eq!(kept(&young, &versions), [3]);
}

#[test]
fn order_given_and_ties() {
    let mut versions = hourly(5);
    versions.reverse();
    versions.push(version(9, now()));
    let r = Retention {
        max_count: Some(2),
        ..Retention::default()
    };
    // Seq 9 and seq 5 share the newest time: the higher seq is newer.
    assert_eq!(kept(&r, &versions), [5, 9]);
    assert_eq!(
        r.keep(&versions, now(), &TimeZone::UTC),
        [true, false, false, false, false, true]
    );
}

#[test]
fn expired_objects() {
    // The deletion record is the newest version, 2 days old.
    let gone = |pinned_oldest: bool| {
        let mut v = hourly(3);
        v[2].time_ns = now() - 2 * DAY;
        v[0].time_ns = now() - 3 * DAY;
        v[1].time_ns = now() - 3 * DAY + HOUR;
        v[0].pinned = pinned_oldest;
        v
    };
    let aged = Retention {
        max_age_secs: Some(86400),
        ..Retention::default()
    };
    assert!(aged.expired(&gone(false), now(), &TimeZone::UTC));
    assert!(!aged.expired(&gone(true), now(), &TimeZone::UTC), "pinned");
    assert!(!aged.expired(&gone(false), now() - 2 * DAY + HOUR, &TimeZone::UTC));

    let protected = Retention {
        protect_secs: 3 * 86400,
        ..aged.clone()
    };
    assert!(!protected.expired(&gone(false), now(), &TimeZone::UTC));

    let counted = Retention {
        max_count: Some(3),
        ..Retention::default()
    };
    assert!(!counted.expired(&gone(false), now(), &TimeZone::UTC));
    assert!(!Retention::default().expired(&gone(false), now(), &TimeZone::UTC));

    let within = Retention {
        keep_within_secs: Some(86400),
        ..Retention::default()
    };
    assert!(within.expired(&gone(false), now(), &TimeZone::UTC));
}

#[test]
fn keeps_all_ignores_minimums() {
    let r = Retention {
        protect_secs: 7 * 86400,
        min_count: Some(3),
        min_age_secs: Some(60),
        min_space: Some(1 << 20),
        ..Retention::default()
    };
    assert!(r.keeps_all());
    let capped = Retention {
        max_space: Some(1),
        ..r
    };
    assert!(!capped.keeps_all());
}

#[test]
fn retention_round_trips_through_json() -> serde_json::Result<()> {
    let r: Retention = serde_json::from_str(r#"{"max_count": 3, "protect_secs": 60}"#)?;
    assert_eq!(
        r,
        Retention {
            max_count: Some(3),
            protect_secs: 60,
            ..Retention::default()
        }
    );
    let back: Retention = serde_json::from_value(serde_json::to_value(&r)?)?;
    assert_eq!(back, r);
    Ok(())
}
