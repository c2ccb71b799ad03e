//! The morning report (DESIGN §6) over a month of generated traffic (see `traffic`), judged by
//! the real judge in virtual time with the default `[debts]`.
//!
//! Windows that end with the month: the last 24 hours, the whole month, and one from its
//! middle. For each, every figure of the report is checked against the generator's own books —
//! which requests it left open and since when, what it sent, which lines it broke on purpose —
//! and against a model of the doorbell's schedule written from the contract (§4), never against
//! the ledger the report is built from. Then the markdown, the JSON and the terminal text are
//! pinned as snapshots (`tests/snapshots/`; refresh with
//! `UPDATE_EXPECT=1 cargo test -p doorbell-store --test report` and read the diff).

mod traffic;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use chrono::{DateTime, Duration, Utc};
use doorbell_core::report::{build, Inputs, Report};
use doorbell_core::Kind;
use doorbell_store::{Config, View};
use expect_test::expect_file;
use traffic::{Book, Expect, Judged, Month, HUMAN, NOTES, REQUESTS, SEED};

/// `[debts]` defaults, as the contract states them; the fixture checks the config agrees.
const RING_AFTER_SECS: i64 = 30 * 60;
const BACKOFF: i32 = 2;
const MAX_RINGS: u32 = 4;
const STALLED_AFTER_SECS: i64 = 4 * 3600;

struct Fixture {
    month: Month,
    judged: Judged,
    _dir: tempfile::TempDir,
}

/// The month, generated and judged once for every test of this file.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        // The markdown shows times in local time. Pin the zone for this test process before
        // anything reads it: every test comes through here first, and chrono reads `TZ`
        // through `std::env`, whose lock makes this safe (`set_var` is a safe fn in the 2021
        // edition). `UTC0` is a POSIX zone string, so no zoneinfo file is needed.
        std::env::set_var("TZ", "UTC0");
        let debts = Config::default().debts;
        assert_eq!(
            (
                debts.ring_after.as_secs(),
                debts.backoff,
                debts.max_rings,
                debts.stalled_after.as_secs()
            ),
            (
                RING_AFTER_SECS as u64,
                f64::from(BACKOFF),
                MAX_RINGS,
                STALLED_AFTER_SECS as u64
            ),
            "the [debts] defaults changed: update the model in this file"
        );
        let month = Month::generate(SEED);
        let dir = tempfile::tempdir().expect("temp dir");
        let judged = month.judge(&dir.path().join("bridge"));
        Fixture {
            month,
            judged,
            _dir: dir,
        }
    })
}

/// The report as `doorbell report` builds it (crates/cli/report.rs), at `now`.
fn report(judged: &Judged, since: DateTime<Utc>, now: DateTime<Utc>) -> Report {
    let config = &judged.bridge.config;
    let mut view = View::unjudged(&judged.bridge).expect("the bridge opens");
    let requests = view.report_requests(since).expect("the requests");
    let requests: Vec<&doorbell_core::Request> = requests.iter().collect();
    let open: Vec<&doorbell_core::Request> =
        requests.iter().copied().filter(|r| r.is_open()).collect();
    let inputs = Inputs {
        texts: view.texts(&open),
        activity: view.activity(since).expect("activity"),
        requests,
        since,
        now,
        stalled_after: config.debts.stalled_after,
        human: config.human.clone(),
    };
    build(&inputs)
}

// ---- the model: what the books and the contract say the report must show ------------------

fn is_terminal(state: &str) -> bool {
    matches!(state, "completed" | "failed" | "canceled" | "rejected")
}

/// A line the doorbell writes: a ring to the debtor, or the escalation to the human.
struct Rang {
    at: DateTime<Utc>,
    escalation: bool,
}

/// Every ring and escalation of `book` up to `until` (DESIGN §4): per epoch, with
/// `R = ring_after / (1, 1, 2, 4)[priority]`, ring 1 at `t0 + R` (or `replyBy` when earlier —
/// in a later epoch only while it is still ahead), ring `k+1` at ring `k` + `R·2^k`, and the
/// escalation one interval after ring 4 unless the human owes. Nothing of an epoch is due
/// after the state changed. The judge here wakes exactly at each due time.
fn doorbell(book: &Book, until: DateTime<Utc>) -> Vec<Rang> {
    let divisor = [1, 1, 2, 4][usize::from(book.priority.min(3))];
    let r = Duration::seconds(RING_AFTER_SECS / divisor);
    let mut out = Vec::new();
    for epoch in 0..=book.changes.len() {
        let (t0, state) = match epoch {
            0 => (book.at, "submitted"),
            n => (book.changes[n - 1].at, book.changes[n - 1].state),
        };
        if is_terminal(state) {
            break;
        }
        let limit = book.changes.get(epoch).map_or(until, |c| c.at);
        let debtor = if state == "input-required" {
            &book.requester
        } else {
            &book.addressee
        };
        let mut due = t0 + r;
        if let Some(reply_by) = book.reply_by.filter(|rb| epoch == 0 || *rb > t0) {
            due = due.min(reply_by);
        }
        let mut rings = 0;
        while rings < MAX_RINGS && due <= limit {
            out.push(Rang {
                at: due,
                escalation: false,
            });
            rings += 1;
            due += r * BACKOFF.pow(rings);
        }
        if rings == MAX_RINGS && debtor != HUMAN && due <= limit {
            out.push(Rang {
                at: due,
                escalation: true,
            });
        }
    }
    out
}

