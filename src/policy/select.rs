//! Rule selectors: which files (and which changes to them) a rule is about.

use std::path::Path;

use globset::GlobSet;
use jiff::civil::DateTime;

use super::Subject;

/// A user or group named in a selector, by name or by numeric id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Name(String),
    Id(u32),
}

impl Principal {
    fn is(&self, id: u32, name: Option<&str>) -> bool {
        match self {
            Principal::Id(want) => *want == id,
            Principal::Name(want) => name == Some(want.as_str()),
        }
    }
}

/// An inclusive range of file sizes; either end may be open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SizeRange {
    pub min: Option<u64>,
    pub max: Option<u64>,
}

impl SizeRange {
    fn contains(&self, size: u64) -> bool {
        self.min.is_none_or(|min| size >= min) && self.max.is_none_or(|max| size <= max)
    }
}

/// Minutes since local midnight.
pub type Minute = u32;

/// A weekly window of local time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeWindow {
    /// Bit i set = weekday i (Monday = 0) selected; `None` = every day.
    pub days: Option<u8>,
    /// From (inclusive) and to (exclusive); from > to wraps past midnight.
    pub hours: Option<(Minute, Minute)>,
}

impl TimeWindow {
    fn contains(&self, time: DateTime) -> bool {
        let day = weekday_index(time);
        let minute = Minute::from(time.hour().unsigned_abs()) * 60
            + Minute::from(time.minute().unsigned_abs());
        match self.hours {
            None => self.has_day(day),
            Some((from, to)) if from < to => (from..to).contains(&minute) && self.has_day(day),
            Some((from, _)) if minute >= from => self.has_day(day),
            // The early-morning part of a window that wraps past midnight
            // belongs to the evening it started on: "fri 22:00-06:00"
            // covers Saturday 02:00, not Friday 02:00.
            Some((_, to)) => minute < to && self.has_day((day + 6) % 7),
        }
    }

    fn has_day(&self, day: u8) -> bool {
        self.days.is_none_or(|days| days & (1 << day) != 0)
    }
}

fn weekday_index(time: DateTime) -> u8 {
    time.weekday().to_monday_zero_offset().unsigned_abs()
}

/// Every selector of one rule; `None` means "not given" (matches all),
/// while an empty list given explicitly matches nothing.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    pub paths: Option<GlobSet>,
    pub exclude_paths: Option<GlobSet>,
    pub names: Option<GlobSet>,
    pub extensions: Option<Vec<String>>,
    pub users: Option<Vec<Principal>>,
    pub groups: Option<Vec<Principal>>,
    pub processes: Option<Vec<String>>,
    pub size: Option<SizeRange>,
    pub time: Option<TimeWindow>,
}

impl Selector {
    /// Whether every given selector matches. Cheap checks come first so
    /// that globs run only for plausible candidates.
    pub fn matches(&self, s: &Subject) -> bool {
        self.size.is_none_or(|r| r.contains(s.size))
            && any_principal(&self.users, s.owner_uid, s.owner_name)
            && any_principal(&self.groups, s.owner_gid, s.group_name)
            && self.matches_process(s.process)
            && self.matches_time(s.local_time)
            && self.matches_extension(final_component(s.path))
            && self
                .names
                .as_ref()
                .is_none_or(|g| g.is_match(as_path(final_component(s.path))))
            && self
                .paths
                .as_ref()
                .is_none_or(|g| g.is_match(as_path(s.path)))
            && !self
                .exclude_paths
                .as_ref()
                .is_some_and(|g| g.is_match(as_path(s.path)))
    }

    // Unknown callers and times fail their selectors: a rule about "gcc"
    // must not catch changes whose process nobody knows.
    fn matches_process(&self, process: Option<&str>) -> bool {
        match &self.processes {
            None => true,
            Some(list) => process.is_some_and(|p| list.iter().any(|want| want == p)),
        }
    }

    fn matches_time(&self, time: Option<DateTime>) -> bool {
        match &self.time {
            None => true,
            Some(window) => time.is_some_and(|t| window.contains(t)),
        }
    }

    fn matches_extension(&self, name: &[u8]) -> bool {
        let Some(list) = &self.extensions else {
            return true;
        };
        let ext = as_path(name).extension().and_then(|e| e.to_str());
        ext.is_some_and(|ext| list.iter().any(|want| want == ext))
    }
}

fn any_principal(list: &Option<Vec<Principal>>, id: u32, name: Option<&str>) -> bool {
    list.as_ref()
        .is_none_or(|list| list.iter().any(|p| p.is(id, name)))
}

fn final_component(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// The bytes as a path, without conversion: globset matches a Unix path
/// by its bytes, so a name that is not UTF-8 is matched as it is (a lossy
/// text would merge distinct names and shift every byte offset).
fn as_path(bytes: &[u8]) -> &Path {
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(bytes))
}
