//! Listings of the past: `.history/` (tags and recent instants), the
//! deleted entries of a live directory, and a directory at an instant.

use super::*;

impl Vfs {
    /// `.history/`'s entries: tags, and the instants at the ends of recent
    /// hours and days in which something changed.
    fn top_entries(&self) -> Result<Vec<Vec<u8>>> {
        let h = self.history()?;
        let hist = |e: crate::history::HistoryError| past_err(e.into());
        let mut names: Vec<Vec<u8>> = Vec::new();
        for (tag, _) in h.tags().map_err(hist)? {
            names.push(format!("@{tag}").into_bytes());
        }
        let now = crate::history::now_ns();
        const HOUR: i64 = 3_600_000_000_000;
        let mut seen = std::collections::HashSet::new();
        let mut boundaries: Vec<i64> = (0..LISTED_HOURS).map(|k| (now / HOUR - k) * HOUR).collect();
        boundaries.extend((1..=LISTED_DAYS).filter_map(|k| spec::midnight_days_back(k - 1).ok()));
        boundaries.sort_unstable_by(|a, b| b.cmp(a));
        boundaries.dedup();
        let mut instants = Vec::new();
        for b in boundaries {
            if b > now {
                continue;
            }
            let Some(seq) = h.seq_at_time(b).map_err(hist)? else {
                break;
            };
            if seen.insert(seq) {
                instants.push(b);
            }
        }
        instants.reverse();
        names.extend(
            instants
                .into_iter()
                .map(|t| format!("@{}", spec::minute(t)).into_bytes()),
        );
        Ok(names)
    }

    /// A directory at an instant never changes (a removal from history
    /// invalidates what the kernel holds, see `removal.rs`); `.history`
    /// and `;deleted` change with every tag, hour and deletion.
    pub(in crate::vfs) fn view_dir_cache(&self, ino: InodeNo) -> DirCache {
        match self.view(ino).map(|n| matches!(n.what, What::At { .. })) {
            Ok(true) => DirCache::Keep,
            _ => DirCache::Off,
        }
    }

