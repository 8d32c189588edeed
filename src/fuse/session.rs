//! Making the kernel mount and running the request loop.

use std::io;
use std::path::Path;

use fuser::MountOption as M;

use super::ChronoFuse;

/// What the kernel mount should look like.
#[derive(Clone, Debug)]
pub struct MountSpec {
    /// Shown as the source in /proc/mounts.
    pub fsname: String,
    /// Generic mount flags from `-o` (ro, nosuid, noexec...).
    pub kernel_flags: Vec<String>,
    pub allow_other: bool,
    /// Request threads.
    pub threads: usize,
    /// Ask for FUSE over io_uring (falls back to /dev/fuse when INIT does
    /// not offer it).
    pub uring: bool,
}

impl MountSpec {
    fn options(&self) -> Vec<M> {
        let mut out = vec![
            M::FSName(self.fsname.clone()),
            // fuser passes Subtype only to fusermount; as root it mounts
            // directly, so the kernel gets it as a plain option.
            M::CUSTOM("subtype=chronofs".into()),
            M::DefaultPermissions,
        ];
        let has = |k: &str| self.kernel_flags.iter().any(|o| o == k);
        // Files in SRC may carry set-id bits and device nodes natively, so
        // the root-run mount honours them too unless told otherwise.
        if !has("nosuid") {
            out.push(M::Suid);
        }
        if !has("nodev") {
            out.push(M::Dev);
        }
        for k in &self.kernel_flags {
            out.push(match k.as_str() {
                "suid" | "dev" => continue,
                "ro" => M::RO,
                "rw" => M::RW,
                "nosuid" => M::NoSuid,
                "nodev" => M::NoDev,
                "exec" => M::Exec,
                "noexec" => M::NoExec,
                "atime" => M::Atime,
                "noatime" => M::NoAtime,
                "sync" => M::Sync,
                "async" => M::Async,
                "dirsync" => M::DirSync,
                other => M::CUSTOM(other.to_string()),
            });
        }
        out
    }
}

/// A mounted chronofs, not yet serving.
pub struct Mounted {
    session: fuser::Session<ChronoFuse>,
}

impl Mounted {
    pub fn new(fs: ChronoFuse, mnt: &Path, spec: &MountSpec) -> io::Result<Mounted> {
        let mut config = fuser::Config::default();
        config.mount_options = spec.options();
        if spec.allow_other {
            config.acl = fuser::SessionACL::All;
        }
        config.n_threads = Some(spec.threads);
        // One /dev/fuse descriptor per thread: requests are not funnelled
        // through a single queue lock.
        config.clone_fd = true;
        config.io_uring = spec.uring;
        fs.forget_removed_views();
        fs.invalidate_changed_attrs();
        fs.drop_names_at_set_change();
        let notifier = fs.notifier_slot();
        let session = fuser::Session::new(fs, mnt, &config)?;
        // Only ever set here, once.
        let _ = notifier.set(session.notifier());
        Ok(Mounted { session })
    }

    /// Whether INIT granted FUSE over io_uring.
    pub fn io_uring_granted(&self) -> bool {
        self.session.io_uring_granted()
    }

    /// The transport in use (io_uring once its queues registered).
    pub fn transport(&self) -> fuser::TransportState {
        self.session.transport()
    }

    /// Serves requests until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}
