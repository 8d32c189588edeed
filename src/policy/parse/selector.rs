//! Reading a rule's selectors.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use toml::de::{DeInteger, DeValue};
use toml::Spanned;

use super::Parser;
use crate::policy::select::{Minute, Principal, Selector, SizeRange, TimeWindow};
use crate::policy::units::format_size;
use crate::policy::NamedPrincipal;

pub(super) const KEYS: [&str; 9] = [
    "paths",
    "exclude-paths",
    "names",
    "extensions",
    "users",
    "groups",
    "processes",
    "size",
    "time",
];
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const LONG_DAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];
/// The kernel truncates a process's comm name to this many bytes.
const COMM_LEN: usize = 15;

impl Parser<'_> {
    /// Reads selector `name` into `selector`; false if `name` is no
    /// selector.
    pub(super) fn selector(
        &mut self,
        selector: &mut Selector,
        name: &str,
        value: &Spanned<DeValue<'_>>,
    ) -> bool {
        match name {
            "paths" => selector.paths = self.globs(name, value),
            "exclude-paths" => selector.exclude_paths = self.globs(name, value),
            "names" => selector.names = self.globs(name, value),
            "extensions" => selector.extensions = self.extensions(value),
            "users" => selector.users = self.principals(name, value),
            "groups" => selector.groups = self.principals(name, value),
            "processes" => selector.processes = self.processes(value),
            "size" => selector.size = self.size_range(value),
            "time" => selector.time = self.time_window(value),
            _ => return false,
        }
        true
    }

    fn globs(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<GlobSet> {
        let mut builder = GlobSetBuilder::new();
        let mut ok = true;
        for item in self.array(key, value)? {
            let Some(pattern) = self.string(key, item) else {
                ok = false;
                continue;
            };
            match glob(key, pattern) {
                Ok(glob) => {
                    builder.add(glob);
                }
                Err(message) => {
                    self.error(item.span(), message);
                    ok = false;
                }
            }
        }
        let set = builder.build();
        if let Err(e) = &set {
            self.error(value.span(), format!("'{key}': {e}"));
        }
        set.ok().filter(|_| ok)
    }

    fn extensions(&mut self, value: &Spanned<DeValue<'_>>) -> Option<Vec<String>> {
        self.strings("extensions", value, |ext| {
            ext.strip_prefix('.')
                .map(|bare| format!("extensions are written without the dot: \"{bare}\""))
        })
    }

    fn processes(&mut self, value: &Spanned<DeValue<'_>>) -> Option<Vec<String>> {
        self.strings("processes", value, |name| {
            (name.len() > COMM_LEN).then(|| {
                format!(
                    "process name \"{name}\" can never match: the kernel shortens \
                     process names to {COMM_LEN} bytes (\"{}\")",
                    truncate(name, COMM_LEN)
                )
            })
        })
    }

    fn principals(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<Vec<Principal>> {
        let mut list = Vec::new();
        let mut ok = true;
        for item in self.array(key, value)? {
            let principal = match item.get_ref() {
                DeValue::String(name) => {
                    self.names.push(NamedPrincipal {
                        group: key == "groups",
                        name: name.to_string(),
                        at: self.lines.pos(item.span().start),
                    });
                    Some(Principal::Name(name.to_string()))
                }
                DeValue::Integer(id) => self.id(key, item, id).map(Principal::Id),
                _ => self.type_error(key, item, "a name or a numeric id"),
            };
            ok &= principal.is_some();
            list.extend(principal);
        }
        ok.then_some(list)
    }

    fn id(&mut self, key: &str, item: &Spanned<DeValue<'_>>, id: &DeInteger<'_>) -> Option<u32> {
        let parsed = u32::from_str_radix(id.as_str(), id.radix()).ok();
        if parsed.is_none() {
            let message = format!("'{key}' ids must be from 0 to {}, found {id}", u32::MAX);
            self.error(item.span(), message);
        }
        parsed
    }

    fn size_range(&mut self, value: &Spanned<DeValue<'_>>) -> Option<SizeRange> {
        let DeValue::Table(table) = value.get_ref() else {
            return self.type_error(
                "size",
                value,
                "a table such as { min = \"0\", max = \"100M\" }",
            );
        };
        let mut range = SizeRange::default();
        let mut ok = true;
        for (key, item) in table {
            let bound = match key.get_ref().as_ref() {
                "min" => &mut range.min,
                "max" => &mut range.max,
                _ => {
                    self.unknown_key(key, "in 'size'", &["min", "max"]);
                    ok = false;
                    continue;
                }
            };
            *bound = self.size(key.get_ref(), item);
            ok &= bound.is_some();
        }
        if let (Some(min), Some(max)) = (range.min, range.max) {
            if min > max {
                let message = format!(
                    "empty size range: min {} is greater than max {}",
                    format_size(min),
                    format_size(max)
                );
                self.error(value.span(), message);
                ok = false;
            }
        }
        ok.then_some(range)
    }

    fn time_window(&mut self, value: &Spanned<DeValue<'_>>) -> Option<TimeWindow> {
        let DeValue::Table(table) = value.get_ref() else {
            return self.type_error(
                "time",
                value,
                "a table such as { from = \"09:00\", to = \"18:00\" }",
            );
        };
        let mut window = TimeWindow::default();
        let (mut from, mut to) = (None, None);
        let mut ok = true;
        for (key, item) in table {
            match key.get_ref().as_ref() {
                "days" => {
                    window.days = self.days(item);
                    ok &= window.days.is_some();
                }
                "from" => {
                    from = self.time_of_day("from", item);
                    ok &= from.is_some();
                }
                "to" => {
                    to = self.time_of_day("to", item).map(|t| (t, item.span()));
                    ok &= to.is_some();
                }
                _ => {
                    self.unknown_key(key, "in 'time'", &["days", "from", "to"]);
                    ok = false;
                }
            }
        }
        if !ok {
            return None;
        }
        match (from, to) {
            (Some(from), Some((to, span))) if from == to => {
                let message = format!("empty time window: 'from' and 'to' are both {}", hh_mm(to));
                self.error(span, message);
                return None;
            }
            (Some(from), Some((to, _))) => window.hours = Some((from, to)),
            (None, None) => {}
            _ => {
                self.error(value.span(), "'time' needs both 'from' and 'to'");
                return None;
            }
        }
        Some(window)
    }

    fn days(&mut self, value: &Spanned<DeValue<'_>>) -> Option<u8> {
        let mut days = 0u8;
        let mut ok = true;
        for item in self.array("days", value)? {
            let Some(name) = self.string("days", item) else {
                ok = false;
                continue;
            };
            match day_index(name) {
                Some(day) => days |= 1 << day,
                None => {
                    let message = format!(
                        "unknown day \"{name}\" in 'days' (expected {})",
                        DAYS.join(", ")
                    );
                    self.error(item.span(), message);
                    ok = false;
                }
            }
        }
        ok.then_some(days)
    }

    fn time_of_day(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<Minute> {
        let text = self.string(key, value)?;
        let minute = parse_hh_mm(text);
        if minute.is_none() {
            let message =
                format!("invalid time \"{text}\" for '{key}': expected HH:MM, from 00:00 to 23:59");
            self.error(value.span(), message);
        }
        minute
    }
}

/// Compiles one glob of `paths`, `exclude-paths` or `names`, rejecting
/// patterns that could never match.
fn glob(key: &str, pattern: &str) -> Result<Glob, String> {
    if key == "names" && pattern.contains('/') {
        return Err(format!(
            "'names' globs see only the final component, which has no '/': \
             put \"{pattern}\" in 'paths'"
        ));
    }
    if key != "names" && pattern.starts_with('/') {
        return Err(format!(
            "'{key}' globs are relative to the mount root: write \"{}\"",
            pattern.trim_start_matches('/')
        ));
    }
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("invalid glob \"{pattern}\" in '{key}': {}", e.kind()))
}

fn day_index(name: &str) -> Option<u8> {
    let name = name.to_ascii_lowercase();
    (0u8..)
        .zip(DAYS.iter().zip(LONG_DAYS))
        .find(|(_, (short, long))| name == **short || name == *long)
        .map(|(i, _)| i)
}

/// "09:00" → minutes since midnight.
fn parse_hh_mm(text: &str) -> Option<Minute> {
    let (hours, minutes) = text.split_once(':')?;
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !(1..=2).contains(&hours.len())
        || !hours.bytes().all(|b| b.is_ascii_digit())
        || !two_digits(minutes)
    {
        return None;
    }
    let (h, m): (Minute, Minute) = (hours.parse().ok()?, minutes.parse().ok()?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

fn hh_mm(minute: Minute) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

fn truncate(text: &str, max: usize) -> &str {
    let end = (0..=max.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    &text[..end]
}
