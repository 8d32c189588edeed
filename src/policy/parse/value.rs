//! Reading scalar values and lists, reporting wrong types in place.

use toml::de::{DeString, DeTable, DeValue};
use toml::Spanned;

use super::Parser;
use crate::policy::units::{parse_duration, parse_size, UnitError};

impl Parser<'_> {
    pub(super) fn table<'a, 'i>(
        &mut self,
        key: &Spanned<DeString<'_>>,
        value: &'a Spanned<DeValue<'i>>,
    ) -> Option<&'a DeTable<'i>> {
        match value.get_ref() {
            DeValue::Table(table) => Some(table),
            _ => self.type_error(key.get_ref(), value, "a table"),
        }
    }

    pub(super) fn array<'a, 'i>(
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
    pub(super) fn strings(
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

    pub(super) fn string<'a>(
        &mut self,
        key: &str,
        value: &'a Spanned<DeValue<'_>>,
    ) -> Option<&'a str> {
        match value.get_ref() {
            DeValue::String(s) => Some(s),
            _ => self.type_error(key, value, "a string"),
        }
    }

    pub(super) fn unsigned(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<u64> {
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

    pub(super) fn size(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<u64> {
        match value.get_ref() {
            DeValue::Integer(_) => self.unsigned(key, value),
            DeValue::String(s) => self.unit(parse_size(s), "size", key, value),
            _ => self.type_error(key, value, "a size such as \"10M\" or a number of bytes"),
        }
    }

    pub(super) fn duration(&mut self, key: &str, value: &Spanned<DeValue<'_>>) -> Option<u64> {
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
}

/// A value as quoted in messages: strings in quotes, others by type.
pub(super) fn describe(value: &DeValue<'_>) -> String {
    match value {
        DeValue::String(s) => format!("\"{s}\""),
        DeValue::Integer(n) => n.to_string(),
        DeValue::Boolean(b) => b.to_string(),
        other => other.type_str().to_string(),
    }
}
