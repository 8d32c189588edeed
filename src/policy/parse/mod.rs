//! Reading a policy file: TOML with exact positions for every problem.
//!
//! The document is parsed into toml's spanned tree and walked by hand
//! rather than deserialized into structs, so that one pass can report every
//! problem (serde stops at the first) with the position of the offending
//! key or value.

mod selector;
mod value;

use std::ops::Range;
use std::sync::Arc;

use toml::de::{DeString, DeTable, DeValue};
use toml::Spanned;

use super::error::{Lines, PolicyError};
use super::select::Selector;
use super::settings::{
    Capture, Key, Kind, Pos, Setting, Settings, Value, BOUND_KEYS, MIN_MAX_PAIRS,
};
use super::{Level, NamedPrincipal, PolicyFile, Rule};
use value::describe;

const FORMAT: u64 = 1;
const MAX_COMPRESSION: u64 = 19;

const TOP_KEYS: [&str; 4] = ["format", "defaults", "bounds", "rule"];

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
        names: Vec::new(),
    };
    let mut file = parser.document(doc.get_ref(), level);
    file.names = std::mem::take(&mut parser.names);
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
    names: Vec<NamedPrincipal>,
}

impl Parser<'_> {
    fn document(&mut self, doc: &DeTable<'_>, level: Level) -> PolicyFile {
        let mut file = PolicyFile {
            origin: Arc::from(self.origin),
            defaults: Settings::default(),
            bounds: Settings::default(),
            rules: Vec::new(),
            names: Vec::new(),
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
                self.error_at(min.pos, message);
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
            } else if let Some(k) = Key::from_name(name) {
                self.setting_into(&mut rule.settings, k, key, value);
            } else if !self.selector(&mut rule.selector, name, value) {
                self.unknown_key(key, "in [[rule]]", &rule_keys());
            }
        }
        self.check_min_max(&rule.settings, "rule");
        rule
    }

    // ---- reporting ----

    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.error_at(self.lines.pos(span.start), message);
    }

    fn error_at(&mut self, pos: Pos, message: impl Into<String>) {
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

fn setting_names() -> Vec<&'static str> {
    Key::ALL.iter().map(|k| k.name()).collect()
}

fn rule_keys() -> Vec<&'static str> {
    let mut keys = vec!["name"];
    keys.extend(selector::KEYS);
    keys.extend(setting_names());
    keys
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
