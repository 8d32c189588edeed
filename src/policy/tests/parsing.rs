use super::{errors, file, ORIGIN};
use crate::policy::settings::{Capture, Key, Value};
use std::path::Path;

use crate::policy::{check_file, Level};

const FULL: &str = r#"format = 1

[defaults]
version = true
capture = "session"
compression = 3
protect = "7d"
min-count = 1
max-count = 100
min-age = "1h"
max-age = "90d"
min-space = "10M"
max-space = "1G"
keep-last = 10
keep-hourly = 24
keep-daily = 7
keep-weekly = 4
keep-monthly = 12
keep-yearly = 3
keep-within = "2d"

[bounds]
min-count = 1
min-age = "1d"
protect = "7d"
max-count = 1000
max-age = "365d"
max-space = "10G"
version = "required"

[[rule]]
name = "objects"
paths = ["**/*.o", "target/**"]
exclude-paths = ["keep/**"]
names = ["*~", "*.swp"]
extensions = ["o", "tmp"]
users = ["alice", 1001]
groups = ["staff"]
processes = ["gcc", "cc1"]
size = { min = "0", max = "100M" }
time = { days = ["mon","tue","wed","thu","fri"], from = "09:00", to = "18:00" }
version = false

[[rule]]
extensions = ["txt"]
max-count = 3
capture = "every-write"
"#;

fn value(file: &crate::policy::PolicyFile, key: Key) -> Option<Value> {
    file.defaults.get(key).map(|s| s.value)
}

#[test]
fn full_file() {
    let f = file(FULL, Level::Admin);
    assert_eq!(f.origin(), ORIGIN);
    assert_eq!(f.rule_count(), 2);
    assert_eq!(value(&f, Key::Version), Some(Value::Bool(true)));
    assert_eq!(
        value(&f, Key::Capture),
        Some(Value::Capture(Capture::Session))
    );
    assert_eq!(value(&f, Key::Compression), Some(Value::Level(3)));
    assert_eq!(value(&f, Key::Protect), Some(Value::Duration(7 * 86400)));
    assert_eq!(value(&f, Key::MinSpace), Some(Value::Size(10 << 20)));
    assert_eq!(value(&f, Key::KeepWithin), Some(Value::Duration(2 * 86400)));
    assert_eq!(value(&f, Key::KeepYearly), Some(Value::Count(3)));
    let protect = f
        .defaults
        .get(Key::Protect)
        .map(|s| (s.pos.line, s.pos.column));
    assert_eq!(protect, Some((7, 1)));

    assert_eq!(
        f.bounds.get(Key::Version).map(|s| s.value),
        Some(Value::Bool(true))
    );
    assert_eq!(
        f.bounds.get(Key::MaxSpace).map(|s| s.value),
        Some(Value::Size(10 << 30))
    );

    let objects = &f.rules[0];
    assert_eq!(objects.name.as_deref(), Some("objects"));
    assert_eq!(objects.number, 1);
    assert!(objects.selector.paths.is_some() && objects.selector.time.is_some());
    assert_eq!(
        objects.settings.get(Key::Version).map(|s| s.value),
        Some(Value::Bool(false))
    );
    let texts = &f.rules[1];
    assert_eq!((texts.name.as_deref(), texts.number), (None, 2));
    assert_eq!(
        texts.settings.get(Key::MaxCount).map(|s| s.pos.line),
        Some(46)
    );
}

#[test]
fn user_file_with_rules_only() {
    let f = file(
        "format = 1\n[[rule]]\npaths = [\"*\"]\nkeep-last = 2\n",
        Level::User,
    );
    assert_eq!(f.rule_count(), 1);
    assert!(f.defaults.is_empty() && f.bounds.is_empty());
}

#[test]
fn empty_file_is_valid() {
    assert_eq!(file("", Level::Admin).rule_count(), 0);
    assert_eq!(file("# nothing yet\n", Level::User).rule_count(), 0);
}

#[test]
fn integers_for_sizes_and_durations() {
    let f = file(
        "[defaults]\nmax-space = 4096\nmax-age = 3600\n",
        Level::Admin,
    );
    assert_eq!(value(&f, Key::MaxSpace), Some(Value::Size(4096)));
    assert_eq!(value(&f, Key::MaxAge), Some(Value::Duration(3600)));
}

#[test]
fn syntax_error() {
    assert_eq!(
        errors("format = 1\nversion = \n", Level::Admin),
        ["p.toml:2:11: invalid TOML: string values must be quoted, expected literal string"]
    );
    assert_eq!(
        errors("[defaults]\nmax-count = 1\nmax-count = 2\n", Level::Admin),
        ["p.toml:3:1: invalid TOML: duplicate key"]
    );
}

