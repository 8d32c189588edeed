//! Instants as users write them: ISO 8601 (`2026-11-21T10:00`, with or
//! without seconds, fraction or zone; a date alone means its midnight),
//! relative (`-10m`, `-2h`, `-3d`, `-1w`; `+1h` from now), `now`, `today 14:00`,
//! `yesterday 14:00`, a sequence number (`1234` or `#1234`), or a tag name.
//! A bare number is always a sequence number, never a year.

use super::Seq;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    Now,
    Seq(Seq),
    /// Nanoseconds since the epoch.
    Time(i64),
    Tag(String),
}

fn now_ns() -> i64 {
    jiff::Timestamp::now().as_nanosecond() as i64
}

/// Parses an instant; `Err` is a one-line message.
pub fn parse(s: &str) -> Result<At, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty time".into());
    }
    if s == "now" {
        return Ok(At::Now);
    }
    let digits = s.strip_prefix('#').unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return digits
            .parse()
            .map(|n| At::Seq(Seq::new(n)))
            .map_err(|_| format!("sequence number {s} is too large"));
    }
    // A time from now is in the future: a range clamps it to now, a
    // single instant is not found, as an ISO time past now is. No tag
    // starts with '+' or '-' (`chronofs tag` refuses one).
    if let Some(rel) = s.strip_prefix('-') {
        return relative('-', rel).map(|d| At::Time(now_ns().saturating_sub(d)));
    }
    if let Some(rel) = s.strip_prefix('+') {
        return relative('+', rel).map(|d| At::Time(now_ns().saturating_add(d)));
    }
    for (word, days) in [("today", 0), ("yesterday", 1)] {
        if let Some(rest) = s.strip_prefix(word) {
            return day_time(days, rest.trim()).map(At::Time);
        }
    }
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        return absolute(s).map(At::Time);
    }
    if s.chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | ':'))
    {
        return Ok(At::Tag(s.to_string()));
    }
    Err(format!(
        "cannot read '{s}' as a time, sequence number or tag"
    ))
}

/// The length of `rel`, a relative time after its `sign`: one or more
/// number-and-unit parts (`10m`, `1.5d`, `1h30m`, `2d12h`).
fn relative(sign: char, rel: &str) -> Result<i64, String> {
    let bad = || {
        format!("cannot read '{sign}{rel}' as a relative time (e.g. -10m, -2h, -1h30m, -3d, +1w)")
    };
    let mut rest = rel;
    let mut ns = 0.0_f64;
    while !rest.is_empty() {
        let unit_at = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let (num, after) = rest.split_at(unit_at);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let n: f64 = num.parse().map_err(|_| bad())?;
        ns += n * unit_secs(unit).ok_or_else(bad)? * 1e9;
        rest = next;
    }
    if rel.is_empty() || !ns.is_finite() || ns > 1e19 {
        return Err(bad());
    }
    Ok(ns as i64)
}

fn unit_secs(unit: &str) -> Option<f64> {
    Some(match unit {
        "s" | "sec" | "secs" => 1.0,
        "m" | "min" | "mins" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86400.0,
        "w" | "week" | "weeks" => 604800.0,
        _ => return None,
    })
}

/// The local time zone as jiff's `TimeZone::system` finds it, but read
/// straight from /etc/localtime when that links into a zoneinfo tree:
/// jiff looks the link's name up in its database, which first lists the
/// whole tree (about 60 directories: most of a short command's run).
pub fn local_zone() -> jiff::tz::TimeZone {
    static ZONE: std::sync::OnceLock<jiff::tz::TimeZone> = std::sync::OnceLock::new();
    ZONE.get_or_init(|| etc_localtime().unwrap_or_else(jiff::tz::TimeZone::system))
        .clone()
}

fn etc_localtime() -> Option<jiff::tz::TimeZone> {
    const LOCALTIME: &str = "/etc/localtime";
    if std::env::var_os("TZ").is_some() {
        return None;
    }
    let target = std::fs::read_link(LOCALTIME).ok()?;
    let (_, name) = target.to_str()?.rsplit_once("zoneinfo/")?;
    let data = std::fs::read(LOCALTIME).ok()?;
    jiff::tz::TimeZone::tzif(name, &data).ok()
}

fn day_time(days_back: i64, clock: &str) -> Result<i64, String> {
    let tz = local_zone();
    let today = jiff::Timestamp::now().to_zoned(tz.clone()).date();
    let day = today
        .checked_sub(jiff::Span::new().days(days_back))
        .map_err(|e| e.to_string())?;
    let time = if clock.is_empty() {
        jiff::civil::Time::midnight()
    } else {
        parse_clock(clock)?
    };
    let ts = tz
        .to_timestamp(day.to_datetime(time))
        .map_err(|e| e.to_string())?;
    Ok(ts.as_nanosecond() as i64)
}

fn parse_clock(clock: &str) -> Result<jiff::civil::Time, String> {
    let mut full = if clock.matches(':').count() == 1 {
        format!("{clock}:00")
    } else {
        clock.to_string()
    };
    // 9:30 as people write it; ISO 8601 wants 09:30.
    if full.find(':') == Some(1) {
        full.insert(0, '0');
    }
    full.parse::<jiff::civil::Time>()
        .map_err(|_| format!("cannot read '{clock}' as a time of day (HH:MM)"))
}

