//! Answers to `chronofs template`: a template names a tree as it was at
//! one instant (`history::templates`), and instantiating it is a clone
//! `--at` that instant, so a template costs nothing to make or to use
//! whatever the tree's size, and the tree it was made from may change or
//! go without disturbing it.

use super::proto::{CloneReply, CloneRow, ClonesReply, TemplateInfo, TemplatesReply, UntagReply};
use super::service::{who, Error, Result, Service};
use super::spec::At;
use super::Components;
use crate::history::access;
use crate::history::past::show_path;
use crate::history::templates::tag_of;
use crate::history::{Draft, ObjectId, Seq};
use crate::sys::Peer;

/// Why `name` cannot name a template, if it cannot: it must read the
/// same in a shell, a tag and a file name.
fn check_name(name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "._+-".contains(c);
    if name.is_empty()
        || name.len() > 128
        || name.starts_with(['.', '-'])
        || !name.chars().all(ok_char)
    {
        return Err(Error::Usage(format!(
            "'{name}' cannot name a template: use 1 to 128 letters, digits, '.', '_', '+' or '-', \
             not starting with '.' or '-'"
        )));
    }
    Ok(())
}

impl Service {
    /// Template `name`: its path and the instant it was made at.
    fn template(&self, name: &str) -> Result<(Components, Seq)> {
        let missing = || Error::NotFound(format!("no template named '{name}'"));
        let seq = self.history().tag(&tag_of(name))?.ok_or_else(missing)?;
        let path = self.history().template_path(name)?.ok_or_else(missing)?;
        Ok((path, seq))
    }

    fn template_info(&self, name: String, path: &[Vec<u8>], seq: Seq) -> Result<TemplateInfo> {
        Ok(TemplateInfo {
            name,
            path: show_path(path),
            seq,
            time_ns: self.history().time_of_seq(seq)?,
        })
    }

    pub(super) fn template_create(
        &self,
        name: &str,
        path: &Components,
        at: &At,
        peer: &Peer,
    ) -> Result<TemplateInfo> {
        check_name(name)?;
        if path.is_empty() {
            // Every instantiation would lie inside what it copies.
            return Err(Error::Usage(
                "a template of the whole mount could never be instantiated inside it: \
                 name a directory in the mount"
                    .into(),
            ));
        }
        // As for a clone: closes other writers outlived count.
        self.host().settle_within(path);
        let (seq, _) = self.resolve_at(at)?;
        let node = self.past().node(path, seq)?;
        self.past()
            .check(&who(peer), path, seq, &node, access::READ)?;
        let tag = tag_of(name);
        if self.history().tag(&tag)?.is_some() {
            return Err(Error::Usage(format!(
                "template '{name}' already exists; remove it first with `chronofs template delete {name}`"
            )));
        }
        // The path first: a template is there once its tag is.
        self.history().set_template_path(name, Some(path))?;
        self.history().commit(Draft {
            tags: vec![(tag.clone(), Some(seq))],
            ..Default::default()
        })?;
        self.history().set_tag_owner(&tag, Some(peer.uid))?;
        self.host().tag_made(&tag);
        self.history().sync()?;
        self.template_info(name.to_string(), path, seq)
    }

    pub(super) fn template_instantiate(
        &self,
        name: &str,
        dst: &Components,
        peer: &Peer,
    ) -> Result<CloneReply> {
        let (path, seq) = self.template(name)?;
        // The caller must be able to read the template's tree as it was:
        // a template shows no one more than the tree did (clone checks).
        self.clone_path(&path, dst, &At::Seq(seq), peer)
    }

    pub(super) fn templates(&self) -> Result<TemplatesReply> {
        let mut templates = Vec::new();
        for (name, path) in self.history().template_paths()? {
            // A record without its tag is a create a crash cut short.
            if let Some(seq) = self.history().tag(&tag_of(&name))? {
                templates.push(self.template_info(name, &path, seq)?);
            }
        }
        Ok(TemplatesReply { templates })
    }

