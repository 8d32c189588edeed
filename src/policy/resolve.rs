//! Combining the levels of policy into the effective settings for one file,
//! remembering which file and rule decided each key.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

use super::retention::Retention;
use super::settings::{Capture, Key, Settings, Value, BOUND_KEYS, KEY_COUNT};
use super::{PolicyFile, Rule, Subject};

/// Where an effective setting came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Origin {
    BuiltIn,
    Defaults {
        #[serde(serialize_with = "as_str")]
        file: Arc<str>,
        line: u32,
    },
    Bounds {
        #[serde(serialize_with = "as_str")]
        file: Arc<str>,
        line: u32,
    },
    Rule {
        #[serde(serialize_with = "as_str")]
        file: Arc<str>,
        line: u32,
        /// 1-based among the file's rules.
        number: usize,
        #[serde(serialize_with = "as_opt_str")]
        name: Option<Arc<str>>,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::BuiltIn => f.write_str("built-in"),
            Origin::Defaults { file, line } => write!(f, "defaults ({file}:{line})"),
            Origin::Bounds { file, line } => write!(f, "bounds ({file}:{line})"),
            Origin::Rule {
                file,
                line,
                name: Some(name),
                ..
            } => write!(f, "rule \"{name}\" ({file}:{line})"),
            Origin::Rule {
                file, line, number, ..
            } => write!(f, "rule #{number} at {file}:{line}"),
        }
    }
}

/// One effective setting and what decided it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Source {
    pub key: Key,
    #[serde(serialize_with = "as_display")]
    pub value: Value,
    pub origin: Origin,
}

/// The effective policy for one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolved {
    pub version: bool,
    pub capture: Capture,
    pub compression: u8,
    pub retention: Retention,
    /// Every key that has a value, in `Key::ALL` order.
    pub sources: Vec<Source>,
}

