//! Content hashes for recognising a file again: xxh3, a fixed algorithm, so a hash written to
//! disk today still matches after an upgrade.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// How many bytes at the head of a file identify it.
pub const HEAD_BYTES: u64 = 4096;
/// How many bytes just before an offset identify the position.
pub const TAIL_BYTES: u64 = 32;

/// The xxh3 hash of `len` bytes of `file` from `offset`, or `None` when the file is shorter.
pub fn hash_range(file: &File, offset: u64, len: u64) -> io::Result<Option<u64>> {
    let mut buf = vec![0; len as usize];
    let mut done = 0;
    while done < buf.len() {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            return Ok(None);
        }
        done += n;
    }
    Ok(Some(xxhash_rust::xxh3::xxh3_64(&buf)))
}

/// What identifies a position in a file: its first bytes and the bytes just before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    pub head_len: u64,
    pub head: u64,
    pub tail: u64,
}

impl Marker {
    /// The marker of `offset` in `file`, or `None` when the file is shorter than `offset`.
    pub fn of(file: &File, offset: u64) -> io::Result<Option<Marker>> {
        let head_len = offset.min(HEAD_BYTES);
        let tail_len = offset.min(TAIL_BYTES);
        let (Some(head), Some(tail)) = (
            hash_range(file, 0, head_len)?,
            hash_range(file, offset - tail_len, tail_len)?,
        ) else {
            return Ok(None);
        };
        Ok(Some(Marker {
            head_len,
            head,
            tail,
        }))
    }

    /// Whether `file` still has the same bytes at the head and before `offset`.
    pub fn matches(&self, file: &File, offset: u64) -> io::Result<bool> {
        Ok(Marker::of(file, offset)?.as_ref() == Some(self))
    }
}
