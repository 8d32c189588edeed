//! The settings a policy can make (the keys of `[defaults]` and of rules),
//! their values, and which of two values is the more restrictive.

use std::fmt;

use serde::Serialize;

use super::units::{format_duration, format_size};

/// How changes become versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capture {
    // Declared from the fewest versions to the most: the derived order is
    // the restrictiveness order used when rules disagree.
    Session,
    Interval,
    EveryWrite,
}

impl Capture {
    /// In the order the documentation lists them.
    pub const ALL: [Capture; 3] = [Capture::Session, Capture::EveryWrite, Capture::Interval];

    pub fn name(self) -> &'static str {
        match self {
            Capture::Session => "session",
            Capture::Interval => "interval",
            Capture::EveryWrite => "every-write",
        }
    }
}

/// One setting key, as written in `[defaults]` and `[[rule]]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Key {
    Version,
    Capture,
    Compression,
    Protect,
    MinCount,
    MaxCount,
    MinAge,
    MaxAge,
    MinSpace,
    MaxSpace,
    KeepLast,
    KeepHourly,
    KeepDaily,
    KeepWeekly,
    KeepMonthly,
    KeepYearly,
    KeepWithin,
}

/// What kind of value a key takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Capture,
    Level,
    Count,
    Duration,
    Size,
}

pub const KEY_COUNT: usize = 17;

impl Key {
    /// Every key, in the order `explain` lists them.
    pub const ALL: [Key; KEY_COUNT] = [
        Key::Version,
        Key::Capture,
        Key::Compression,
        Key::Protect,
        Key::MinCount,
        Key::MaxCount,
        Key::MinAge,
        Key::MaxAge,
        Key::MinSpace,
        Key::MaxSpace,
        Key::KeepLast,
        Key::KeepHourly,
        Key::KeepDaily,
        Key::KeepWeekly,
        Key::KeepMonthly,
        Key::KeepYearly,
        Key::KeepWithin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Key::Version => "version",
            Key::Capture => "capture",
            Key::Compression => "compression",
            Key::Protect => "protect",
            Key::MinCount => "min-count",
            Key::MaxCount => "max-count",
            Key::MinAge => "min-age",
            Key::MaxAge => "max-age",
            Key::MinSpace => "min-space",
            Key::MaxSpace => "max-space",
            Key::KeepLast => "keep-last",
            Key::KeepHourly => "keep-hourly",
            Key::KeepDaily => "keep-daily",
            Key::KeepWeekly => "keep-weekly",
            Key::KeepMonthly => "keep-monthly",
            Key::KeepYearly => "keep-yearly",
            Key::KeepWithin => "keep-within",
        }
    }

    pub fn from_name(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn kind(self) -> Kind {
        match self {
            Key::Version => Kind::Bool,
            Key::Capture => Kind::Capture,
            Key::Compression => Kind::Level,
            Key::Protect | Key::MinAge | Key::MaxAge | Key::KeepWithin => Kind::Duration,
            Key::MinSpace | Key::MaxSpace => Kind::Size,
            Key::MinCount
            | Key::MaxCount
            | Key::KeepLast
            | Key::KeepHourly
            | Key::KeepDaily
            | Key::KeepWeekly
            | Key::KeepMonthly
            | Key::KeepYearly => Kind::Count,
        }
    }

    /// Whether a larger value is the more restrictive one for this key.
    /// Restrictive means "records more, keeps more, prunes less" for
    /// minimums, capture and compression, and "versions less or keeps
    /// less" for `version`, maximums and the staggered keep-* keys.
    fn larger_is_stricter(self) -> bool {
        matches!(
            self,
            Key::Capture
                | Key::Compression
                | Key::Protect
                | Key::MinCount
                | Key::MinAge
                | Key::MinSpace
        )
    }

    /// Whether `candidate` is more restrictive than `current` for this key.
    pub fn stricter(self, candidate: &Value, current: &Value) -> bool {
        if self.larger_is_stricter() {
            candidate > current
        } else {
            candidate < current
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// A setting's value. Which variant a key takes is fixed by `Key::kind`, so
/// the derived order only ever compares values of one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    Bool(bool),
    Capture(Capture),
    Level(u8),
    Count(u64),
    /// Seconds.
    Duration(u64),
    /// Bytes.
    Size(u64),
}

impl Value {
    /// The numeric payload of a level, count, duration or size.
    pub fn number(self) -> Option<u64> {
        match self {
            Value::Level(n) => Some(u64::from(n)),
            Value::Count(n) | Value::Duration(n) | Value::Size(n) => Some(n),
            Value::Bool(_) | Value::Capture(_) => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Bool(true) => f.write_str("yes"),
            Value::Bool(false) => f.write_str("no"),
            Value::Capture(c) => f.write_str(c.name()),
            Value::Level(n) => write!(f, "{n}"),
            Value::Count(n) => write!(f, "{n}"),
            Value::Duration(s) => f.write_str(&format_duration(*s)),
            Value::Size(b) => f.write_str(&format_size(*b)),
        }
    }
}

/// A 1-based position in a policy file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

/// One key set in one table, with where it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    pub value: Value,
    pub pos: Pos,
}

/// The settings one table (`[defaults]` or a rule) makes; unset keys are
/// `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    values: [Option<Setting>; KEY_COUNT],
}

impl Settings {
    pub fn get(&self, key: Key) -> Option<&Setting> {
        self.values[key.index()].as_ref()
    }

    pub fn set(&mut self, key: Key, setting: Setting) {
        self.values[key.index()] = Some(setting);
    }

    pub fn is_empty(&self) -> bool {
        self.values.iter().all(Option::is_none)
    }

    pub fn iter(&self) -> impl Iterator<Item = (Key, &Setting)> {
        Key::ALL
            .into_iter()
            .filter_map(|key| self.get(key).map(|s| (key, s)))
    }
}

/// Pairs of keys whose first must not exceed its second in one table.
pub const MIN_MAX_PAIRS: [(Key, Key); 3] = [
    (Key::MinCount, Key::MaxCount),
    (Key::MinAge, Key::MaxAge),
    (Key::MinSpace, Key::MaxSpace),
];

/// Which way an administrator bound limits a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// The effective value is at least the bound; unset becomes the bound.
    Floor,
    /// The effective value is at most the bound; unset becomes the bound.
    Ceiling,
}

impl Limit {
    /// Whether `value` (None = unset) lies outside `bound`.
    pub fn excludes(self, bound: &Value, value: Option<&Value>) -> bool {
        match (value, self) {
            (None, _) => true,
            (Some(v), Limit::Floor) => v < bound,
            (Some(v), Limit::Ceiling) => v > bound,
        }
    }
}

/// The keys `[bounds]` accepts and how each limits. `version = "required"`
/// is stored as a floor of `true`.
pub const BOUND_KEYS: [(Key, Limit); 7] = [
    (Key::MinCount, Limit::Floor),
    (Key::MinAge, Limit::Floor),
    (Key::Protect, Limit::Floor),
    (Key::MaxCount, Limit::Ceiling),
    (Key::MaxAge, Limit::Ceiling),
    (Key::MaxSpace, Limit::Ceiling),
    (Key::Version, Limit::Floor),
];
