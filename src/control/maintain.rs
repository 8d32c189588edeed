//! Answers to the maintenance requests: garbage collection, retention
//! passes, manual prune and purge, the policy (explain, reload) and the
//! audit log. Every destructive request checks the peer here.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};

use super::proto::{
    AuditRecord, AuditReply, ExplainReply, GcReport, HeldBack, PruneReply, PurgeReply, ReloadReply,
};
use super::service::{Error, Result, Service};
use super::{Components, Reply};
use crate::capture::retention::{self, CleanReport, Decide, PolicyCell};
use crate::history::past::show_path;
use crate::history::prune::{Pins, Removal};
use crate::history::{ObjectId, Seq};
use crate::policy::{Policy, Retention, Subject};
use crate::sys::{self, Peer};

/// The policy a service answers for, and where it is loaded from.
#[derive(Clone)]
pub struct PolicyHolder {
    pub cell: Arc<PolicyCell>,
    pub source: crate::policy::load::Source,
    /// Why the policy files could not be loaded (a store opened without
    /// a mount): the verbs that apply the policy refuse to guess.
    pub broken: Option<String>,
}

impl PolicyHolder {
    fn current(&self) -> Result<Arc<Policy>> {
        match &self.broken {
            Some(why) => Err(Error::Usage(why.clone())),
            None => Ok(self.cell.get()),
        }
    }
}

fn root_only(peer: &Peer, what: &str) -> Result<()> {
    if peer.uid == 0 {
        Ok(())
    } else {
        Err(Error::NotPermitted(format!("only root may {what}")))
    }
}

impl Service {
    /// An audit record, with the hash chain's head at the time (so the
    /// log itself anchors the chain).
    pub(super) fn audit_record(&self, peer: &Peer, action: &str, detail: Value) -> Value {
        let mut r = audit_value(peer, action, detail);
        if let Ok(Some((seq, hash))) = crate::history::chain::head(self.history().db()) {
            r["chain_head"] = json!({"seq": seq, "hash": hash});
        }
        r
    }
}

fn audit_value(peer: &Peer, action: &str, mut detail: Value) -> Value {
    if let Some(map) = detail.as_object_mut() {
        map.retain(|_, v| !v.is_null());
        for v in map.values_mut() {
            if let Some(inner) = v.as_object_mut() {
                // Limits not given are null; a limit of 0 is one
                // (`--max-count 0`). The protection window is no limit
                // the caller gives, 0 unless a policy set it.
                let no_window = |k: &str, x: &Value| k == "protect_secs" && *x == json!(0);
                inner.retain(|k, x| !x.is_null() && !no_window(k, x));
            }
        }
    }
    json!({
        "time_ns": crate::history::now_ns(),
        "uid": peer.uid, "pid": peer.pid, "action": action, "detail": detail,
    })
}

/// A manual prune's retention: what the caller asked, raised to the
/// policy's minimums and protection window unless the caller is root.
struct Manual<'a> {
    keep: &'a Retention,
    policy: Option<&'a Policy>,
}

impl Decide for Manual<'_> {
    fn retention(&self, subject: &Subject) -> Option<Retention> {
        let mut r = self.keep.clone();
        if let Some(p) = self.policy {
            let floor = p.resolve(subject).retention;
            let raise = |mine: &mut Option<u64>, theirs: Option<u64>| {
                *mine = match (*mine, theirs) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
            };
            raise(&mut r.min_count, floor.min_count);
            raise(&mut r.min_age_secs, floor.min_age_secs);
            raise(&mut r.min_space, floor.min_space);
            r.protect_secs = r
                .protect_secs
                .max(floor.protect_secs)
                .max(p.owner_protect_secs());
        }
        Some(r)
    }
}

