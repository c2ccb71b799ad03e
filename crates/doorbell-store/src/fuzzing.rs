//! The body of the fuzz target, shared with the stable smoke test so both check the very same
//! thing: arbitrary bytes as an inbox, read by [`LineReader`] and judged line by line by
//! [`judge_line`] against a ledger that keeps every accepted line, and handed to the judge
//! while a helper parses from the back (the parallel stateless half, `halves`).
//!
//! [`read_and_judge`] panics when an invariant breaks, which is what a fuzzer reports. It is
//! not part of doorbell's interface and must never be called by the daemon or the CLI.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use doorbell_core::{
    judge_line, judge_stateless, Ledger, Limits, Refusal, RefusalReason, Registry, Verdict,
};

use crate::halves;
use crate::reader::{Line, LineReader};

/// The inbox the bytes are in, and the other stations.
const OWNER: &str = "web";
const STATIONS: [&str; 4] = ["web", "design", "marketing", "human"];
const LOOPS: [&str; 1] = ["cron"];

/// `max_line_bytes` of the whole-file pass: the one the check fixtures are written for.
const WHOLE_LIMIT: usize = 4096;
/// `max_line_bytes` of the chunked pass, picked per input: from "every line is too long" to
/// "a valid envelope fits".
const SMALL_LIMITS: [usize; 8] = [0, 1, 8, 40, 100, 200, 400, 1000];

/// Read `data` as an inbox twice and judge every line, panicking on a broken invariant:
///
/// 1. whole, with `max_line_bytes = 4096`, each line judged in the inbox it is addressed to
///    (so responses reach their requests and the ledger's transition rules), and
/// 2. appended in small chunks with a reader limit picked from the bytes, reading after every
///    append (so partial tails and over-long lines are crossed at every boundary), each line
///    judged in `web`'s inbox.
///
/// Invariants: the reader hands out exactly the `\n`-terminated lines of the bytes, in order,
/// tiling them from offset 0 with no gap or overlap, and stops after the last `\n`; a line is
/// over-long exactly when it exceeds the limit plus an optional `\r`; every line gets exactly
/// one verdict; a refusal carries a known reason code; the stateless rules decide alone when
/// they refuse and agree with the stateful judge; only an accepted line claims an id; and the
/// same bytes judged again after being accepted are a duplicate.
///
/// Returns how often each verdict was reached, so a test can tell how deep its inputs go.
pub fn read_and_judge(data: &[u8]) -> Reached {
    let mut reached = Reached::default();
    SCRATCH.with_borrow_mut(|scratch| {
        let scratch = scratch.get_or_insert_with(Scratch::new);
        let mut rng = SplitMix(xxhash_rust::xxh3::xxh3_64(data));

        scratch.reset();
        scratch.append(data, 0);
        let lines = scratch.read_all(WHOLE_LIMIT, 0);
        check_tiling(data, &lines, WHOLE_LIMIT);
        judge_all(&lines, WHOLE_LIMIT, Route::ToAddressee, &mut reached);

        let limit = SMALL_LIMITS[(rng.next() % SMALL_LIMITS.len() as u64) as usize];
        let mut reader = LineReader::new(limit);
        let mut lines = Vec::new();
        let (mut written, mut judged_to) = (0, 0);
        scratch.reset();
        // Up to 16 appends, each ending at a random byte: over many inputs every boundary
        // (inside a line, between `\r` and `\n`, inside an over-long line) is crossed, while
        // one input costs a bounded number of reads.
        let mut ends: Vec<usize> = (0..rng.next() % 16)
            .map(|_| (rng.next() % (data.len() as u64 + 1)) as usize)
            .chain([data.len()])
            .collect();
        ends.sort_unstable();
        for end in ends {
            if end > written {
                scratch.append(&data[written..end], written as u64);
                written = end;
            }
            judged_to = scratch.read_into(&mut reader, judged_to, &mut lines);
        }
        assert_eq!(judged_to, lines.last().map_or(0, |l| l.offset + l.span));
        check_tiling(data, &lines, limit);
        judge_all(&lines, limit, Route::AllToOwner, &mut reached);
        check_halves(
            &lines,
            limit,
            (rng.next() % (lines.len() as u64 + 1)) as usize,
        );
    });
    reached
}