#[test]
fn unknown_keys() {
    let text = "[[rule]]\nname = \"x\"\nmax-cout = 3\n";
    assert_eq!(
        errors(text, Level::Admin),
        ["p.toml:3:1: unknown key 'max-cout' in [[rule]] (did you mean 'max-count'?)"]
    );
    assert_eq!(
        errors("[defaults]\ncolour = \"red\"\n", Level::Admin),
        [
            "p.toml:2:1: unknown key 'colour' in [defaults] (expected one of: version, \
             capture, compression, protect, min-count, max-count, min-age, max-age, \
             min-space, max-space, keep-last, keep-hourly, keep-daily, keep-weekly, \
             keep-monthly, keep-yearly, keep-within)"
        ]
    );
    assert_eq!(
        errors("[[rules]]\n", Level::Admin),
        ["p.toml:1:3: unknown key 'rules' at the top level (did you mean 'rule'?)"]
    );
    assert_eq!(
        errors("[bounds]\nmin-space = \"1M\"\n", Level::Admin),
        [
            "p.toml:2:1: 'min-space' cannot be bounded (bounds exist for: min-count, \
             min-age, protect, max-count, max-age, max-space, version)"
        ]
    );
    assert_eq!(
        errors(
            "[[rule]]\nsize = { minimum = 3 }\ntime = { day = [\"mon\"] }\n",
            Level::Admin
        ),
        [
            "p.toml:2:10: unknown key 'minimum' in 'size' (expected one of: min, max)",
            "p.toml:3:10: unknown key 'day' in 'time' (did you mean 'days'?)",
        ]
    );
}

#[test]
fn wrong_types() {
    let text = "[[rule]]\n\
                max-count = \"3\"\n\
                version = \"no\"\n\
                paths = \"*.o\"\n\
                users = [\"bob\", 1.5]\n\
                name = 7\n";
    assert_eq!(
        errors(text, Level::Admin),
        [
            "p.toml:2:13: 'max-count' must be a non-negative integer, found string",
            "p.toml:3:11: 'version' must be true or false, found string",
            "p.toml:4:9: 'paths' must be a list, found string",
            "p.toml:5:17: 'users' must be a name or a numeric id, found float",
            "p.toml:6:8: 'name' must be a string, found integer",
        ]
    );
    assert_eq!(
        errors("[defaults]\nmax-count = -1\nmax-age = true\n", Level::Admin),
        [
            "p.toml:2:13: 'max-count' must be a non-negative integer, found -1",
            "p.toml:3:11: 'max-age' must be a duration such as \"7d\" or a number of \
             seconds, found boolean",
        ]
    );
    assert_eq!(
        errors("defaults = 3\n[rule]\n", Level::Admin),
        [
            "p.toml:1:12: 'defaults' must be a table, found integer",
            "p.toml:2:1: 'rule' must be written [[rule]] (an array of tables), found table",
        ]
    );
}

#[test]
fn bad_values() {
    let text = r#"[[rule]]
max-space = "10X"
max-age = "3x"
min-age = "1d12"
paths = ["ok/**", "a/[b", "/abs/*"]
extensions = [".o"]
groups = [-1]
time = { days = ["mon", "funday"], from = "9h", to = "18:00" }
processes = ["a-very-long-process-name"]
capture = "always"
names = ["build/*.o"]
"#;
    assert_eq!(
        errors(text, Level::Admin),
        [
            "p.toml:2:13: invalid size \"10X\" for 'max-space': unknown unit 'X' \
             (expected K, M, G or T, optionally followed by B or iB)",
            "p.toml:3:11: invalid duration \"3x\" for 'max-age': unknown unit 'x' \
             (expected s, m, h, d, w or y)",
            "p.toml:4:11: invalid duration \"1d12\" for 'min-age': 12 has no unit \
             (expected s, m, h, d, w or y)",
            "p.toml:5:19: invalid glob \"a/[b\" in 'paths': unclosed character class; \
             missing ']'",
            "p.toml:5:27: 'paths' globs are relative to the mount root: write \"abs/*\"",
            "p.toml:6:15: extensions are written without the dot: \"o\"",
            "p.toml:7:11: 'groups' ids must be from 0 to 4294967295, found -1",
            "p.toml:8:25: unknown day \"funday\" in 'days' (expected mon, tue, wed, thu, \
             fri, sat, sun)",
            "p.toml:8:43: invalid time \"9h\" for 'from': expected HH:MM, from 00:00 to 23:59",
            "p.toml:9:14: process name \"a-very-long-process-name\" can never match: the \
             kernel shortens process names to 15 bytes (\"a-very-long-pro\")",
            "p.toml:10:11: 'capture' must be one of \"session\", \"every-write\", \
             \"interval\", found \"always\"",
            "p.toml:11:10: 'names' globs see only the final component, which has no '/': \
             put \"build/*.o\" in 'paths'",
        ]
    );
}