impl Service {
    pub(super) fn gc(&self, dry_run: bool, peer: &Peer, reply: &mut dyn Reply) -> Result<GcReport> {
        root_only(peer, "collect garbage")?;
        let mut last = std::time::Instant::now();
        let mut progress = |phase: &str, done: u64, total: u64| {
            // A line at most every 100 ms (and at each phase's end).
            if done == total || last.elapsed().as_millis() >= 100 {
                last = std::time::Instant::now();
                let _ = reply.data(format!("{phase} {done} {total}\n").as_bytes());
            }
        };
        let released_clone_tags = self.release_gone_clones(dry_run)?;
        let mut report = self.history().gc(dry_run, &mut progress)?;
        report.released_clone_tags = released_clone_tags;
        if !dry_run {
            let detail = serde_json::to_value(&report).unwrap_or(Value::Null);
            self.history()
                .audit(&self.audit_record(peer, "gc", detail))?;
        }
        Ok(report)
    }

    pub(super) fn clean(
        &self,
        now_ns: Option<i64>,
        dry_run: bool,
        peer: &Peer,
    ) -> Result<CleanReport> {
        root_only(peer, "run the cleaner")?;
        let now = now_ns.unwrap_or_else(|| self.history().now_ns());
        let policy = self.policy.current()?;
        let report = retention::clean(self.history(), &policy, now, dry_run, None)?;
        if !dry_run {
            // Recorded even when nothing went: a pass run by hand, perhaps
            // with another clock, is an administrative act.
            let detail = json!({"now_ns": now, "removed": report.outcome});
            self.history()
                .audit(&self.audit_record(peer, "clean", detail))?;
        }
        Ok(report)
    }

    /// Every object ever at `path` or under it.
    fn objects_under(&self, path: &Components) -> Result<HashSet<ObjectId>> {
        Ok(self
            .tree_objects(path)?
            .into_iter()
            .map(|(o, _)| o)
            .collect())
    }

    pub(super) fn prune(
        &self,
        path: &Components,
        keep: &Retention,
        dry_run: bool,
        peer: &Peer,
    ) -> Result<PruneReply> {
        if keep.keeps_all() {
            return Err(Error::Usage(
                "nothing to prune: give a limit (--keep-last, --keep-daily, --max-count, --max-age, ...)"
                    .into(),
            ));
        }
        let scope = self.objects_under(path)?;
        if peer.uid != 0 {
            self.check_owner(&scope, peer)?;
        }
        let policy = self.policy.current()?;
        let decide = Manual {
            keep,
            policy: (peer.uid != 0).then_some(&*policy),
        };
        let tz = crate::history::spec::local_zone();
        let mut report = CleanReport {
            dry_run,
            ..Default::default()
        };
        let now = self.history().now_ns();
        let plan = retention::plan(self.history(), &decide, now, &tz, Some(&scope), &mut report)?;
        // What the request alone would take, to say why less goes.
        let held_back = if peer.uid != 0 {
            let alone = Manual { keep, policy: None };
            let mut asked = CleanReport::default();
            retention::plan(self.history(), &alone, now, &tz, Some(&scope), &mut asked)?;
            asked
                .planned_versions
                .saturating_sub(report.planned_versions)
        } else {
            0
        };
        if !dry_run {
            let detail = json!({"path": show_path(path), "keep": keep,
                "versions": report.planned_versions, "objects": report.planned_objects});
            retention::apply(
                self.history(),
                &plan,
                Some(self.audit_record(peer, "prune", detail)),
                &mut report,
            )?;
        }
        Ok(PruneReply {
            report,
            held_back: HeldBack {
                versions: held_back,
                protect_secs: policy.owner_protect_secs(),
                why: (held_back > 0).then(|| format!(
                    "kept {held_back} version(s) inside the protection window ({}) or the policy's minimums: only root may prune them",
                    crate::policy::format_duration(policy.owner_protect_secs())
                )),
            },
        })
    }

    /// Refuses unless `peer` owns every object (its newest version).
    fn check_owner(&self, scope: &HashSet<ObjectId>, peer: &Peer) -> Result<()> {
        for &obj in scope {
            if let Some((_, v)) = self.history().object_at(obj, Seq::MAX)? {
                if v.attrs.uid != peer.uid {
                    let path = self
                        .history()
                        .path_at(obj, Seq::MAX)?
                        .map_or_else(|| format!("object {obj}"), |p| show_path(&p));
                    return Err(Error::NotPermitted(format!(
                        "{path} belongs to uid {}: only its owner or root may prune its history",
                        v.attrs.uid
                    )));
                }
            }
        }
        Ok(())
    }

