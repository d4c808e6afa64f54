//! A persistent thread pool for data-parallel kernels.
//!
//! `run(f)` calls `f(thread_index, num_threads)` once on every thread (the caller is thread 0) and returns when all
//! are done. Workers spin briefly between jobs (decode issues a few hundred small jobs per token, so waking threads
//! through the OS each time would cost more than the work) and then sleep on a condition variable, so an idle server
//! uses no CPU. Every wait spins only a few microseconds before it starts yielding the core: when the machine has
//! more runnable threads than cores, a spinning waiter would otherwise hold the core that the thread it waits for
//! needs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// How long a worker waits (spinning, then yielding) for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(200);
/// Busy-wait iterations before a waiter starts yielding its core (a few microseconds).
const SPIN_ITERS: u32 = 2000;

struct Shared {
    generation: AtomicU64,
    /// The current job, as a fat pointer whose lifetime `run` guarantees.
    job: Mutex<Option<Job<'static>>>,
    num_pending: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    num_threads: usize,
    /// Serializes `run` calls from different threads.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `num_threads` threads in all (the calling thread included). 0 means one per available core.
    pub fn new(num_threads: usize) -> Self {
        let num_threads = if num_threads == 0 { default_threads() } else { num_threads };
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            num_pending: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let handles = (1..num_threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("splash-cpu-{i}"))
                    .spawn(move || worker(shared, i, num_threads))
                    .expect("INVARIANT: spawning a worker thread succeeds at start-up")
            })
            .collect();
        ThreadPool { shared, handles, num_threads, run_lock: Mutex::new(()) }
    }

    pub fn num_threads(&self) -> usize {
        self.num_threads
    }

    /// Runs `f(thread_index, num_threads)` on every thread and waits for all of them.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.num_threads == 1 {
            f(0, 1);
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the job reference is only used by workers until `num_pending` drops to zero, which this function
        // waits for before returning, so it never outlives `f`.
        let job: Job<'static> = unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(f) };
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        self.shared.num_pending.store(self.num_threads - 1, Ordering::Release);
        {
            let _l = self.shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.shared.wake.notify_all();
        f(0, self.num_threads);
        let mut spins = 0u32;
        while self.shared.num_pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Splits `0..n` into chunks of `chunk` and hands them out dynamically to all threads, calling `f(range)`.
    pub fn for_each_chunk(&self, n: usize, chunk: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let chunk = chunk.max(1);
        let num_chunks = n.div_ceil(chunk);
        if num_chunks <= 1 || self.num_threads == 1 {
            if n > 0 {
                f(0..n);
            }
            return;
        }
        let next = AtomicUsize::new(0);
        self.run(&|_, _| {
            loop {
                let c = next.fetch_add(1, Ordering::Relaxed);
                if c >= num_chunks {
                    break;
                }
                f(c * chunk..((c + 1) * chunk).min(n));
            }
        });
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _l = self.shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.generation.fetch_add(1, Ordering::AcqRel);
        }
        self.shared.wake.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(shared: Arc<Shared>, index: usize, num_threads: usize) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else if start.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                let guard = shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                if shared.generation.load(Ordering::Acquire) == seen {
                    drop(shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        let job = *shared.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            job(index, num_threads);
        }
        shared.num_pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Physical cores are what matter for bandwidth-bound kernels; without a portable way to count them, use the
/// available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_once_per_job() {
        let pool = ThreadPool::new(4);
        for _ in 0..1000 {
            let hits = AtomicUsize::new(0);
            pool.run(&|i, n| {
                assert!(i < n);
                hits.fetch_add(1 << (8 * i), Ordering::Relaxed);
            });
            assert_eq!(hits.load(Ordering::Relaxed), 0x01010101);
        }
    }

    #[test]
    fn chunks_cover_the_range_exactly_once() {
        let pool = ThreadPool::new(3);
        let seen: Vec<AtomicUsize> = (0..1001).map(|_| AtomicUsize::new(0)).collect();
        pool.for_each_chunk(1001, 7, &|r| {
            for i in r {
                seen[i].fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = ThreadPool::new(2);
        std::thread::sleep(Duration::from_millis(5));
        let hits = AtomicUsize::new(0);
        pool.run(&|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
