//! The two halves of judging a batch of lines, on as many cores as the machine has.
//!
//! A line's stateless half (framing is done; then UTF-8, the JSON, the envelope, the
//! fingerprint and the inbox's owner: `judge_stateless`) needs nothing but the line, so it
//! can be worked out anywhere. Its stateful half needs the ledger as every line before it
//! left it, so it is worked out by one thread, the judge's, in the inbox's order.
//!
//! [`judge_batch`] hands the judge a batch's lines from the front, one at a time, while
//! helper threads take lines from the back and parse them. The judge parses the lines it
//! takes itself; where the two meet, it waits for the helpers and goes on with what they
//! parsed. Every line is handed to the judge exactly once, in order, and its stateless half
//! is the one `judge_stateless` gives, whoever worked it out: only when it came. The fuzz
//! target holds both (`fuzzing::read_and_judge`).

use std::sync::atomic::{AtomicU64, Ordering};

use doorbell_core::{judge_stateless, Envelope, Limits, Refusal};

use crate::reader::Line;

/// A line's stateless half.
pub type Parsed<'a> = Result<Envelope<'a>, Refusal>;

/// Who helps the judge with a batch of lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharing {
    /// How many helper threads a batch gets.
    pub helpers: usize,
    /// The fewest lines a batch needs to get them: below it, a helper's start costs more
    /// than it would parse (a live judge's reads are a few lines).
    pub least_lines: usize,
}

impl Sharing {
    /// One helper fewer than the cores this process may use, for batches of 128 lines or
    /// more.
    #[must_use]
    pub fn of_this_machine() -> Sharing {
        Sharing {
            helpers: std::thread::available_parallelism().map_or(0, |n| n.get().saturating_sub(1)),
            least_lines: 128,
        }
    }
}

/// The stateless half of `bytes`, found in `owner`'s inbox, as a helper hands it over: the
/// message's parts (only the fingerprint needs them, and it is made) are let go on the
/// helper's thread, which allocated them.
pub fn parse<'a>(bytes: &'a [u8], owner: &str, limits: &Limits) -> Parsed<'a> {
    judge_stateless(bytes, Some(owner), limits).map(|mut envelope| {
        envelope.message.parts = Vec::new();
        envelope
    })
}

/// The two ends of a batch, in one word so that both move together: the judge's next line
/// (the high half) and one past the helpers' last (the low half). Lines from the front up to
/// the back are nobody's yet.
struct Ends(AtomicU64);

impl Ends {
    fn new(len: usize) -> Ends {
        Ends(AtomicU64::new(len as u64))
    }

    fn split(word: u64) -> (u64, u64) {
        (word >> 32, word & u64::from(u32::MAX))
    }

    fn take(&self, from_front: bool) -> Option<usize> {
        let taken = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let (front, back) = Ends::split(word);
                (front < back).then(|| {
                    if from_front {
                        word + (1 << 32)
                    } else {
                        word - 1
                    }
                })
            })
            .ok()?;
        let (front, back) = Ends::split(taken);
        usize::try_from(if from_front { front } else { back - 1 }).ok()
    }

    /// Leave the helpers nothing more to take.
    fn close(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let (front, _) = Ends::split(word);
                Some((front << 32) | front)
            });
    }
}

/// Hand every line of `lines` (found in `owner`'s inbox) to `each`, in order, with its
/// stateless half when a helper worked it out (`None`: `each` works it out itself). With no
/// helpers, or a batch shorter than `sharing` asks, `each` gets every line with `None`. An
/// error from `each` stops the batch: the helpers stop too, and it is returned.
///
/// # Panics
/// When a helper panicked (parsing never does: the fuzz target holds it).
pub fn judge_batch<'b, E>(
    lines: &[Line<'b>],
    owner: &str,
    limits: &Limits,
    sharing: Sharing,
    each: impl FnMut(&Line<'b>, Option<Parsed<'b>>) -> Result<(), E>,
) -> Result<(), E> {
    judge_batch_from(lines, owner, limits, sharing, 0, each)
}