/// One open request as the report should list it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    id: String,
    debtor: String,
    creditor: String,
    state: String,
    since: DateTime<Utc>,
    rings: u32,
    title: String,
}

impl Item {
    fn of(book: &Book, now: DateTime<Utc>) -> Item {
        let state = book.state();
        let (debtor, creditor) = if state == "input-required" {
            (&book.requester, &book.addressee)
        } else {
            (&book.addressee, &book.requester)
        };
        Item {
            id: book.id.clone(),
            debtor: debtor.clone(),
            creditor: creditor.clone(),
            state: state.to_owned(),
            since: book.since(),
            // The rings of the current epoch: those since the state changed last.
            rings: u32::try_from(
                doorbell(book, now)
                    .iter()
                    .filter(|r| !r.escalation && r.at > book.since())
                    .count(),
            )
            .expect("few"),
            title: book.title.clone(),
        }
    }

    fn silent_secs(&self, now: DateTime<Utc>) -> i64 {
        (now - self.since).num_seconds()
    }
}

/// A span the way the summary shows one: `2 d 4 h`, `3 h 5 min`, `35 min`, `12 s`.
fn spoken(secs: i64) -> String {
    let (d, h, m) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60);
    if d > 0 {
        format!("{d} d {h} h")
    } else if h > 0 {
        format!("{h} h {m} min")
    } else if m > 0 {
        format!("{m} min")
    } else {
        format!("{secs} s")
    }
}

/// Nearest rank: the smallest value with at least `num/den` of the values at or below it.
fn nearest_rank(sorted: &[i64], num: usize, den: usize) -> Option<i64> {
    let rank = (sorted.len() * num).div_ceil(den);
    (rank > 0).then(|| sorted[rank - 1])
}

/// What the report over `since..=now` must say, from the books alone.
#[derive(Debug)]
struct Expected {
    summary: String,
    stalled: Vec<(String, Vec<Item>)>,
    waiting: Vec<Item>,
    /// Seconds from request to answer, sorted, of requests answered in the window.
    answers: Vec<i64>,
    per_agent: BTreeMap<String, [u64; 3]>,
    refused: BTreeMap<String, u64>,
}

