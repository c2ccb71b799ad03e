//! Replacing a state file so that a crash at any instant leaves either the old or the new
//! content, never a mix: temp file, fsync, rename, fsync the folder.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::fault::{self, Guarded};
use crate::{Error, Result};

/// The temp file that becomes `path`: hidden, beside it, named after it and this process
/// (`.web-inbox.cursor.tmp.4242`), so one left by a killed process is recognised as such.
fn temp_path(path: &Path) -> std::path::PathBuf {
    temp_path_in(path.parent().unwrap_or(Path::new(".")), path)
}

/// [`temp_path`], in `dir` instead of beside `path`.
fn temp_path_in(dir: &Path, path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    dir.join(format!(".{name}.tmp.{}", std::process::id()))
}

/// Remove from `dir` the temp files (`.NAME.tmp.PID`) that processes no longer running left
/// behind: killed between writing one and renaming it.
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .filter(|n| n.starts_with('.'))
            .and_then(|n| n.rsplit_once(".tmp.").map(|(_, pid)| pid))
        else {
            continue;
        };
        let dead = pid.parse::<u32>().is_ok_and(|pid| {
            pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
        });
        if dead {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Write `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace_with(path, None, |out| out.write_all(bytes))
}

/// Write `bytes` to `path` atomically against a crash of the process, without waiting for
/// the disk: after a power loss the file may hold its previous content. For state that may
/// go back but never forward (a reader's cursor: messages shown again, never skipped), where
/// an fsync on every update would hold up the reader.
pub fn write_atomic_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_unsynced_via(path, path.parent().unwrap_or(Path::new(".")), bytes).map(drop)
}

/// [`write_atomic_unsynced`], with the temp file made in `tmp_dir` (a folder of the same
/// file system that nobody watches, so that the write makes no events beside `path` but the
/// rename), and the file written handed back, open for reading: closing it later makes no
/// "closed after writing" event beside `path` either.
pub fn write_atomic_unsynced_via(path: &Path, tmp_dir: &Path, bytes: &[u8]) -> Result<File> {
    let tmp = temp_path_in(tmp_dir, path);
    let replaced = replace_via(path, &tmp, None, Some(bytes.len()), |out| {
        out.write_all(bytes)
    });
    if replaced.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    replaced
}

/// Replace `path` with what `write` produces, atomically; the file it replaces is first
/// renamed to `previous` when one is given, so a reader always finds one of the two.
pub fn replace_with(
    path: &Path,
    previous: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    let tmp = temp_path(path);
    let replaced = replace_via(path, &tmp, previous, None, write);
    if replaced.is_err() {
        // Nothing refers to the temp file: leave no litter (and give back the space).
        let _ = fs::remove_file(&tmp);
    }
    replaced.map(drop)
}

/// Write `tmp`, rename it to `path` (after renaming `path` to `previous`), and hand back the
/// file. `unsynced`: not synced, its length known (`None`: synced, the file and the folder).
fn replace_via(
    path: &Path,
    tmp: &Path,
    previous: Option<&Path>,
    unsynced: Option<usize>,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<File> {
    let durable = unsynced.is_none();
    let dir = path.parent().unwrap_or(Path::new("."));
    fault::check(tmp).map_err(Error::io("write", tmp))?;
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(tmp)
        .map_err(Error::io("write", tmp))?;
    if let Some(len) = unsynced {
        // Its blocks reserved before the write, not at it: ext4 writes a file renamed over
        // another to disk at once while its blocks are still to be allocated (so that a crash
        // cannot leave it empty); a cursor moved after every message made a disk write for
        // every message, and waited for it when the file it replaced was let go. This file
        // needs no such care (it may go back after a power loss, never forward), and replaced
        // before the next writeback it is never written at all. Where a file system cannot
        // reserve, it is written as before.
        let _ = rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len as u64);
    }
    let file = Guarded {
        file,
        path: tmp.to_path_buf(),
    };
    // A small state file (a cursor) is written as it comes; a large one (a board, a report)
    // in large writes.
    let mut out = BufWriter::with_capacity(if durable { 1 << 20 } else { 0 }, file);
    write(&mut out).map_err(Error::io("write", tmp))?;
    let file = out
        .into_inner()
        .map_err(|e| Error::io("write", tmp)(e.into_error()))?;
    if durable {
        fault::check(tmp).map_err(Error::io("sync", tmp))?;
        file.file.sync_all().map_err(Error::io("sync", tmp))?;
    }
    // Handed back open for reading only; the written one is closed here, before the rename.
    let file = if durable {
        file.file
    } else {
        let reading = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(tmp)
            .map_err(Error::io("reopen", tmp))?;
        drop(file);
        reading
    };
    fault::check(path).map_err(Error::io("rename", path))?;
    if let Some(previous) = previous.filter(|_| path.exists()) {
        fs::rename(path, previous).map_err(Error::io("keep previous copy of", path))?;
    }
    fs::rename(tmp, path).map_err(Error::io("rename", path))?;
    if !durable {
        return Ok(file);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io("sync folder", dir))?;
    Ok(file)
}
