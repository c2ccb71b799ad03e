//! The bridge lock, `.doorbell/lock`: whoever holds it is the judge. The holder writes its
//! pid and role into the file so a second judge can name it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::{Bridge, Error, Result};

/// A held bridge lock; dropping it releases the bridge.
#[derive(Debug)]
pub struct BridgeLock {
    file: File,
    path: PathBuf,
    /// The locked file's device and inode.
    identity: (u64, u64),
}

impl BridgeLock {
    /// Take the lock without waiting. `Ok(None)` when another judge holds it.
    pub fn try_acquire(bridge: &Bridge, role: &str) -> Result<Option<BridgeLock>> {
        let (mut file, path) = lock_file(bridge)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", &path)(e)),
        }
        file.set_len(0).map_err(Error::io("write lock", &path))?;
        writeln!(file, "pid {} ({role})", std::process::id())
            .map_err(Error::io("write lock", &path))?;
        let meta = file.metadata().map_err(Error::io("stat lock", &path))?;
        let identity = (
            std::os::unix::fs::MetadataExt::dev(&meta),
            std::os::unix::fs::MetadataExt::ino(&meta),
        );
        Ok(Some(BridgeLock {
            file,
            path,
            identity,
        }))
    }

    /// Take the lock, waiting while its holder is another command's short catch-up (up to
    /// `within`): a command that read the bridge while another judged for a moment would
    /// miss what that one was judging. `Ok(None)` when a daemon holds it, or the wait ran out.
    pub fn after_catch_ups(
        bridge: &Bridge,
        role: &str,
        within: std::time::Duration,
    ) -> Result<Option<BridgeLock>> {
        let until = std::time::Instant::now() + within;
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            if let Some(lock) = Self::try_acquire(bridge, role)? {
                return Ok(Some(lock));
            }
            // A holder that has not written its role yet (it does so just after taking the
            // lock) counts as passing too: its role is read again in a moment.
            let holder = holder(bridge);
            let transient = holder == UNKNOWN
                || TRANSIENT
                    .iter()
                    .any(|r| holder.ends_with(&format!("({r})")));
            if !transient || std::time::Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(20));
        }
    }

    /// Take the lock or fail with `Error::Locked` naming the holder.
    pub fn acquire(bridge: &Bridge, role: &str) -> Result<BridgeLock> {
        match Self::try_acquire(bridge, role)? {
            Some(lock) => Ok(lock),
            None => Err(Error::Locked {
                dir: bridge.dir().to_path_buf(),
                holder: holder(bridge),
            }),
        }
    }

    #[must_use]
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Whether the lock file at its path is still the one this judge locked. A `.doorbell/`
    /// restored under a running judge has a new one, free for any other judge to take.
    pub fn still_held(&self) -> Result<bool> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(&self.path) {
            Ok(now) => Ok((now.dev(), now.ino()) == self.identity),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("stat lock", &self.path)(e)),
        }
    }
}

