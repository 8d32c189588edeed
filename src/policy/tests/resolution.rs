use super::{file, subject};
use crate::policy::{parse, Capture, Level, Origin, Policy, PolicyFile, Resolved, Subject};

const ADMIN: &str = "/etc/chronofs/policy.toml";
const ALICE: &str = "/home/alice/.config/chronofs/policy.toml";

fn named(text: &str, origin: &str, level: Level) -> PolicyFile {
    match parse(text, origin, level) {
        Ok(f) => f,
        Err(e) => panic!("{e:#?}"),
    }
}

fn policy(admin: &str, alice: &str) -> Policy {
    Policy::new(
        Some(named(admin, ADMIN, Level::Admin)),
        vec![(1000, named(alice, ALICE, Level::User))],
    )
}

const LEVELS_ADMIN: &str = r#"[defaults]
max-count = 50
capture = "interval"
compression = 5

[[rule]]
name = "objects"
extensions = ["o"]
version = false

[[rule]]
paths = ["logs/**"]
max-count = 20
"#;

const LEVELS_ALICE: &str = r#"[[rule]]
name = "texts"
extensions = ["txt", "o", "log"]
max-count = 3
version = true
"#;

fn origin_of(r: &Resolved, key: &str) -> String {
    r.sources
        .iter()
        .find(|s| s.key.name() == key)
        .map_or_else(|| "unset".to_string(), |s| s.origin.to_string())
}

#[test]
fn admin_rules_beat_user_rules_beat_admin_defaults() {
    let p = policy(LEVELS_ADMIN, LEVELS_ALICE);

    let object = p.resolve(&subject("a.o"));
    assert!(
        !object.version,
        "the admin rule beats alice's version = true"
    );
    assert_eq!(
        object.retention.max_count,
        Some(3),
        "alice's rule beats the defaults"
    );
    assert_eq!(object.capture, Capture::Interval);
    assert_eq!(object.compression, 5);

    let log = p.resolve(&subject("logs/today.log"));
    assert_eq!(
        log.retention.max_count,
        Some(20),
        "admin rule over alice's stricter 3"
    );
    assert_eq!(
        origin_of(&log, "max-count"),
        format!("rule #2 at {ADMIN}:13")
    );

    let other = p.resolve(&subject("README"));
    assert!(other.version);
    assert_eq!(other.retention.max_count, Some(50));
    assert_eq!(
        origin_of(&other, "max-count"),
        format!("defaults ({ADMIN}:2)")
    );
    assert_eq!(origin_of(&other, "version"), "built-in");
}

#[test]
fn user_rules_apply_to_their_owner_only() {
    let p = policy(LEVELS_ADMIN, LEVELS_ALICE);
    let bobs = Subject {
        owner_uid: 1001,
        owner_name: Some("bob"),
        ..subject("notes.txt")
    };
    assert_eq!(p.resolve(&bobs).retention.max_count, Some(50));
    let alices = p.resolve(&subject("notes.txt"));
    assert_eq!(alices.retention.max_count, Some(3));
    assert_eq!(
        origin_of(&alices, "max-count"),
        format!("rule \"texts\" ({ALICE}:4)")
    );
}

#[test]
fn the_most_restrictive_value_wins_within_a_level() {
    let admin = r#"
[[rule]]
version = true
min-count = 2
max-count = 5
capture = "interval"
compression = 9
min-age = "1h"
max-age = "10d"
keep-daily = 7
keep-within = "1d"
protect = "3h"
min-space = "1M"
max-space = "100M"

[[rule]]
version = false
min-count = 4
max-count = 10
capture = "every-write"
compression = 4
min-age = "2h"
max-age = "30d"
keep-daily = 3
keep-within = "2d"
protect = "1h"
min-space = "2M"
max-space = "1G"

[[rule]]
capture = "session"
compression = 1
"#;
    let r = Policy::new(Some(file(admin, Level::Admin)), vec![]).resolve(&subject("f"));
    assert!(!r.version);
    assert_eq!(r.capture, Capture::EveryWrite);
    assert_eq!(r.compression, 9);
    let k = &r.retention;
    assert_eq!((k.min_count, k.max_count), (Some(4), Some(5)));
    assert_eq!(
        (k.min_age_secs, k.max_age_secs),
        (Some(7200), Some(10 * 86400))
    );
    assert_eq!((k.min_space, k.max_space), (Some(2 << 20), Some(100 << 20)));
    assert_eq!((k.keep_daily, k.keep_within_secs), (Some(3), Some(86400)));
    assert_eq!(k.protect_secs, 3 * 3600);
    assert_eq!(origin_of(&r, "version"), "rule #2 at p.toml:17");
    assert_eq!(origin_of(&r, "compression"), "rule #1 at p.toml:7");
}

#[test]
fn ties_go_to_the_first_rule() {
    let admin = "[[rule]]\nmax-count = 5\n[[rule]]\nmax-count = 5\n";
    let r = Policy::new(Some(file(admin, Level::Admin)), vec![]).resolve(&subject("f"));
    assert_eq!(origin_of(&r, "max-count"), "rule #1 at p.toml:2");
}

