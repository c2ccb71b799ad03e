//! Stress and crash tests of the daemon: many writers, SIGKILL at random moments, lost inotify
//! events, a thousand inboxes under a low file limit. Every wait is on a condition with a
//! deadline; sleeping only paces writers or picks a random moment to kill.
//!
//! The tests in this module run one at a time (they are heavy, and one of them lowers a
//! system-wide inotify limit for a moment).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::util::{
    line, notices_in, read_records, split_lines, Bridge, Daemon, JournalRecord, Key, Notice,
    RefusedRecord, BIN,
};

/// The torture tests run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Small tools: a seeded random source, locked appends, inbox creation.

/// xorshift64*: enough randomness to pick lines and moments; the seed is printed so a failing
/// run can be repeated with `TORTURE_SEED`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

fn seed() -> u64 {
    let seed = std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("TORTURE_SEED={seed}");
    seed
}

/// Append one whole line the way every writer must: `flock(LOCK_EX)` on the inbox, then one
/// `write`. Returns the offset the line starts at. The file must end with a newline: no writer
/// (this one, the senders, the daemon's notices) may ever leave a fragment.
fn append_locked(path: &Path, line: &[u8]) -> u64 {
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    file.lock().unwrap();
    let offset = file.metadata().unwrap().len();
    if offset > 0 {
        let mut last = [0u8; 1];
        file.read_exact_at(&mut last, offset - 1).unwrap();
        assert_eq!(
            last[0],
            b'\n',
            "{} ends in a fragment at byte {offset}",
            path.display()
        );
    }
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(b'\n');
    file.write_all(&buf).unwrap();
    offset
}

/// Create inboxes the way `doorbell agent add` does (mode 0600), without a process each.
fn add_inboxes(bridge: &Bridge, names: &[String]) {
    for name in names {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(bridge.inbox(name))
            .unwrap();
    }
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i:04}")).collect()
}

// ---------------------------------------------------------------------------------------------
// What the bridge folder says: the journal, the inboxes, the refused log, the notices.

/// One look at the bridge folder.
struct Seen {
    /// Verdicts (not marks or intents), in journal order.
    verdicts: Vec<JournalRecord>,
    /// Every inbox's current generation (the last mark's).
    gens: BTreeMap<String, u32>,
    /// Every inbox's complete lines: offset and bytes.
    lines: BTreeMap<String, Vec<(u64, Vec<u8>)>>,
    /// Inboxes whose last bytes are not a complete line (a write in progress).
    partial: BTreeSet<String>,
    refused: Vec<RefusedRecord>,
    notices: Vec<Notice>,
}

fn observe(bridge: &Bridge, inboxes: &[String]) -> Seen {
    let state = bridge.dir().join(".doorbell");
    let records: Vec<JournalRecord> = read_records(&state.join("journal.jsonl"));
    let mut gens = BTreeMap::new();
    for record in records.iter().filter(|r| r.verdict == "m") {
        let gen = gens.entry(record.inbox.clone()).or_insert(0);
        *gen = (*gen).max(record.gen);
    }
    let verdicts = records
        .into_iter()
        .filter(|r| matches!(r.verdict.as_str(), "a" | "d" | "r"))
        .collect();
    let mut lines = BTreeMap::new();
    let mut partial = BTreeSet::new();
    let mut notices = Vec::new();
    for inbox in inboxes {
        let bytes = std::fs::read(bridge.inbox(inbox)).unwrap();
        let (complete, fragment) = split_lines(&bytes);
        if fragment {
            partial.insert(inbox.clone());
        }
        notices.extend(notices_in(inbox, &complete));
        lines.insert(inbox.clone(), complete);
    }
    Seen {
        verdicts,
        gens,
        lines,
        partial,
        refused: read_records(&state.join("refused.jsonl")),
        notices,
    }
}

impl Seen {
    fn gen(&self, inbox: &str) -> u32 {
        self.gens.get(inbox).copied().unwrap_or(0)
    }