/// The lines handed to the judge while a helper parses from the back ([`halves`]): every
/// line exactly once, in order, and the stateless half a helper worked out is the one the
/// judge would have. Every batch is shared here, however short, and the helper parses
/// `head_start` lines before the judge starts (the judge meets it there or before).
fn check_halves(reads: &[Read], max_line_bytes: usize, head_start: usize) {
    let limits = Limits { max_line_bytes };
    let lines: Vec<Line<'_>> = reads
        .iter()
        .map(|read| match &read.bytes {
            Some(bytes) => Line::Complete {
                offset: read.offset,
                bytes,
            },
            None => Line::TooLong {
                offset: read.offset,
                len: read.span - 1,
            },
        })
        .collect();
    let sharing = halves::Sharing {
        helpers: 1,
        least_lines: 0,
    };
    let mut handed = Vec::new();
    halves::judge_batch_from::<()>(
        &lines,
        OWNER,
        &limits,
        sharing,
        head_start,
        |line, parsed| {
            handed.push(line.offset());
            match (line, parsed) {
                (Line::Complete { bytes, .. }, Some(parsed)) => assert_eq!(
                    format!("{parsed:?}"),
                    format!("{:?}", halves::parse(bytes, OWNER, &limits)),
                    "a helper's stateless half differs from the judge's"
                ),
                (Line::TooLong { .. }, Some(_)) => panic!("a helper parsed an over-long line"),
                _ => {}
            }
            Ok(())
        },
    )
    .expect("nothing stops the batch");
    let offsets: Vec<u64> = lines.iter().map(Line::offset).collect();
    assert_eq!(
        handed, offsets,
        "a line handed out twice, never, or out of order"
    );
}

/// How many lines ended in each verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reached {
    pub accepted: usize,
    pub duplicate: usize,
    /// Indexed like [`RefusalReason::ALL`].
    pub refused: [usize; RefusalReason::ALL.len()],
}

impl Reached {
    pub fn add(&mut self, other: &Reached) {
        self.accepted += other.accepted;
        self.duplicate += other.duplicate;
        for (sum, n) in self.refused.iter_mut().zip(other.refused) {
            *sum += n;
        }
    }

    /// The refusal reasons never reached.
    #[must_use]
    pub fn missing_reasons(&self) -> Vec<RefusalReason> {
        RefusalReason::ALL
            .into_iter()
            .zip(self.refused)
            .filter(|&(_, n)| n == 0)
            .map(|(reason, _)| reason)
            .collect()
    }

    fn count(&mut self, verdict: &Verdict) {
        match verdict {
            Verdict::Accepted => self.accepted += 1,
            Verdict::Duplicate => self.duplicate += 1,
            Verdict::Refused(refusal) => self.refused[refusal.reason as usize] += 1,
        }
    }
}

/// A line as the reader handed it out, owned so it outlives the read.
#[derive(Debug)]
struct Read {
    offset: u64,
    span: u64,
    /// `None` for a line over the reader's limit.
    bytes: Option<Vec<u8>>,
}

fn check_tiling(data: &[u8], lines: &[Read], limit: usize) {
    let mut expected = 0u64;
    for line in lines {
        assert_eq!(line.offset, expected, "lines leave a gap or overlap");
        let start = line.offset as usize;
        let end = start + line.span as usize - 1;
        let text = &data[start..end];
        assert_eq!(
            data.get(end),
            Some(&b'\n'),
            "a line must end in its newline"
        );
        assert!(
            memchr::memchr(b'\n', text).is_none(),
            "a line holds a newline"
        );
        match &line.bytes {
            Some(bytes) => {
                assert_eq!(bytes, text, "a line's bytes are not the file's");
                assert!(bytes.len() <= limit + 1, "an over-long line was handed out");
            }
            None => assert!(
                text.len() > limit + 1,
                "a line within the limit was skipped"
            ),
        }
        expected += line.span;
    }
    let last_newline = memchr::memrchr(b'\n', data);
    assert_eq!(
        expected,
        last_newline.map_or(0, |at| at as u64 + 1),
        "the reader must stop just after the last newline"
    );
}

#[derive(Clone, Copy)]
enum Route {
    /// Each line is judged in the inbox of its `to` when that is a station: several inboxes
    /// read as one stream.
    ToAddressee,
    /// Every line is judged in the owner's inbox.
    AllToOwner,
}

