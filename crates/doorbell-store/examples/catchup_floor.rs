//! The floor under a catch-up, for `scripts/bench`: reading, judging and journaling inbox
//! files with nearly all of the judge's work left out. Every line goes through the judge's
//! own stateless half (framing, UTF-8, the envelope, the fingerprint) on every core, a chunk
//! of each inbox in turn; then, on one thread, in one order, a bare ledger (an id is taken
//! once; an answer waits for its request to be read, and needs it open; a final answer
//! closes it), a compact journal record per line, and the accepted ids sorted into one index
//! file. Both files are synced once, at the end.
//!
//! Left out: every other stateful rule, the order of answers across inboxes (an answer read
//! before an earlier one of the same request may be refused), notices and rings, the index's
//! lookups by thread and time, checkpoints, marks. So no judge built on the same stateless
//! half that does its whole job catches up in less time on the same machine; a faster
//! stateless half would lower the floor too.
//!
//! `catchup_floor OUT_DIR INBOX…`: writes `OUT_DIR/floor-journal` and `OUT_DIR/floor-index`,
//! and says on stderr what it judged.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::hash::BuildHasherDefault;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use doorbell_core::{judge_stateless, Envelope, Kind, Limits, State};

/// How much of a file one helper reads and parses at a time.
const CHUNK: u64 = 4 << 20;

/// A span of one file that starts and ends at line boundaries.
#[derive(Clone, Copy)]
struct Chunk {
    file: usize,
    start: u64,
    end: u64,
}

/// A chunk read, and its lines judged alone: each one's offset in the chunk, its length, and
/// what the sequencer needs of its envelope when it has one.
struct Parsed {
    bytes: Vec<u8>,
    lines: Vec<(usize, usize, Option<Summary>)>,
}

/// Text of an envelope: where it lies in the chunk, or a copy when it was unescaped.
enum Text {
    At(usize, usize),
    Copy(String),
}

impl Text {
    fn of(text: &str, bytes: &[u8]) -> Text {
        let at = (text.as_ptr() as usize).wrapping_sub(bytes.as_ptr() as usize);
        if at
            .checked_add(text.len())
            .is_some_and(|end| end <= bytes.len())
        {
            Text::At(at, text.len())
        } else {
            Text::Copy(text.to_owned())
        }
    }

    fn in_chunk<'a>(&'a self, bytes: &'a [u8]) -> &'a [u8] {
        match self {
            Text::At(at, len) => &bytes[*at..*at + *len],
            Text::Copy(text) => text.as_bytes(),
        }
    }
}

/// What the bare ledger and the journal record need of an envelope.
struct Summary {
    id: Text,
    id_hash: u64,
    from: Text,
    kind: Kind,
    answers: Option<u64>,
    last: bool,
    fingerprint: u64,
}

/// Keys that are hashes already.
#[derive(Default)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Ids = HashSet<u64, BuildHasherDefault<Prehashed>>;

fn main() -> std::io::Result<()> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let Some((out, inboxes)) = args.split_first() else {
        eprintln!("usage: catchup_floor OUT_DIR INBOX...");
        std::process::exit(2);
    };
    let judged = run(out, inboxes, CHUNK)?;
    eprintln!(
        "judged {} lines: {} accepted, {} refused; {} requests open",
        judged.lines, judged.accepted, judged.refused, judged.open
    );
    Ok(())
}

/// What a run judged.
#[derive(Debug, PartialEq, Eq)]
struct Judged {
    lines: u64,
    accepted: u64,
    refused: u64,
    open: usize,
}

