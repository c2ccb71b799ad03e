//! Reading whole lines from an offset. A line is complete only when its `\n` has been read;
//! a trailing fragment is never handed out, and the position returned is always the start of
//! a line. A line longer than the limit is skipped while streaming, never buffered whole.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

/// One complete line found in an inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line<'a> {
    /// The line's bytes without the `\n`.
    Complete { offset: u64, bytes: &'a [u8] },
    /// A line over the limit: only its place and length are known.
    TooLong { offset: u64, len: u64 },
}

impl Line<'_> {
    /// Where the line starts.
    #[must_use]
    pub fn offset(&self) -> u64 {
        match self {
            Line::Complete { offset, .. } | Line::TooLong { offset, .. } => *offset,
        }
    }

    /// The line's length in the file, with its `\n`.
    #[must_use]
    pub fn span(&self) -> u64 {
        match self {
            Line::Complete { bytes, .. } => bytes.len() as u64 + 1,
            Line::TooLong { len, .. } => len + 1,
        }
    }
}

const FIRST_BUFFER: usize = 256 * 1024;

/// The most lines in a batch: a read of tiny lines hands them out in batches of this many,
/// so a batch's lines and what is worked out for them stay a bounded size.
const BATCH_LINES: usize = 2048;

/// How many files' unended over-long lines a reader remembers.
const UNENDED_KEPT: usize = 8;

/// How many bytes before where an unended line was scanned to are checked again before the
/// scan goes on from there: a file rewritten in place since is scanned from the start.
const UNENDED_CHECKED: u64 = 256;

/// A line over the limit that had no newline yet when a read reached the end of its file:
/// where it starts, how far it was scanned, and a hash of its first bytes and of the bytes
/// just before where the scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unended {
    dev: u64,
    ino: u64,
    start: u64,
    scanned_to: u64,
    check: (u64, u64),
}

/// The hashes an [`Unended`] line is known by: its first [`UNENDED_CHECKED`] bytes and the
/// last ones before `scanned_to`.
fn unended_check(file: &File, start: u64, scanned_to: u64) -> Option<(u64, u64)> {
    let head = crate::hash::hash_range(file, start, UNENDED_CHECKED.min(scanned_to - start))
        .ok()
        .flatten()?;
    let from = scanned_to.saturating_sub(UNENDED_CHECKED).max(start);
    let tail = crate::hash::hash_range(file, from, scanned_to - from)
        .ok()
        .flatten()?;
    Some((head, tail))
}

/// A reusable line reader with a buffer bounded by the line limit.
#[derive(Debug)]
pub struct LineReader {
    buf: Vec<u8>,
    max_line_bytes: usize,
    /// Over-long lines without their end yet: a writer that grows one (or never ends it)
    /// costs each read only its new bytes, not the whole line again.
    unended: Vec<Unended>,
}

impl LineReader {
    #[must_use]
    pub fn new(max_line_bytes: usize) -> Self {
        Self {
            buf: Vec::new(),
            max_line_bytes,
            unended: Vec::new(),
        }
    }

    /// Where a read of `file` from `start` may go on scanning an over-long line it left
    /// unended, when the bytes before that are still the ones it scanned.
    fn resume(&mut self, file: &File, start: u64) -> Option<u64> {
        if self.unended.is_empty() {
            return None;
        }
        let meta = file.metadata().ok()?;
        let at = self
            .unended
            .iter()
            .position(|u| (u.dev, u.ino) == (meta.dev(), meta.ino()))?;
        let unended = self.unended.remove(at);
        let same = unended.start == start
            && meta.len() >= unended.scanned_to
            && unended_check(file, start, unended.scanned_to) == Some(unended.check);
        same.then_some(unended.scanned_to)
    }

    /// Remember that the over-long line of `file` at `start` has no end up to `scanned_to`.
    fn leave_unended(&mut self, file: &File, start: u64, scanned_to: u64) {
        let Ok(meta) = file.metadata() else {
            return;
        };
        let Some(check) = unended_check(file, start, scanned_to) else {
            return;
        };
        self.unended
            .retain(|u| (u.dev, u.ino) != (meta.dev(), meta.ino()));
        if self.unended.len() == UNENDED_KEPT {
            self.unended.remove(0);
        }
        self.unended.push(Unended {
            dev: meta.dev(),
            ino: meta.ino(),
            start,
            scanned_to,
            check,
        });
    }

