//! Replacing a small state file so that a crash at any instant leaves either the old or the
//! new content, never a mix: temp file, fsync, rename, fsync the folder.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{Error, Result};

/// Write `bytes` to `path` atomically: a temp file, fsync, rename, fsync the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(Error::io("write", &tmp))?;
    file.write_all(bytes).map_err(Error::io("write", &tmp))?;
    file.sync_all().map_err(Error::io("sync", &tmp))?;
    fs::rename(&tmp, path).map_err(Error::io("rename", path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io("sync folder", dir))
}