    pub(super) fn purge(
        &self,
        path: &Components,
        dry_run: bool,
        peer: &Peer,
    ) -> Result<PurgeReply> {
        root_only(peer, "purge history")?;
        let own: HashSet<ObjectId> = self
            .past()
            .incarnations(path)?
            .into_iter()
            .map(|(o, _, _)| o)
            .collect();
        let scope = self.objects_under(path)?;
        // A clone reads its shared bytes from the history of its source,
        // which a purge overrides every pin to remove.
        let readers = self.host().clones_reading(path, &scope)?;
        if let Some(first) = readers.first() {
            return Err(Error::Usage(format!(
                "{}'s history holds the shared bytes of {} clone object(s) (/{} first): \
                 remove those clones, or copy them to plain files, before purging it",
                show_path(path),
                readers.len(),
                String::from_utf8_lossy(first)
            )));
        }
        let mut plan = Vec::new();
        let mut kept = 0u64;
        let mut versions = 0u64;
        for &obj in &scope {
            let Some((_, newest)) = self.history().object_at(obj, Seq::MAX)? else {
                continue;
            };
            if !newest.gone {
                // A real purge removes the live tree through the mount
                // first, which records one more version (the removal) of
                // each object still in it: a dry run counts those too, so
                // its figures are the real run's.
                let linked_elsewhere =
                    newest.attrs.mode & libc::S_IFMT != libc::S_IFDIR && newest.attrs.nlink > 1;
                if dry_run && own.contains(&obj) && linked_elsewhere {
                    // Its removal through the mount would leave it alive
                    // under its other names, and the purge would then
                    // refuse it: the name would be gone for nothing.
                    return Err(Error::Usage(format!(
                        "{} has other hard links: remove them first (history is shared by all its names)",
                        show_path(path)
                    )));
                }
                if dry_run && (own.contains(&obj) || self.lives_under(obj, path)?) {
                    versions += self.history().versions(obj, Seq::ZERO, Seq::MAX)?.len() as u64 + 1;
                    plan.push((obj, Removal::Whole));
                    continue;
                }
                if own.contains(&obj) {
                    return Err(Error::Usage(format!(
                        "{} still exists: remove it first (or let `chronofs purge` do it through the mount)",
                        show_path(path)
                    )));
                }
                // Moved out of the tree and still alive elsewhere.
                kept += 1;
                continue;
            }
            versions += self.history().versions(obj, Seq::ZERO, Seq::MAX)?.len() as u64;
            plan.push((obj, Removal::Whole));
        }
        let detail = json!({"path": show_path(path), "objects": plan.len(), "versions": versions});
        if dry_run {
            return Ok(PurgeReply {
                dry_run: true,
                objects: plan.len() as u64,
                versions,
                kept_alive_elsewhere: kept,
                collected: None,
            });
        }
        let objects: Vec<ObjectId> = plan.iter().map(|(o, _)| *o).collect();
        self.history().scrub_later(&objects)?;
        let outcome = self.history().prune(
            &plan,
            Pins::Override,
            Some(self.audit_record(peer, "purge", detail)),
        )?;
        // The bytes go now, not at some later collection: that is what a
        // purge is for (a secret written by mistake).
        let collected = self.history().gc(false, &mut |_, _, _| {})?;
        let detail = serde_json::to_value(&collected).unwrap_or(Value::Null);
        self.history()
            .audit(&self.audit_record(peer, "gc", detail))?;
        Ok(PurgeReply {
            dry_run: false,
            objects: outcome.objects_removed,
            versions: outcome.versions_removed,
            kept_alive_elsewhere: kept,
            collected: Some(collected),
        })
    }

    /// Whether live `obj`'s current name lies at or under `path`.
    fn lives_under(&self, obj: ObjectId, path: &Components) -> Result<bool> {
        Ok(self
            .history()
            .path_at(obj, Seq::MAX)?
            .is_some_and(|p| p.starts_with(path)))
    }