    /// Verdicts of the inboxes' current generations, by place.
    fn current(&self) -> HashMap<Key, Vec<&JournalRecord>> {
        let mut map: HashMap<Key, Vec<&JournalRecord>> = HashMap::new();
        for record in &self.verdicts {
            if record.gen == self.gen(&record.inbox) {
                map.entry((record.inbox.clone(), record.gen, record.offset))
                    .or_default()
                    .push(record);
            }
        }
        map
    }

    /// Nothing left for the judge to do: every complete line of every inbox has a verdict,
    /// no line is half written, every refusal is in `refused.jsonl`, and every refusal whose
    /// sender must be told is named in a notice that is in an inbox (and so judged too).
    fn settled(&self) -> Result<(), String> {
        if let Some(inbox) = self.partial.iter().next() {
            return Err(format!("{inbox} ends in a partial line"));
        }
        let current = self.current();
        let mut lines = 0;
        for (inbox, complete) in &self.lines {
            let gen = self.gen(inbox);
            lines += complete.len();
            if let Some((offset, _)) = complete
                .iter()
                .find(|(offset, _)| !current.contains_key(&(inbox.clone(), gen, *offset)))
            {
                return Err(format!(
                    "{inbox} has no verdict for its line at byte {offset} ({} lines, {} verdicts in all)",
                    lines,
                    current.len()
                ));
            }
        }
        let refusals = self.verdicts.iter().filter(|r| r.verdict == "r").count();
        if self.refused.len() != refusals {
            return Err(format!(
                "refused.jsonl has {} records, the journal {refusals} refusals",
                self.refused.len()
            ));
        }
        let named: BTreeSet<&Key> = self
            .notices
            .iter()
            .flat_map(|n| n.named.iter().map(|r| &r.key))
            .collect();
        if let Some(untold) = self
            .verdicts
            .iter()
            .filter(|r| r.tell)
            .map(|r| (r.inbox.clone(), r.gen, r.offset))
            .find(|key| !named.contains(key))
        {
            return Err(format!("no notice names the refused line {untold:?} yet"));
        }
        Ok(())
    }
}

/// Wait until [`Seen::settled`] holds; the bridge's state then.
#[track_caller]
fn wait_settled(bridge: &Bridge, inboxes: &[String], timeout: Duration) -> Seen {
    let mut why = String::from("never looked");
    let mut seen = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        bridge.wait_for(timeout, "every line judged and every refusal told", |b| {
            let now = observe(b, inboxes);
            match now.settled() {
                Ok(()) => {
                    seen = Some(now);
                    true
                }
                Err(reason) => {
                    why = reason;
                    false
                }
            }
        });
    }));
    match (outcome, seen) {
        (Ok(()), Some(seen)) => seen,
        _ => panic!("the bridge did not settle within {timeout:?}: {why}"),
    }
}

/// Panic (with its stderr) unless the daemon is still running.
#[track_caller]
fn assert_running(daemon: &mut Daemon, when: &str) {
    if let Some(status) = daemon.child.try_wait().unwrap() {
        let stderr = daemon.finish_stderr(Duration::from_secs(2)).join("\n");
        panic!("the daemon exited on its own ({status}) {when}; stderr:\n{stderr}");
    }
}

/// SIGTERM the daemon and expect a clean exit; its whole stderr.
fn stop(mut daemon: Daemon) -> Vec<String> {
    daemon.signal("TERM");
    let code = daemon.wait_exit(Duration::from_secs(5));
    let stderr = daemon.finish_stderr(Duration::from_secs(2)).to_vec();
    assert_eq!(code, Some(0), "daemon exit; stderr:\n{}", stderr.join("\n"));
    stderr
}

// ---------------------------------------------------------------------------------------------
// 1. Crash torture.

const AGENTS: [&str; 6] = ["web", "design", "ops", "data", "qa", "human"];
const WRITERS: usize = 8;
const TOTAL_LINES: usize = 20_000;
const MIN_KILLS: usize = 5;

