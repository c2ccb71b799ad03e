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
/// Read through a buffer on the stack: this runs on every sweep, and a heap buffer here showed
/// up as fresh pages faulted in on each arrival.
pub fn hash_range(file: &File, offset: u64, len: u64) -> io::Result<Option<u64>> {
    let mut buf = [0u8; 4096];
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut done = 0;
    while done < len {
        let want = usize::try_from((len - done).min(buf.len() as u64)).unwrap_or(buf.len());
        let n = file.read_at(&mut buf[..want], offset + done)?;
        if n == 0 {
            return Ok(None);
        }
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    Ok(Some(hasher.digest()))
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

    /// [`Marker::of`], taking the head as `head` (its length and hash) when that is the head
    /// `offset` needs: for a file whose head was just read and matched, only the bytes
    /// before `offset` are read.
    pub fn of_with_head(
        file: &File,
        offset: u64,
        head: Option<(u64, u64)>,
    ) -> io::Result<Option<Marker>> {
        let head_len = offset.min(HEAD_BYTES);
        let Some((known_len, known)) = head.filter(|(len, _)| *len == head_len) else {
            return Marker::of(file, offset);
        };
        let tail_len = offset.min(TAIL_BYTES);
        Ok(
            hash_range(file, offset - tail_len, tail_len)?.map(|tail| Marker {
                head_len: known_len,
                head: known,
                tail,
            }),
        )
    }

    /// The head this marker holds: its length and hash.
    #[must_use]
    pub fn head(&self) -> (u64, u64) {
        (self.head_len, self.head)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::hash_range;

    /// Markers are on disk (journal marks, checkpoints, cursors): reading through a buffer
    /// must hash exactly as xxh3 over the whole range did.
    #[test]
    fn a_range_hashes_as_the_one_shot_xxh3_of_its_bytes() {
        let bytes: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        for (offset, len) in [
            (0, 0),
            (0, 1),
            (5, 32),
            (0, 4095),
            (0, 4096),
            (3, 4097),
            (100, 12_345),
        ] {
            let want = xxhash_rust::xxh3::xxh3_64(&bytes[offset..offset + len]);
            assert_eq!(
                hash_range(&file, offset as u64, len as u64).unwrap(),
                Some(want),
                "{offset}+{len}"
            );
        }
        assert_eq!(hash_range(&file, 19_990, 11).unwrap(), None, "past the end");
    }
}
