//! Reading a policy file: TOML with exact positions for every problem.
//!
//! The document is parsed into toml's spanned tree and walked by hand
//! rather than deserialized into structs, so that one pass can report every
//! problem (serde stops at the first) with the position of the offending
//! key or value.

use std::ops::Range;
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use toml::de::{DeInteger, DeString, DeTable, DeValue};
use toml::Spanned;

use super::error::{Lines, PolicyError};
use super::select::{Minute, Principal, Selector, SizeRange, TimeWindow};
use super::settings::{
    Capture, Key, Kind, Pos, Setting, Settings, Value, BOUND_KEYS, MIN_MAX_PAIRS,
};
use super::units::{format_size, parse_duration, parse_size, UnitError};
use super::{Level, PolicyFile, Rule};

const FORMAT: u64 = 1;
const MAX_COMPRESSION: u64 = 19;
/// The kernel truncates a process's comm name to this many bytes.
const COMM_LEN: usize = 15;

const TOP_KEYS: [&str; 4] = ["format", "defaults", "bounds", "rule"];
const SELECTOR_KEYS: [&str; 9] = [
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

type Entry<'a, 'i> = (&'a Spanned<DeString<'i>>, &'a Spanned<DeValue<'i>>);

/// Parses one policy file. `origin` names it in errors and in `explain`.
pub fn parse(text: &str, origin: &str, level: Level) -> Result<PolicyFile, Vec<PolicyError>> {
    let lines = Lines::new(text);
    let doc = DeTable::parse(text).map_err(|e| {
        let pos = e.span().map_or(Pos::default(), |s| lines.pos(s.start));
        vec![PolicyError::at(
            origin,
            pos,
            format!("invalid TOML: {}", e.message()),
        )]
    })?;
    let mut parser = Parser {
        lines,
        origin,
        errors: Vec::new(),
    };
    let file = parser.document(doc.get_ref(), level);
    if parser.errors.is_empty() {
        Ok(file)
    } else {
        // Tables iterate in key order, not file order.
        parser.errors.sort_by_key(|e| (e.line, e.column));
        Err(parser.errors)
    }
}

struct Parser<'t> {
    lines: Lines<'t>,
    origin: &'t str,
    errors: Vec<PolicyError>,
}