    pub(in crate::vfs) fn view_opendir(&self, caller: &Caller, ino: InodeNo) -> Result<u64> {
        let node = self.view(ino)?;
        self.current(&node)?;
        self.view_permits(caller, &node, crate::history::access::READ)?;
        let entries = match &node.what {
            What::Top => {
                let mut out = Vec::new();
                for name in self.top_entries()? {
                    match self.lookup_instant(&name) {
                        Ok(e) => {
                            self.view_forget(e.attr.ino, 1);
                            out.push(Listed {
                                name,
                                ino: e.attr.ino,
                                kind: libc::S_IFDIR,
                                hist: None,
                                ttl: e.entry_ttl.unwrap_or(IMMUTABLE_TTL),
                            });
                        }
                        Err(e) => {
                            tracing::debug!("history view: listing {}: {e}", past::name_str(&name))
                        }
                    }
                }
                out
            }
            What::Deleted { dir } => {
                let mut out = Vec::new();
                for (name, at, node, ttl) in self.deleted_shown(caller, *dir)? {
                    out.push(self.listed(name, at, node, ttl)?);
                }
                out
            }
            What::At { at, obj, state } => {
                if node.st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(errno(libc::ENOTDIR));
                }
                // What readdirplus gives the kernel is kept as a lookup's
                // would be (`view_search`): a caller who may list but not
                // search gets the names only, as natively.
                let ttl = match self.view_search(caller, &node) {
                    Err(e) if e.errno_is(libc::EACCES) => Duration::ZERO,
                    ttl => ttl?,
                };
                let mut entries = self.list_at(*at, *obj, state)?;
                for l in &mut entries {
                    l.ttl = ttl;
                }
                entries
            }
        };
        Ok(self.insert_view_handle(ViewHandle::Dir { ino, entries }))
    }

    /// A directory entry for `node`, shown at `at`.
    fn listed(&self, name: Vec<u8>, at: Seq, node: Node, ttl: Duration) -> Result<Listed> {
        let kind = node.mode() & libc::S_IFMT;
        let (obj, hist) = match node {
            Node::Hist { obj, v, .. } => (obj, Some((at, obj, Arc::new(v)))),
            Node::Live { obj: Some(o), .. } => (o, None),
            Node::Live { st, .. } => (
                self.inodes.number_for(self.inodes.key_of(&st))?.object(),
                None,
            ),
        };
        Ok(Listed {
            name,
            ino: self.view_number(at, obj)?,
            kind,
            hist,
            ttl,
        })
    }

    pub(super) fn list_at(&self, at: Seq, obj: ObjectId, state: &State) -> Result<Vec<Listed>> {
        self.fill_live_dir(state)?;
        let recorded = self.past_dir(at, obj, state)?;
        let is_recorded = recorded.is_some();
        let dir = match (recorded, state) {
            (Some(node), _) => node,
            (None, State::Hist { v }) => Node::Hist {
                obj,
                seq: at,
                v: (**v).clone(),
            },
            (None, State::Live { inode }) => {
                let (fd, st) = self.live_path_fd(inode)?;
                Node::Live {
                    obj: Some(obj),
                    fd,
                    st,
                }
            }
        };
        self.with_past(|p| {
            let names = p.names(&dir, at, obj == ROOT).map_err(past_err)?;
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let cur = self.dir_cur(obj, state, is_recorded)?;
                let Some(next) = p.step(cur, &name, at, obj == ROOT).map_err(past_err)? else {
                    continue;
                };
                let Some(child) = p.finish(next, at).map_err(past_err)? else {
                    continue;
                };
                out.push(self.listed(name, at, child, IMMUTABLE_TTL)?);
            }
            Ok(out)
        })
    }

    /// Feeds a view directory's entries from `offset` on to `add`; with
    /// `plus`, each is looked up (the kernel takes a reference).
    pub(in crate::vfs) fn view_readdir(
        &self,
        caller: &Caller,
        fh: u64,
        offset: i64,
        mut add: impl FnMut(&DirEntry<'_>, Option<&Entry>) -> bool,
        plus: bool,
    ) -> Result<()> {
        let handle = self.view_handle(fh)?;
        let ViewHandle::Dir { ino: dir, entries } = &*handle else {
            return Err(errno(libc::ENOTDIR));
        };
        let start = offset.max(0) as usize;
        let dots = [b".".as_slice(), b"..".as_slice()];
        for i in start..entries.len() + 2 {
            let (name, ino, kind, hist, ttl) = match i {
                0 | 1 => (dots[i], *dir, libc::S_IFDIR, None, Duration::ZERO),
                _ => {
                    let l = &entries[i - 2];
                    (l.name.as_slice(), l.ino, l.kind, l.hist.as_ref(), l.ttl)
                }
            };
            let dirent = DirEntry {
                ino,
                offset: i as i64 + 1,
                kind,
                name: OsStr::from_bytes(name),
            };
            if !plus || i < 2 {
                if add(&dirent, None) {
                    break;
                }
                continue;
            }
            let found = match hist {
                Some((at, obj, v)) => self.hist_at(*at, *obj, v.clone()),
                None => self.plus_lookup(caller, *dir, OsStr::from_bytes(name)),
            }
            .map(|e| kept_at_most(e, ttl))
            .inspect(|e| self.note_view_name(*dir, OsStr::from_bytes(name), e.attr.ino));
            let e = match found {
                Ok(e) => e,
                Err(e) if e.errno_is(libc::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            if add(&dirent, Some(&e)) {
                self.view_forget(e.attr.ino, 1);
                break;
            }
        }
        Ok(())
    }

    /// A listed name looked up for readdirplus: what opendir granted
    /// (the listing) needs no search, which a lookup would ask; the
    /// entry's timeout says whether others may use it.
    fn plus_lookup(&self, caller: &Caller, dir: InodeNo, name: &OsStr) -> Result<Entry> {
        let node = self.view(dir)?;
        match node.what {
            What::At { .. } => self.lookup_at(&node, name),
            _ => self.view_lookup(caller, dir, name),
        }
    }
}