    /// Call `each` for every complete line of `file` from `start` (which must be the start of
    /// a line) to the end of the file, and return the offset just after the last complete
    /// line. A line of up to `max_line_bytes` plus an optional `\r` counts as within the
    /// limit; the judge measures it exactly.
    pub fn read<E: From<io::Error>>(
        &mut self,
        file: &File,
        start: u64,
        each: impl FnMut(Line<'_>) -> Result<(), E>,
    ) -> Result<u64, E> {
        self.read_until(file, start, None, each)
    }

    /// As [`LineReader::read`], but taking the file to end at `known_end` (its size as just
    /// seen) when given: no read is spent finding the end. Bytes written past it since are
    /// left for the next read.
    pub fn read_until<E: From<io::Error>>(
        &mut self,
        file: &File,
        start: u64,
        known_end: Option<u64>,
        mut each: impl FnMut(Line<'_>) -> Result<(), E>,
    ) -> Result<u64, E> {
        self.read_batches_until(file, start, known_end, |lines| {
            lines.iter().try_for_each(|line| each(line.clone()))
        })
    }

    /// As [`LineReader::read_until`], handing out the lines of each read of the file
    /// together, in order, in batches of at most [`BATCH_LINES`]: lines that one thread can
    /// judge while another parses them.
    pub fn read_batches_until<E: From<io::Error>>(
        &mut self,
        file: &File,
        start: u64,
        known_end: Option<u64>,
        mut each: impl FnMut(&[Line<'_>]) -> Result<(), E>,
    ) -> Result<u64, E> {
        let limit = self.max_line_bytes + 1;
        if self.buf.is_empty() {
            self.buf = vec![0; FIRST_BUFFER.min(limit + 1).max(4096)];
        }
        let mut line_start = start; // file offset of buf[0]
        let mut filled = 0; // bytes of buf in use
        let mut read_at = start;
        let mut skipping: Option<u64> = None; // bytes of an over-long line seen so far
        if let Some(scanned_to) = self.resume(file, start) {
            skipping = Some(scanned_to - start);
            read_at = scanned_to;
        }
        loop {
            if filled == self.buf.len() {
                if self.buf.len() <= limit {
                    let bigger = (self.buf.len() * 2).min(limit + 1);
                    self.buf.resize(bigger, 0);
                } else {
                    // Longer than any allowed line: stop keeping it.
                    skipping = Some(filled as u64);
                    filled = 0;
                }
            }
            if known_end.is_some_and(|end| read_at >= end) {
                if skipping.is_some() {
                    self.leave_unended(file, line_start, read_at);
                }
                return Ok(line_start);
            }
            // Not past `known_end`: what was written since is left for the next read.
            let room = known_end.map_or(self.buf.len(), |end| {
                let left = usize::try_from(end - read_at).unwrap_or(usize::MAX);
                self.buf.len().min(filled.saturating_add(left))
            });
            let n = file.read_at(&mut self.buf[filled..room], read_at)?;
            if n == 0 {
                if skipping.is_some() {
                    self.leave_unended(file, line_start, read_at);
                }
                return Ok(line_start);
            }
            read_at += n as u64;
            let mut scan_from = filled;
            filled += n;
            // The over-long line this read ends, if any, goes first in the batch.
            let mut ended: Option<Line<'static>> = None;
            if let Some(seen) = skipping {
                match memchr::memchr(b'\n', &self.buf[..filled]) {
                    None => {
                        skipping = Some(seen + filled as u64);
                        filled = 0;
                        continue;
                    }
                    Some(at) => {
                        let len = seen + at as u64;
                        ended = Some(Line::TooLong {
                            offset: line_start,
                            len,
                        });
                        line_start += len + 1;
                        skipping = None;
                        self.buf.copy_within(at + 1..filled, 0);
                        filled -= at + 1;
                        scan_from = 0;
                    }
                }
            }
            let mut lines: Vec<Line<'_>> = ended.into_iter().collect();
            let mut first = 0; // start of the current line in buf
            for at in memchr::memchr_iter(b'\n', &self.buf[scan_from..filled]) {
                let end = scan_from + at;
                let offset = line_start + first as u64;
                lines.push(if end - first > limit {
                    Line::TooLong {
                        offset,
                        len: (end - first) as u64,
                    }
                } else {
                    Line::Complete {
                        offset,
                        bytes: &self.buf[first..end],
                    }
                });
                first = end + 1;
                if lines.len() == BATCH_LINES {
                    each(&lines)?;
                    lines.clear();
                }
            }
            if !lines.is_empty() {
                each(&lines)?;
            }
            drop(lines);
            if first > 0 {
                self.buf.copy_within(first..filled, 0);
                filled -= first;
                line_start += first as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_known_end_reads_as_far_as_the_end_of_the_file_would() {
        let content = b"one\ntwo\nthr";
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(content).unwrap();
        for known in [None, Some(content.len() as u64)] {
            let mut seen = Vec::new();
            let end = LineReader::new(64)
                .read_until::<io::Error>(&file, 0, known, |line| {
                    seen.push(line.offset());
                    Ok(())
                })
                .unwrap();
            assert_eq!((seen, end), (vec![0, 4], 8), "{known:?}");
        }
        // An end seen before more was written: the rest waits for the next read.
        let mut seen = Vec::new();
        let end = LineReader::new(64)
            .read_until::<io::Error>(&file, 0, Some(4), |line| {
                seen.push(line.offset());
                Ok(())
            })
            .unwrap();
        assert!(end >= 4 && seen.first() == Some(&0), "{seen:?} {end}");
    }

    /// A line over the limit that grows a little at a time: each read scans only what came
    /// since, and the line is found whole, with its length, once it ends. A file restored to
    /// an older copy meanwhile, and written on past where the scan stopped, is scanned from
    /// the start again.
    #[test]
    fn an_unended_long_line_is_scanned_on_from_where_the_last_read_stopped() {
        let mut file = tempfile::tempfile().unwrap();
        let mut reader = LineReader::new(64);
        let mut seen = Vec::new();
        {
            let mut read = |reader: &mut LineReader, file: &File, start: u64| {
                reader
                    .read::<io::Error>(file, start, |line| {
                        seen.push(match line {
                            Line::Complete { offset, bytes } => {
                                format!("{offset}:{}", String::from_utf8_lossy(bytes))
                            }
                            Line::TooLong { offset, len } => format!("{offset}:too-long {len}"),
                        });
                        Ok(())
                    })
                    .unwrap()
            };
            file.write_all(b"one\n").unwrap();
            for _ in 0..10 {
                file.write_all(&[b'x'; 1000]).unwrap();
                assert_eq!(read(&mut reader, &file, 4), 4);
            }
            assert_eq!(reader.unended.len(), 1);
            assert_eq!(reader.unended[0].scanned_to, 10_004);
            file.write_all(b"x\ntwo\n").unwrap();
            assert_eq!(read(&mut reader, &file, 4), 10_010);
            assert!(reader.unended.is_empty());
            // Again from byte 4, then restored to a copy with 2,000 of its bytes, and written on.
            file.set_len(4).unwrap();
            file.write_all_at(&[b'y'; 5000], 4).unwrap();
            assert_eq!(read(&mut reader, &file, 4), 4);
            assert_eq!(reader.unended[0].scanned_to, 5004);
            file.set_len(2004).unwrap();
            let after = [&b"\nthree\n"[..], &[b'z'; 4000][..]].concat();
            file.write_all_at(&after, 2004).unwrap();
            assert_eq!(read(&mut reader, &file, 4), 2011);
            // Unended again, then a whole line written in place over its start.
            file.write_all_at(&[b'w'; 5000], 2011).unwrap();
            assert_eq!(read(&mut reader, &file, 2011), 2011);
            file.write_all_at(b"over\n", 2011).unwrap();
            file.write_all_at(b"\n", 7011).unwrap();
            assert_eq!(read(&mut reader, &file, 2011), 7012);
        }
        assert_eq!(
            seen,
            [
                "4:too-long 10001",
                "10006:two",
                "4:too-long 2000",
                "2005:three",
                "2011:over",
                "2016:too-long 4995"
            ],
            "{seen:?}"
        );
    }

    fn lines(content: &[u8], start: u64, max: usize) -> (Vec<String>, u64) {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(content).unwrap();
        let mut out = Vec::new();
        let end = LineReader::new(max)
            .read::<io::Error>(&file, start, |line| {
                out.push(match line {
                    Line::Complete { offset, bytes } => {
                        format!("{offset}:{}", String::from_utf8_lossy(bytes))
                    }
                    Line::TooLong { offset, len } => format!("{offset}:too-long {len}"),
                });
                Ok(())
            })
            .unwrap();
        (out, end)
    }

    #[test]
    fn partial_tail_is_never_returned() {
        assert_eq!(
            lines(b"a\nbb\nccc", 0, 100),
            (vec!["0:a".into(), "2:bb".into()], 5)
        );
        assert_eq!(lines(b"a\nbb\n", 2, 100), (vec!["2:bb".into()], 5));
        assert_eq!(lines(b"", 0, 100), (vec![], 0));
        assert_eq!(lines(b"xyz", 0, 100), (vec![], 0));
    }

    #[test]
    fn long_lines_are_skipped_while_streaming() {
        let mut content = b"ok\n".to_vec();
        content.extend(std::iter::repeat_n(b'x', 1_000_000));
        content.extend(b"\nnext\n");
        let (out, end) = lines(&content, 0, 300);
        assert_eq!(out, vec!["0:ok", "3:too-long 1000000", "1000004:next"]);
        assert_eq!(end, content.len() as u64);
    }

    #[test]
    fn a_long_line_without_newline_stays_unread() {
        let mut content = b"ok\n".to_vec();
        content.extend(std::iter::repeat_n(b'x', 100_000));
        assert_eq!(lines(&content, 0, 300), (vec!["0:ok".into()], 3));
    }

    #[test]
    fn many_lines_across_buffer_refills() {
        let mut content = Vec::new();
        for i in 0..50_000 {
            writeln!(content, "line number {i}").unwrap();
        }
        let (out, end) = lines(&content, 0, 1 << 20);
        assert_eq!(out.len(), 50_000);
        assert!(out[49_999].ends_with(":line number 49999"));
        assert_eq!(end, content.len() as u64);
    }

    #[test]
    fn lines_at_the_limit() {
        let exact = format!(
            "{}\n{}\r\n{}\n",
            "a".repeat(10),
            "b".repeat(10),
            "c".repeat(12)
        );
        let (out, _) = lines(exact.as_bytes(), 0, 10);
        assert_eq!(out[0], format!("0:{}", "a".repeat(10)));
        assert_eq!(out[1], format!("11:{}\r", "b".repeat(10)));
        assert_eq!(out[2], "23:too-long 12");
    }
}