impl Drop for BridgeLock {
    /// Name nobody once the lock is let go, so a stale role never misleads a waiter.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// The running daemon (or other long-lived judge) that holds the bridge's lock, as it named
/// itself; `None` when no process holds it, or a command's short catch-up does.
#[must_use]
pub fn running_judge(bridge: &Bridge) -> Option<String> {
    // Looked at, never made: a sender that is refused writes nothing.
    let path = bridge.dir().join(crate::bridge::STATE_DIR).join("lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    flock_holder(&file)?;
    let role = holder(bridge);
    let transient = role == UNKNOWN || TRANSIENT.iter().any(|r| role.ends_with(&format!("({r})")));
    (!transient).then_some(role)
}

/// The roles of judges that catch up and let go: worth waiting for.
pub const TRANSIENT: [&str; 2] = ["doorbell catch-up", "doorbell daemon --once"];

/// What `holder` says when the lock file names nobody.
const UNKNOWN: &str = "holder unknown";

/// Who holds the lock, as its holder wrote it.
#[must_use]
pub fn holder(bridge: &Bridge) -> String {
    let path = bridge.dir().join(crate::bridge::STATE_DIR).join("lock");
    let mut text = String::new();
    let read = File::open(&path).and_then(|mut f| f.read_to_string(&mut text));
    match read {
        Ok(_) if !text.trim().is_empty() => text.trim().to_owned(),
        _ => UNKNOWN.to_owned(),
    }
}

/// The bridge's lock file, opened (and created) but not locked: for taking the lock, or for
/// probing whether someone holds it.
pub fn lock_file(bridge: &Bridge) -> Result<(File, PathBuf)> {
    let path = bridge.state_dir()?.join("lock");
    let file = open_lock_file(&path)?;
    Ok((file, path))
}

/// A lock file at `path`, opened (created 0600 when missing) and never through a symlink.
pub fn open_lock_file(path: &std::path::Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(Error::io("open lock", path))
}

/// How much of a holder's command line an error shows.
const MAX_COMMAND: usize = 100;

/// Who holds a `flock` on `file`, from `/proc/locks`: "pid N: its command line", or `None`
/// when nobody does or the holder cannot be seen (another pid namespace, no `/proc`).
#[must_use]
pub fn flock_holder(file: &File) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().ok()?;
    let id = format!(
        "{:02x}:{:02x}:{}",
        libc::major(meta.dev()),
        libc::minor(meta.dev()),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    // Some file systems (an overlay, btrfs) give `stat` another device than the one the
    // kernel writes there: then the inode alone, when one flock names it.
    let pid = holder_in(&locks, &id).or_else(|| only_holder_of_inode(&locks, meta.ino()))?;
    let command = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let command: Vec<String> = command
        .split(|&b| b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    Some(match command.as_slice() {
        [] => format!("pid {pid}"),
        [program, args @ ..] => {
            // The program's name, not the path it was started by.
            let name = program.rsplit('/').next().unwrap_or(program);
            let mut text = format!("pid {pid}: {name}");
            for arg in args {
                text.push(' ');
                text.push_str(arg);
            }
            if let Some((cut, _)) = text.char_indices().nth(MAX_COMMAND) {
                text.truncate(cut);
                text.push_str("...");
            }
            text
        }
    })
}

/// Each `FLOCK` held in the text of `/proc/locks`: its holder's pid and its file
/// (`MAJOR:MINOR:INODE`); waiters (`->`) hold nothing.
fn flocks(locks: &str) -> impl Iterator<Item = (u32, &str)> {
    locks.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, "FLOCK", _, _, pid, file, ..] => Some((pid.parse().ok()?, *file)),
            _ => None,
        }
    })
}

/// The pid that holds the `FLOCK` on the file `id`.
fn holder_in(locks: &str, id: &str) -> Option<u32> {
    flocks(locks).find_map(|(pid, file)| (file == id).then_some(pid))
}

/// The pid that holds the only `FLOCK` on an inode numbered `ino`, on whatever device.
fn only_holder_of_inode(locks: &str, ino: u64) -> Option<u32> {
    let suffix = format!(":{ino}");
    let mut holders =
        flocks(locks).filter_map(|(pid, file)| file.ends_with(&suffix).then_some(pid));
    let first = holders.next()?;
    holders.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::{holder_in, only_holder_of_inode};

    #[test]
    fn the_holder_of_a_flock_is_found_and_its_waiters_are_not() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 fe:00:42 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 fe:00:10371300 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 5151 fe:00:10371300 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 99 fe:00:7 0 EOF\n";
        assert_eq!(holder_in(locks, "fe:00:10371300"), Some(4242));
        assert_eq!(holder_in(locks, "fe:00:7"), Some(99));
        // A POSIX lock is not a flock, and another file's lock is not this one's.
        assert_eq!(holder_in(locks, "fe:00:42"), None);
        assert_eq!(holder_in(locks, "fe:01:10371300"), None);
        let waiting_only = "2: -> FLOCK  ADVISORY  WRITE 5151 fe:00:10371300 0 EOF\n";
        assert_eq!(holder_in(waiting_only, "fe:00:10371300"), None);
    }

    #[test]
    fn an_inode_on_a_device_stat_does_not_name_is_found_when_one_flock_holds_it() {
        // An overlay: `stat` says 00:2a, the kernel 00:29.
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 00:29:1234 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 77 00:29:12345 0 EOF\n";
        assert_eq!(holder_in(locks, "00:2a:1234"), None);
        assert_eq!(only_holder_of_inode(locks, 1234), Some(4242));
        // Two files of that number on two devices: neither is named.
        let two = "1: FLOCK  ADVISORY  WRITE 4242 00:29:1234 0 EOF\n\
                   2: FLOCK  ADVISORY  WRITE 77 fe:00:1234 0 EOF\n";
        assert_eq!(only_holder_of_inode(two, 1234), None);
    }
}
