//! `chronofs completions SHELL` and `chronofs man`: what shells and
//! man(1) read about the command line, made from the clap definition the
//! binary parses with, so they name every verb and option it takes.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

pub fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut cmd = super::Cli::command();
    let mut script = Vec::new();
    // `generate` builds every subcommand, the deferred ones included.
    clap_complete::generate(shell, &mut cmd, "chronofs", &mut script);
    to_stdout(&script)
}

/// Every page into `dir` (chronofs.1, chronofs-log.1,
/// chronofs-template-create.1...), or chronofs.1 alone to stdout.
pub fn man(dir: Option<&Path>) -> Result<()> {
    // No page for clap's `help` verb (`generate_to` leaves it out too).
    let cmd = super::Cli::command().disable_help_subcommand(true);
    let Some(dir) = dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        return to_stdout(&page);
    };
    std::fs::create_dir_all(dir)
        .and_then(|()| clap_mangen::generate_to(cmd, dir))
        .with_context(|| format!("writing man pages into {}", dir.display()))
}

// Written here, not by the generators: they panic on a write error.
fn to_stdout(bytes: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .context("writing output")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Subcommands are deferred (built only when run): the scripts must
    /// still name every one and every long option of each.
    #[test]
    fn completions_name_every_subcommand_and_option() {
        let mut cmd = super::super::Cli::command();
        cmd.build();
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd.clone(), "chronofs", &mut script);
            let script = String::from_utf8_lossy(&script);
            let mut stack = vec![&cmd];
            while let Some(c) = stack.pop() {
                for sub in c.get_subcommands() {
                    assert!(
                        script.contains(sub.get_name()),
                        "{shell}: {}",
                        sub.get_name()
                    );
                    for long in sub.get_arguments().filter_map(|a| a.get_long()) {
                        assert!(
                            script.contains(long),
                            "{shell}: {} --{long}",
                            sub.get_name()
                        );
                    }
                    stack.push(sub);
                }
            }
        }
    }
}
