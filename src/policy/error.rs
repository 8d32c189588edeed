//! Policy file problems, reported the way compilers do: `FILE:LINE:COL: message`.

use std::fmt;

use thiserror::Error;

use super::settings::Pos;

/// One problem in one policy file. `line` and `column` are 1-based; a
/// `line` of 0 means the problem concerns the whole file (e.g. it cannot
/// be read).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{origin}{}: {message}", At(*.line, *.column))]
pub struct PolicyError {
    pub origin: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl PolicyError {
    pub fn at(origin: &str, pos: Pos, message: impl Into<String>) -> PolicyError {
        PolicyError {
            origin: origin.to_string(),
            line: pos.line,
            column: pos.column,
            // One problem, one line: multi-line messages would break the
            // compiler-style format editors and scripts parse.
            message: message.into().replace('\n', "; "),
        }
    }

    pub fn whole_file(origin: &str, message: impl Into<String>) -> PolicyError {
        PolicyError::at(origin, Pos::default(), message)
    }
}

/// The ":LINE:COL" part, absent for whole-file problems.
struct At(u32, u32);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At(0, _) => Ok(()),
            At(line, column) => write!(f, ":{line}:{column}"),
        }
    }
}

/// Turns byte offsets into line and column numbers.
pub struct Lines<'t> {
    text: &'t str,
    starts: Vec<usize>,
}

impl<'t> Lines<'t> {
    pub fn new(text: &'t str) -> Lines<'t> {
        let breaks = text.match_indices('\n').map(|(i, _)| i + 1);
        Lines {
            text,
            starts: std::iter::once(0).chain(breaks).collect(),
        }
    }

    /// The position of a byte offset; columns count characters, as
    /// editors do.
    pub fn pos(&self, offset: usize) -> Pos {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|&start| start <= offset);
        let start = self.starts[line.saturating_sub(1)];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        Pos {
            line: to_u32(line),
            column: to_u32(column + 1),
        }
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