/// Judge `inboxes` into `out`, read in chunks of about `size` bytes: a chunk of each inbox
/// in turn, as the judge reads a backlog in rounds.
fn run(out: &Path, inboxes: &[PathBuf], size: u64) -> std::io::Result<Judged> {
    let files = inboxes
        .iter()
        .map(File::open)
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut each = Vec::new();
    for (at, file) in files.iter().enumerate() {
        let mut chunks = Vec::new();
        chunk(file, at, size, &mut chunks)?;
        each.push(chunks.into_iter());
    }
    let mut chunks = Vec::new();
    loop {
        let before = chunks.len();
        chunks.extend(each.iter_mut().filter_map(Iterator::next));
        if chunks.len() == before {
            break;
        }
    }
    let owners: Vec<String> = inboxes.iter().map(|path| owner(path)).collect();
    let slots: Vec<Mutex<Option<std::io::Result<Parsed>>>> =
        chunks.iter().map(|_| Mutex::new(None)).collect();
    let ready = Condvar::new();
    let next = AtomicUsize::new(0);
    let helpers = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let mut sequencer = Sequencer::new(out)?;
    std::thread::scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                let Some(&chunk) = chunks.get(at) else {
                    break;
                };
                // A helper that panics still fills its slot: the sequencer waits for it.
                let parsed = std::panic::catch_unwind(|| {
                    parse(&files[chunk.file], chunk, &owners[chunk.file])
                })
                .unwrap_or_else(|_| Err(std::io::Error::other("a helper panicked")));
                *slots[at].lock().unwrap_or_else(PoisonError::into_inner) = Some(parsed);
                ready.notify_all();
            });
        }
        for (slot, chunk) in slots.iter().zip(&chunks) {
            let mut taken = slot.lock().unwrap_or_else(PoisonError::into_inner);
            let parsed = loop {
                match taken.take() {
                    Some(parsed) => break parsed,
                    None => taken = ready.wait(taken).unwrap_or_else(PoisonError::into_inner),
                }
            };
            drop(taken);
            if let Err(e) = parsed.and_then(|parsed| sequencer.take(chunk, &parsed)) {
                // The helpers stop at their next chunk.
                next.store(chunks.len(), Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(())
    })?;
    sequencer.finish(out)
}

/// The inbox's owner, from its file name (`web-inbox.jsonl`).
fn owner(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    name.as_deref()
        .and_then(|n| n.strip_suffix("-inbox.jsonl"))
        .unwrap_or_default()
        .to_owned()
}

/// Cut `file` into chunks of about `size` bytes that end at line breaks (the last one where
/// the file ends).
fn chunk(file: &File, at: usize, size: u64, chunks: &mut Vec<Chunk>) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    let mut start = 0;
    let mut probe = vec![0u8; 1 << 16];
    while start < len {
        let mut end = (start + size).min(len);
        // Past the next line break (a line longer than the probe goes on to the next one).
        while end < len {
            let n = file.read_at(&mut probe, end)?;
            if n == 0 {
                // Shorter than it was a moment ago: it ends here.
                break;
            }
            if let Some(nl) = memchr::memchr(b'\n', &probe[..n]) {
                end += nl as u64 + 1;
                break;
            }
            end += n as u64;
        }
        chunks.push(Chunk {
            file: at,
            start,
            end: end.min(len),
        });
        start = end;
    }
    Ok(())
}

/// Read `chunk` and judge each of its complete lines alone, as the judge's helpers do.
fn parse(file: &File, chunk: Chunk, owner: &str) -> std::io::Result<Parsed> {
    let mut bytes = vec![0u8; usize::try_from(chunk.end - chunk.start).unwrap_or(0)];
    file.read_exact_at(&mut bytes, chunk.start)?;
    let limits = Limits::default();
    let mut lines = Vec::with_capacity(bytes.len() / 400 + 1);
    let mut at = 0;
    // A last line without its break is still being written: not judged.
    while let Some(end) = memchr::memchr(b'\n', &bytes[at..]).map(|nl| at + nl) {
        let summary = judge_stateless(&bytes[at..end], Some(owner), &limits)
            .ok()
            .map(|envelope| summary(&envelope, &bytes));
        lines.push((at, end - at, summary));
        at = end + 1;
    }
    Ok(Parsed { bytes, lines })
}

fn summary(envelope: &Envelope<'_>, bytes: &[u8]) -> Summary {
    let hash = |s: &str| xxhash_rust::xxh3::xxh3_64(s.as_bytes());
    Summary {
        id: Text::of(&envelope.id, bytes),
        id_hash: hash(&envelope.id),
        from: Text::of(&envelope.from, bytes),
        kind: envelope.kind,
        answers: envelope.correlates_to.as_deref().map(hash),
        last: envelope.state.is_some_and(State::is_terminal),
        fingerprint: envelope.fingerprint,
    }
}

/// An answer read before its request: held until the request is read (or the end).
struct Held {
    file: usize,
    offset: u64,
    span: u64,
    id: String,
    id_hash: u64,
    from: String,
    last: bool,
    fingerprint: u64,
}