fn judge_all(lines: &[Read], max_line_bytes: usize, route: Route, reached: &mut Reached) {
    let limits = Limits { max_line_bytes };
    let registry = Registry {
        stations: STATIONS.iter().map(|&s| s.to_owned()).collect(),
        loops: LOOPS.iter().map(|&s| s.to_owned()).collect(),
        owners: std::collections::BTreeMap::default(),
        ..Registry::default()
    };
    // The judge journals the ids it writes; here its ids are the ones it would make.
    let own_line = |id: &str| id.starts_with("bridge:");
    let seen_at = DateTime::<Utc>::from_timestamp(1_788_000_000, 0).expect("a valid time");
    let mut ledger = Ledger::new();
    let mut verdicts = 0usize;
    for line in lines {
        let Some(bytes) = &line.bytes else {
            // The reader's word is final for a line it skipped, as in the daemon.
            verdicts += 1;
            reached.refused[RefusalReason::LineTooLong as usize] += 1;
            continue;
        };
        let stateless = judge_stateless(bytes, None, &limits);
        let owner = match (&stateless, route) {
            (Ok(envelope), Route::ToAddressee) if registry.is_station(&envelope.to) => {
                envelope.to.to_string()
            }
            _ => OWNER.to_owned(),
        };
        let claims = ledger.len();
        let (verdict, envelope) = judge_line(bytes, &owner, &limits, &registry, &ledger, &own_line);
        verdicts += 1;
        reached.count(&verdict);

        let stripped = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        let too_long = stripped.len() > max_line_bytes;
        // The owner matters from `misaddressed` on; before it the stateless rules decide alone.
        match (&stateless, &verdict) {
            (Err(stateless), Verdict::Refused(refusal)) => {
                assert_eq!(
                    stateless, refusal,
                    "the line judge and the stateless rules differ"
                );
                assert!(envelope.is_none());
            }
            (Err(_), _) => panic!("a line the stateless rules refuse was {}", verdict.word()),
            (Ok(e), verdict) if e.to != owner => assert!(
                matches!(verdict, Verdict::Refused(r) if r.reason == RefusalReason::Misaddressed),
                "a line to '{}' in the inbox of '{owner}' was {}",
                e.to,
                verdict.word()
            ),
            (Ok(_), Verdict::Refused(refusal)) => {
                assert!(envelope.is_some());
                assert!(
                    refusal.reason > RefusalReason::MissingField,
                    "a stateful refusal for a stateless reason: {refusal}"
                );
            }
            (Ok(_), _) => assert!(envelope.is_some()),
        }
        assert_eq!(
            matches!(&verdict, Verdict::Refused(r) if r.reason == RefusalReason::LineTooLong),
            too_long,
            "line-too-long must be exactly the lines over the limit"
        );
        if let Verdict::Refused(refusal) = &verdict {
            check_refusal(refusal);
        }

        match (&verdict, envelope) {
            (Verdict::Accepted, Some(envelope)) => {
                assert!(!ledger.is_claimed(&envelope.id), "accepted a claimed id");
                let accepted = ledger.accepted(&envelope);
                assert_eq!(accepted.id, envelope.id);
                ledger.apply(accepted, seen_at);
                assert_eq!(ledger.len(), claims + 1, "an accepted line claims its id");
                let (again, _) = judge_line(bytes, &owner, &limits, &registry, &ledger, &own_line);
                assert_eq!(
                    again,
                    Verdict::Duplicate,
                    "the same bytes again must be a duplicate of the accepted line at {}",
                    line.offset
                );
            }
            (Verdict::Duplicate, Some(envelope)) => {
                assert!(
                    ledger.is_claimed(&envelope.id),
                    "a duplicate of no claimed id"
                );
                assert_eq!(ledger.len(), claims);
            }
            (Verdict::Refused(_), _) => assert_eq!(ledger.len(), claims, "a refusal claimed an id"),
            (verdict, None) => panic!("{} without an envelope", verdict.word()),
        }
    }
    assert_eq!(verdicts, lines.len(), "every line gets exactly one verdict");
}

fn check_refusal(refusal: &Refusal) {
    assert!(RefusalReason::ALL.contains(&refusal.reason));
    assert_eq!(
        RefusalReason::from_code(refusal.reason.code()),
        Some(refusal.reason),
        "a reason code that does not parse back"
    );
    assert!(!refusal.detail.is_empty(), "a refusal without detail");
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// One unlinked file per thread, truncated and refilled for every input: the reader reads
/// files by offset, and reopening a file per input would cost more than the judging.
struct Scratch {
    file: File,
}

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = ["/dev/shm"]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let path = dir.join(format!(
            "doorbell-fuzz-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("a scratch file can be created");
        std::fs::remove_file(&path).expect("a scratch file can be unlinked");
        Self { file }
    }

    fn reset(&mut self) {
        self.file
            .set_len(0)
            .expect("a scratch file can be truncated");
    }

    fn append(&mut self, bytes: &[u8], at: u64) {
        self.file
            .write_all_at(bytes, at)
            .expect("a scratch file can be written");
    }

    fn read_all(&mut self, limit: usize, start: u64) -> Vec<Read> {
        let mut lines = Vec::new();
        let end = self.read_into(&mut LineReader::new(limit), start, &mut lines);
        assert_eq!(end, lines.last().map_or(start, |l| l.offset + l.span));
        lines
    }

    fn read_into(&mut self, reader: &mut LineReader, start: u64, lines: &mut Vec<Read>) -> u64 {
        reader
            .read::<io::Error>(&self.file, start, |line| {
                lines.push(Read {
                    offset: line.offset(),
                    span: line.span(),
                    bytes: match line {
                        Line::Complete { bytes, .. } => Some(bytes.to_vec()),
                        Line::TooLong { .. } => None,
                    },
                });
                Ok(())
            })
            .expect("a scratch file can be read")
    }
}

/// A tiny deterministic generator: the chunking and the limit follow from the bytes alone, so
/// a crash replays exactly.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