/// [`judge_batch`], the helpers' side having parsed `head_start` lines from the back (on
/// this thread) before the judge takes its first: the judge then meets them no later than
/// there. The fuzz target picks it, so that every meeting point is crossed.
///
/// # Panics
/// When a helper panicked.
pub fn judge_batch_from<'b, E>(
    lines: &[Line<'b>],
    owner: &str,
    limits: &Limits,
    sharing: Sharing,
    head_start: usize,
    mut each: impl FnMut(&Line<'b>, Option<Parsed<'b>>) -> Result<(), E>,
) -> Result<(), E> {
    let Sharing {
        helpers,
        least_lines,
    } = sharing;
    let shared = (helpers > 0 && lines.len() >= least_lines) || head_start > 0;
    if !shared || u32::try_from(lines.len()).is_err() {
        return lines.iter().try_for_each(|line| each(line, None));
    }
    let ends = Ends::new(lines.len());
    let early = help(&ends, lines, owner, *limits, head_start);
    std::thread::scope(|scope| {
        let ends = &ends;
        let started: Vec<_> = (0..helpers)
            .map_while(|_| {
                // A helper that cannot start leaves its lines to the judge.
                std::thread::Builder::new()
                    .name("parse".into())
                    .spawn_scoped(scope, move || help(ends, lines, owner, *limits, usize::MAX))
                    .ok()
            })
            .collect();
        let mut met = 0;
        while let Some(at) = ends.take(true) {
            if let Err(error) = each(&lines[at], None) {
                ends.close();
                return Err(error);
            }
            met = at + 1;
        }
        // Where the judge met the helpers: every line from there on is theirs.
        let mut theirs: Vec<Option<Parsed<'b>>> = Vec::new();
        theirs.resize_with(lines.len() - met, || None);
        let joined = started.into_iter().map(|helper| {
            helper
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        for (at, line) in std::iter::once(early).chain(joined).flatten() {
            theirs[at - met] = Some(line);
        }
        lines[met..]
            .iter()
            .zip(theirs)
            .try_for_each(|(line, parsed)| each(line, parsed))
    })
}

/// A helper's side: take up to `most` lines from the back and parse the complete ones.
fn help<'b>(
    ends: &Ends,
    lines: &[Line<'b>],
    owner: &str,
    limits: Limits,
    most: usize,
) -> Vec<(usize, Parsed<'b>)> {
    let mut parsed = Vec::new();
    for _ in 0..most {
        let Some(at) = ends.take(false) else {
            break;
        };
        if let Line::Complete { bytes, .. } = lines[at] {
            parsed.push((at, parse(bytes, owner, &limits)));
        }
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write;

    fn lines(text: &'static str) -> Vec<Line<'static>> {
        let mut offset = 0;
        text.split_inclusive('\n')
            .map(|line| {
                let at = offset;
                offset += line.len() as u64;
                Line::Complete {
                    offset: at,
                    bytes: line.trim_end_matches('\n').as_bytes(),
                }
            })
            .collect()
    }

    /// Every line once, in order, with the very stateless half the judge would work out,
    /// whichever thread worked it out; an error stops the batch where it happened.
    #[test]
    fn every_line_once_in_order_with_the_same_half() {
        let mut text = String::new();
        for i in 0..1000 {
            match i % 3 {
                0 => write!(
                    text,
                    r#"{{"id":"01X{i}","from":"design","to":"web","kind":"note","createdAt":"2026-01-01T00:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"hi {i}"}}]}}}}"#
                )
                .unwrap(),
                1 => text.push_str("not json"),
                _ => write!(text, r#"{{"id":"01Y{i}"}}"#).unwrap(),
            }
            text.push('\n');
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let lines = lines(text);
        let limits = Limits::default();
        for (helpers, head_start) in [(0, 0), (1, 0), (3, 0), (0, 100), (1, 100), (3, 100)] {
            let mut seen = Vec::new();
            let mut shared = 0;
            let sharing = Sharing {
                helpers,
                least_lines: 0,
            };
            judge_batch_from::<()>(
                &lines,
                "web",
                &limits,
                sharing,
                head_start,
                |line, parsed| {
                    let Line::Complete { offset, bytes } = line else {
                        unreachable!()
                    };
                    shared += usize::from(parsed.is_some());
                    let alone = parse(bytes, "web", &limits);
                    let parsed = parsed.unwrap_or_else(|| parse(bytes, "web", &limits));
                    assert_eq!(format!("{parsed:?}"), format!("{alone:?}"));
                    seen.push(*offset);
                    Ok(())
                },
            )
            .unwrap();
            let all: Vec<u64> = lines.iter().map(Line::offset).collect();
            assert_eq!(seen, all, "{helpers} helpers, {head_start} parsed first");
            // How many a started helper parses depends on when it starts; those parsed
            // first are the helpers' for certain.
            if helpers == 0 && head_start == 0 {
                assert_eq!(shared, 0);
            } else {
                assert!(shared >= head_start, "{helpers} helpers parsed {shared}");
            }

            let mut judged = 0;
            let stopped = judge_batch(&lines, "web", &limits, sharing, |_, _| {
                judged += 1;
                if judged == 600 {
                    Err("stop")
                } else {
                    Ok(())
                }
            });
            assert_eq!((stopped, judged), (Err("stop"), 600));
        }
    }
}
