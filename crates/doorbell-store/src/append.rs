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

use crate::{Error, Result};

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

/// Append `line` (one JSON object without its newline) to the inbox at `path`. Returns the
/// offset the line starts at.
pub fn append_line(path: &Path, line: &[u8]) -> Result<u64> {
    debug_assert!(
        !line.contains(&b'\n'),
        "a line never contains a raw newline"
    );
    let file = open_inbox(path, true)?;
    file.lock().map_err(Error::io("lock inbox", path))?;
    let len = file
        .metadata()
        .map_err(Error::io("stat inbox", path))?
        .len();
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
    buf.extend_from_slice(line);
    buf.push(b'\n');
    let mut file = crate::fault::Guarded {
        file,
        path: path.to_path_buf(),
    };
    file.write_all(&buf)
        .map_err(Error::io("append to inbox", path))?;
    // Closing the file releases the lock.
    Ok(offset)
}