fn absolute(s: &str) -> Result<i64, String> {
    if let Ok(ts) = s.parse::<jiff::Timestamp>() {
        return Ok(ts.as_nanosecond() as i64);
    }
    let tz = local_zone();
    let civil = s
        .parse::<jiff::civil::DateTime>()
        .or_else(|_| {
            // Without seconds: 2026-11-21T10:00 parses, but be lenient
            // about a space instead of the T.
            s.replacen(' ', "T", 1).parse::<jiff::civil::DateTime>()
        })
        .or_else(|_| {
            s.parse::<jiff::civil::Date>()
                .map(|d| d.to_datetime(jiff::civil::Time::midnight()))
        })
        .map_err(|_| format!("cannot read '{s}' as an ISO 8601 time"))?;
    let ts = tz.to_timestamp(civil).map_err(|e| e.to_string())?;
    Ok(ts.as_nanosecond() as i64)
}

/// Local midnight `days_back` days ago.
pub fn midnight_days_back(days_back: i64) -> Result<i64, String> {
    day_time(days_back, "")
}

/// Formats a time as an instant name to the minute (local zone), e.g.
/// `2026-11-21T10:00`; `parse` reads it back.
pub fn minute(ns: i64) -> String {
    local(ns, "%Y-%m-%dT%H:%M")
}

/// Formats a time for humans (local zone, second precision).
pub fn show(ns: i64) -> String {
    local(ns, "%Y-%m-%d %H:%M:%S")
}

/// `ns` in the local zone with `format` (strftime), or `@ns` if out of
/// range.
fn local(ns: i64, format: &str) -> String {
    match jiff::Timestamp::from_nanosecond(i128::from(ns)) {
        Ok(ts) => ts.to_zoned(local_zone()).strftime(format).to_string(),
        Err(_) => format!("@{ns}"),
    }
}

/// Formats a time as ISO 8601 with nanoseconds and offset (for --json).
pub fn iso(ns: i64) -> String {
    match jiff::Timestamp::from_nanosecond(i128::from(ns)) {
        Ok(ts) => ts.to_zoned(local_zone()).to_string(),
        Err(_) => format!("@{ns}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_zone_read_directly_is_the_one_jiff_finds() {
        let Some(direct) = etc_localtime() else {
            return; // no /etc/localtime link here: jiff's own lookup serves
        };
        let system = jiff::tz::TimeZone::system();
        let now = jiff::Timestamp::now();
        assert_eq!(direct.iana_name(), system.iana_name());
        for days in [0, 91, 182, 273] {
            let t = now + jiff::SignedDuration::from_hours(24 * days);
            assert_eq!(direct.to_offset(t), system.to_offset(t));
        }
    }

    #[test]
    fn parses_each_form() {
        assert_eq!(parse("now"), Ok(At::Now));
        assert_eq!(parse("42"), Ok(At::Seq(Seq::new(42))));
        assert_eq!(parse("#42"), Ok(At::Seq(Seq::new(42))));
        assert_eq!(parse("release-1.0"), Ok(At::Tag("release-1.0".into())));
        let z = parse("2026-11-21T10:00:00Z").unwrap();
        assert_eq!(z, At::Time(1_795_255_200_000_000_000));
        for s in [
            "2026-11-21T10:00",
            "2026-11-21 10:00:00",
            "2026-11-21",
            "2026-11-21T10:00:00.5+01:00",
            "-10m",
            "-1.5h",
            "yesterday 14:00",
            "yesterday 9:30",
            "today",
        ] {
            assert!(matches!(parse(s), Ok(At::Time(_))), "{s}");
        }
        let ten_min = match parse("-10m") {
            Ok(At::Time(t)) => now_ns() - t,
            other => panic!("{other:?}"),
        };
        assert!((599_000_000_000..=601_000_000_000).contains(&ten_min));
    }

    #[test]
    fn rejects_garbage_with_one_line() {
        for s in [
            "",
            "-10x",
            "2026-13-45",
            "yesterday 25:99",
            "a b c",
            "-",
            "+x",
        ] {
            let e = parse(s).unwrap_err();
            assert!(!e.contains('\n'), "{s}: {e}");
        }
    }

    #[test]
    fn a_time_from_now_is_a_time_in_the_future_not_a_tag() {
        let before = now_ns();
        let Ok(At::Time(t)) = parse("+1h") else {
            panic!("+1h: {:?}", parse("+1h"));
        };
        assert!(t >= before + 3_600_000_000_000, "{t} {before}");
        assert!(parse("+1.5d").is_ok());
    }

    #[test]
    fn a_relative_time_may_combine_units() {
        let t = |s: &str| match parse(s) {
            Ok(At::Time(t)) => t,
            other => panic!("{s}: {other:?}"),
        };
        let (a, b) = (t("-90m"), t("-1h30m"));
        assert!((a - b).abs() < 1_000_000_000, "{a} {b}");
        let (a, b) = (t("-2.5d"), t("-2d12h"));
        assert!((a - b).abs() < 1_000_000_000, "{a} {b}");
        assert!(t("+1w2d") > t("+1w"));
    }

    #[test]
    fn a_malformed_relative_time_is_named_with_its_own_sign() {
        for s in [
            "+1x", "-1x", "+", "+x", "-1h30", "-h", "-1h-2m", "-1..2h", "-1h 2m",
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.contains(&format!("'{s}'")), "{s}: {e}");
        }
    }
}
