use jiff::civil::{date, DateTime};

use super::{file, subject};
use crate::policy::{Level, Subject};

/// Whether a rule with the given selector lines matches `s`.
fn matches(selectors: &str, s: &Subject) -> bool {
    let f = file(
        &format!("[[rule]]\n{selectors}\nversion = false\n"),
        Level::Admin,
    );
    f.rules[0].selector.matches(s)
}

fn at(path: &str) -> Subject<'_> {
    subject(path)
}

// 2024-06-03 is a Monday.
fn monday(hour: i8, minute: i8) -> DateTime {
    date(2024, 6, 3).at(hour, minute, 0, 0)
}

#[test]
fn no_selectors_match_everything() {
    assert!(matches("", &at("")));
    assert!(matches("", &at("a/b/c")));
}

#[test]
fn path_globs_respect_separators() {
    let top = r#"paths = ["*.o"]"#;
    assert!(matches(top, &at("main.o")));
    assert!(!matches(top, &at("src/main.o")));
    let anywhere = r#"paths = ["**/*.o"]"#;
    assert!(matches(anywhere, &at("main.o")));
    assert!(matches(anywhere, &at("src/deep/main.o")));
    assert!(!matches(anywhere, &at("src/main.c")));
    let tree = r#"paths = ["target/**"]"#;
    assert!(matches(tree, &at("target/debug/app")));
    assert!(!matches(tree, &at("target")));
    assert!(!matches(tree, &at("src/target/x")));
}

#[test]
fn exclude_paths_win() {
    let sel = "paths = [\"**/*.o\"]\nexclude-paths = [\"keep/**\"]";
    assert!(matches(sel, &at("build/a.o")));
    assert!(!matches(sel, &at("keep/a.o")));
    assert!(matches("exclude-paths = [\"keep/**\"]", &at("other")));
}

#[test]
fn names_look_at_the_final_component() {
    let sel = r#"names = ["*~", "*.swp"]"#;
    assert!(matches(sel, &at("notes.txt~")));
    assert!(matches(sel, &at("deep/dir/.notes.txt.swp")));
    assert!(!matches(sel, &at("dir~/notes.txt")));
}

#[test]
fn extensions_are_exact() {
    let sel = r#"extensions = ["o", "tmp"]"#;
    assert!(matches(sel, &at("a/b.o")));
    assert!(matches(sel, &at("x.tar.tmp")));
    assert!(!matches(sel, &at("b.O")));
    assert!(!matches(sel, &at("o")));
    assert!(!matches(sel, &at("dir.o/file")));
}

#[test]
fn empty_lists_match_nothing() {
    assert!(!matches("paths = []", &at("a")));
    assert!(!matches("users = []", &at("a")));
}

