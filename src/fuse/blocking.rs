//! A small pool for requests that may block for long (fsync): handled off
//! the request threads, so a slow disk flush never stalls other callers.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

pub struct BlockingPool {
    queue: SyncSender<Job>,
}

/// Flushes queued beyond this wait for a free worker (back-pressure).
const QUEUE: usize = 256;

impl BlockingPool {
    pub fn new(workers: usize) -> std::io::Result<BlockingPool> {
        let (queue, jobs) = sync_channel::<Job>(QUEUE);
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..workers {
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name(format!("blocking-{i}"))
                .spawn(move || work(&jobs))?;
        }
        Ok(BlockingPool { queue })
    }

    /// Runs `job` on a worker; if the pool is gone, runs it right here.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        if let Err(job) = self.queue.send(Box::new(job)) {
            (job.0)();
        }
    }
}

fn work(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}
