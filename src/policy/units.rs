//! Sizes ("10M", "1GiB") and durations ("1d12h") as written in policy files,
//! and their canonical display.

use thiserror::Error;

/// Why a size or duration string was rejected; the parser adds the key and
/// position.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UnitError {
    #[error("empty value")]
    Empty,
    #[error("expected a number at '{0}'")]
    ExpectedNumber(String),
    #[error("unknown unit '{unit}' (expected {expected})")]
    UnknownUnit {
        unit: String,
        expected: &'static str,
    },
    #[error("{0} has no unit (expected s, m, h, d, w or y)")]
    MissingUnit(u64),
    #[error("value is too large")]
    Overflow,
}

const SIZE_UNITS: &str = "K, M, G or T, optionally followed by B or iB";
const DURATION_UNITS: &str = "s, m, h, d, w or y";

const KIB: u64 = 1024;
const SIZE_STEPS: [(char, u64); 4] = [
    ('T', KIB * KIB * KIB * KIB),
    ('G', KIB * KIB * KIB),
    ('M', KIB * KIB),
    ('K', KIB),
];

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;
// Weeks and years are accepted on input but never shown: "365d" reads
// unambiguously, while "1y" might suggest calendar years with leap days.
const DURATION_STEPS: [(char, u64); 4] = [('d', DAY), ('h', HOUR), ('m', MINUTE), ('s', 1)];

/// Parses a byte count: "512", "512B", "10K", "10M", "10MB", "1GiB".
/// Multipliers are powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let (number, rest) = leading_number(text)?;
    let multiplier = size_multiplier(rest)?;
    number.checked_mul(multiplier).ok_or(UnitError::Overflow)
}

fn size_multiplier(unit: &str) -> Result<u64, UnitError> {
    let unknown = || UnitError::UnknownUnit {
        unit: unit.to_string(),
        expected: SIZE_UNITS,
    };
    if unit.is_empty() || unit == "B" {
        return Ok(1);
    }
    let mut chars = unit.chars();
    let letter = chars.next().ok_or_else(unknown)?.to_ascii_uppercase();
    let (_, multiplier) = SIZE_STEPS
        .iter()
        .find(|(l, _)| *l == letter)
        .ok_or_else(unknown)?;
    match chars.as_str() {
        "" | "B" | "iB" => Ok(*multiplier),
        _ => Err(unknown()),
    }
}

/// Parses a duration in seconds: "30s", "10m", "2h", "3d", "1w", "1y"
/// (365 days), combinations such as "1d12h", or plain digits as seconds.
pub fn parse_duration(text: &str) -> Result<u64, UnitError> {
    if text.is_empty() {
        return Err(UnitError::Empty);
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map_err(|_| UnitError::Overflow);
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let (number, after) = leading_number(rest)?;
        let unit = after.chars().next().ok_or(UnitError::MissingUnit(number))?;
        let seconds = number
            .checked_mul(duration_unit(unit)?)
            .ok_or(UnitError::Overflow)?;
        total = total.checked_add(seconds).ok_or(UnitError::Overflow)?;
        rest = &after[unit.len_utf8()..];
    }
    Ok(total)
}

fn duration_unit(unit: char) -> Result<u64, UnitError> {
    match unit {
        's' => Ok(1),
        'm' => Ok(MINUTE),
        'h' => Ok(HOUR),
        'd' => Ok(DAY),
        'w' => Ok(7 * DAY),
        'y' => Ok(365 * DAY),
        _ => Err(UnitError::UnknownUnit {
            unit: unit.to_string(),
            expected: DURATION_UNITS,
        }),
    }
}

/// Splits "12abc" into (12, "abc").
fn leading_number(text: &str) -> Result<(u64, &str), UnitError> {
    if text.is_empty() {
        return Err(UnitError::Empty);
    }
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(UnitError::ExpectedNumber(text.to_string()));
    }
    let number = text[..digits].parse().map_err(|_| UnitError::Overflow)?;
    Ok((number, &text[digits..]))
}

/// Shows a byte count exactly, in the largest unit that divides it: "10M",
/// "1536B".
pub fn format_size(bytes: u64) -> String {
    SIZE_STEPS
        .iter()
        .find(|(_, m)| bytes != 0 && bytes % m == 0)
        .map_or_else(
            || format!("{bytes}B"),
            |(letter, m)| format!("{}{letter}", bytes / m),
        )
}

/// Shows a duration exactly as days, hours, minutes and seconds: "7d",
/// "1d12h", "0s".
pub fn format_duration(seconds: u64) -> String {
    if seconds == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = seconds;
    for (letter, step) in DURATION_STEPS {
        if rest >= step {
            out.push_str(&format!("{}{letter}", rest / step));
            rest %= step;
        }
    }
    out
}