impl Parser<'_> {
    fn document(&mut self, doc: &DeTable<'_>, level: Level) -> PolicyFile {
        let mut file = PolicyFile {
            origin: Arc::from(self.origin),
            defaults: Settings::default(),
            bounds: Settings::default(),
            rules: Vec::new(),
        };
        for (key, value) in doc {
            match (key.get_ref().as_ref(), level) {
                ("format", _) => self.format(value),
                ("rule", _) => file.rules = self.rules(value),
                ("defaults" | "bounds", Level::User) => self.error(
                    header_span(key, value),
                    format!(
                        "[{}] is only allowed in the administrator's policy file",
                        key.get_ref()
                    ),
                ),
                ("defaults", Level::Admin) => {
                    if let Some(table) = self.table(key, value) {
                        file.defaults = self.settings_table(table, "[defaults]");
                    }
                }
                ("bounds", Level::Admin) => {
                    if let Some(table) = self.table(key, value) {
                        file.bounds = self.bounds(table);
                    }
                }
                _ => {
                    let expected: &[&str] = match level {
                        Level::Admin => &TOP_KEYS,
                        Level::User => &["format", "rule"],
                    };
                    self.unknown_key(key, "at the top level", expected);
                }
            }
        }
        file
    }

    fn format(&mut self, value: &Spanned<DeValue<'_>>) {
        if let Some(n) = self.unsigned("format", value) {
            if n != FORMAT {
                self.error(
                    value.span(),
                    format!("unsupported format {n} (this chronofs reads format {FORMAT})"),
                );
            }
        }
    }

    // ---- [defaults] and [bounds] ----

    fn settings_table(&mut self, table: &DeTable<'_>, context: &str) -> Settings {
        let mut settings = Settings::default();
        for (key, value) in table {
            match Key::from_name(key.get_ref()) {
                Some(k) => self.setting_into(&mut settings, k, key, value),
                None => self.unknown_key(key, &format!("in {context}"), &setting_names()),
            }
        }
        self.check_min_max(&settings, context);
        settings
    }

    fn setting_into(
        &mut self,
        settings: &mut Settings,
        key: Key,
        name: &Spanned<DeString<'_>>,
        value: &Spanned<DeValue<'_>>,
    ) {
        if let Some(v) = self.setting_value(key, value) {
            let pos = self.lines.pos(name.span().start);
            settings.set(key, Setting { value: v, pos });
        }
    }

    fn bounds(&mut self, table: &DeTable<'_>) -> Settings {
        let mut bounds = Settings::default();
        for (name, value) in table {
            let key = BOUND_KEYS
                .iter()
                .map(|(k, _)| *k)
                .find(|k| k.name() == name.get_ref().as_ref());
            match key {
                Some(Key::Version) => {
                    if self.version_required(value) {
                        let pos = self.lines.pos(name.span().start);
                        let value = Value::Bool(true);
                        bounds.set(Key::Version, Setting { value, pos });
                    }
                }
                Some(k) => self.setting_into(&mut bounds, k, name, value),
                None => {
                    let expected: Vec<&str> = BOUND_KEYS.iter().map(|(k, _)| k.name()).collect();
                    if Key::from_name(name.get_ref()).is_some() {
                        let message = format!(
                            "'{}' cannot be bounded (bounds exist for: {})",
                            name.get_ref(),
                            expected.join(", ")
                        );
                        self.error(name.span(), message);
                    } else {
                        self.unknown_key(name, "in [bounds]", &expected);
                    }
                }
            }
        }
        self.check_min_max(&bounds, "[bounds]");
        bounds
    }

    fn version_required(&mut self, value: &Spanned<DeValue<'_>>) -> bool {
        match value.get_ref().as_str() {
            Some("required") => true,
            Some("optional") => false,
            _ => {
                let found = describe(value.get_ref());
                let message = format!(
                    "'version' in [bounds] must be \"required\" or \"optional\", found {found}"
                );
                self.error(value.span(), message);
                false
            }
        }
    }

    fn check_min_max(&mut self, settings: &Settings, context: &str) {
        for (min_key, max_key) in MIN_MAX_PAIRS {
            let (Some(min), Some(max)) = (settings.get(min_key), settings.get(max_key)) else {
                continue;
            };
            if min.value > max.value {
                let message = format!(
                    "contradictory {context}: {} {} is greater than {} {} (line {})",
                    min_key.name(),
                    min.value,
                    max_key.name(),
                    max.value,
                    max.pos.line
                );
                self.errors
                    .push(PolicyError::at(self.origin, min.pos, message));
            }
        }
    }

    fn setting_value(&mut self, key: Key, value: &Spanned<DeValue<'_>>) -> Option<Value> {
        let name = key.name();
        match key.kind() {
            Kind::Bool => match value.get_ref() {
                DeValue::Boolean(b) => Some(Value::Bool(*b)),
                _ => self.type_error(name, value, "true or false"),
            },
            Kind::Capture => self.capture(value).map(Value::Capture),
            Kind::Level => self.compression(value).map(Value::Level),
            Kind::Count => self.unsigned(name, value).map(Value::Count),
            Kind::Duration => self.duration(name, value).map(Value::Duration),
            Kind::Size => self.size(name, value).map(Value::Size),
        }
    }

    fn capture(&mut self, value: &Spanned<DeValue<'_>>) -> Option<Capture> {
        let found = value.get_ref().as_str();
        let capture = Capture::ALL.into_iter().find(|c| Some(c.name()) == found);
        if capture.is_none() {
            let names: Vec<String> = Capture::ALL
                .iter()
                .map(|c| format!("\"{}\"", c.name()))
                .collect();
            let message = format!(
                "'capture' must be one of {}, found {}",
                names.join(", "),
                describe(value.get_ref())
            );
            self.error(value.span(), message);
        }
        capture
    }

    fn compression(&mut self, value: &Spanned<DeValue<'_>>) -> Option<u8> {
        let level = self.unsigned("compression", value)?;
        match u8::try_from(level) {
            Ok(level) if (1..=MAX_COMPRESSION).contains(&u64::from(level)) => Some(level),
            _ => {
                let message = format!(
                    "'compression' must be a zstd level from 1 to {MAX_COMPRESSION}, found {level}"
                );
                self.error(value.span(), message);
                None
            }
        }
    }

    // ---- [[rule]] ----

    fn rules(&mut self, value: &Spanned<DeValue<'_>>) -> Vec<Rule> {
        let DeValue::Array(items) = value.get_ref() else {
            let message = format!(
                "'rule' must be written [[rule]] (an array of tables), found {}",
                value.get_ref().type_str()
            );
            self.error(value.span(), message);
            return Vec::new();
        };
        let mut rules = Vec::new();
        for (number, item) in (1..).zip(items.iter()) {
            match item.get_ref() {
                DeValue::Table(table) => rules.push(self.rule(number, table)),
                _ => {
                    self.type_error::<()>("rule", item, "a table");
                }
            }
        }
        rules
    }

    fn rule(&mut self, number: usize, table: &DeTable<'_>) -> Rule {
        let mut rule = Rule {
            number,
            name: None,
            selector: Selector::default(),
            settings: Settings::default(),
        };
        for (key, value) in table {
            let name = key.get_ref().as_ref();
            if name == "name" {
                rule.name = self.string("name", value).map(Arc::from);
            } else if SELECTOR_KEYS.contains(&name) {
                self.selector(&mut rule.selector, name, value);
            } else if let Some(k) = Key::from_name(name) {
                self.setting_into(&mut rule.settings, k, key, value);
            } else {
                self.unknown_key(key, "in [[rule]]", &rule_keys());
            }
        }
        self.check_min_max(&rule.settings, "rule");
        rule
    }

    fn selector(&mut self, selector: &mut Selector, name: &str, value: &Spanned<DeValue<'_>>) {
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
            _ => {}
        }
    }

    fn globs(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<GlobSet> {
        let mut builder = GlobSetBuilder::new();
        let mut ok = true;
        for item in self.array(key, value)? {
            let Some(pattern) = self.string(key, item) else {
                ok = false;
                continue;
            };
            match self.glob(key, pattern) {
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

    fn glob(&self, key: &str, pattern: &str) -> Result<globset::Glob, String> {
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
                DeValue::String(name) => Some(Principal::Name(name.to_string())),
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

    // ---- values ----

    fn table<'a, 'i>(
        &mut self,
        key: &Spanned<DeString<'_>>,
        value: &'a Spanned<DeValue<'i>>,
    ) -> Option<&'a DeTable<'i>> {
        match value.get_ref() {
            DeValue::Table(table) => Some(table),
            _ => self.type_error(key.get_ref(), value, "a table"),
        }
    }

    fn array<'a, 'i>(
        &mut self,
        key: &str,
        value: &'a Spanned<DeValue<'i>>,
    ) -> Option<&'a [Spanned<DeValue<'i>>]> {
        match value.get_ref() {
            DeValue::Array(items) => Some(items),
            _ => self.type_error(key, value, "a list"),
        }
    }

    /// A list of strings; `problem` names what is wrong with an entry.
    fn strings(
        &mut self,
        key: &str,
        value: &Spanned<DeValue<'_>>,
        problem: impl Fn(&str) -> Option<String>,
    ) -> Option<Vec<String>> {
        let mut list = Vec::new();
        let mut ok = true;
        for item in self.array(key, value)? {
            let Some(s) = self.string(key, item) else {
                ok = false;
                continue;
            };
            match problem(s) {
                Some(message) => {
                    self.error(item.span(), message);
                    ok = false;
                }
                None => list.push(s.to_string()),
            }
        }
        ok.then_some(list)
    }

    fn string<'a>(&mut self, key: &str, value: &'a Spanned<DeValue<'_>>) -> Option<&'a str> {
        match value.get_ref() {
            DeValue::String(s) => Some(s),
            _ => self.type_error(key, value, "a string"),
        }
    }

    fn unsigned(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<u64> {
        let DeValue::Integer(n) = value.get_ref() else {
            return self.type_error(key, value, "a non-negative integer");
        };
        let parsed = u64::from_str_radix(n.as_str(), n.radix()).ok();
        if parsed.is_none() {
            self.error(
                value.span(),
                format!("'{key}' must be a non-negative integer, found {n}"),
            );
        }
        parsed
    }

    fn size(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<u64> {
        match value.get_ref() {
            DeValue::Integer(_) => self.unsigned(key, value),
            DeValue::String(s) => self.unit(parse_size(s), "size", key, value),
            _ => self.type_error(key, value, "a size such as \"10M\" or a number of bytes"),
        }
    }

    fn duration(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<u64> {
        match value.get_ref() {
            DeValue::Integer(_) => self.unsigned(key, value),
            DeValue::String(s) => self.unit(parse_duration(s), "duration", key, value),
            _ => self.type_error(
                key,
                value,
                "a duration such as \"7d\" or a number of seconds",
            ),
        }
    }

    fn unit(
        &mut self,
        parsed: Result<u64, UnitError>,
        what: &str,
        key: &str,
        value: &Spanned<DeValue<'_>>,
    ) -> Option<u64> {
        parsed
            .map_err(|e| {
                let text = describe(value.get_ref());
                self.error(
                    value.span(),
                    format!("invalid {what} {text} for '{key}': {e}"),
                );
            })
            .ok()
    }

    // ---- reporting ----

    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        let pos = self.lines.pos(span.start);
        self.errors.push(PolicyError::at(self.origin, pos, message));
    }

    /// Reports a value of the wrong type; returns None for the caller's
    /// convenience.
    fn type_error<T>(
        &mut self,
        key: &str,
        value: &Spanned<DeValue<'_>>,
        expected: &str,
    ) -> Option<T> {
        let found = value.get_ref().type_str();
        self.error(
            value.span(),
            format!("'{key}' must be {expected}, found {found}"),
        );
        None
    }

    fn unknown_key(&mut self, key: &Spanned<DeString<'_>>, context: &str, expected: &[&str]) {
        let name = key.get_ref();
        let hint = match closest(name, expected) {
            Some(guess) => format!("did you mean '{guess}'?"),
            None => format!("expected one of: {}", expected.join(", ")),
        };
        self.error(
            key.span(),
            format!("unknown key '{name}' {context} ({hint})"),
        );
    }
}

/// Where a table starts: its `[header]` when it has one, else its key.
fn header_span(key: &Spanned<DeString<'_>>, value: &Spanned<DeValue<'_>>) -> Range<usize> {
    let start = key.span().start.min(value.span().start);
    start..key.span().end
}

/// A value as quoted in messages: strings in quotes, others by type.
fn describe(value: &DeValue<'_>) -> String {
    match value {
        DeValue::String(s) => format!("\"{s}\""),
        DeValue::Integer(n) => n.to_string(),
        DeValue::Boolean(b) => b.to_string(),
        other => other.type_str().to_string(),
    }
}

fn setting_names() -> Vec<&'static str> {
    Key::ALL.iter().map(|k| k.name()).collect()
}

fn rule_keys() -> Vec<&'static str> {
    let mut keys = vec!["name"];
    keys.extend(SELECTOR_KEYS);
    keys.extend(setting_names());
    keys
}

fn day_index(name: &str) -> Option<u8> {
    let name = name.to_ascii_lowercase();
    const LONG: [&str; 7] = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    (0u8..)
        .zip(DAYS.iter().zip(LONG))
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

/// The expected key a misspelling most likely meant, if any is close.
fn closest<'a>(name: &str, expected: &[&'a str]) -> Option<&'a str> {
    expected
        .iter()
        .map(|e| (edit_distance(name, e), *e))
        .filter(|(d, e)| *d <= 2 && *d < e.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, e)| e)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}