impl Resolved {
    /// Readable lines "key  value  origin" for `chronofs policy explain`.
    pub fn explain(&self) -> String {
        let values: Vec<String> = self.sources.iter().map(|s| s.value.to_string()).collect();
        let width = values.iter().map(String::len).max().unwrap_or(0).max(9);
        let mut out = String::new();
        for (source, value) in self.sources.iter().zip(&values) {
            let line = format!(
                "{:<12} {value:<width$} {}",
                source.key.name(),
                source.origin
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
        if self.retention.keeps_all() {
            out.push_str("(no maximum and no keep-* setting: every version is kept)\n");
        }
        out
    }
}

/// Built-in settings: version everything once per session, keep forever.
const BUILT_IN: [(Key, Value); 4] = [
    (Key::Version, Value::Bool(true)),
    (Key::Capture, Value::Capture(Capture::Session)),
    (Key::Compression, Value::Level(3)),
    (Key::Protect, Value::Duration(0)),
];

/// Resolves one subject: admin rules, then the owner's rules, then admin
/// defaults, then built-ins, each key taken from the first level that sets
/// it; finally clamped into the admin bounds.
pub fn resolve(admin: Option<&PolicyFile>, user: Option<&PolicyFile>, s: &Subject) -> Resolved {
    let mut decided = Decisions::default();
    if let Some(admin) = admin {
        decided.fill_from(Decisions::from_rules(admin, s));
    }
    if let Some(user) = user {
        decided.fill_from(Decisions::from_rules(user, s));
    }
    if let Some(admin) = admin {
        decided.fill_from(Decisions::from_defaults(admin));
    }
    decided.fill_from(Decisions::built_in());
    if let Some(admin) = admin {
        decided.clamp(&admin.bounds, &admin.origin);
    }
    decided.into_resolved()
}

/// One candidate source per key.
#[derive(Default)]
struct Decisions {
    by_key: [Option<Source>; KEY_COUNT],
}

impl Decisions {
    /// The matching rules of one file; where several set a key, the most
    /// restrictive value wins (the earlier rule on a tie).
    fn from_rules(file: &PolicyFile, s: &Subject) -> Decisions {
        let mut layer = Decisions::default();
        for rule in file.rules.iter().filter(|r| r.selector.matches(s)) {
            for (key, setting) in rule.settings.iter() {
                let slot = &mut layer.by_key[key.index()];
                if slot
                    .as_ref()
                    .is_none_or(|cur| key.stricter(&setting.value, &cur.value))
                {
                    let origin = rule_origin(&file.origin, rule, setting.pos.line);
                    *slot = Some(Source {
                        key,
                        value: setting.value,
                        origin,
                    });
                }
            }
        }
        layer
    }

    fn from_defaults(file: &PolicyFile) -> Decisions {
        let mut layer = Decisions::default();
        for (key, setting) in file.defaults.iter() {
            let origin = Origin::Defaults {
                file: file.origin.clone(),
                line: setting.pos.line,
            };
            layer.set(key, setting.value, origin);
        }
        layer
    }

    fn built_in() -> Decisions {
        let mut layer = Decisions::default();
        for (key, value) in BUILT_IN {
            layer.set(key, value, Origin::BuiltIn);
        }
        layer
    }

    fn set(&mut self, key: Key, value: Value, origin: Origin) {
        self.by_key[key.index()] = Some(Source { key, value, origin });
    }

    /// Takes the lower-priority `layer`'s keys that no higher level set.
    fn fill_from(&mut self, layer: Decisions) {
        for (mine, theirs) in self.by_key.iter_mut().zip(layer.by_key) {
            if mine.is_none() {
                *mine = theirs;
            }
        }
    }

    /// Bounds win over everything, and an unset key takes its bound.
    fn clamp(&mut self, bounds: &Settings, file: &Arc<str>) {
        for (key, limit) in BOUND_KEYS {
            let Some(bound) = bounds.get(key) else {
                continue;
            };
            let current = self.by_key[key.index()].as_ref().map(|s| &s.value);
            if limit.excludes(&bound.value, current) {
                let origin = Origin::Bounds {
                    file: file.clone(),
                    line: bound.pos.line,
                };
                self.set(key, bound.value, origin);
            }
        }
    }

    fn value(&self, key: Key) -> Option<Value> {
        self.by_key[key.index()].as_ref().map(|s| s.value)
    }

    fn number(&self, key: Key) -> Option<u64> {
        self.value(key).and_then(Value::number)
    }

    fn into_resolved(self) -> Resolved {
        // Built-ins fill these keys, so the fallbacks only restate them.
        let version = !matches!(self.value(Key::Version), Some(Value::Bool(false)));
        let capture = match self.value(Key::Capture) {
            Some(Value::Capture(c)) => c,
            _ => Capture::Session,
        };
        let compression = match self.value(Key::Compression) {
            Some(Value::Level(n)) => n,
            _ => 3,
        };
        let retention = self.retention();
        Resolved {
            version,
            capture,
            compression,
            retention,
            sources: self.by_key.into_iter().flatten().collect(),
        }
    }

    fn retention(&self) -> Retention {
        Retention {
            protect_secs: self.number(Key::Protect).unwrap_or(0),
            min_count: self.number(Key::MinCount),
            max_count: self.number(Key::MaxCount),
            min_age_secs: self.number(Key::MinAge),
            max_age_secs: self.number(Key::MaxAge),
            min_space: self.number(Key::MinSpace),
            max_space: self.number(Key::MaxSpace),
            keep_last: self.number(Key::KeepLast),
            keep_hourly: self.number(Key::KeepHourly),
            keep_daily: self.number(Key::KeepDaily),
            keep_weekly: self.number(Key::KeepWeekly),
            keep_monthly: self.number(Key::KeepMonthly),
            keep_yearly: self.number(Key::KeepYearly),
            keep_within_secs: self.number(Key::KeepWithin),
        }
    }
}

fn rule_origin(file: &Arc<str>, rule: &Rule, line: u32) -> Origin {
    Origin::Rule {
        file: file.clone(),
        line,
        number: rule.number,
        name: rule.name.clone(),
    }
}

fn as_str<S: Serializer>(text: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(text)
}

fn as_opt_str<S: Serializer>(text: &Option<Arc<str>>, serializer: S) -> Result<S::Ok, S::Error> {
    match text {
        Some(text) => serializer.serialize_some(&**text),
        None => serializer.serialize_none(),
    }
}

fn as_display<S: Serializer>(value: &Value, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}
