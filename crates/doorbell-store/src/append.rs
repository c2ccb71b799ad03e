//! Appending a line to an inbox, the way every writer must: under `flock(LOCK_EX)`, after
//! torn-tail repair, in one `write`.
//!
//! Torn-tail repair: a writer that crashed mid-line leaves a fragment without `\n`. Before
//! appending, the last byte is checked under the lock and a `\n` is written first when it is
//! missing, so the fragment spoils only itself (it is refused as `bad-json`) and never the
//! next good message.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Lock `file` (at `path`), an inbox opened for this one append and closed after it, waiting
/// at most `wait` for a process that holds it: then the error `locked` makes, never a wait
/// for good.
///
/// The wait is a blocked `flock` on a thread of its own, woken by the kernel when the holder
/// lets go, as the shell sender's `flock -w` waits: a writer that polled lost the lock to
/// every blocked one under a steady stream of writers, and gave up. The thread locks a
/// duplicate of `file` (the same open file, so the lock is `file`'s); one that gets the lock
/// after the wait was given up lets it go at once, which is safe only because nobody locks
/// this open file again. A thread given up on stays blocked until the holder lets go: past
/// [`MOST_WAITERS`] of them (a holder that hangs, a long-lived process asking again and
/// again), the wait polls instead.
fn lock_fresh_within(
    file: &std::fs::File,
    path: &Path,
    wait: Duration,
    locked: impl FnOnce() -> Error,
) -> Result<()> {
    use std::sync::atomic::Ordering;
    use std::sync::{mpsc, Arc, Mutex, PoisonError};
    match file.try_lock() {
        Ok(()) => return Ok(()),
        Err(std::fs::TryLockError::WouldBlock) if !wait.is_zero() => {}
        Err(std::fs::TryLockError::WouldBlock) => return Err(locked()),
        Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", path)(e)),
    }
    if WAITERS.fetch_add(1, Ordering::SeqCst) >= MOST_WAITERS {
        WAITERS.fetch_sub(1, Ordering::SeqCst);
        return lock_file_within(file, path, wait, locked);
    }
    let waiter = match file.try_clone() {
        Ok(waiter) => waiter,
        Err(e) => {
            WAITERS.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::io("lock", path)(e));
        }
    };
    // What became of the wait, decided once under the mutex: taken by the thread, or given
    // up by this one (then a lock the thread gets later is let go).
    let outcome: Arc<Mutex<Option<bool>>> = Arc::new(Mutex::new(None));
    let (done, finished) = mpsc::channel();
    let shared = Arc::clone(&outcome);
    let spawned = std::thread::Builder::new()
        .name("lock-wait".to_owned())
        .spawn(move || {
            let result = waiter.lock();
            if result.is_ok() {
                let mut outcome = shared.lock().unwrap_or_else(PoisonError::into_inner);
                if *outcome == Some(false) {
                    let _ = waiter.unlock();
                } else {
                    *outcome = Some(true);
                }
            }
            WAITERS.fetch_sub(1, Ordering::SeqCst);
            let _ = done.send(result);
        });
    if let Err(e) = spawned {
        WAITERS.fetch_sub(1, Ordering::SeqCst);
        return Err(Error::io("lock", path)(e));
    }
    match finished.recv_timeout(wait) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::io("lock", path)(e)),
        Err(_) => {
            let mut outcome = outcome.lock().unwrap_or_else(PoisonError::into_inner);
            if *outcome == Some(true) {
                // Taken right as the wait ended: it is ours.
                return Ok(());
            }
            *outcome = Some(false);
            Err(locked())
        }
    }
}

/// The threads of this process blocked in a lock's wait ([`lock_file_within`]).
static WAITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many threads may wait blocked at once; past them, waits poll.
const MOST_WAITERS: usize = 4;

/// Lock `file` (at `path`), waiting at most `wait` for a process that holds it: then the
/// error `locked` makes, never a wait for good. It tries again after a pause that doubles up
/// to 50 ms.
pub(crate) fn lock_file_within(
    file: &std::fs::File,
    path: &Path,
    wait: Duration,
    locked: impl FnOnce() -> Error,
) -> Result<()> {
    let until = Instant::now() + wait;
    let mut pause = Duration::from_millis(1);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(pause.min(until.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Err(locked()),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", path)(e)),
        }
    }
}

/// Open an existing inbox without following a symlink or blocking on a FIFO, and make sure it
/// is a regular file.
pub fn open_inbox(path: &Path, append: bool) -> Result<File> {
    if append {
        crate::fault::check(path).map_err(Error::io("open inbox", path))?;
    }
    let file = OpenOptions::new()
        .read(true)
        .append(append)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::NotRegularFile {
                    path: path.to_path_buf(),
                }
            } else {
                Error::io("open inbox", path)(e)
            }
        })?;
    let meta = file.metadata().map_err(Error::io("stat inbox", path))?;
    if !meta.file_type().is_file() {
        return Err(Error::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    Ok(file)
}

/// Open the inbox at `path` for appending and take its lock, waiting at most `wait`. A file
/// renamed away (a rotation) or replaced while its lock was waited for is no longer the
/// inbox: the lock is taken again on the file at `path`, or nothing would ever read the line.
fn open_locked(path: &Path, wait: Duration) -> Result<File> {
    use std::os::unix::fs::MetadataExt;
    let until = Instant::now() + wait;
    loop {
        let file = open_inbox(path, true)?;
        // Said with the whole wait, however much of it a replaced file took.
        let left = until.saturating_duration_since(Instant::now());
        lock_fresh_within(&file, path, left, || Error::InboxLocked {
            path: path.to_path_buf(),
            secs: wait.as_secs_f64(),
        })?;
        let held = file.metadata().map_err(Error::io("stat inbox", path))?;
        match std::fs::symlink_metadata(path) {
            Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => return Ok(file),
            // Gone or replaced: open what is at the path now (a missing inbox is said there).
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("stat inbox", path)(e)),
        }
        if Instant::now() >= until {
            return Err(Error::InboxLocked {
                path: path.to_path_buf(),
                secs: wait.as_secs_f64(),
            });
        }
    }
}