    /// Every clone (a tag `clone:N`, N its top's object) with where it
    /// is now and its space there.
    /// A peer sees the clones whose top it may read now.
    pub(super) fn clones(&self, peer: &Peer) -> Result<ClonesReply> {
        let mut clones = Vec::new();
        let Some((_, (now, _))) = self.history().bounds()? else {
            return Ok(ClonesReply { clones });
        };
        for (mut row, path) in self.clones_listed()? {
            if peer.uid != 0 {
                let readable = path.as_ref().is_some_and(|p| {
                    self.past()
                        .node(p, now)
                        .and_then(|n| self.past().check(&who(peer), p, now, &n, access::READ))
                        .is_ok()
                });
                if !readable {
                    continue;
                }
            }
            row.space = match &path {
                Some(p) => Some(self.host().clone_space(p)?),
                None => None,
            };
            clones.push(row);
        }
        Ok(ClonesReply { clones })
    }

    /// Every clone's tag, instant and place now (without its space).
    fn clones_listed(&self) -> Result<Vec<(CloneRow, Option<Components>)>> {
        let Some((_, (now, _))) = self.history().bounds()? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (tag, seq) in self.history().tags()? {
            let Some(top) = tag.strip_prefix("clone:").and_then(|n| n.parse().ok()) else {
                continue;
            };
            let path = self.history().path_at(ObjectId::new(top), now)?;
            let row = CloneRow {
                tag,
                path: path.as_deref().map(show_path),
                seq,
                time_ns: self.history().time_of_seq(seq)?,
                space: None,
            };
            out.push((row, path));
        }
        Ok(out)
    }

    /// Refuses to remove a clone's tag while the clone is there or a
    /// mark still reads its instant: history could then drop the base.
    pub(super) fn clone_tag_unused(&self, tag: &str, seq: Seq) -> Result<()> {
        let Some(top) = tag.strip_prefix("clone:").and_then(|n| n.parse().ok()) else {
            return Ok(());
        };
        if let Some((_, (now, _))) = self.history().bounds()? {
            if let Some(path) = self.history().path_at(ObjectId::new(top), now)? {
                return Err(Error::Busy(format!(
                    "tag '{tag}' keeps the base of the clone at {}: remove the clone first",
                    show_path(&path)
                )));
            }
        }
        match self.host().clone_instants_in_use()? {
            Some(used) if !used.contains(&seq) => Ok(()),
            Some(_) => Err(Error::Busy(format!(
                "tag '{tag}': parts of its clone moved elsewhere in the mount still read #{seq}"
            ))),
            None => Err(Error::Busy(format!(
                "tag '{tag}' keeps a clone's base: remove it through the clone's mount"
            ))),
        }
    }

    /// Releases the tags of removed clones whose instants no mark reads.
    pub(super) fn release_gone_clones(&self, dry_run: bool) -> Result<Vec<String>> {
        let gone: Vec<(String, Seq)> = self
            .clones_listed()?
            .into_iter()
            .filter(|(row, _)| row.path.is_none())
            .map(|(row, _)| (row.tag, row.seq))
            .collect();
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        let Some(used) = self.host().clone_instants_in_use()? else {
            return Ok(Vec::new());
        };
        let released: Vec<String> = gone
            .into_iter()
            .filter(|(_, seq)| !used.contains(seq))
            .map(|(tag, _)| tag)
            .collect();
        if !dry_run && !released.is_empty() {
            self.history().commit(Draft {
                tags: released.iter().map(|t| (t.clone(), None)).collect(),
                ..Default::default()
            })?;
        }
        Ok(released)
    }

    pub(super) fn template_delete(&self, name: &str, peer: &Peer) -> Result<UntagReply> {
        self.template(name)?;
        let tag = tag_of(name);
        let owner = self.history().tag_owner(&tag)?;
        if peer.uid != 0 && owner != Some(peer.uid) {
            return Err(Error::Denied(format!(
                "template '{name}' was made by {}: only its maker or root may remove it",
                owner.map_or_else(|| "root".to_string(), |u| format!("uid {u}"))
            )));
        }
        self.history().commit(Draft {
            tags: vec![(tag.clone(), None)],
            ..Default::default()
        })?;
        self.history().set_tag_owner(&tag, None)?;
        self.history().set_template_path(name, None)?;
        Ok(UntagReply {
            name: name.to_string(),
            deleted: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn template_names_are_plain_words() {
        for ok in ["rootfs", "debian-13", "py3.12", "a_b+c"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "-x", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