#[test]
fn admin_sections_in_a_user_file() {
    let text = "format = 1\n\n[defaults]\nversion = false\n\n[bounds]\nmin-count = 1\n";
    assert_eq!(
        errors(text, Level::User),
        [
            "p.toml:3:1: [defaults] is only allowed in the administrator's policy file",
            "p.toml:6:1: [bounds] is only allowed in the administrator's policy file",
        ]
    );
}

#[test]
fn contradictions() {
    let text = r#"[[rule]]
min-count = 5
max-count = 3
min-age = "2d"
max-age = "1d"
min-space = "2G"
max-space = "1G"
time = { from = "09:00", to = "09:00" }
size = { min = "2M", max = "1M" }
"#;
    assert_eq!(
        errors(text, Level::Admin),
        [
            "p.toml:2:1: contradictory rule: min-count 5 is greater than max-count 3 (line 3)",
            "p.toml:4:1: contradictory rule: min-age 2d is greater than max-age 1d (line 5)",
            "p.toml:6:1: contradictory rule: min-space 2G is greater than max-space 1G (line 7)",
            "p.toml:8:31: empty time window: 'from' and 'to' are both 09:00",
            "p.toml:9:8: empty size range: min 2M is greater than max 1M",
        ]
    );
    assert_eq!(
        errors("[bounds]\nmin-count = 10\nmax-count = 5\n", Level::Admin),
        ["p.toml:2:1: contradictory [bounds]: min-count 10 is greater than max-count 5 (line 3)"]
    );
    assert_eq!(
        errors("[[rule]]\ntime = { from = \"09:00\" }\n", Level::Admin),
        ["p.toml:2:8: 'time' needs both 'from' and 'to'"]
    );
}

#[test]
fn compression_and_format() {
    assert_eq!(
        errors(
            "format = 2\n[defaults]\ncompression = 0\n[[rule]]\ncompression = 20\n",
            Level::Admin
        ),
        [
            "p.toml:1:10: unsupported format 2 (this chronofs reads format 1)",
            "p.toml:3:15: 'compression' must be a zstd level from 1 to 19, found 0",
            "p.toml:5:15: 'compression' must be a zstd level from 1 to 19, found 20",
        ]
    );
    assert_eq!(
        errors("[bounds]\nversion = true\n", Level::Admin),
        ["p.toml:2:11: 'version' in [bounds] must be \"required\" or \"optional\", found true"]
    );
}

#[test]
fn columns_count_characters() {
    assert_eq!(
        errors("[[rule]]\nname = \"żółw\"; x = 1\n", Level::Admin),
        ["p.toml:2:14: invalid TOML: unexpected key or value, expected newline, `#`"]
    );
}

#[test]
fn unreadable_file() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("missing.toml");
    let errors = check_file(&path, Level::Admin).map(|_| ()).unwrap_err();
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [format!(
            "{}: cannot read: No such file or directory (os error 2)",
            path.display()
        )]
    );
    Ok(())
}

#[test]
fn check_file_reads_and_parses() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, FULL)?;
    let parsed =
        check_file(&path, Level::Admin).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
    assert_eq!(parsed.origin(), path.display().to_string());
    std::fs::write(&path, "[[rule]]\nmax-count = \"x\"\n")?;
    let errors = check_file(&path, Level::Admin).map(|_| ()).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{}:2:13: 'max-count' must be a non-negative integer, found string",
            path.display()
        )
    );
    Ok(())
}

/// The root daemon reads files users own: none may block it or fill its
/// memory.
#[test]
fn refuses_special_and_huge_files() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let fifo = dir.path().join("fifo.toml");
    crate::sys::mkfifo(&fifo, 0o600)?;
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)?.set_len(300 << 20)?;
    let cases = [
        (fifo.as_path(), "not a regular file"),
        (Path::new("/dev/zero"), "not a regular file"),
        (
            huge.as_path(),
            "larger than 1024 KiB, the most a policy file may be",
        ),
    ];
    for (path, why) in cases {
        let errors = check_file(path, Level::Admin).map(|_| ()).unwrap_err();
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [format!("{}: cannot read: {why}", path.display())]
        );
    }
    Ok(())
}