const BOUNDED_ADMIN: &str = r#"[defaults]
protect = "1d"

[bounds]
max-count = 1000
min-age = "1d"
protect = "7d"
version = "required"
"#;

#[test]
fn bounds_clamp_everything() {
    let alice = "[[rule]]\nmax-count = 5000\nmin-age = 0\nversion = false\n";
    let p = policy(BOUNDED_ADMIN, alice);
    let r = p.resolve(&subject("f"));
    assert!(r.version, "version = required");
    assert_eq!(r.retention.max_count, Some(1000));
    assert_eq!(r.retention.min_age_secs, Some(86400));
    assert_eq!(r.retention.protect_secs, 7 * 86400);
    assert_eq!(origin_of(&r, "max-count"), format!("bounds ({ADMIN}:5)"));
    assert_eq!(origin_of(&r, "version"), format!("bounds ({ADMIN}:8)"));

    // Unset values take the bound; values already inside it stay.
    let within = policy(
        BOUNDED_ADMIN,
        "[[rule]]\nmax-count = 10\nmin-age = \"2d\"\n",
    );
    let r = within.resolve(&subject("f"));
    assert_eq!(r.retention.max_count, Some(10));
    assert_eq!(r.retention.min_age_secs, Some(2 * 86400));
    assert_eq!(origin_of(&r, "max-count"), format!("rule #1 at {ALICE}:2"));
    let bobs = Subject {
        owner_uid: 1001,
        ..subject("f")
    };
    assert_eq!(within.resolve(&bobs).retention.max_count, Some(1000));
}

#[test]
fn explain_names_the_deciding_file_and_rule() {
    // A bound shows only where it changed the value: version is already on.
    let p = policy(
        &format!("{BOUNDED_ADMIN}\n[[rule]]\nname = \"objects\"\nextensions = [\"o\"]\ncapture = \"every-write\"\n"),
        "[[rule]]\nname = \"texts\"\nmax-count = 3\n",
    );
    let r = p.resolve(&subject("a.o"));
    let expected = format!(
        "version      yes         built-in\n\
         capture      every-write rule \"objects\" ({ADMIN}:13)\n\
         compression  3           built-in\n\
         protect      7d          bounds ({ADMIN}:7)\n\
         max-count    3           rule \"texts\" ({ALICE}:3)\n\
         min-age      1d          bounds ({ADMIN}:6)\n"
    );
    assert_eq!(r.explain(), expected);
}

#[test]
fn explain_says_when_everything_is_kept() {
    let r = Policy::default().resolve(&subject("f"));
    assert_eq!(
        r.explain(),
        "version      yes       built-in\n\
         capture      session   built-in\n\
         compression  3         built-in\n\
         protect      0s        built-in\n\
         (no maximum and no keep-* setting: every version is kept)\n"
    );
}

#[test]
fn resolved_serializes_for_json() -> serde_json::Result<()> {
    let p = policy(LEVELS_ADMIN, LEVELS_ALICE);
    let v = serde_json::to_value(p.resolve(&subject("a.o")))?;
    assert_eq!(v["version"], false);
    assert_eq!(v["capture"], "interval");
    assert_eq!(v["retention"]["max_count"], 3);
    assert_eq!(v["retention"]["max_age_secs"], serde_json::Value::Null);
    assert_eq!(
        v["sources"][0],
        serde_json::json!({
            "key": "version",
            "value": "no",
            "origin": {"kind": "rule", "file": ADMIN, "line": 9, "number": 1, "name": "objects"},
        })
    );
    assert_eq!(v["sources"][2]["origin"]["kind"], "defaults");
    assert_eq!(
        v["sources"][3],
        serde_json::json!({"key": "protect", "value": "0s", "origin": {"kind": "built-in"}})
    );
    Ok(())
}

#[test]
fn origins_display() {
    let rule = Origin::Rule {
        file: "f.toml".into(),
        line: 4,
        number: 2,
        name: None,
    };
    assert_eq!(rule.to_string(), "rule #2 at f.toml:4");
}

#[test]
fn trivial_policies() {
    assert!(Policy::default().is_trivial());
    assert!(Policy::new(Some(file("format = 1\n", Level::Admin)), vec![]).is_trivial());
    let empty_user = vec![(1000, file("", Level::User))];
    assert!(Policy::new(None, empty_user).is_trivial());
    let ruled = vec![(1000, file("[[rule]]\nversion = false\n", Level::User))];
    assert!(!Policy::new(None, ruled).is_trivial());
    let defaults = file("[defaults]\nmax-count = 3\n", Level::Admin);
    assert!(!Policy::new(Some(defaults), vec![]).is_trivial());
}

#[test]
fn protection_window() {
    assert_eq!(Policy::default().protect_secs(), 0);
    let defaults_only = file("[defaults]\nprotect = \"2h\"\n", Level::Admin);
    assert_eq!(
        Policy::new(Some(defaults_only), vec![]).protect_secs(),
        7200
    );
    let bounded = file(BOUNDED_ADMIN, Level::Admin);
    assert_eq!(Policy::new(Some(bounded), vec![]).protect_secs(), 7 * 86400);
}