/// How long a sender waits for an inbox another process holds locked.
pub const SENDER_WAIT: Duration = Duration::from_secs(10);

/// Append `line` (one JSON object without its newline) to the inbox at `path`, waiting at
/// most [`SENDER_WAIT`] for its lock. Returns the offset the line starts at.
pub fn append_line(path: &Path, line: &[u8]) -> Result<u64> {
    append_line_within(path, line, SENDER_WAIT)
}

/// Append `line` to the inbox at `path`, waiting at most `wait` for its lock: a process
/// that holds it and hangs gets [`Error::InboxLocked`], never a writer stuck for good.
pub fn append_line_within(path: &Path, line: &[u8], wait: Duration) -> Result<u64> {
    append_line_checked(path, line, None, wait, |_, _| Ok(()))
}

/// [`append_line_within`], with `check` asked first, the lock held: given the inbox and its
/// length, it may refuse the line in view of what the inbox holds that no judge read yet.
/// `created_at`: where in `line` its `createdAt` value is (`2026-12-01T10:00:00.000Z`),
/// written again with the time the lock was taken: a sender that waited for the lock
/// stamps its line as written after the lines written meanwhile, the order a judge reads.
pub fn append_line_checked(
    path: &Path,
    line: &[u8],
    created_at: Option<std::ops::Range<usize>>,
    wait: Duration,
    check: impl FnOnce(&File, u64) -> Result<()>,
) -> Result<u64> {
    debug_assert!(
        !line.contains(&b'\n'),
        "a line never contains a raw newline"
    );
    let file = open_locked(path, wait)?;
    let len = file
        .metadata()
        .map_err(Error::io("stat inbox", path))?
        .len();
    check(&file, len)?;
    let mut buf = Vec::with_capacity(line.len() + 2);
    if len > 0 {
        let mut last = [0u8; 1];
        file.read_exact_at(&mut last, len - 1)
            .map_err(Error::io("read inbox", path))?;
        if last[0] != b'\n' {
            buf.push(b'\n');
        }
    }
    let offset = len + buf.len() as u64;
    let start = buf.len();
    buf.extend_from_slice(line);
    buf.push(b'\n');
    if let Some(at) = created_at {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let at = start + at.start..start + at.end;
        // The same length (any year of four digits): the line's checks still hold.
        if at.len() == now.len() && at.end <= buf.len() {
            buf[at].copy_from_slice(now.as_bytes());
        }
    }
    let mut file = crate::fault::Guarded {
        file,
        path: path.to_path_buf(),
    };
    let mut written = 0;
    if let Err(error) = write_counted(&mut file, &buf, &mut written) {
        // A line cut short (a full disk) would be a torn line, refused, its sender told it
        // was not delivered though a retry was. The lock is still held: cut it off, unless
        // a writer that takes no lock wrote past it meanwhile.
        if written > 0
            && file
                .file
                .metadata()
                .is_ok_and(|m| m.len() == len + written as u64)
        {
            if let Err(cut) = file.file.set_len(len) {
                tracing::warn!(path = %path.display(), %cut, "could not cut off a line that failed half way");
            }
        }
        return Err(Error::io("append to inbox", path)(error));
    }
    // Closing the file releases the lock.
    Ok(offset)
}

/// `write_all`, counting in `written` what got through before an error.
fn write_counted(file: &mut impl Write, buf: &[u8], written: &mut usize) -> std::io::Result<()> {
    while *written < buf.len() {
        match file.write(&buf[*written..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait given up leaves no lock behind: the thread that gets it later lets it go, and
    /// another open file of the inbox takes it. Within its time, a wait gets the lock the
    /// moment the holder lets go.
    #[test]
    fn a_wait_given_up_leaves_no_lock_and_a_wait_in_time_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web-inbox.jsonl");
        std::fs::write(&path, b"").unwrap();
        let holder = File::open(&path).unwrap();
        holder.lock().unwrap();
        let late = File::open(&path).unwrap();
        let gave_up = lock_fresh_within(&late, &path, Duration::from_millis(50), || {
            Error::InboxLocked {
                path: path.clone(),
                secs: 0.05,
            }
        });
        assert!(
            matches!(gave_up, Err(Error::InboxLocked { .. })),
            "{gave_up:?}"
        );
        drop(late);
        // The holder lets go while a second wait is on: it gets the lock.
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = std::thread::scope(|scope| {
            let path = &path;
            let waiting = scope.spawn(move || {
                let file = File::open(path).unwrap();
                tx.send(()).unwrap();
                let got = lock_fresh_within(&file, path, Duration::from_secs(20), || {
                    Error::InboxLocked {
                        path: path.clone(),
                        secs: 20.0,
                    }
                });
                (got.is_ok(), file)
            });
            rx.recv().unwrap();
            holder.unlock().unwrap();
            waiting.join().unwrap()
        });
        assert!(waiting.0, "the wait in time did not get the lock");
        drop(waiting.1);
        // Nothing holds it now: the given-up wait's thread let go of what it got, so
        // another open file takes the lock (blocked until then, within a bound).
        let third = File::open(&path).unwrap();
        let (tx, taken) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(third.lock().is_ok());
        });
        let taken = taken.recv_timeout(Duration::from_secs(20));
        assert_eq!(taken, Ok(true), "the lock was left held");
    }
}
