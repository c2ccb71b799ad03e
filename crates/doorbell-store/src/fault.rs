//! A seam for disk faults. A test arms it for one folder, and the store's writes under that
//! folder then fail as on a full disk (`ENOSPC`) or a read-only file system (`EROFS`), after
//! an optional budget of bytes that still get through (so a record can be torn half way).
//! Every write of the journal, the refused log, state files and inbox appends passes here;
//! disarmed, the seam costs one atomic load.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// What kind of failure to play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `ENOSPC`: data beyond the budget is refused; opening, renaming and syncing still work
    /// until the budget is spent.
    NoSpace,
    /// `EROFS`: nothing under the folder can be opened for writing, written, synced or
    /// renamed.
    ReadOnly,
}

impl Fault {
    fn error(self) -> io::Error {
        io::Error::from_raw_os_error(match self {
            Fault::NoSpace => libc::ENOSPC,
            Fault::ReadOnly => libc::EROFS,
        })
    }
}

#[derive(Debug)]
struct Plan {
    dir: PathBuf,
    fault: Fault,
    budget: u64,
}

static ARMED: AtomicBool = AtomicBool::new(false);
static PLANS: Mutex<Vec<Plan>> = Mutex::new(Vec::new());

fn plans() -> std::sync::MutexGuard<'static, Vec<Plan>> {
    PLANS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Make writes under `dir` fail with `fault` once `budget` more bytes were written there.
/// `dir` is compared as given: pass the bridge's own (canonical) folder.
pub fn inject(dir: &Path, fault: Fault, budget: u64) {
    let mut plans = plans();
    plans.retain(|p| p.dir != dir);
    plans.push(Plan {
        dir: dir.to_path_buf(),
        fault,
        budget,
    });
    ARMED.store(true, Ordering::SeqCst);
}

/// Let writes under `dir` succeed again.
pub fn clear(dir: &Path) {
    let mut plans = plans();
    plans.retain(|p| p.dir != dir);
    ARMED.store(!plans.is_empty(), Ordering::SeqCst);
}

/// How many of `len` bytes may be written to `path` now: all of them when no fault is armed
/// for it, else what is left of the budget, and an error once nothing is.
pub(crate) fn allow(path: &Path, len: usize) -> io::Result<usize> {
    if !ARMED.load(Ordering::Relaxed) {
        return Ok(len);
    }
    let mut plans = plans();
    let Some(plan) = plans.iter_mut().find(|p| path.starts_with(&p.dir)) else {
        return Ok(len);
    };
    if plan.fault == Fault::ReadOnly || plan.budget == 0 {
        return Err(plan.fault.error());
    }
    let n = len.min(usize::try_from(plan.budget).unwrap_or(usize::MAX));
    plan.budget -= n as u64;
    Ok(n)
}

/// Whether an operation that changes `path` without writing data into it (opening it for
/// writing, syncing, renaming) may go ahead.
pub(crate) fn check(path: &Path) -> io::Result<()> {
    if !ARMED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let plans = plans();
    match plans.iter().find(|p| path.starts_with(&p.dir)) {
        Some(plan) if plan.fault == Fault::ReadOnly || plan.budget == 0 => Err(plan.fault.error()),
        _ => Ok(()),
    }
}

/// The fault that fails writes under `path` now, if one is armed and its budget spent: what
/// `status` reads in place of the file system's own state (`statvfs`).
pub(crate) fn failing(path: &Path) -> Option<Fault> {
    if !ARMED.load(Ordering::Relaxed) {
        return None;
    }
    let plans = plans();
    plans
        .iter()
        .find(|p| path.starts_with(&p.dir))
        .filter(|plan| plan.fault == Fault::ReadOnly || plan.budget == 0)
        .map(|plan| plan.fault)
}

/// A file whose writes pass the seam.
#[derive(Debug)]
pub(crate) struct Guarded {
    pub file: File,
    pub path: PathBuf,
}

impl Write for Guarded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = allow(&self.path, buf.len())?;
        self.file.write(&buf[..n])
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Guarded {
    pub fn sync_data(&self) -> io::Result<()> {
        check(&self.path)?;
        self.file.sync_data()
    }
}
