use crate::policy::units::{format_duration, format_size, parse_duration, parse_size, UnitError};

#[test]
fn sizes() {
    assert_eq!(parse_size("512"), Ok(512));
    assert_eq!(parse_size("512B"), Ok(512));
    assert_eq!(parse_size("10K"), Ok(10 * 1024));
    assert_eq!(parse_size("10k"), Ok(10 * 1024));
    assert_eq!(parse_size("10M"), Ok(10 << 20));
    assert_eq!(parse_size("10MB"), Ok(10 << 20));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert_eq!(parse_size("2T"), Ok(2 << 40));
}

#[test]
fn bad_sizes() {
    assert_eq!(parse_size(""), Err(UnitError::Empty));
    assert_eq!(parse_size("M"), Err(UnitError::ExpectedNumber("M".into())));
    assert!(matches!(
        parse_size("10X"),
        Err(UnitError::UnknownUnit { .. })
    ));
    assert!(matches!(
        parse_size("10Mb"),
        Err(UnitError::UnknownUnit { .. })
    ));
    assert!(matches!(
        parse_size("1.5G"),
        Err(UnitError::UnknownUnit { .. })
    ));
    assert_eq!(parse_size("99999999T"), Err(UnitError::Overflow));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("30s"), Ok(30));
    assert_eq!(parse_duration("10m"), Ok(600));
    assert_eq!(parse_duration("2h"), Ok(7200));
    assert_eq!(parse_duration("3d"), Ok(3 * 86400));
    assert_eq!(parse_duration("1w"), Ok(7 * 86400));
    assert_eq!(parse_duration("1y"), Ok(365 * 86400));
    assert_eq!(parse_duration("1d12h"), Ok(36 * 3600));
    assert_eq!(parse_duration("90"), Ok(90));
    assert_eq!(parse_duration("0"), Ok(0));
}

#[test]
fn bad_durations() {
    assert_eq!(parse_duration(""), Err(UnitError::Empty));
    assert_eq!(parse_duration("1d12"), Err(UnitError::MissingUnit(12)));
    assert_eq!(
        parse_duration("d"),
        Err(UnitError::ExpectedNumber("d".into()))
    );
    assert!(matches!(
        parse_duration("3M"),
        Err(UnitError::UnknownUnit { .. })
    ));
    assert_eq!(
        parse_duration("99999999999999999999"),
        Err(UnitError::Overflow)
    );
    assert_eq!(parse_duration("999999999999999y"), Err(UnitError::Overflow));
}

#[test]
fn display_is_exact() {
    assert_eq!(format_size(0), "0B");
    assert_eq!(format_size(1536), "1536B");
    assert_eq!(format_size(10 << 20), "10M");
    assert_eq!(format_size(1 << 30), "1G");
    assert_eq!(format_size(3 << 40), "3T");
    assert_eq!(format_duration(0), "0s");
    assert_eq!(format_duration(7 * 86400), "7d");
    assert_eq!(format_duration(36 * 3600), "1d12h");
    assert_eq!(format_duration(3661), "1h1m1s");
    assert_eq!(format_duration(365 * 86400), "365d");
}