impl Expected {
    fn new(month: &Month, since: DateTime<Utc>, now: DateTime<Utc>) -> Expected {
        let mut open: Vec<Item> = month
            .requests
            .iter()
            .filter(|b| !is_terminal(b.state()))
            .map(|b| Item::of(b, now))
            .collect();
        open.sort_by(|a, b| (a.since, &a.id).cmp(&(b.since, &b.id)));
        let waiting: Vec<Item> = open.iter().filter(|i| i.debtor == HUMAN).cloned().collect();
        let mut stalled: Vec<(String, Vec<Item>)> = Vec::new();
        for item in open
            .into_iter()
            .filter(|i| i.debtor != HUMAN && i.silent_secs(now) >= STALLED_AFTER_SECS)
        {
            match stalled.iter_mut().find(|(d, _)| *d == item.debtor) {
                Some((_, items)) => items.push(item),
                None => stalled.push((item.debtor.clone(), vec![item])),
            }
        }

        let count: usize = stalled.iter().map(|(_, items)| items.len()).sum();
        let mut summary = match count {
            0 => "nothing stalled".to_owned(),
            n => {
                let oldest = stalled
                    .iter()
                    .flat_map(|(_, items)| items)
                    .map(|i| i.silent_secs(now))
                    .max()
                    .expect("some");
                let noun = if n == 1 { "request" } else { "requests" };
                format!("{n} {noun} stalled, oldest {}", spoken(oldest))
            }
        };
        if count > 0 {
            let owes: Vec<String> = stalled
                .iter()
                .map(|(d, items)| format!("{d} owes {}", items.len()))
                .collect();
            summary = format!("{summary}; {}", owes.join(", "));
        }
        match waiting.len() {
            0 => {}
            1 => summary.push_str("; 1 question waits on you"),
            n => write!(summary, "; {n} questions wait on you").expect("a string"),
        }

        // Answered: the addressee's completed, failed or rejected; a cancel is no answer.
        let mut answers: Vec<i64> = month
            .requests
            .iter()
            .filter_map(|b| {
                let close = b.changes.iter().find(|c| {
                    c.from == b.addressee && matches!(c.state, "completed" | "failed" | "rejected")
                })?;
                (close.at >= since && close.at <= now).then(|| (close.at - b.at).num_seconds())
            })
            .collect();
        answers.sort_unstable();

        let mut per_agent: BTreeMap<String, [u64; 3]> = BTreeMap::new();
        let mut refused: BTreeMap<String, u64> = BTreeMap::new();
        for line in month.lines.iter().filter(|l| l.at >= since && l.at <= now) {
            match &line.expect {
                Expect::Accepted { from, kind } => {
                    let slot = match *kind {
                        "request" => 0,
                        "response" => 1,
                        _ => 2,
                    };
                    per_agent.entry(from.clone()).or_default()[slot] += 1;
                }
                Expect::Refused { reason, told } => {
                    *refused.entry((*reason).to_owned()).or_default() += 1;
                    // Told at once, one notice per refused line: a note from the bridge.
                    if told.is_some() {
                        per_agent.entry("bridge".into()).or_default()[2] += 1;
                    }
                }
                Expect::Duplicate => {}
            }
        }
        let rang = month
            .requests
            .iter()
            .flat_map(|b| doorbell(b, now))
            .filter(|r| r.at >= since && r.at <= now)
            .count() as u64;
        if rang > 0 {
            per_agent.entry("debt-loop".into()).or_default()[2] += rang;
        }

        Expected {
            summary,
            stalled,
            waiting,
            answers,
            per_agent,
            refused,
        }
    }
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Every figure of `report` against `expected`, each with its own message.
fn check(report: &Report, expected: &Expected, since: DateTime<Utc>, now: DateTime<Utc>) {
    assert_eq!(report.summary, expected.summary, "the summary line");

    let listed = |items: &[doorbell_core::report::Stalled]| -> Vec<Item> {
        items
            .iter()
            .map(|s| Item {
                id: s.id.clone(),
                debtor: s.debtor.clone(),
                creditor: s.waiting.clone(),
                state: s.state.clone(),
                since: DateTime::parse_from_rfc3339(&s.silent_since)
                    .expect("rfc 3339")
                    .with_timezone(&Utc),
                rings: s.rings,
                title: s.text.clone(),
            })
            .collect()
    };
    let debtors: Vec<&String> = report.stalled.iter().map(|(d, _)| d).collect();
    let want: Vec<&String> = expected.stalled.iter().map(|(d, _)| d).collect();
    assert_eq!(debtors, want, "debtors, by their oldest debt");
    for ((debtor, items), (_, want)) in report.stalled.iter().zip(&expected.stalled) {
        assert_eq!(&listed(items), want, "what {debtor} owes");
        for (s, want) in items.iter().zip(want) {
            assert_eq!(
                s.silent_for,
                want.silent_secs(now),
                "how long {} is silent",
                s.id
            );
        }
    }
    assert_eq!(
        listed(&report.waiting_on_human),
        expected.waiting,
        "questions waiting on the human"
    );

    let answered = expected.answers.len() as u64;
    assert_eq!(report.answered, answered, "answered in the window");
    assert_eq!(
        report.median_answer_secs,
        nearest_rank(&expected.answers, 1, 2),
        "median time to answer"
    );
    assert_eq!(
        report.p90_answer_secs,
        nearest_rank(&expected.answers, 9, 10),
        "p90 time to answer"
    );

    let per_agent: BTreeMap<String, [u64; 3]> = report
        .per_agent
        .iter()
        .map(|(a, c)| (a.clone(), [c.requests, c.responses, c.notes]))
        .collect();
    // The judge's own loops are not agents: the report leaves them out, but the journal
    // holds exactly the rings, escalations and notices the model predicts.
    let mut agents = expected.per_agent.clone();
    let loops: BTreeMap<String, [u64; 3]> = View::unjudged(&fixture().judged.bridge)
        .and_then(|view| view.activity(since))
        .expect("activity")
        .sent
        .iter()
        .filter(|(agent, _)| doorbell_core::BUILTIN_LOOPS.contains(&agent.as_str()))
        .map(|(agent, kinds)| {
            let n = |k| kinds.get(&k).copied().unwrap_or(0);
            (
                agent.clone(),
                [n(Kind::Request), n(Kind::Response), n(Kind::Note)],
            )
        })
        .collect();
    agents.retain(|agent, counts| {
        let builtin = doorbell_core::BUILTIN_LOOPS.contains(&agent.as_str());
        if builtin {
            assert_eq!(
                loops.get(agent),
                Some(&*counts),
                "{agent}'s lines in the window"
            );
        }
        !builtin
    });
    assert_eq!(per_agent, agents, "requests, responses, notes per agent");
    assert_eq!(report.refused, expected.refused, "refused lines by reason");
}

fn end_of_month() -> DateTime<Utc> {
    fixture().month.end
}

// ---- the tests ------------------------------------------------------------------------------

#[test]
fn the_month_has_the_seed_factory_mix() {
    let month = &fixture().month;
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    let mut refused = 0;
    let mut duplicates = 0;
    for line in &month.lines {
        match &line.expect {
            Expect::Accepted { kind, .. } => *kinds.entry(kind).or_default() += 1,
            Expect::Refused { .. } => refused += 1,
            Expect::Duplicate => duplicates += 1,
        }
    }
    assert_eq!(kinds["request"], REQUESTS);
    assert_eq!(kinds["note"], NOTES);
    assert!(
        (900..=1030).contains(&kinds["response"]),
        "about 962 responses, got {}",
        kinds["response"]
    );
    assert_eq!((refused, duplicates), (20, 3));
    assert_eq!(
        month.requests.iter().filter(|b| b.id.contains('.')).count(),
        15,
        "three broadcasts to five stations each"
    );
    // The shape the report is about: stalled debts of several debtors, questions for the
    // person, and every way a request ends.
    let expected = Expected::new(month, month.start, month.end);
    let debtors: Vec<&str> = expected.stalled.iter().map(|(d, _)| d.as_str()).collect();
    for debtor in ["web", "design", "ci"] {
        assert!(
            debtors.contains(&debtor),
            "{debtor} owes nothing: {debtors:?}"
        );
    }
    assert!(expected.waiting.len() >= 2, "{:?}", expected.waiting);
    for state in [
        "completed",
        "failed",
        "rejected",
        "canceled",
        "input-required",
    ] {
        assert!(
            month
                .requests
                .iter()
                .any(|b| b.changes.iter().any(|c| c.state == state)),
            "no request went {state}"
        );
    }
    // The month was judged in order: the ledger holds every request, the doorbell rang.
    let judged = &fixture().judged;
    let view = View::unjudged(&judged.bridge).expect("the bridge opens");
    assert_eq!(month.requests.len(), REQUESTS);
    for book in &month.requests {
        assert!(
            view.request(&book.id).is_some(),
            "{} is in the index",
            book.id
        );
    }
    assert!(judged.passes > 100, "{} doorbell passes", judged.passes);
}

#[test]
fn the_last_day_matches_the_books() {
    let f = fixture();
    let now = end_of_month();
    let since = now - Duration::hours(24);
    let report = report(&f.judged, since, now);
    assert_eq!(
        (report.since.as_str(), report.until.as_str()),
        (&*rfc(since), &*rfc(now))
    );
    check(&report, &Expected::new(&f.month, since, now), since, now);
}

#[test]
fn the_whole_month_matches_the_books() {
    let f = fixture();
    let now = end_of_month();
    let since = f.month.start;
    let report = report(&f.judged, since, now);
    check(&report, &Expected::new(&f.month, since, now), since, now);
}

#[test]
fn a_window_from_the_middle_of_the_month_matches_the_books() {
    let f = fixture();
    let now = end_of_month();
    let since = f.month.start + Duration::days(12) + Duration::hours(7);
    let report = report(&f.judged, since, now);
    check(&report, &Expected::new(&f.month, since, now), since, now);
}

#[test]
fn snapshots_of_the_last_day() {
    let f = fixture();
    let now = end_of_month();
    let report = report(&f.judged, now - Duration::hours(24), now);
    expect_file!["snapshots/report-last-day.md"]
        .assert_eq(&report.markdown("doorbell report 2026-10-31"));
    expect_file!["snapshots/report-last-day.json"].assert_eq(&json(&report));
}

#[test]
fn snapshots_of_the_whole_month() {
    let f = fixture();
    let now = end_of_month();
    let report = report(&f.judged, f.month.start, now);
    expect_file!["snapshots/report-month.md"]
        .assert_eq(&report.markdown("doorbell report 2026-10-31"));
    expect_file!["snapshots/report-month.json"].assert_eq(&json(&report));
    expect_file!["snapshots/report-month.txt"].assert_eq(&report.text(false));
}

fn json(report: &Report) -> String {
    let mut text = serde_json::to_string_pretty(report).expect("a report serialises");
    text.push('\n');
    text
}