/// What a line written by the test must end as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Accepted,
    /// Refused for this reason; `told`: its sender can be named and must get a notice.
    Refused {
        reason: &'static str,
        told: bool,
    },
}

#[derive(Debug, Clone)]
struct Sent {
    inbox: String,
    /// Known for lines appended by the test itself; the senders' lines are found by id.
    offset: Option<u64>,
    id: String,
    from: String,
    kind: &'static str,
    expect: Expect,
}

/// A request a writer may still answer.
struct Open {
    id: String,
    requester: &'static str,
    addressee: &'static str,
    working: bool,
}

/// A writer's lines and the requests it left open.
struct Written {
    sent: Vec<Sent>,
    open: Vec<Open>,
}

fn two_agents(rng: &mut Rng) -> (&'static str, &'static str) {
    let a = AGENTS[rng.index(AGENTS.len())];
    loop {
        let b = AGENTS[rng.index(AGENTS.len())];
        if b != a {
            return (a, b);
        }
    }
}

/// One invalid line from station `from` in `to`'s inbox, and why it must be refused.
fn invalid(rng: &mut Rng, id: &str, from: &str, to: &str) -> (String, &'static str, bool) {
    match rng.below(5) {
        // A fragment: not JSON, but it names its sender, who is told.
        0 => (
            format!(r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"note","#),
            "bad-json",
            true,
        ),
        1 => (
            format!(
                r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"note","message":{{"role":"agent","parts":[{{"type":"text","text":"no time"}}]}}}}"#
            ),
            "missing-field",
            true,
        ),
        2 => (
            line(id, from, to, "response", r#","state":"completed""#),
            "response-without-correlation",
            true,
        ),
        3 => (
            line(
                id,
                from,
                to,
                "response",
                &format!(r#","correlatesTo":"nosuch-{id}","state":"completed""#),
            ),
            "unknown-request",
            true,
        ),
        _ => {
            // Addressed to someone else than the inbox's owner.
            let other = AGENTS.iter().find(|a| **a != to && **a != from).unwrap();
            (line(id, from, other, "note", ""), "misaddressed", true)
        }
    }
}

/// Writer `w`: `count` lines, paced, in a mix of requests, responses, notes and invalid lines;
/// a few through `doorbell send` and `scripts/doorbell-send`.
#[allow(clippy::too_many_lines)]
fn writer(bridge: &Bridge, w: usize, count: usize, seed: u64) -> Written {
    let mut rng = Rng::new(seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut sent = Vec::with_capacity(count);
    let mut open: Vec<Open> = Vec::new();
    for n in 0..count {
        let id = format!("w{w}-{n:05}");
        let roll = rng.below(1000);
        if roll < 50 {
            let (from, to) = two_agents(&mut rng);
            let (text, reason, told) = invalid(&mut rng, &id, from, to);
            let offset = append_locked(&bridge.inbox(to), text.as_bytes());
            sent.push(Sent {
                inbox: to.to_owned(),
                offset: Some(offset),
                id,
                from: from.to_owned(),
                kind: "invalid",
                expect: Expect::Refused { reason, told },
            });
        } else if roll < 350 {
            let (requester, addressee) = two_agents(&mut rng);
            let text = line(&id, requester, addressee, "request", "");
            let offset = append_locked(&bridge.inbox(addressee), text.as_bytes());
            sent.push(Sent {
                inbox: addressee.to_owned(),
                offset: Some(offset),
                id: id.clone(),
                from: requester.to_owned(),
                kind: "request",
                expect: Expect::Accepted,
            });
            open.push(Open {
                id,
                requester,
                addressee,
                working: false,
            });
        } else if roll < 650 && !open.is_empty() {
            // The addressee answers an earlier request, in the requester's inbox: a
            // heartbeat first now and then, then the final answer.
            let at = rng.index(open.len());
            let heartbeat = !open[at].working && rng.below(3) == 0;
            let (request, requester, addressee) =
                (open[at].id.clone(), open[at].requester, open[at].addressee);
            let state = if heartbeat {
                open[at].working = true;
                "working"
            } else {
                open.swap_remove(at);
                "completed"
            };
            let text = line(
                &id,
                addressee,
                requester,
                "response",
                &format!(r#","correlatesTo":"{request}","state":"{state}""#),
            );
            let offset = append_locked(&bridge.inbox(requester), text.as_bytes());
            sent.push(Sent {
                inbox: requester.to_owned(),
                offset: Some(offset),
                id,
                from: addressee.to_owned(),
                kind: "response",
                expect: Expect::Accepted,
            });
        } else {
            let (from, to) = two_agents(&mut rng);
            let how = rng.below(1000);
            let (id, offset) = if how < 8 {
                // The binary, making its own id (no catch-up).
                let out = bridge.send(from, to, "a note").trim().to_owned();
                (out, None)
            } else if how < 12 {
                // The binary with --id: it catches up (and judges) when no daemon runs.
                bridge
                    .doorbell(&["send", "--to", to, "--from", from, "--id", &id, "a note"])
                    .ok();
                (id, None)
            } else if how < 20 {
                bridge
                    .script(&["--to", to, "--from", from, "--id", &id, "a note"], None)
                    .ok();
                (id, None)
            } else {
                let text = line(&id, from, to, "note", "");
                let offset = append_locked(&bridge.inbox(to), text.as_bytes());
                (id, Some(offset))
            };
            sent.push(Sent {
                inbox: to.to_owned(),
                offset,
                id,
                from: from.to_owned(),
                kind: "note",
                expect: Expect::Accepted,
            });
        }
        // Pace the writers so that the kills land in the middle of the traffic.
        std::thread::sleep(Duration::from_micros(rng.below(12_000)));
    }
    Written { sent, open }
}

#[allow(clippy::too_many_lines)]
#[test]
fn crash_torture_every_line_one_verdict_every_refusal_told_once() {
    let _serial = serial();
    let started = Instant::now();
    let base = seed();
    let bridge = Bridge::with_agents(&AGENTS);
    let inboxes: Vec<String> = AGENTS.iter().map(|a| (*a).to_owned()).collect();
    let mut rng = Rng::new(base);
    let finished = AtomicUsize::new(0);
    let mut kills = 0;
    let mut startup_kills = 0;
    let written: Vec<Written> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let bridge = &bridge;
                let finished = &finished;
                s.spawn(move || {
                    let written = writer(bridge, w, TOTAL_LINES / WRITERS, base);
                    finished.fetch_add(1, Ordering::SeqCst);
                    written
                })
            })
            .collect();
        let mut daemon = Daemon::start(&bridge, &[]);
        while finished.load(Ordering::SeqCst) < WRITERS || kills < MIN_KILLS {
            // A random moment to kill, not a wait for a result: now and then right after the
            // start-up catch-up (when due notices are written), mostly later.
            let delay = if rng.below(3) == 0 {
                rng.below(100)
            } else {
                100 + rng.below(1400)
            };
            std::thread::sleep(Duration::from_millis(delay));
            assert_running(&mut daemon, "before a kill");
            daemon.kill();
            kills += 1;
            if rng.below(3) == 0 {
                // Now and then one more, killed during its start-up catch-up.
                let mut child = bridge
                    .command(&["daemon"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                std::thread::sleep(Duration::from_millis(rng.below(60)));
                child.kill().unwrap();
                child.wait().unwrap();
                startup_kills += 1;
            }
            daemon = Daemon::start(&bridge, &[]);
        }
        assert_running(&mut daemon, "after the writers finished");
        daemon.kill();
        handles
            .into_iter()
            .map(|h| h.join().expect("a writer panicked"))
            .collect()
    });
    let writing = started.elapsed();
    let sent: Vec<Sent> = written.iter().flat_map(|w| w.sent.clone()).collect();
    assert_eq!(sent.len(), TOTAL_LINES);

    // The final daemon judges what is left and tells every sender.
    let daemon = Daemon::start(&bridge, &[]);
    let seen = wait_settled(&bridge, &inboxes, Duration::from_secs(120));
    let status: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["status", "--json"]).ok()).unwrap();
    let stderr = stop(daemon);
    assert!(
        !stderr.iter().any(|l| l.contains("ERROR")),
        "{}",
        stderr.join("\n")
    );

    // Exactly one verdict per line, and every line has one.
    let current = seen.current();
    let twice: Vec<_> = current.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(twice.is_empty(), "lines judged more than once: {twice:?}");
    let all_lines: usize = seen.lines.values().map(Vec::len).sum();
    assert_eq!(current.len(), all_lines, "verdicts vs lines");
    let other_gens: Vec<_> = seen
        .verdicts
        .iter()
        .filter(|r| r.gen != seen.gen(&r.inbox))
        .collect();
    assert!(
        other_gens.is_empty(),
        "no inbox was replaced, yet: {other_gens:?}"
    );

    // Accepted ids: each once.
    let mut accepted: HashMap<&str, Vec<&JournalRecord>> = HashMap::new();
    for record in seen.verdicts.iter().filter(|r| r.verdict == "a") {
        accepted
            .entry(record.accepted.as_ref().unwrap().id.as_str())
            .or_default()
            .push(record);
    }
    let repeated: Vec<_> = accepted.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(repeated.is_empty(), "ids accepted twice: {repeated:?}");

    // Every line the test wrote ended as it must.
    let mut wrong = Vec::new();
    for line in &sent {
        match (&line.expect, line.offset) {
            (Expect::Accepted, None) => match accepted.get(line.id.as_str()) {
                Some(records) if records[0].inbox == line.inbox => {}
                other => wrong.push(format!("{line:?}: {other:?}")),
            },
            (expect, Some(offset)) => {
                let key = (line.inbox.clone(), 0, offset);
                let verdict = current.get(&key).map(|v| v[0]);
                let ok = match (expect, verdict) {
                    (Expect::Accepted, Some(r)) => {
                        r.verdict == "a" && r.accepted.as_ref().unwrap().id == line.id
                    }
                    (Expect::Refused { reason, told }, Some(r)) => {
                        r.verdict == "r"
                            && r.reason.as_deref() == Some(*reason)
                            && r.tell == *told
                            && (!*told || r.id.as_deref() == Some(line.id.as_str()))
                    }
                    (_, None) => false,
                };
                if !ok {
                    wrong.push(format!("{line:?}: {verdict:?}"));
                }
            }
            (Expect::Refused { .. }, None) => unreachable!("refused lines are appended directly"),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} lines ended wrong, e.g. {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );

    // Every request is in the ledger exactly once.
    let requests: BTreeSet<&str> = sent
        .iter()
        .filter(|l| l.kind == "request")
        .map(|l| l.id.as_str())
        .collect();
    let ledgered: Vec<&str> = seen
        .verdicts
        .iter()
        .filter_map(|r| r.accepted.as_ref())
        .filter(|a| a.kind == "request")
        .map(|a| a.id.as_str())
        .collect();
    assert_eq!(ledgered.len(), requests.len(), "requests accepted");
    assert_eq!(
        ledgered.iter().copied().collect::<BTreeSet<_>>(),
        requests,
        "requests accepted"
    );
    // ... and the ledger's debts are exactly the requests left open.
    let mut debtors: BTreeMap<&str, u64> = AGENTS.iter().map(|a| (*a, 0)).collect();
    let mut creditors: BTreeMap<&str, u64> = debtors.clone();
    for open in written.iter().flat_map(|w| &w.open) {
        *debtors.get_mut(open.addressee).unwrap() += 1;
        *creditors.get_mut(open.requester).unwrap() += 1;
    }
    for agent in status["agents"].as_array().unwrap() {
        let name = agent["name"].as_str().unwrap();
        assert_eq!(agent["owes"], debtors[name], "{name} owes; {status}");
        assert_eq!(agent["isOwed"], creditors[name], "{name} is owed; {status}");
    }

    // Every refusal is recorded once in refused.jsonl, and nothing else is.
    let invalid: Vec<&Sent> = sent
        .iter()
        .filter(|l| matches!(l.expect, Expect::Refused { .. }))
        .collect();
    let mut logged: HashMap<Key, Vec<&RefusedRecord>> = HashMap::new();
    for record in &seen.refused {
        logged
            .entry((record.inbox.clone(), record.generation, record.offset))
            .or_default()
            .push(record);
    }
    let twice: Vec<_> = logged.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(twice.is_empty(), "refused.jsonl repeats: {twice:?}");
    assert_eq!(seen.refused.len(), invalid.len(), "refused.jsonl records");
    for line in &invalid {
        let key = (line.inbox.clone(), 0, line.offset.unwrap());
        let Expect::Refused { reason, told } = &line.expect else {
            unreachable!()
        };
        let record = logged
            .get(&key)
            .unwrap_or_else(|| panic!("not in refused.jsonl: {line:?}"))[0];
        assert_eq!(record.reason, *reason, "{line:?}");
        if *told {
            assert_eq!(record.id.as_deref(), Some(line.id.as_str()), "{line:?}");
        }
    }

    // Every refused line from a station is named in exactly one notice, sent to that station.
    let by_key: HashMap<Key, &Sent> = invalid
        .iter()
        .map(|l| ((l.inbox.clone(), 0, l.offset.unwrap()), *l))
        .collect();
    let mut named: HashMap<&Key, usize> = HashMap::new();
    let mut notice_ids: HashMap<&str, usize> = HashMap::new();
    for notice in &seen.notices {
        *notice_ids.entry(notice.id.as_str()).or_default() += 1;
        let verdict = current.get(&(notice.inbox.clone(), 0, notice.offset));
        assert!(
            verdict.is_some_and(|v| v[0].verdict == "a"),
            "a notice not accepted: {notice:?} {verdict:?}"
        );
        for entry in &notice.named {
            *named.entry(&entry.key).or_default() += 1;
            let line = by_key
                .get(&entry.key)
                .unwrap_or_else(|| panic!("a notice names a line that was not refused: {entry:?}"));
            assert_eq!(line.from, notice.inbox, "told the wrong station: {entry:?}");
            assert_eq!(entry.id.as_deref(), Some(line.id.as_str()), "{entry:?}");
            let Expect::Refused { reason, .. } = &line.expect else {
                unreachable!()
            };
            assert_eq!(entry.reason, *reason, "{entry:?}");
            assert!(
                notice.text.contains(&format!("'{}'", line.id)),
                "the text does not name {}: {}",
                line.id,
                notice.text
            );
        }
    }
    let repeated: Vec<_> = notice_ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "notices written twice: {repeated:?}");
    let twice: Vec<_> = named.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "lines named in more than one notice: {twice:?}"
    );
    let must_tell: BTreeSet<&Key> = by_key
        .iter()
        .filter(|(_, l)| matches!(l.expect, Expect::Refused { told: true, .. }))
        .map(|(k, _)| k)
        .collect();
    let told: BTreeSet<&Key> = named.keys().copied().collect();
    assert_eq!(told, must_tell, "the lines named in notices");

    // One more start finds nothing to do and writes nothing.
    let sizes: Vec<u64> = inboxes
        .iter()
        .map(|i| std::fs::metadata(bridge.inbox(i)).unwrap().len())
        .collect();
    let verdicts = seen.verdicts.len();
    let daemon = Daemon::start(&bridge, &[]);
    let again = observe(&bridge, &inboxes);
    stop(daemon);
    assert_eq!(again.verdicts.len(), verdicts, "a restart judged again");
    let sizes_again: Vec<u64> = inboxes
        .iter()
        .map(|i| std::fs::metadata(bridge.inbox(i)).unwrap().len())
        .collect();
    assert_eq!(sizes_again, sizes, "a restart wrote to an inbox");

    let by_reason = invalid.iter().fold(BTreeMap::new(), |mut m, l| {
        if let Expect::Refused { reason, .. } = l.expect {
            *m.entry(reason).or_insert(0) += 1;
        }
        m
    });
    println!(
        "crash torture: {} lines ({} refused: {by_reason:?}), {} notices, {kills} kills + \
         {startup_kills} during start-up; writing {writing:.1?}, in all {:.1?}",
        sent.len(),
        invalid.len(),
        seen.notices.len(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A response right behind its request, in another inbox.

#[test]
fn responses_right_behind_their_requests_are_never_unknown() {
    const THREADS: usize = 4;
    const PAIRS: usize = 1_000;
    let _serial = serial();
    let started = Instant::now();
    let base = seed();
    let agents = names("p", 10);
    let bridge = Bridge::new();
    add_inboxes(&bridge, &agents);
    let daemon = Daemon::start(&bridge, &[]);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (bridge, agents) = (&bridge, &agents);
            s.spawn(move || {
                let mut rng = Rng::new(base ^ (t as u64 + 1));
                for n in 0..PAIRS / THREADS {
                    let requester = &agents[rng.index(agents.len())];
                    let addressee = loop {
                        let a = &agents[rng.index(agents.len())];
                        if a != requester {
                            break a;
                        }
                    };
                    let request = format!("q{t}-{n:04}");
                    append_locked(
                        &bridge.inbox(addressee),
                        line(&request, requester, addressee, "request", "").as_bytes(),
                    );
                    append_locked(
                        &bridge.inbox(requester),
                        line(
                            &format!("r{t}-{n:04}"),
                            addressee,
                            requester,
                            "response",
                            &format!(r#","correlatesTo":"{request}","state":"completed""#),
                        )
                        .as_bytes(),
                    );
                }
            });
        }
    });
    let seen = wait_settled(&bridge, &agents, Duration::from_secs(60));
    stop(daemon);
    let refused: Vec<_> = seen.verdicts.iter().filter(|r| r.verdict != "a").collect();
    let mut reasons: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for record in &refused {
        let reason = record.reason.as_deref().unwrap_or("-");
        *reasons.entry((&record.verdict, reason)).or_default() += 1;
    }
    assert!(
        refused.is_empty(),
        "{} lines not accepted ({reasons:?}), e.g. {:#?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );
    let accepted: BTreeSet<&str> = seen
        .verdicts
        .iter()
        .map(|r| r.accepted.as_ref().unwrap().id.as_str())
        .collect();
    assert_eq!(accepted.len(), 2 * PAIRS, "accepted ids");
    assert_eq!(seen.verdicts.len(), 2 * PAIRS, "verdicts");
    println!(
        "{PAIRS} request/response pairs: all accepted in {:.1?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Lost inotify events.

const MAX_QUEUED_EVENTS: &str = "/proc/sys/fs/inotify/max_queued_events";

/// Lowers the system's inotify queue limit while it lives; the old value comes back on drop,
/// a panic included.
struct QueueLimit {
    old: String,
}

impl QueueLimit {
    fn lower_to(limit: u32) -> QueueLimit {
        let old = std::fs::read_to_string(MAX_QUEUED_EVENTS)
            .unwrap_or_else(|e| panic!("cannot read {MAX_QUEUED_EVENTS}: {e}"));
        std::fs::write(MAX_QUEUED_EVENTS, limit.to_string()).unwrap_or_else(|e| {
            panic!(
                "cannot lower {MAX_QUEUED_EVENTS} (this test must run as root, as in CI, to make \
                 the kernel drop inotify events): {e}"
            )
        });
        QueueLimit {
            old: old.trim().to_owned(),
        }
    }
}

impl Drop for QueueLimit {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(MAX_QUEUED_EVENTS, &self.old) {
            eprintln!("could not restore {MAX_QUEUED_EVENTS} to {}: {e}", self.old);
        }
    }
}

#[test]
fn lost_events_mean_a_sweep_and_every_line_is_still_judged() {
    const INBOXES: usize = 200;
    const PER_INBOX: usize = 5;
    let _serial = serial();
    let started = Instant::now();
    let agents = names("r", INBOXES);
    let bridge = Bridge::new();
    add_inboxes(&bridge, &agents);
    // The limit applies to inotify instances created while it is low: the daemon's only.
    let limit = QueueLimit::lower_to(16);
    let mut daemon = Daemon::start(&bridge, &[]);
    drop(limit);
    std::thread::scope(|s| {
        for chunk in agents.chunks(INBOXES / 4) {
            let (bridge, agents) = (&bridge, &agents);
            s.spawn(move || {
                for round in 0..PER_INBOX {
                    for (i, owner) in chunk.iter().enumerate() {
                        let from = &agents[(i + 1) % agents.len()];
                        let id = format!("{owner}-{round}");
                        append_locked(
                            &bridge.inbox(owner),
                            line(&id, from, owner, "note", "").as_bytes(),
                        );
                    }
                }
            });
        }
    });
    daemon.expect_stderr("events were lost", Duration::from_secs(30));
    let seen = wait_settled(&bridge, &agents, Duration::from_secs(60));
    assert_running(&mut daemon, "after the burst");
    stop(daemon);
    let accepted = seen.verdicts.iter().filter(|r| r.verdict == "a").count();
    assert_eq!(accepted, INBOXES * PER_INBOX, "accepted lines");
    assert_eq!(seen.verdicts.len(), INBOXES * PER_INBOX, "verdicts");
    println!(
        "lost events: {} lines in {INBOXES} inboxes judged in {:.1?}",
        INBOXES * PER_INBOX,
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 4. A thousand inboxes under `ulimit -n 1024`.

/// The open-files limit of a process, as `/proc/PID/limits` shows it (soft, hard).
fn open_files_limit(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let row = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut fields = row["Max open files".len()..].split_whitespace();
    (
        fields.next().unwrap().to_owned(),
        fields.next().unwrap().to_owned(),
    )
}

#[test]
fn a_thousand_inboxes_under_ulimit_1024() {
    const INBOXES: usize = 1_000;
    let _serial = serial();
    let started = Instant::now();
    let agents = names("n", INBOXES);
    let bridge = Bridge::new();
    add_inboxes(&bridge, &agents);
    let mut command = Command::new("sh");
    bridge.env(&mut command);
    command.args(["-c", r#"ulimit -n 1024 && exec "$0" daemon"#, BIN]);
    let mut daemon = Daemon::spawn(command);
    let pid = daemon.child.id();
    let (soft, hard) = open_files_limit(pid);
    assert_eq!(soft, "1024", "the daemon's soft limit");
    assert_eq!(hard, "1024", "the daemon's hard limit");
    for (i, owner) in agents.iter().enumerate() {
        let from = &agents[(i + 1) % INBOXES];
        append_locked(
            &bridge.inbox(owner),
            line(&format!("{owner}-hello"), from, owner, "note", "").as_bytes(),
        );
    }
    let seen = wait_settled(&bridge, &agents, Duration::from_secs(60));
    assert_running(&mut daemon, "after judging 1,000 inboxes");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(fds < 1024, "the daemon holds {fds} files open");
    let stderr = stop(daemon);
    let accepted = seen.verdicts.iter().filter(|r| r.verdict == "a").count();
    assert_eq!(accepted, INBOXES, "accepted lines");
    assert_eq!(seen.verdicts.len(), INBOXES, "verdicts");
    let too_many: Vec<&String> = stderr
        .iter()
        .filter(|l| l.contains("Too many open files") || l.contains("EMFILE"))
        .collect();
    assert!(too_many.is_empty(), "{too_many:?}");
    println!(
        "{INBOXES} inboxes under ulimit -n 1024: all judged, {fds} fds open, in {:.1?}",
        started.elapsed()
    );
}
