//! The branch registry: a small database of its own (`branches.redb`)
//! for what names a union's branches — their ids, the set in force and
//! the snapshots' names (`branches.rs`). A branch change records itself
//! there durably before it takes effect; in the index, that record
//! waited for history's transactions (a baseline walk's batch held the
//! write lock for 50-90 ms) and its fsync flushed their pages.
//!
//! A format-6 store kept these tables in the index. Opening one moves
//! them: the index says format 7 first (a format-6 build then refuses
//! the store, and cannot change branches where this build no longer
//! looks), then the registry's first transaction copies the tables and
//! writes the registry's format, then the index drops them. A crash
//! between steps repeats what is left at the next open.

use std::sync::Arc;

use super::{branches, index_error, put_format, DbFile, Guarded, Index, Store, StoreError};

pub const REGISTRY_FILE: &str = "branches.redb";

/// The registry's own format number (`meta` `format_version`). Format 2:
/// `branches` rows may be of record format 2 (a key device); a format-1
/// registry is upgraded by rewriting the number (its rows still read), so
/// that a build that knows only format-1 rows refuses it.
const REGISTRY_FORMAT: u32 = 2;

const REGISTRY_DB: DbFile = DbFile {
    name: REGISTRY_FILE,
    building: "branches.redb.new",
    // Written by the transaction that fills it: a registry with a format
    // holds the branch tables of the store it belongs to.
    created_format: None,
};