    pub(super) fn explain(
        &self,
        path: &Components,
        user: Option<&str>,
        process: Option<&str>,
    ) -> Result<ExplainReply> {
        let live = self.live_stat(path)?;
        let (mut uid, gid) = live.map_or((0, 0), |st| (st.st_uid, st.st_gid));
        if let Some(u) = user {
            uid = sys::user_home(u)
                .map(|(id, _)| id)
                .ok_or_else(|| Error::NotFound(format!("no user '{u}'")))?;
        }
        // Bytes: the policy's globs match the real name.
        let rel = path.join(&b'/');
        let owner = sys::user_name(uid);
        let group = sys::group_name(gid);
        let local = jiff::Zoned::now().datetime();
        let subject = Subject {
            path: &rel,
            is_dir: live.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
            size: live.map_or(0, |st| st.st_size as u64),
            owner_uid: uid,
            owner_gid: gid,
            owner_name: owner.as_deref(),
            group_name: group.as_deref(),
            process,
            local_time: Some(local),
        };
        let resolved = self.policy.current()?.resolve(&subject);
        let mut resolved_doc = match serde_json::to_value(&resolved) {
            Ok(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        // The reply's own fields win over a policy field of the same name.
        for own in ["text", "path", "path_raw", "exists"] {
            resolved_doc.remove(own);
        }
        let (shown, shown_raw) = super::proto::path_text(path);
        Ok(ExplainReply {
            resolved: resolved_doc,
            text: resolved.explain(),
            path: shown,
            path_raw: shown_raw,
            exists: live.is_some(),
        })
    }

    /// The live object at `path`, if there is one.
    fn live_stat(&self, path: &Components) -> Result<Option<sys::Stat>> {
        let past = self.past();
        let mut fd = sys::reopen(std::os::fd::AsFd::as_fd(&self.root_fd()), libc::O_PATH)?;
        for (i, comp) in path.iter().enumerate() {
            match past.live_step(std::os::fd::AsFd::as_fd(&fd), i == 0, comp)? {
                Some(crate::history::past::Cur::Live { fd: next, .. }) => fd = next,
                _ => return Ok(None),
            }
        }
        Ok(Some(sys::fstat(std::os::fd::AsFd::as_fd(&fd))?))
    }

    pub(super) fn reload(&self, peer: &Peer) -> Result<ReloadReply> {
        root_only(peer, "reload the policy")?;
        let previous = self.policy.cell.get();
        match self.policy.source.load(Some(&previous)) {
            Ok((policy, warnings)) => {
                let rules = policy.rule_count();
                self.policy.cell.set(policy);
                let detail = json!({"rules": rules, "warnings": warnings});
                self.history()
                    .audit(&self.audit_record(peer, "policy-reload", detail))?;
                Ok(ReloadReply { rules, warnings })
            }
            Err(errors) => Err(Error::Usage(format!(
                "{} (the previous policy stays in force{})",
                errors.first().map_or_else(String::new, ToString::to_string),
                match errors.len() {
                    0 | 1 => String::new(),
                    n => format!("; {} more problem(s): run `chronofs policy check`", n - 1),
                }
            ))),
        }
    }

    pub(super) fn audit_log(&self, peer: &Peer) -> Result<AuditReply> {
        root_only(peer, "read the audit log")?;
        let records = self
            .history()
            .audit_log()?
            .into_iter()
            .map(|(_, v)| {
                // A record of an older layout keeps what still parses.
                serde_json::from_value(v.clone()).unwrap_or_else(|_| AuditRecord {
                    detail: v,
                    ..Default::default()
                })
            })
            .collect();
        Ok(AuditReply { records })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audited_limit_of_zero_is_kept() {
        let keep = Retention {
            max_count: Some(0),
            ..Retention::default()
        };
        let peer = crate::sys::Peer {
            uid: 0,
            gid: 0,
            pid: 1,
            groups: None,
        };
        let r = audit_value(&peer, "prune", json!({"keep": keep, "versions": 0}));
        assert_eq!(r["detail"]["keep"], json!({"max_count": 0}));
        assert_eq!(r["detail"]["versions"], json!(0));
    }
}
