//! Unit tests of the policy module, one file per part.

mod parsing;
mod resolution;
mod retention;
mod selection;
mod units;

use super::{parse, Level, PolicyFile, Subject};

const ORIGIN: &str = "p.toml";

/// Parses a file that must be valid.
fn file(text: &str, level: Level) -> PolicyFile {
    match parse(text, ORIGIN, level) {
        Ok(file) => file,
        Err(errors) => panic!("unexpected errors: {errors:#?}"),
    }
}

/// The displayed errors of a file that must be invalid.
fn errors(text: &str, level: Level) -> Vec<String> {
    match parse(text, ORIGIN, level) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

/// A 100-byte file owned by alice (1000) of group staff (100).
fn subject(path: &str) -> Subject<'_> {
    Subject {
        path: path.as_bytes(),
        is_dir: false,
        size: 100,
        owner_uid: 1000,
        owner_gid: 100,
        owner_name: Some("alice"),
        group_name: Some("staff"),
        process: None,
        local_time: None,
    }
}