/// Opens the store's registry, creating it and moving a format-6 index's
/// branch tables into it. `main` is the index, at the current format.
pub(super) fn open(
    io: &Arc<Guarded>,
    names: &[String],
    main: &Index,
) -> Result<Arc<Index>, StoreError> {
    let registry = Arc::new(Store::open_db(io, names, REGISTRY_DB)?);
    match registry.format()? {
        Some(v) if v == u64::from(REGISTRY_FORMAT) => {}
        Some(1) => {
            let txn = registry.begin_write().map_err(index_error)?;
            put_format(&txn, REGISTRY_FORMAT)?;
            txn.commit().map_err(index_error)?;
        }
        Some(v) => {
            return Err(StoreError::UnsupportedFormat {
                path: io.path(REGISTRY_FILE),
                found: v,
                supported: REGISTRY_FORMAT,
            })
        }
        None => {
            let txn = registry.begin_write().map_err(index_error)?;
            branches::copy_branch_tables(main, &txn)?;
            put_format(&txn, REGISTRY_FORMAT)?;
            txn.commit().map_err(index_error)?;
        }
    }
    branches::drop_from_index(main)?;
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use super::super::sim::{Rng, Sim};
    use super::super::{BranchRoot, BranchSet, StoreIo, INDEX_FILE};
    use super::*;

    fn open(sim: &Sim) -> Store {
        Store::open_with(Box::new(sim.clone()), "/sim".into()).expect("open the store")
    }

    fn set(live: &[(u32, bool)]) -> BranchSet {
        BranchSet {
            mounted: vec![(0, true), (1, false), (2, false)],
            live: live.to_vec(),
        }
    }

    /// What a reader finds of the branch registry.
    type Found = (Option<BranchSet>, Vec<String>, Vec<u32>);

    fn found(store: &Store) -> Found {
        let snapshots = store
            .branch_set_log()
            .snapshots()
            .expect("snapshots")
            .into_iter()
            .map(|s| s.name)
            .collect();
        let ids = store
            .branches()
            .expect("branches")
            .into_iter()
            .map(|r| r.id)
            .collect();
        (store.branch_set().expect("branch set"), snapshots, ids)
    }

    fn roots(n: u64) -> Vec<BranchRoot> {
        (0..n)
            .map(|i| BranchRoot {
                path: format!("/b{i}").into(),
                dev: 1,
                ino: 100 + i,
                born: None,
            })
            .collect()
    }

    /// A branch change is recorded durably before it takes effect: a power
    /// cut at any point leaves the set last acknowledged or the one being
    /// recorded, and a snapshot's name only with its set.
    #[test]
    fn a_power_cut_leaves_the_old_branch_set_or_the_new_one() {
        let sim = Sim::new();
        let store = open(&sim);
        store.branch_ids(&roots(3)).unwrap();
        let log = store.branch_set_log();
        let mut records = vec![(None, false)];
        let mut acked = Vec::new();
        let mut rng = Rng::new(17);
        for i in 0..10 {
            let next = set(&[(0, rng.chance(2)), (1, rng.chance(2)), (2, i % 2 == 0)]);
            let snapshot = i % 4 == 3;
            if snapshot {
                let snap = super::super::Snapshot {
                    name: format!("s{i}"),
                    branch: 0,
                    time_ns: i,
                };
                log.record_snapshot(&next, &snap).unwrap();
            } else {
                log.record(&next).unwrap();
            }
            records.push((Some(next), snapshot));
            acked.push(sim.log_len());
        }
        drop((log, store));
        for k in 0..=sim.log_len() {
            // Records acknowledged by log position k; the next may be in flight.
            let done = acked.iter().filter(|&&p| p <= k).count();
            let allowed = &records[done..(done + 2).min(records.len())];
            for _ in 0..2 {
                let image = sim.crash_image(k, &mut rng);
                let (live, snapshots, _) = found(&open(&image));
                let at = allowed
                    .iter()
                    .position(|(s, _)| *s == live)
                    .unwrap_or_else(|| panic!("cut at {k}: {live:?}, not one of {allowed:?}"));
                let named = records[..=done + at].iter().filter(|(_, s)| *s).count();
                assert_eq!(
                    snapshots.len(),
                    named,
                    "cut at {k}: snapshot names {snapshots:?}"
                );
            }
        }
    }

    /// Makes `sim` a format-6 store: the branch tables in the index, no
    /// registry, everything synced.
    fn make_format_6(sim: &Sim) {
        let store = open(sim);
        {
            let txn = store.index().begin_write().unwrap();
            branches::copy_branch_tables(&store.registry, &txn).unwrap();
            put_format(&txn, 6).unwrap();
            txn.commit().unwrap();
        }
        drop(store);
        sim.remove(REGISTRY_FILE).unwrap();
        sim.sync_dir("").unwrap();
    }

    fn table_names(db: &Index) -> Vec<String> {
        use redb::TableHandle;
        let txn = db.begin_read().unwrap();
        txn.list_tables()
            .unwrap()
            .map(|t| t.name().to_string())
            .collect()
    }

    /// A format-6 store (branch tables in its index) opens with every
    /// branch id, the live set and the snapshots' names, moved to the
    /// registry; a power cut at any point of the move loses none of them.
    #[test]
    fn a_format_6_store_moves_its_branch_tables_and_survives_a_cut_midway() {
        let sim = Sim::new();
        let expected = {
            let store = open(&sim);
            store.branch_ids(&roots(4)).unwrap();
            store.start_branch_set(&set(&[]).mounted).unwrap();
            let log = store.branch_set_log();
            let live = set(&[(0, true), (1, true), (2, false)]);
            log.record(&live).unwrap();
            let snap = super::super::Snapshot {
                name: "before-upgrade".into(),
                branch: 1,
                time_ns: 5,
            };
            log.record_snapshot(&live, &snap).unwrap();
            found(&store)
        };
        assert_eq!(expected.1, vec!["before-upgrade".to_string()]);
        assert_eq!(expected.2, vec![0, 1, 2, 3]);
        make_format_6(&sim);
        assert!(!sim.list("").unwrap().iter().any(|n| n == REGISTRY_FILE));
        let start = sim.log_len();
        let store = open(&sim);
        assert_eq!(found(&store), expected);
        let names = table_names(&store.index());
        for moved in ["branches", "branch_set", "snapshots"] {
            assert!(
                !names.iter().any(|n| n == moved),
                "{moved} left in the index"
            );
        }
        assert_eq!(
            store.index().format().unwrap(),
            Some(u64::from(super::super::FORMAT_VERSION))
        );
        // A new id continues where the old counter was.
        assert_eq!(store.branch_ids(&roots(5)).unwrap(), vec![0, 1, 2, 3, 4]);
        drop(store);
        let end = sim.log_len();
        let mut rng = Rng::new(29);
        for k in start..=end {
            for _ in 0..2 {
                let image = sim.crash_image(k, &mut rng);
                let store = open(&image);
                let (live, snapshots, ids) = found(&store);
                assert_eq!(
                    (&live, &snapshots),
                    (&expected.0, &expected.1),
                    "cut at {k}"
                );
                assert!(ids.starts_with(&expected.2), "cut at {k}: ids {ids:?}");
                // And it opens again the same (the move finished).
                drop(store);
                assert_eq!(found(&open(&image)).0, expected.0, "cut at {k}, reopened");
            }
        }
        assert!(sim.list("").unwrap().iter().any(|n| n == INDEX_FILE));
    }

    #[test]
    fn a_registry_of_an_unknown_format_is_refused() {
        let sim = Sim::new();
        let store = open(&sim);
        {
            let txn = store.registry.begin_write().unwrap();
            put_format(&txn, 99).unwrap();
            txn.commit().unwrap();
        }
        drop(store);
        let err = Store::open_with(Box::new(sim.clone()), "/sim".into())
            .err()
            .expect("a registry of format 99 opened");
        assert!(err.to_string().contains("99"), "{err}");
    }
}