/// The one thread that takes the lines in order.
struct Sequencer {
    journal: BufWriter<File>,
    taken: Ids,
    open: Ids,
    /// Answers to requests not read yet, by the request's id hash, in the order read.
    held: HashMap<u64, Vec<Held>, BuildHasherDefault<Prehashed>>,
    /// Accepted ids: their hash, file, offset.
    rows: Vec<(u64, u32, u64)>,
    record: Vec<u8>,
    lines: u64,
    accepted: u64,
}

impl Sequencer {
    fn new(out: &Path) -> std::io::Result<Sequencer> {
        Ok(Sequencer {
            journal: BufWriter::with_capacity(1 << 20, File::create(out.join("floor-journal"))?),
            taken: Ids::default(),
            open: Ids::default(),
            held: HashMap::default(),
            rows: Vec::new(),
            record: Vec::with_capacity(256),
            lines: 0,
            accepted: 0,
        })
    }

    fn take(&mut self, chunk: &Chunk, parsed: &Parsed) -> std::io::Result<()> {
        for (at, len, summary) in &parsed.lines {
            let offset = chunk.start + *at as u64;
            let span = *len as u64 + 1;
            self.lines += 1;
            let Some(s) = summary else {
                self.write(chunk.file, offset, span, None)?;
                continue;
            };
            let id = s.id.in_chunk(&parsed.bytes);
            let from = s.from.in_chunk(&parsed.bytes);
            if self.taken.contains(&s.id_hash) {
                self.write(chunk.file, offset, span, None)?;
                continue;
            }
            match (s.kind, s.answers) {
                (Kind::Response, Some(request)) if !self.taken.contains(&request) => {
                    self.held.entry(request).or_default().push(Held {
                        file: chunk.file,
                        offset,
                        span,
                        id: String::from_utf8_lossy(id).into_owned(),
                        id_hash: s.id_hash,
                        from: String::from_utf8_lossy(from).into_owned(),
                        last: s.last,
                        fingerprint: s.fingerprint,
                    });
                }
                (Kind::Response, Some(request)) => {
                    let open = if s.last {
                        self.open.remove(&request)
                    } else {
                        self.open.contains(&request)
                    };
                    let accepted = open.then_some((s.id_hash, id, from, s.fingerprint));
                    self.write(chunk.file, offset, span, accepted)?;
                }
                (kind, _) => {
                    let accepted = Some((s.id_hash, id, from, s.fingerprint));
                    self.write(chunk.file, offset, span, accepted)?;
                    if kind == Kind::Request {
                        self.open.insert(s.id_hash);
                        self.answers_held(s.id_hash)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Judge the answers held for `request`, now read, in the order they were read.
    fn answers_held(&mut self, request: u64) -> std::io::Result<()> {
        for held in self.held.remove(&request).unwrap_or_default() {
            let open = !self.taken.contains(&held.id_hash)
                && if held.last {
                    self.open.remove(&request)
                } else {
                    self.open.contains(&request)
                };
            let accepted = open.then_some((
                held.id_hash,
                held.id.as_bytes(),
                held.from.as_bytes(),
                held.fingerprint,
            ));
            self.write(held.file, held.offset, held.span, accepted)?;
        }
        Ok(())
    }

    /// Journal the verdict on the line of `span` bytes at `offset` of inbox `file`: accepted
    /// with its id's hash, id, sender and fingerprint, or refused. An accepted id is taken,
    /// and indexed.
    fn write(
        &mut self,
        file: usize,
        offset: u64,
        span: u64,
        accepted: Option<(u64, &[u8], &[u8], u64)>,
    ) -> std::io::Result<()> {
        let r = &mut self.record;
        r.clear();
        r.extend_from_slice(b"{\"in\":");
        r.extend_from_slice(itoa::Buffer::new().format(file).as_bytes());
        r.extend_from_slice(b",\"o\":");
        r.extend_from_slice(itoa::Buffer::new().format(offset).as_bytes());
        r.extend_from_slice(b",\"n\":");
        r.extend_from_slice(itoa::Buffer::new().format(span).as_bytes());
        match accepted {
            // Ids and agent names need no escaping: the stateless half checked their bytes.
            Some((hash, id, from, fingerprint)) => {
                self.accepted += 1;
                self.taken.insert(hash);
                r.extend_from_slice(b",\"v\":\"a\",\"id\":\"");
                r.extend_from_slice(id);
                r.extend_from_slice(b"\",\"f\":\"");
                r.extend_from_slice(from);
                r.extend_from_slice(b"\",\"fp\":");
                r.extend_from_slice(itoa::Buffer::new().format(fingerprint).as_bytes());
                let file = u32::try_from(file).unwrap_or(u32::MAX);
                self.rows.push((hash, file, offset));
            }
            None => r.extend_from_slice(b",\"v\":\"r\""),
        }
        r.extend_from_slice(b"}\n");
        self.journal.write_all(r)
    }

    /// Refuse the answers whose request never came, sync the journal, write the index.
    fn finish(mut self, out: &Path) -> std::io::Result<Judged> {
        let mut never: Vec<Held> = std::mem::take(&mut self.held)
            .into_values()
            .flatten()
            .collect();
        never.sort_by_key(|held| (held.file, held.offset));
        for held in never {
            self.write(held.file, held.offset, held.span, None)?;
        }
        self.journal.flush()?;
        self.journal.get_ref().sync_data()?;
        self.rows.sort_unstable();
        let mut index = BufWriter::with_capacity(1 << 20, File::create(out.join("floor-index"))?);
        for (hash, file, offset) in &self.rows {
            index.write_all(&hash.to_le_bytes())?;
            index.write_all(&file.to_le_bytes())?;
            index.write_all(&offset.to_le_bytes())?;
        }
        index.flush()?;
        index.get_ref().sync_data()?;
        Ok(Judged {
            lines: self.lines,
            accepted: self.accepted,
            refused: self.lines - self.accepted,
            open: self.open.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::{chunk, parse, Chunk, Judged, Sequencer};

    fn line(id: &str, kind: &str, more: &str) -> String {
        line_to("web", id, kind, more)
    }

    fn line_to(to: &str, id: &str, kind: &str, more: &str) -> String {
        format!(
            "{{\"id\":\"{id}\",\"from\":\"qa\",\"to\":\"{to}\",\"kind\":\"{kind}\",\"createdAt\":\"2026-12-01T00:00:00Z\",{more}\"message\":{{\"role\":\"agent\",\"parts\":[{{\"type\":\"text\",\"text\":\"hi\"}}]}}}}\n"
        )
    }

    /// Chunks cover the file once, each ending at a line break, a line longer than the probe
    /// included, and the last one where the file ends.
    #[test]
    fn chunks_cover_the_file_and_end_at_line_breaks() {
        let mut file = tempfile::tempfile().unwrap();
        let long = format!("{}\n", "x".repeat(100_000));
        let text = format!("a\n{long}bb\nccc\n{long}dddd");
        file.write_all(text.as_bytes()).unwrap();
        let mut chunks = Vec::new();
        chunk(&file, 7, 3, &mut chunks).unwrap();
        let mut at = 0;
        for c in &chunks {
            assert_eq!((c.file, c.start), (7, at));
            assert!(c.end == text.len() as u64 || text.as_bytes()[c.end as usize - 1] == b'\n');
            at = c.end;
        }
        assert_eq!(at, text.len() as u64);
        // Each one past the first break after its size: "a" and the long line, "bb" and
        // "ccc", the long line again, and the unfinished "dddd".
        let spans: Vec<(u64, u64)> = chunks.iter().map(|c| (c.start, c.end)).collect();
        assert_eq!(
            spans,
            [
                (0, 100_003),
                (100_003, 100_010),
                (100_010, 200_011),
                (200_011, 200_015)
            ]
        );
    }

    /// An id is taken once, an answer needs its request open, a final answer closes it; a
    /// line that is no envelope is refused, and a last line without its break is left.
    #[test]
    fn the_bare_ledger_judges_ids_and_answers_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let text = [
            line("r1", "request", ""),
            line("r1", "note", ""),
            "not json\n".to_owned(),
            line(
                "a1",
                "response",
                "\"correlatesTo\":\"r1\",\"state\":\"working\",",
            ),
            line(
                "a2",
                "response",
                "\"correlatesTo\":\"r1\",\"state\":\"completed\",",
            ),
            line(
                "a3",
                "response",
                "\"correlatesTo\":\"r1\",\"state\":\"completed\",",
            ),
            line(
                "a4",
                "response",
                "\"correlatesTo\":\"nobody\",\"state\":\"completed\",",
            ),
            line("n1", "note", "").trim_end().to_owned(),
        ]
        .concat();
        let path = dir.path().join("web-inbox.jsonl");
        std::fs::write(&path, &text).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let whole = Chunk {
            file: 0,
            start: 0,
            end: text.len() as u64,
        };
        let parsed = parse(&file, whole, "web").unwrap();
        assert_eq!(parsed.lines.len(), 7, "the unfinished last line is left");
        let mut sequencer = Sequencer::new(dir.path()).unwrap();
        sequencer.take(&whole, &parsed).unwrap();
        let judged = sequencer.finish(dir.path()).unwrap();
        assert_eq!(
            judged,
            Judged {
                lines: 7,
                accepted: 3,
                refused: 4,
                open: 0
            }
        );
        let journal = std::fs::read_to_string(dir.path().join("floor-journal")).unwrap();
        let verdicts: Vec<&str> = journal
            .lines()
            .map(|l| if l.contains("\"v\":\"a\"") { "a" } else { "r" })
            .collect();
        assert_eq!(verdicts, ["a", "r", "r", "a", "a", "r", "r"]);
    }

    /// Read in small chunks, a chunk of each inbox in turn, every line is journaled once at
    /// its own offset and length; an answer read before its request (in another inbox) waits
    /// for it; the index holds the accepted ids sorted by hash, each at its line.
    #[test]
    fn every_line_is_journaled_once_at_its_place_and_answers_wait_for_their_request() {
        let dir = tempfile::tempdir().unwrap();
        let mut web = String::new();
        let mut ops = String::new();
        for i in 0..40 {
            ops.push_str(&line_to("ops", &format!("n{i}"), "note", ""));
            web.push_str(&line(&format!("m{i}"), "note", ""));
        }
        web.push_str(&line(
            "a1",
            "response",
            "\"correlatesTo\":\"r1\",\"state\":\"completed\",",
        ));
        ops.push_str(&line_to("ops", "r1", "request", ""));
        let paths = [
            dir.path().join("web-inbox.jsonl"),
            dir.path().join("ops-inbox.jsonl"),
        ];
        std::fs::write(&paths[0], &web).unwrap();
        std::fs::write(&paths[1], &ops).unwrap();
        let judged = super::run(dir.path(), &paths, 1000).unwrap();
        assert_eq!(
            judged,
            Judged {
                lines: 82,
                accepted: 82,
                refused: 0,
                open: 0
            }
        );
        let files = [web.as_bytes(), ops.as_bytes()];
        let journal = std::fs::read_to_string(dir.path().join("floor-journal")).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for record in journal.lines() {
            let record: serde_json::Value = serde_json::from_str(record).unwrap();
            let (file, offset, span) = (
                record["in"].as_u64().unwrap() as usize,
                record["o"].as_u64().unwrap() as usize,
                record["n"].as_u64().unwrap() as usize,
            );
            let bytes = &files[file][offset..offset + span];
            assert!(offset == 0 || files[file][offset - 1] == b'\n');
            assert_eq!(bytes.iter().position(|&b| b == b'\n'), Some(span - 1));
            let id = record["id"].as_str().unwrap();
            assert!(std::str::from_utf8(bytes)
                .unwrap()
                .contains(&format!("\"id\":\"{id}\"")));
            assert!(seen.insert((file, offset)), "journaled twice: {record}");
        }
        assert_eq!(seen.len(), 82);
        let index = std::fs::read(dir.path().join("floor-index")).unwrap();
        let rows: Vec<(u64, u32, u64)> = index
            .chunks(20)
            .map(|row| {
                (
                    u64::from_le_bytes(row[..8].try_into().unwrap()),
                    u32::from_le_bytes(row[8..12].try_into().unwrap()),
                    u64::from_le_bytes(row[12..].try_into().unwrap()),
                )
            })
            .collect();
        assert_eq!(rows.len(), 82);
        assert!(rows.windows(2).all(|pair| pair[0] <= pair[1]), "sorted");
        for (hash, file, offset) in rows {
            let at = &files[file as usize][offset as usize..];
            let id_at = at.iter().position(|&b| b == b',').unwrap();
            let id = std::str::from_utf8(&at[7..id_at - 1]).unwrap();
            assert_eq!(hash, xxhash_rust::xxh3::xxh3_64(id.as_bytes()), "{id}");
        }
    }
}