#[test]
fn users_and_groups_by_name_or_id() {
    let s = at("f");
    assert!(matches(r#"users = ["alice"]"#, &s));
    assert!(matches("users = [1000]", &s));
    assert!(matches(r#"users = ["bob", 1000]"#, &s));
    assert!(!matches(r#"users = ["bob", 1001]"#, &s));
    assert!(matches(r#"groups = ["staff"]"#, &s));
    assert!(matches("groups = [100]", &s));
    assert!(!matches(r#"groups = ["wheel", 0]"#, &s));
    let nameless = Subject {
        owner_name: None,
        group_name: None,
        ..s
    };
    assert!(!matches(r#"users = ["alice"]"#, &nameless));
    assert!(matches("users = [1000]", &nameless));
}

#[test]
fn processes_need_a_known_caller() {
    let sel = r#"processes = ["gcc", "cc1"]"#;
    assert!(!matches(sel, &at("a.o")));
    let gcc = Subject {
        process: Some("cc1"),
        ..at("a.o")
    };
    assert!(matches(sel, &gcc));
    let vim = Subject {
        process: Some("vim"),
        ..at("a.o")
    };
    assert!(!matches(sel, &vim));
}

#[test]
fn size_ranges_are_inclusive() {
    let sel = r#"size = { min = "1K", max = 2048 }"#;
    let sized = |size| Subject { size, ..at("f") };
    assert!(!matches(sel, &sized(1023)));
    assert!(matches(sel, &sized(1024)));
    assert!(matches(sel, &sized(2048)));
    assert!(!matches(sel, &sized(2049)));
    assert!(matches(r#"size = { min = "1M" }"#, &sized(u64::MAX)));
    assert!(matches("size = { max = 0 }", &sized(0)));
}

#[test]
fn time_windows() {
    let sel = r#"time = { days = ["mon","tue","wed","thu","fri"], from = "09:00", to = "18:00" }"#;
    let when = |t| Subject {
        local_time: Some(t),
        ..at("f")
    };
    assert!(!matches(sel, &at("f")), "no change time: no match");
    assert!(matches(sel, &when(monday(9, 0))));
    assert!(matches(sel, &when(monday(17, 59))));
    assert!(!matches(sel, &when(monday(18, 0))));
    assert!(!matches(sel, &when(monday(8, 59))));
    let saturday = date(2024, 6, 8).at(12, 0, 0, 0);
    assert!(!matches(sel, &when(saturday)));
    assert!(matches(
        r#"time = { days = ["Sat", "sunday"] }"#,
        &when(saturday)
    ));
}

#[test]
fn time_windows_wrap_past_midnight() {
    let nightly = r#"time = { from = "22:00", to = "06:00" }"#;
    let when = |t| Subject {
        local_time: Some(t),
        ..at("f")
    };
    assert!(matches(nightly, &when(monday(23, 30))));
    assert!(matches(nightly, &when(monday(0, 0))));
    assert!(matches(nightly, &when(monday(5, 59))));
    assert!(!matches(nightly, &when(monday(6, 0))));
    assert!(!matches(nightly, &when(monday(12, 0))));
    // Friday night runs into Saturday morning, not into Friday morning.
    let friday_night = r#"time = { days = ["fri"], from = "22:00", to = "06:00" }"#;
    let friday = date(2024, 6, 7);
    let saturday = date(2024, 6, 8);
    assert!(matches(friday_night, &when(friday.at(23, 0, 0, 0))));
    assert!(matches(friday_night, &when(saturday.at(2, 0, 0, 0))));
    assert!(!matches(friday_night, &when(friday.at(2, 0, 0, 0))));
    assert!(!matches(friday_night, &when(saturday.at(23, 0, 0, 0))));
}

#[test]
fn every_selector_must_match() {
    let sel = "paths = [\"src/**\"]\nusers = [\"alice\"]\nextensions = [\"c\"]";
    assert!(matches(sel, &at("src/main.c")));
    assert!(!matches(sel, &at("src/main.h")));
    let bobs = Subject {
        owner_uid: 1001,
        owner_name: Some("bob"),
        ..at("src/main.c")
    };
    assert!(!matches(sel, &bobs));
}

/// A subject whose path is arbitrary bytes.
fn at_bytes(path: &[u8]) -> Subject<'_> {
    Subject { path, ..at("") }
}

#[test]
fn globs_match_the_bytes_of_names_that_are_not_utf8() {
    // One byte 0xff is one character for `?`: a lossy U+FFFD would be
    // three bytes, and two distinct names would become one.
    let one = r#"paths = ["a/?.o"]"#;
    assert!(matches(one, &at_bytes(b"a/\xff.o")));
    assert!(!matches(one, &at_bytes(b"a/\xff\xfe.o")));
    let names = r#"names = ["*.swp"]"#;
    assert!(matches(names, &at_bytes(b"d\xff/x\xfe.swp")));
    assert!(!matches(names, &at_bytes(b"d\xff.swp/x")));
    let newline = r#"paths = ["keep/**"]"#;
    assert!(matches(newline, &at_bytes(b"keep/a\nb")));
    assert!(matches(r#"extensions = ["tmp"]"#, &at_bytes(b"x\xff.tmp")));
    // A truncated UTF-8 sequence is two bytes, one U+FFFD when lossy.
    assert!(matches(r#"paths = ["??.o"]"#, &at_bytes(b"\xe2\x82.o")));
    assert!(!matches(r#"paths = ["?.o"]"#, &at_bytes(b"\xe2\x82.o")));
    // A glob naming U+FFFD itself does not catch a name that is not UTF-8.
    assert!(!matches("paths = [\"a/\u{fffd}\"]", &at_bytes(b"a/\xff")));
}
