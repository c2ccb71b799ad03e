//! Content hashes for recognising a file again: xxh3, a fixed algorithm, so a hash written to
//! disk today still matches after an upgrade.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// How many bytes at the head of a file identify it.
pub const HEAD_BYTES: u64 = 4096;
/// How many bytes just before an offset identified the position in markers that do not say
/// (`Marker::tail_len` is `None`), and the least a marker covers.
pub const TAIL_BYTES: u64 = 32;
/// The most bytes before an offset a marker covers: the whole last line when it is shorter.
pub const MAX_TAIL_BYTES: u64 = 64 * 1024;

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

/// What identifies a position in a file: its first bytes and the bytes just before it, the
/// last line's whole (with the line break before it), where that line's id is. Lines of one
/// length and one text differ only there: a file restored to an older copy and written on
/// to the same length is not taken for the file it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    pub head_len: u64,
    pub head: u64,
    pub tail: u64,
    /// How many bytes before the offset `tail` covers; `None` in markers written before it
    /// was kept, which cover [`TAIL_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_len: Option<u64>,
}

/// How many bytes before `offset` a new marker covers, and their hash: back to the line break
/// before the last line (included), at least [`TAIL_BYTES`] and at most [`MAX_TAIL_BYTES`].
/// `None` when the file is shorter than `offset`. A last line inside the first read (4 KiB,
/// ending at the offset) is hashed from that read: one read per marker, as over 32 bytes.
fn tail(file: &File, offset: u64) -> io::Result<Option<(u64, u64)>> {
    let least = offset.min(TAIL_BYTES);
    let most = offset.min(MAX_TAIL_BYTES);
    let mut buf = [0u8; 4096];
    let mut end = offset;
    while end > offset - most {
        let start = end.saturating_sub(buf.len() as u64).max(offset - most);
        let want = usize::try_from(end - start).unwrap_or(buf.len());
        if file.read_at(&mut buf[..want], start)? < want {
            return Ok(None);
        }
        // The byte just before the offset ends the last line: no break to stop at.
        let search = if end == offset {
            &buf[..want.saturating_sub(1)]
        } else {
            &buf[..want]
        };
        if let Some(at) = search.iter().rposition(|&b| b == b'\n') {
            let len = (offset - (start + at as u64)).max(least);
            let from = offset - len;
            if end == offset && from >= start {
                let kept = usize::try_from(from - start).unwrap_or(0);
                return Ok(Some((len, xxhash_rust::xxh3::xxh3_64(&buf[kept..want]))));
            }
            return Ok(hash_range(file, from, len)?.map(|hash| (len, hash)));
        }
        end = start;
    }
    let len = most.max(least);
    Ok(hash_range(file, offset - len, len)?.map(|hash| (len, hash)))
}

impl Marker {
    /// The marker of `offset` in `file`, or `None` when the file is shorter than `offset`.
    pub fn of(file: &File, offset: u64) -> io::Result<Option<Marker>> {
        Marker::of_with_head(file, offset, None)
    }

    /// Whether `file` still has the same bytes at the head and before `offset`.
    pub fn matches(&self, file: &File, offset: u64) -> io::Result<bool> {
        let tail_len = self.tail_len.unwrap_or(offset.min(TAIL_BYTES));
        if self.head_len != offset.min(HEAD_BYTES) || tail_len > offset {
            return Ok(false);
        }
        Ok(hash_range(file, 0, self.head_len)? == Some(self.head)
            && hash_range(file, offset - tail_len, tail_len)? == Some(self.tail))
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
        let head = match head.filter(|(len, _)| *len == head_len) {
            Some((_, known)) => Some(known),
            None => hash_range(file, 0, head_len)?,
        };
        let (Some(head), Some((tail_len, tail))) = (head, tail(file, offset)?) else {
            return Ok(None);
        };
        Ok(Some(Marker {
            head_len,
            head,
            tail,
            tail_len: Some(tail_len),
        }))
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

    use super::{hash_range, Marker, TAIL_BYTES};

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

    /// A marker covers the last line and the break before it, at least 32 bytes; one written
    /// before it said how much it covers still matches over 32.
    #[test]
    fn a_marker_covers_the_whole_last_line_and_old_markers_still_match() {
        let long = format!("{{\"id\":\"B\",\"text\":\"{}\"}}\n", "y".repeat(100));
        let text = format!("{{\"id\":\"A\"}}\n{long}");
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        let end = text.len() as u64;
        let marker = Marker::of(&file, end).unwrap().unwrap();
        assert_eq!(marker.tail_len, Some(long.len() as u64 + 1));
        let covered = long.len() as u64 + 1;
        assert_eq!(
            Some(marker.tail),
            hash_range(&file, end - covered, covered).unwrap(),
            "hashed from the read as over the range"
        );
        assert!(marker.matches(&file, end).unwrap());
        // A file of one short line: all of it.
        let short = Marker::of(&file, 11).unwrap().unwrap();
        assert_eq!(short.tail_len, Some(11));
        assert!(
            Marker::of(&file, end + 1).unwrap().is_none(),
            "past the end"
        );
        // A last line longer than one read (4 KiB) is found further back, and hashed whole.
        let mut big = tempfile::tempfile().unwrap();
        let line = format!("{{\"id\":\"D\",\"text\":\"{}\"}}\n", "z".repeat(10_000));
        big.write_all(format!("x\n{line}").as_bytes()).unwrap();
        let big_end = 2 + line.len() as u64;
        let whole = Marker::of(&big, big_end).unwrap().unwrap();
        assert_eq!(whole.tail_len, Some(line.len() as u64 + 1));
        assert!(whole.matches(&big, big_end).unwrap());
        // The same length and text under another id is another file.
        let other = text.replace("\"B\"", "\"C\"");
        let mut copy = tempfile::tempfile().unwrap();
        copy.write_all(other.as_bytes()).unwrap();
        assert!(!marker.matches(&copy, end).unwrap());
        // A marker from before: 32 bytes, no length kept.
        let old = Marker {
            tail: hash_range(&file, end - TAIL_BYTES, TAIL_BYTES)
                .unwrap()
                .unwrap(),
            tail_len: None,
            ..marker
        };
        assert!(old.matches(&file, end).unwrap());
        let json = serde_json::to_string(&old).unwrap();
        assert!(!json.contains("tailLen"), "{json}");
        assert_eq!(serde_json::from_str::<Marker>(&json).unwrap(), old);
    }
}
