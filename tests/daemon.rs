//! The daemon end to end: the real binary, real inotify, conditions awaited with deadlines.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::util::{line, wait_for_file, Bridge, Daemon, Run, Watch};

const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn watch_prints_a_request_and_a_bad_response_is_refused_and_told_once() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let _daemon = Daemon::start(&bridge, &[]);
    let mut watch = crate::util::WatchChild::spawn(&bridge, "web");
    let mut printed = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    let id = bridge
        .doorbell(&[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--kind",
            "request",
            "the header colour?",
        ])
        .ok()
        .trim()
        .to_owned();
    let first: serde_json::Value = serde_json::from_str(&printed.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["envelope"]["id"], id.as_str());
    drop(watch);

    // A response without correlatesTo, written by hand into design's inbox.
    bridge.append_raw(
        "design",
        format!(
            "{}\n",
            line(
                "01NOCORR",
                "web",
                "design",
                "response",
                r#","state":"completed""#
            )
        )
        .as_bytes(),
    );
    bridge.wait_for(PATIENCE, "the notice to web", |b| {
        b.lines("web")
            .iter()
            .any(|l| l.starts_with(br#"{"id":"bridge:refused:"#))
    });
    let refused = std::fs::read_to_string(bridge.dir().join(".doorbell/refused.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = refused
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "{refused}");
    assert_eq!(records[0]["reason"], "response-without-correlation");
    assert_eq!(records[0]["id"], "01NOCORR");
    let notices: Vec<serde_json::Value> = bridge
        .lines("web")
        .iter()
        .map(|l| serde_json::from_slice::<serde_json::Value>(l).unwrap())
        .filter(|e| e["from"] == "bridge")
        .collect();
    assert_eq!(notices.len(), 1);
    let text = notices[0]["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("'01NOCORR' in design-inbox.jsonl: response-without-correlation"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Helpers for the tests below. They read only complete records: the judge may be mid-append.

/// A journal record that is a verdict, keyed by where its line is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Judged {
    inbox: String,
    gen: u64,
    offset: u64,
    verdict: String,
    reason: Option<String>,
}

/// The journal's complete records.
fn records(bridge: &Bridge) -> Vec<serde_json::Value> {
    let bytes = std::fs::read(bridge.dir().join(".doorbell/journal.jsonl")).unwrap_or_default();
    let complete = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(end) => &bytes[..=end],
        None => &[][..],
    };
    complete
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// Every verdict in the journal (not marks, not intents), in journal order.
fn judged(bridge: &Bridge) -> Vec<Judged> {
    records(bridge)
        .into_iter()
        .filter(|r| r["v"] != "m" && r["v"] != "i")
        .map(|r| Judged {
            inbox: r["in"].as_str().unwrap().to_owned(),
            gen: r["g"].as_u64().unwrap_or(0),
            offset: r["o"].as_u64().unwrap(),
            verdict: r["v"].as_str().unwrap().to_owned(),
            reason: r["reason"].as_str().map(str::to_owned),
        })
        .collect()
}

/// The verdicts of one inbox's generation `gen`, as (offset, verdict), in journal order.
fn judged_in(bridge: &Bridge, inbox: &str, gen: u64) -> Vec<(u64, String)> {
    judged(bridge)
        .into_iter()
        .filter(|j| j.inbox == inbox && j.gen == gen)
        .map(|j| (j.offset, j.verdict))
        .collect()
}

/// The generations the journal has marked for `inbox`, in journal order (repeats removed).
fn marked_generations(bridge: &Bridge, inbox: &str) -> Vec<u64> {
    let mut gens: Vec<u64> = records(bridge)
        .into_iter()
        .filter(|r| r["v"] == "m" && r["in"] == inbox)
        .map(|r| r["g"].as_u64().unwrap_or(0))
        .collect();
    gens.dedup();
    gens
}

/// Every verdict key (inbox, generation, offset) and how often the journal has it.
fn verdict_keys(bridge: &Bridge) -> BTreeMap<(String, u64, u64), usize> {
    let mut keys = BTreeMap::new();
    for j in judged(bridge) {
        *keys.entry((j.inbox, j.gen, j.offset)).or_insert(0) += 1;
    }
    keys
}

/// Panic when any line has more than one verdict.
#[track_caller]
fn assert_judged_once(bridge: &Bridge) -> BTreeMap<(String, u64, u64), usize> {
    let keys = verdict_keys(bridge);
    let twice: Vec<_> = keys.iter().filter(|(_, &n)| n != 1).collect();
    assert!(twice.is_empty(), "lines judged more than once: {twice:?}");
    // The helper in util spells verdicts out; it must agree on how many there are.
    assert_eq!(bridge.verdict_count(), keys.len());
    keys
}

/// Where each complete line of `bytes` starts.
fn starts(bytes: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut at = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' {
            if i > at {
                out.push(at as u64);
            }
            at = i + 1;
        }
    }
    out
}

/// A note from `design` to `to`, with its newline.
fn note(id: &str, to: &str) -> String {
    format!("{}\n", line(id, "design", to, "note", ""))
}

/// The verdict (and reason) of the line with `id` in `inbox`'s current file.
#[track_caller]
fn verdict_of(bridge: &Bridge, inbox: &str, id: &str) -> (String, Option<String>) {
    let bytes = std::fs::read(bridge.inbox(inbox)).unwrap();
    let needle = format!(r#""id":"{id}""#);
    let offset = starts(&bytes)
        .into_iter()
        .find(|&o| {
            let rest = &bytes[o as usize..];
            let end = rest.iter().position(|&b| b == b'\n').unwrap();
            rest[..end]
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
        })
        .unwrap_or_else(|| panic!("no line {id} in {inbox}"));
    let gen = marked_generations(bridge, inbox)
        .last()
        .copied()
        .unwrap_or(0);
    let found = judged(bridge)
        .into_iter()
        .find(|j| j.inbox == inbox && j.gen == gen && j.offset == offset)
        .unwrap_or_else(|| panic!("no verdict for {id} in {inbox}"));
    (found.verdict, found.reason)
}

/// The agents whose inbox is a regular file in the folder.
fn inbox_files(bridge: &Bridge) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(bridge.dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix("-inbox.jsonl")
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// Whether every complete line of every inbox has a verdict in the inbox's current generation:
/// the judge has nothing left to do (notices it wrote included, once they are judged).
fn all_judged(bridge: &Bridge) -> bool {
    let keys = verdict_keys(bridge);
    inbox_files(bridge).iter().all(|name| {
        let gen = marked_generations(bridge, name)
            .last()
            .copied()
            .unwrap_or(0);
        let bytes = std::fs::read(bridge.inbox(name)).unwrap_or_default();
        starts(&bytes)
            .into_iter()
            .all(|offset| keys.contains_key(&(name.clone(), gen, offset)))
    })
}

/// Every refusal notice in every inbox, parsed.
fn notices(bridge: &Bridge) -> Vec<serde_json::Value> {
    inbox_files(bridge)
        .iter()
        .flat_map(|name| bridge.lines(name))
        .filter(|l| l.starts_with(br#"{"id":"bridge:refused:"#))
        .map(|l| serde_json::from_slice(&l).unwrap())
        .collect()
}

/// How many notices name the refused line `id`.
fn notices_naming(bridge: &Bridge, id: &str) -> usize {
    let needle = format!("'{id}'");
    notices(bridge)
        .iter()
        .filter(|n| {
            n["message"]["parts"][0]["text"]
                .as_str()
                .unwrap()
                .contains(&needle)
        })
        .count()
}

/// Append a note to `human` and wait until it is judged: every hint given before it has been
/// taken by the judge (events reach it in order), so what it did not judge by now it skipped.
#[track_caller]
fn barrier(bridge: &Bridge) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let id = format!("01BARRIER{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let before = std::fs::metadata(bridge.inbox("human")).unwrap().len();
    bridge.append_raw("human", note(&id, "human").as_bytes());
    bridge.wait_for(PATIENCE, &format!("barrier {id} judged"), |b| {
        judged(b)
            .iter()
            .any(|j| j.inbox == "human" && j.offset == before)
    });
}

/// Run a command to its end, killing it and failing after `timeout`.
#[track_caller]
fn run_within(mut command: std::process::Command, timeout: Duration) -> Run {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(output) = rx.recv_timeout(timeout) else {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("command did not finish within {timeout:?}");
    };
    let output = output.unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Append to an inbox through a hard link outside the bridge folder: the folder watch hears
/// nothing, so only a judge that reads the file (drains it) finds these lines.
fn append_silently(bridge: &Bridge, name: &str, bytes: &[u8]) {
    let link = bridge.tmp.path().join(format!("{name}-link"));
    std::fs::hard_link(bridge.inbox(name), &link).unwrap();
    let mut file = OpenOptions::new().append(true).open(&link).unwrap();
    file.write_all(bytes).unwrap();
    drop(file);
    std::fs::remove_file(&link).unwrap();
}

/// Stop a daemon with SIGTERM and check it exits 0.
#[track_caller]
fn stop(daemon: Daemon) {
    stop_with(daemon, "TERM");
}

/// Stop a daemon with `signal` and check it exits 0.
#[track_caller]
fn stop_with(mut daemon: Daemon, signal: &str) {
    daemon.signal(signal);
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(10)),
        Some(0),
        "stderr:\n{}",
        daemon.stderr.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Generations while running.

#[test]
fn an_inbox_truncated_in_place_is_read_again_from_0_as_a_new_generation() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let old: String = (0..10)
        .map(|i| note(&format!("01OLD{i:02}"), "web"))
        .collect();
    bridge.append_raw("web", old.as_bytes());
    bridge.wait_for(PATIENCE, "the 10 old lines", |b| {
        judged_in(b, "web", 0).len() == 10
    });
    assert_eq!(bridge.read_ids("web").len(), 10);

    // Truncated in place, then 3 shorter lines.
    let file = OpenOptions::new()
        .write(true)
        .open(bridge.inbox("web"))
        .unwrap();
    file.set_len(0).unwrap();
    drop(file);
    let new: String = (0..3).map(|i| note(&format!("01NEW{i}"), "web")).collect();
    bridge.append_raw("web", new.as_bytes());
    bridge.wait_for(PATIENCE, "the 3 new lines", |b| {
        judged_in(b, "web", 1).len() == 3
    });
    barrier(&bridge);
    let accepted = |offsets: Vec<u64>| -> Vec<(u64, String)> {
        offsets.into_iter().map(|o| (o, "a".to_owned())).collect()
    };
    assert_eq!(
        judged_in(&bridge, "web", 1),
        accepted(starts(new.as_bytes()))
    );
    assert_eq!(
        judged_in(&bridge, "web", 0),
        accepted(starts(old.as_bytes()))
    );
    assert_eq!(marked_generations(&bridge, "web"), [0, 1]);
    // Logged loudly.
    daemon.expect_stderr("new generation", Duration::from_secs(5));
    assert_eq!(bridge.read_ids("web"), ["01NEW0", "01NEW1", "01NEW2"]);

    // Truncated again and written longer than before in one go: the size alone cannot tell,
    // the bytes before the saved position do.
    let file = OpenOptions::new()
        .write(true)
        .open(bridge.inbox("web"))
        .unwrap();
    file.set_len(0).unwrap();
    drop(file);
    let grown: String = (0..12)
        .map(|i| note(&format!("01GROWN{i:02}"), "web"))
        .collect();
    bridge.append_raw("web", grown.as_bytes());
    bridge.wait_for(PATIENCE, "the 12 lines of the third file", |b| {
        judged_in(b, "web", 2).len() == 12
    });
    barrier(&bridge);
    assert_eq!(
        judged_in(&bridge, "web", 2),
        accepted(starts(grown.as_bytes()))
    );
    assert_eq!(judged_in(&bridge, "web", 1).len(), 3);
    assert_eq!(marked_generations(&bridge, "web"), [0, 1, 2]);
    assert_judged_once(&bridge);
    let ids = bridge.read_ids("web");
    assert_eq!(ids.len(), 12, "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("01GROWN")), "{ids:?}");
}

#[test]
fn an_inbox_replaced_by_rename_is_drained_then_read_from_0() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let first: String = (0..2)
        .map(|i| note(&format!("01FIRST{i}"), "web"))
        .collect();
    bridge.append_raw("web", first.as_bytes());
    bridge.wait_for(PATIENCE, "the first lines", |b| {
        judged_in(b, "web", 0).len() == 2
    });

    // A new file is prepared in the folder; lines land in the old one just before the rename,
    // written through a link outside the folder so that no event tells the judge of them:
    // only draining the old file finds them.
    let replacement: String = (0..3).map(|i| note(&format!("01REPL{i}"), "web")).collect();
    let tmp = bridge.dir().join(".web-inbox.tmp");
    std::fs::write(&tmp, &replacement).unwrap();
    let late: String = (0..3).map(|i| note(&format!("01LATE{i}"), "web")).collect();
    append_silently(&bridge, "web", late.as_bytes());
    std::fs::rename(&tmp, bridge.inbox("web")).unwrap();

    bridge.wait_for(PATIENCE, "the old file drained and the new one read", |b| {
        judged_in(b, "web", 0).len() == 5 && judged_in(b, "web", 1).len() == 3
    });
    barrier(&bridge);
    // Logged loudly.
    daemon.expect_stderr("draining the old file", Duration::from_secs(5));
    daemon.expect_stderr("new generation", Duration::from_secs(5));
    let old = format!("{first}{late}");
    let old_verdicts: Vec<(u64, String)> = starts(old.as_bytes())
        .into_iter()
        .map(|o| (o, "a".to_owned()))
        .collect();
    assert_eq!(judged_in(&bridge, "web", 0), old_verdicts);
    let new_verdicts: Vec<(u64, String)> = starts(replacement.as_bytes())
        .into_iter()
        .map(|o| (o, "a".to_owned()))
        .collect();
    assert_eq!(judged_in(&bridge, "web", 1), new_verdicts);
    assert_eq!(marked_generations(&bridge, "web"), [0, 1]);
    assert_judged_once(&bridge);
    assert_eq!(bridge.read_ids("web"), ["01REPL0", "01REPL1", "01REPL2"]);
}

#[test]
fn an_inbox_deleted_and_recreated_is_drained_then_read_from_0() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let first: String = (0..2)
        .map(|i| note(&format!("01FIRST{i}"), "web"))
        .collect();
    bridge.append_raw("web", first.as_bytes());
    bridge.wait_for(PATIENCE, "the first lines", |b| {
        judged_in(b, "web", 0).len() == 2
    });

    // Unread lines (written where no event tells of them), then the file is removed, then a
    // new one is created with content.
    let unread: String = (0..2)
        .map(|i| note(&format!("01UNREAD{i}"), "web"))
        .collect();
    append_silently(&bridge, "web", unread.as_bytes());
    std::fs::remove_file(bridge.inbox("web")).unwrap();
    let again: String = (0..2)
        .map(|i| note(&format!("01AGAIN{i}"), "web"))
        .collect();
    std::fs::write(bridge.inbox("web"), &again).unwrap();

    bridge.wait_for(PATIENCE, "the old file drained and the new one read", |b| {
        judged_in(b, "web", 0).len() == 4 && judged_in(b, "web", 1).len() == 2
    });
    barrier(&bridge);
    // Logged loudly.
    daemon.expect_stderr("draining the old file", Duration::from_secs(5));
    daemon.expect_stderr("new generation", Duration::from_secs(5));
    let old = format!("{first}{unread}");
    let old_offsets: Vec<u64> = judged_in(&bridge, "web", 0)
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    assert_eq!(old_offsets, starts(old.as_bytes()));
    let new_offsets: Vec<u64> = judged_in(&bridge, "web", 1)
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    assert_eq!(new_offsets, starts(again.as_bytes()));
    assert!(judged(&bridge)
        .iter()
        .filter(|j| j.inbox == "web")
        .all(|j| j.verdict == "a"));
    assert_judged_once(&bridge);
    assert_eq!(bridge.read_ids("web"), ["01AGAIN0", "01AGAIN1"]);

    // Deleted again with nothing unread, recreated empty, written later.
    std::fs::remove_file(bridge.inbox("web")).unwrap();
    std::fs::write(bridge.inbox("web"), "").unwrap();
    barrier(&bridge);
    bridge.append_raw("web", note("01THIRD", "web").as_bytes());
    bridge.wait_for(PATIENCE, "the third file's line", |b| {
        judged_in(b, "web", 2) == [(0, "a".to_owned())]
    });
    assert_judged_once(&bridge);
    assert_eq!(bridge.read_ids("web"), ["01THIRD"]);
}

#[test]
fn inboxes_with_the_same_first_line_are_judged_independently() {
    let bridge = Bridge::with_agents(&["web", "mobile", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    // The same bytes open both files: accepted in web, misaddressed in mobile.
    let same = note("01SAMEFIRST", "web");
    bridge.append_raw("web", format!("{same}{}", note("01WEB1", "web")).as_bytes());
    bridge.append_raw(
        "mobile",
        format!("{same}{}", note("01MOB1", "mobile")).as_bytes(),
    );
    bridge.wait_for(PATIENCE, "both files", |b| {
        judged_in(b, "web", 0).len() == 2 && judged_in(b, "mobile", 0).len() == 2
    });
    let second = same.len() as u64;
    assert_eq!(
        judged_in(&bridge, "web", 0),
        [(0, "a".to_owned()), (second, "a".to_owned())]
    );
    assert_eq!(
        judged_in(&bridge, "mobile", 0),
        [(0, "r".to_owned()), (second, "a".to_owned())]
    );
    let reason = judged(&bridge)
        .into_iter()
        .find(|j| j.inbox == "mobile" && j.offset == 0)
        .unwrap()
        .reason;
    assert_eq!(reason.as_deref(), Some("misaddressed"));

    // Across a restart each resumes from its own position.
    stop(daemon);
    bridge.append_raw("web", note("01WEB2", "web").as_bytes());
    bridge.append_raw("mobile", note("01MOB2", "mobile").as_bytes());
    let _daemon = Daemon::start(&bridge, &[]);
    bridge.wait_for(PATIENCE, "both third lines", |b| {
        judged_in(b, "web", 0).len() == 3 && judged_in(b, "mobile", 0).len() == 3
    });
    barrier(&bridge);
    assert_eq!(marked_generations(&bridge, "web"), [0]);
    assert_eq!(marked_generations(&bridge, "mobile"), [0]);
    assert_judged_once(&bridge);
    assert_eq!(bridge.read_ids("web"), ["01SAMEFIRST", "01WEB1", "01WEB2"]);
    assert_eq!(bridge.read_ids("mobile"), ["01MOB1", "01MOB2"]);
}

// ---------------------------------------------------------------------------------------------
// 2. A partial line across a SIGKILL.

#[test]
fn a_partial_line_completed_after_a_kill_is_judged_whole_once() {
    let bridge = Bridge::with_agents(&["web", "mobile", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let whole = note("01WHOLE", "web");
    let split = note("01SPLIT", "web");
    let (head, tail) = split.split_at(split.len() / 2);
    // One write: a complete line and half of the next.
    bridge.append_raw("web", format!("{whole}{head}").as_bytes());
    // mobile holds nothing but a fragment.
    let alone = note("01ALONE", "mobile");
    let (alone_head, alone_tail) = alone.split_at(alone.len() / 3);
    bridge.append_raw("mobile", alone_head.as_bytes());
    bridge.wait_for(PATIENCE, "the complete line", |b| {
        !judged_in(b, "web", 0).is_empty()
    });
    barrier(&bridge);
    assert_eq!(judged_in(&bridge, "web", 0), [(0, "a".to_owned())]);
    assert!(judged_in(&bridge, "mobile", 0).is_empty());

    daemon.kill();
    bridge.append_raw("web", tail.as_bytes());
    bridge.append_raw("mobile", alone_tail.as_bytes());
    let _daemon = Daemon::start(&bridge, &[]);
    bridge.wait_for(PATIENCE, "the completed lines", |b| {
        judged_in(b, "web", 0).len() == 2 && !judged_in(b, "mobile", 0).is_empty()
    });
    barrier(&bridge);
    assert_eq!(
        judged_in(&bridge, "web", 0),
        [(0, "a".to_owned()), (whole.len() as u64, "a".to_owned())]
    );
    assert_eq!(judged_in(&bridge, "mobile", 0), [(0, "a".to_owned())]);
    assert_eq!(bridge.read_ids("web"), ["01WHOLE", "01SPLIT"]);
    assert_eq!(bridge.read_ids("mobile"), ["01ALONE"]);

    // While running, too: a fragment waits for its newline.
    let more = note("01MORE", "web");
    let (more_head, more_tail) = more.split_at(10);
    let at = std::fs::metadata(bridge.inbox("web")).unwrap().len();
    bridge.append_raw("web", more_head.as_bytes());
    barrier(&bridge);
    assert_eq!(judged_in(&bridge, "web", 0).len(), 2);
    bridge.append_raw("web", more_tail.as_bytes());
    bridge.wait_for(PATIENCE, "the completed line", |b| {
        judged_in(b, "web", 0).len() == 3
    });
    assert_eq!(judged_in(&bridge, "web", 0)[2], (at, "a".to_owned()));
    assert_judged_once(&bridge);
    assert!(judged(&bridge).iter().all(|j| j.verdict == "a"));
}

// ---------------------------------------------------------------------------------------------
// 3. Inboxes created while the daemon runs.

#[test]
fn an_inbox_created_and_written_in_one_go_is_judged() {
    let bridge = Bridge::with_agents(&["design", "human"]);
    let _daemon = Daemon::start(&bridge, &[]);
    std::fs::write(bridge.inbox("late"), note("01LATE", "late")).unwrap();
    // Moved into the folder whole: no create or write event, only the rename.
    let outside = bridge.tmp.path().join("moved-inbox.jsonl");
    std::fs::write(&outside, note("01MOVED", "moved")).unwrap();
    std::fs::rename(&outside, bridge.inbox("moved")).unwrap();
    bridge.wait_for(PATIENCE, "the late inboxes' lines", |b| {
        judged_in(b, "late", 0) == [(0, "a".to_owned())]
            && judged_in(b, "moved", 0) == [(0, "a".to_owned())]
    });
    assert_eq!(bridge.read_ids("late"), ["01LATE"]);
    assert_eq!(bridge.read_ids("moved"), ["01MOVED"]);
    assert_judged_once(&bridge);
}

#[test]
fn a_hundred_inboxes_created_in_bursts_around_the_start_are_all_judged() {
    let bridge = Bridge::with_agents(&["design", "human"]);
    // One burst races the daemon's start (its first sweep and its watch)...
    let dir = bridge.dir();
    let racing = std::thread::spawn(move || {
        for i in 0..50 {
            let name = format!("race{i:02}");
            std::fs::write(
                dir.join(format!("{name}-inbox.jsonl")),
                note(&format!("01RACE{i:02}"), &name),
            )
            .unwrap();
        }
    });
    let _daemon = Daemon::start(&bridge, &[]);
    racing.join().unwrap();
    // ...and one follows it at once.
    for i in 0..50 {
        let name = format!("burst{i:02}");
        std::fs::write(bridge.inbox(&name), note(&format!("01BURST{i:02}"), &name)).unwrap();
    }
    let names: Vec<String> = (0..50)
        .flat_map(|i| [format!("race{i:02}"), format!("burst{i:02}")])
        .collect();
    bridge.wait_for(PATIENCE, "a verdict in each of the 100 inboxes", |b| {
        let judged = judged(b);
        names
            .iter()
            .all(|name| judged.iter().any(|j| &j.inbox == name))
    });
    barrier(&bridge);
    for name in &names {
        assert_eq!(judged_in(&bridge, name, 0), [(0, "a".to_owned())], "{name}");
    }
    assert_judged_once(&bridge);
}

// ---------------------------------------------------------------------------------------------
// 4. Inboxes that are not regular files.

#[test]
fn a_symlinked_inbox_is_refused_never_followed() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let outside = bridge.tmp.path().join("outside.jsonl");
    std::fs::write(&outside, note("01VIALINK", "x")).unwrap();
    std::os::unix::fs::symlink(&outside, bridge.inbox("x")).unwrap();
    let daemon = Daemon::start(&bridge, &[]);
    // Another one appears while the daemon runs, and a FIFO too (a naive open would block).
    let outside_y = bridge.tmp.path().join("outside-y.jsonl");
    std::fs::write(&outside_y, note("01VIALINKY", "y")).unwrap();
    std::os::unix::fs::symlink(&outside_y, bridge.inbox("y")).unwrap();
    let mkfifo = std::process::Command::new("mkfifo")
        .arg(bridge.inbox("f"))
        .status()
        .unwrap();
    assert!(mkfifo.success());
    // Written to through the link's target: still nothing to judge.
    {
        let mut file = OpenOptions::new().append(true).open(&outside).unwrap();
        file.write_all(note("01VIALINK2", "x").as_bytes()).unwrap();
    }
    bridge.append_raw("web", note("01REAL", "web").as_bytes());
    bridge.wait_for(PATIENCE, "the real inbox's line", |b| {
        judged_in(b, "web", 0).len() == 1
    });
    barrier(&bridge);
    let touched: Vec<serde_json::Value> = records(&bridge)
        .into_iter()
        .filter(|r| ["x", "y", "f"].iter().any(|n| r["in"] == *n))
        .collect();
    assert!(touched.is_empty(), "{touched:?}");
    assert_eq!(
        judged_in(&bridge, "web", 0),
        [(0, "a".to_owned())],
        "daemon stderr:\n{}",
        daemon.stderr.join("\n")
    );

    let status = bridge.doorbell(&["status"]);
    status.ok();
    for name in ["x", "y", "f"] {
        let warning = format!("{name}-inbox.jsonl is not a regular file and is refused");
        assert!(status.stderr.contains(&warning), "{}", status.stderr);
    }
    let json: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["status", "--json"]).ok()).unwrap();
    let warnings = json["warnings"].to_string();
    assert!(warnings.contains("x-inbox.jsonl"), "{warnings}");

    let before = std::fs::read(&outside).unwrap();
    let send = bridge.doorbell(&["send", "--to", "x", "--from", "design", "hello"]);
    assert_eq!(send.code, 2, "{send:?}");
    assert!(
        send.stderr.contains("not a regular file"),
        "{}",
        send.stderr
    );
    let script = bridge.script(&["--to", "x", "--from", "design", "hello"], None);
    assert_eq!(script.code, 2, "{script:?}");
    assert_eq!(std::fs::read(&outside).unwrap(), before);
    assert!(std::fs::symlink_metadata(bridge.inbox("x"))
        .unwrap()
        .file_type()
        .is_symlink());
    barrier(&bridge);
    assert!(records(&bridge).iter().all(|r| r["in"] != "x"));
}

// ---------------------------------------------------------------------------------------------
// 5. A damaged or lost index (the checkpoint).

/// Traffic with a refusal and its notice, stop, damage the index, restart: it is rebuilt
/// from the journal, loudly; nothing is judged or told twice and new lines still flow.
fn survives_a_damaged_index(damage: impl FnOnce(&Path)) {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    for i in 0..3 {
        bridge.send("design", "web", &format!("hello {i}"));
    }
    // Refused (a response that answers nothing): design hears of it.
    bridge.append_raw(
        "web",
        format!(
            "{}\n",
            line(
                "01BADRESP",
                "design",
                "web",
                "response",
                r#","state":"completed""#
            )
        )
        .as_bytes(),
    );
    bridge.wait_for(PATIENCE, "everything judged, the notice too", |b| {
        notices_naming(b, "01BADRESP") == 1 && all_judged(b)
    });
    stop(daemon);
    let state = bridge.dir().join(".doorbell");
    assert!(state.join("index.db").exists());
    let before = assert_judged_once(&bridge);
    let refused_before = std::fs::read_to_string(state.join("refused.jsonl")).unwrap();

    damage(&state);

    let mut daemon = Daemon::start(&bridge, &[]);
    let said = daemon.expect_stderr("index", Duration::from_secs(5));
    assert!(
        said.contains("rebuilding it from the journal (no line is judged again)"),
        "{said}"
    );
    let ready = daemon.expect_stderr("doorbell: judging", Duration::from_secs(5));
    assert!(ready.contains("0 lines caught up"), "{ready}");
    let id = bridge.send("design", "web", "after").trim().to_owned();
    bridge.wait_for(PATIENCE, "the new line", |b| {
        verdict_keys(b).len() == before.len() + 1
    });
    barrier(&bridge);
    let after = assert_judged_once(&bridge);
    assert!(before.keys().all(|k| after.contains_key(k)));
    assert_eq!(
        after.len(),
        before.len() + 2,
        "the new line and the barrier"
    );
    assert_eq!(notices(&bridge).len(), 1);
    assert_eq!(
        std::fs::read_to_string(state.join("refused.jsonl")).unwrap(),
        refused_before
    );
    assert!(bridge.read_ids("web").contains(&id));
    stop(daemon);
}

#[test]
fn a_garbage_index_is_rebuilt_from_the_journal() {
    survives_a_damaged_index(|state| {
        std::fs::write(state.join("index.db"), b"\0\xffnot an index{{{").unwrap();
    });
}

#[test]
fn a_torn_index_is_rebuilt_from_the_journal() {
    survives_a_damaged_index(|state| {
        let path = state.join("index.db");
        let good = std::fs::read(&path).unwrap();
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    });
}

#[test]
fn a_lost_index_is_rebuilt_from_the_journal() {
    survives_a_damaged_index(|state| {
        for file in ["index.db", "index.db-wal", "index.db-shm"] {
            let _ = std::fs::remove_file(state.join(file));
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 6. One judge; a clean stop; a restart emits nothing twice.

#[test]
fn a_second_daemon_exits_3_and_a_restart_emits_nothing_twice() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let pid = daemon.child.id().to_string();

    let second = run_within(bridge.command(&["daemon"]), Duration::from_secs(15));
    assert_eq!(second.code, 3, "{second:?}");
    let names_pid = second
        .stderr
        .split(|c: char| !c.is_ascii_digit())
        .any(|n| n == pid);
    assert!(names_pid, "pid {pid} not named: {}", second.stderr);
    let once = run_within(
        bridge.command(&["daemon", "--once"]),
        Duration::from_secs(15),
    );
    assert_eq!(once.code, 3, "{once:?}");
    assert!(once.stderr.contains(&pid), "{}", once.stderr);
    let lock = std::fs::read_to_string(bridge.dir().join(".doorbell/lock")).unwrap();
    assert!(lock.contains(&pid), "{lock}");
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the first daemon stopped"
    );

    // Traffic, a refusal and its notice; then quiet.
    bridge
        .doorbell(&[
            "send", "--to", "web", "--from", "design", "--kind", "request", "q?",
        ])
        .ok();
    refuse(&bridge, "01NOCORR1");
    bridge.wait_for(PATIENCE, "everything judged, the notice too", |b| {
        notices_naming(b, "01NOCORR1") == 1 && all_judged(b)
    });
    let before = assert_judged_once(&bridge);

    let asked = Instant::now();
    daemon.signal("TERM");
    let code = daemon.wait_exit(Duration::from_secs(10));
    let took = asked.elapsed();
    assert_eq!(code, Some(0), "stderr:\n{}", daemon.stderr.join("\n"));
    assert!(took <= Duration::from_secs(2), "SIGTERM took {took:?}");
    drop(daemon);

    let daemon = Daemon::start(&bridge, &[]);
    // Once the restarted judge has judged a new line, anything it meant to re-emit is out.
    barrier(&bridge);
    let after = assert_judged_once(&bridge);
    assert!(before.keys().all(|k| after.contains_key(k)));
    assert_eq!(after.len(), before.len() + 1, "only the barrier is new");
    assert_eq!(notices(&bridge).len(), 1);

    // Stopped (SIGINT this time) inside a notice window: the stop writes the notice and does
    // not read it back; the next start reads it and writes nothing again.
    let at = refuse(&bridge, "01NOCORR2");
    bridge.wait_for(PATIENCE, "the second refusal journaled", |b| {
        judged_in(b, "web", 0).iter().any(|(o, _)| *o == at)
    });
    let asked = Instant::now();
    stop_with(daemon, "INT");
    assert!(
        asked.elapsed() <= Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(notices_naming(&bridge, "01NOCORR2"), 1);
    let daemon = Daemon::start(&bridge, &[]);
    barrier(&bridge);
    bridge.wait_for(PATIENCE, "everything judged", all_judged);

    // Killed right after a refusal is journaled, before its notice window closed.
    let at = refuse(&bridge, "01NOCORR3");
    bridge.wait_for(PATIENCE, "the third refusal journaled", |b| {
        judged_in(b, "web", 0).iter().any(|(o, _)| *o == at)
    });
    daemon.kill();
    let daemon = Daemon::start(&bridge, &[]);
    bridge.wait_for(PATIENCE, "the third notice judged", |b| {
        notices_naming(b, "01NOCORR3") == 1 && all_judged(b)
    });

    // Killed right after a notice is written, perhaps before it is read back.
    refuse(&bridge, "01NOCORR4");
    bridge.wait_for(PATIENCE, "the fourth notice written", |b| {
        notices_naming(b, "01NOCORR4") == 1
    });
    daemon.kill();
    let daemon = Daemon::start(&bridge, &[]);
    barrier(&bridge);
    bridge.wait_for(PATIENCE, "everything judged", all_judged);

    assert_judged_once(&bridge);
    for id in ["01NOCORR1", "01NOCORR2", "01NOCORR3", "01NOCORR4"] {
        assert_eq!(notices_naming(&bridge, id), 1, "{id}");
    }
    let ids: Vec<String> = notices(&bridge)
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect();
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    let refused = std::fs::read_to_string(bridge.dir().join(".doorbell/refused.jsonl")).unwrap();
    assert_eq!(refused.lines().count(), 4, "{refused}");
    stop(daemon);
}

/// Append to web a response from design that answers nothing (refused, design is told);
/// returns where it starts.
fn refuse(bridge: &Bridge, id: &str) -> u64 {
    let at = std::fs::metadata(bridge.inbox("web")).unwrap().len();
    let bad = line(id, "design", "web", "response", r#","state":"completed""#);
    bridge.append_raw("web", format!("{bad}\n").as_bytes());
    at
}

// ---------------------------------------------------------------------------------------------
// 7. SIGHUP with a broken config.

#[test]
fn sighup_with_a_broken_config_keeps_the_old_one_and_keeps_judging() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = bridge.tmp.path().join("doorbell.toml");
    let config_arg = config.to_str().unwrap().to_owned();
    std::fs::write(&config, "human = \"human\"\n\n[[loop]]\nname = \"ci\"\n").unwrap();
    let mut daemon = Daemon::start(&bridge, &["--config", &config_arg]);
    let from = |id: &str, sender: &str| format!("{}\n", line(id, sender, "web", "note", ""));

    // Broken: an unknown key. Were it applied, the loop `ci` would become `ci2`.
    std::fs::write(
        &config,
        "human = \"human\"\ncolour = \"blue\"\n\n[[loop]]\nname = \"ci2\"\n",
    )
    .unwrap();
    daemon.signal("HUP");
    let said = daemon.expect_stderr("config not reloaded", Duration::from_secs(10));
    // One log line names the key and the file: journald keeps lines apart.
    assert!(
        said.contains("colour") && said.contains(&config_arg),
        "{said}\nall of stderr:\n{}",
        daemon.stderr.join("\n")
    );
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon stopped"
    );
    let id = bridge
        .send("design", "web", "still there?")
        .trim()
        .to_owned();
    bridge.append_raw("web", from("01FROMCI1", "ci").as_bytes());
    bridge.append_raw("web", from("01FROMCI2A", "ci2").as_bytes());
    bridge.wait_for(PATIENCE, "the three lines", |b| {
        judged_in(b, "web", 0).len() == 3
    });
    assert_eq!(verdict_of(&bridge, "web", &id), ("a".into(), None));
    assert_eq!(verdict_of(&bridge, "web", "01FROMCI1"), ("a".into(), None));
    assert_eq!(
        verdict_of(&bridge, "web", "01FROMCI2A"),
        ("r".into(), Some("unknown-sender".into()))
    );
    assert_eq!(bridge.read_ids("web"), [id.as_str(), "01FROMCI1"]);

    // Fixed: the reload applies to lines judged from now on; earlier verdicts stand.
    std::fs::write(&config, "human = \"human\"\n\n[[loop]]\nname = \"ci2\"\n").unwrap();
    daemon.signal("HUP");
    daemon.expect_stderr("config reloaded", Duration::from_secs(10));
    bridge.append_raw("web", from("01FROMCI2B", "ci2").as_bytes());
    bridge.append_raw("web", from("01FROMCI1B", "ci").as_bytes());
    bridge.wait_for(PATIENCE, "the two new lines", |b| {
        judged_in(b, "web", 0).len() == 5
    });
    assert_eq!(verdict_of(&bridge, "web", "01FROMCI2B"), ("a".into(), None));
    assert_eq!(
        verdict_of(&bridge, "web", "01FROMCI1B"),
        ("r".into(), Some("unknown-sender".into()))
    );
    assert_eq!(verdict_of(&bridge, "web", "01FROMCI1"), ("a".into(), None));
    assert_eq!(bridge.read_ids("web"), ["01FROMCI2B"]);
    assert_judged_once(&bridge);
    stop(daemon);
}

/// Found by the model-based torture (tests/model.rs): with a small `max_line_bytes`, the
/// judge refused its own refusal notice as `line-too-long` when it read it back. The sender was
/// never told, and the notice's intent stayed open, so every restart wrote it once more.
#[test]
fn a_notice_longer_than_max_line_bytes_is_delivered_once_across_restarts() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = bridge.tmp.path().join("doorbell.toml");
    let config_arg = config.to_str().unwrap().to_owned();
    std::fs::write(&config, "max_line_bytes = 300\n").unwrap();
    let daemon = Daemon::start(&bridge, &["--config", &config_arg]);
    refuse(&bridge, "01NOCORRELATION");
    bridge.wait_for(PATIENCE, "the notice written and judged", |b| {
        notices_naming(b, "01NOCORRELATION") == 1 && all_judged(b)
    });
    let notice = &bridge.lines("design")[0];
    assert!(notice.len() > 300, "the notice is {} bytes", notice.len());
    assert_eq!(judged_in(&bridge, "design", 0), [(0, "a".to_owned())]);
    assert_eq!(
        bridge.read_ids("design").len(),
        1,
        "the sender reads its notice"
    );
    stop(daemon);
    for _ in 0..2 {
        stop(Daemon::start(&bridge, &["--config", &config_arg]));
    }
    let daemon = Daemon::start(&bridge, &["--config", &config_arg]);
    barrier(&bridge);
    stop(daemon);
    assert_eq!(
        bridge.lines("design").len(),
        1,
        "the notice was written again"
    );
    assert_eq!(notices_naming(&bridge, "01NOCORRELATION"), 1);
    assert_judged_once(&bridge);
}

/// Found by the model-based torture's long run: the judge's own notice, over a small
/// `max_line_bytes`, copied into a new file of its inbox (an edit before it, a restore) was
/// refused as `line-too-long`: only a notice whose intent was still open was read back
/// whole. A line under the judge's seal is its own wherever it turns up: the copy of the
/// notice, unread by its agent, is shown again from the new file as every unread copy is,
/// never refused.
#[test]
fn a_copy_of_a_notice_longer_than_max_line_bytes_in_a_new_file_is_no_refusal() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = bridge.tmp.path().join("doorbell.toml");
    let config_arg = config.to_str().unwrap().to_owned();
    std::fs::write(&config, "max_line_bytes = 300\n").unwrap();
    let once = || {
        bridge
            .doorbell(&["--config", &config_arg, "daemon", "--once"])
            .ok();
    };
    refuse(&bridge, "01NOCORRELATION");
    once();
    let notice = bridge.lines("design")[0].clone();
    assert!(notice.len() > 300, "the notice is {} bytes", notice.len());
    assert_eq!(judged_in(&bridge, "design", 0), [(0, "a".to_owned())]);
    // The inbox rewritten with a line before the notice: a new file, the notice copied in.
    let first = line("01BEFORENOTICE", "web", "design", "note", "");
    let mut rewritten = format!("{first}\n").into_bytes();
    rewritten.extend_from_slice(&notice);
    rewritten.push(b'\n');
    let temp = bridge.dir().join("design-inbox.jsonl.new");
    std::fs::write(&temp, &rewritten).unwrap();
    std::fs::rename(&temp, bridge.inbox("design")).unwrap();
    once();
    let verdicts = judged_in(&bridge, "design", 1);
    assert_eq!(
        verdicts,
        [
            (0, "a".to_owned()),
            (first.len() as u64 + 1, "a".to_owned())
        ],
        "{:?}",
        judged(&bridge)
    );
    assert_eq!(notices_naming(&bridge, "01NOCORRELATION"), 1);
    assert_judged_once(&bridge);
}

/// A notice exactly one byte longer than `max_line_bytes` reaches the judge as a complete
/// line (the reader leaves room for a `\r`), not as an over-long one: the judge's rule for
/// its own lines must hold there too, or it refuses its own notice as `line-too-long`.
#[test]
fn a_notice_one_byte_over_max_line_bytes_is_no_refusal() {
    let notice_len = {
        let bridge = Bridge::with_agents(&["web", "design", "human"]);
        refuse(&bridge, "01NOCORRELATION");
        bridge.doorbell(&["daemon", "--once"]).ok();
        bridge.lines("design")[0].len()
    };
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = bridge.tmp.path().join("doorbell.toml");
    std::fs::write(&config, format!("max_line_bytes = {}\n", notice_len - 1)).unwrap();
    refuse(&bridge, "01NOCORRELATION");
    bridge
        .doorbell(&["--config", config.to_str().unwrap(), "daemon", "--once"])
        .ok();
    assert_eq!(bridge.lines("design")[0].len(), notice_len);
    assert_eq!(
        judged_in(&bridge, "design", 0),
        [(0, "a".to_owned())],
        "{:?}",
        judged(&bridge)
    );
    assert_eq!(notices_naming(&bridge, "01NOCORRELATION"), 1);
    assert_judged_once(&bridge);
}

/// An inbox deleted while the daemon runs is no station from then on (the stations are the
/// inbox files), as for a catch-up after it and for the senders: a line from it is refused
/// `unknown-sender`. Before, the running daemon kept it a station until a reload, accepted
/// its lines and put debts on others that nobody could answer.
#[test]
fn an_inbox_deleted_while_the_daemon_runs_is_no_station_from_then_on() {
    let bridge = Bridge::with_agents(&["web", "design", "human", "data"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    bridge.append_raw("data", note("01BEFORE", "data").as_bytes());
    bridge.wait_for(PATIENCE, "the note to data judged", |b| {
        judged_in(b, "data", 0).len() == 1
    });
    std::fs::remove_file(bridge.inbox("data")).unwrap();
    daemon.expect_stderr("inbox was replaced or deleted", PATIENCE);
    let from_data = line("01FROMGONE", "data", "web", "request", "");
    bridge.append_raw("web", format!("{from_data}\n").as_bytes());
    bridge.wait_for(PATIENCE, "the line from data judged", |b| {
        !judged_in(b, "web", 0).is_empty()
    });
    assert_eq!(
        verdict_of(&bridge, "web", "01FROMGONE"),
        ("r".to_owned(), Some("unknown-sender".to_owned())),
        "{:?}",
        judged(&bridge)
    );
    assert!(!bridge.doorbell(&["debts"]).ok().contains("01FROMGONE"));
}

// ---------------------------------------------------------------------------------------------
// 8. The hook.

#[test]
fn the_hook_runs_with_a_clean_environment_and_no_message_text() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let out = bridge.tmp.path().join("hook.env");
    let config = bridge.tmp.path().join("doorbell.toml");
    let script = format!(
        "env > '{0}.tmp' && mv '{0}.tmp' '{0}'",
        out.to_str().unwrap()
    );
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"web\"\nhook = [\"sh\", \"-c\", {}]\n",
            serde_json::to_string(&script).unwrap()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&bridge, &["--config", config.to_str().unwrap()]);
    let mut ids = Vec::new();
    for i in 0..5 {
        let id = bridge
            .send("design", "web", &format!("SECRETTEXT{i} do rm -rf"))
            .trim()
            .to_owned();
        ids.push(id);
    }
    wait_for_file(&out, PATIENCE);
    let env = std::fs::read_to_string(&out).unwrap();
    let vars: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
    assert_eq!(vars.get("DOORBELL_AGENT"), Some(&"web"), "{env}");
    let count: u64 = vars["DOORBELL_COUNT"].parse().unwrap();
    assert!((1..=5).contains(&count), "{env}");
    assert!(
        ids.iter()
            .any(|id| vars.get("DOORBELL_ID") == Some(&id.as_str())),
        "{env}"
    );
    assert_eq!(vars.get("DOORBELL_FROM"), Some(&"design"), "{env}");
    assert_eq!(vars.get("DOORBELL_KIND"), Some(&"note"), "{env}");
    let home = bridge.tmp.path().join("home");
    assert_eq!(vars.get("HOME").map(PathBuf::from), Some(home), "{env}");
    assert!(vars.contains_key("PATH"), "{env}");
    assert!(!env.contains("SECRETTEXT"), "message text leaked: {env}");
    let allowed = ["PATH", "HOME", "PWD", "SHLVL", "_", "OLDPWD"];
    let foreign: Vec<&&str> = vars
        .keys()
        .filter(|k| !allowed.contains(k) && !k.starts_with("DOORBELL_"))
        .collect();
    assert!(
        foreign.is_empty(),
        "unexpected variables {foreign:?}:\n{env}"
    );
    // The daemon's own environment had more (the bridge folder, the locale, XDG folders).
    assert!(
        !vars.contains_key("DOORBELL_DIR") && !vars.contains_key("LC_ALL"),
        "{env}"
    );
    stop(daemon);
}

/// `watch` wakes on an inbox write only when no judge holds the lock; then it judges the line
/// itself. Checked across a daemon's life: judged by the daemon, then by `watch` once the
/// daemon is gone.
#[test]
fn a_hook_that_runs_too_long_is_killed_with_everything_it_started() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let pids = bridge.tmp.path().join("pids");
    // The hook starts a grandchild that would outlive it, says both pids, then hangs.
    let script = format!(
        "sleep 600 & echo $$ $! > '{0}.tmp' && mv '{0}.tmp' '{0}'; sleep 600",
        pids.display()
    );
    bridge.config(&format!(
        "[[agent]]\nname = \"web\"\nhook = [\"sh\", \"-c\", {}]\n",
        serde_json::to_string(&script).unwrap()
    ));
    let mut daemon = Daemon::start(&bridge, &[]);
    bridge.send("design", "web", "ring");
    wait_for_file(&pids, PATIENCE);
    let text = std::fs::read_to_string(&pids).unwrap();
    let alive = |pid: &str| Path::new(&format!("/proc/{pid}")).exists();
    let (hook, grandchild) = text.trim().split_once(' ').unwrap();
    assert!(alive(hook) && alive(grandchild), "{text}");
    daemon.expect_stderr("killed, with its process group", Duration::from_secs(30));
    // Killed: gone once reaped (the hook by the daemon, the grandchild by init).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(grandchild)
        && std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the grandchild outlived the hook's kill"
        );
        std::thread::yield_now();
    }
    daemon.kill();
}

#[test]
fn watch_judges_lines_itself_once_the_daemon_stops() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start(&bridge, "web");
    let note = |id: &str| format!("{}\n", line(id, "design", "web", "note", ""));
    // `watch` is watching once it has printed the backlog: wait for the first line to come
    // through the daemon before stopping it.
    bridge.append_raw("web", note("01WATCHEDBYDAEMON").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01WATCHEDBYDAEMON");
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(PATIENCE), Some(0));
    bridge.append_raw("web", note("01WATCHEDALONE").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01WATCHEDALONE");
    assert_eq!(
        bridge.verdicts().len(),
        2,
        "each line judged once: {:?}",
        bridge.verdicts()
    );
}

/// A write that lands while a short-lived judge holds the lock (a command catching up that
/// has already passed this inbox) is judged by nobody but the waiter: `watch` must look again
/// once that judge lets go, and print the line.
#[test]
fn watch_prints_a_line_written_while_a_passing_judge_held_the_lock() {
    use std::os::unix::fs::MetadataExt;
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let watch = Watch::start(&bridge, "web");
    let note = |id: &str| format!("{}\n", line(id, "design", "web", "note", ""));
    // Once a first line comes through, watch is watching (it judges it itself: no daemon).
    bridge.append_raw("web", note("01BEFORETHEHOLD").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01BEFORETHEHOLD");

    let lock_path = bridge.dir().join(".doorbell/lock");
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lock_path)
        .unwrap();
    lock.lock().unwrap();
    bridge.append_raw("web", note("01DURINGTHEHOLD").as_bytes());
    // watch saw the write while the lock was held, and now waits for the lock: its request
    // shows as a blocked one in /proc/locks.
    let ino = std::fs::metadata(&lock_path).unwrap().ino();
    crate::util::wait_in_proc(
        PATIENCE,
        "watch to wait for the lock in /proc/locks",
        || {
            std::fs::read_to_string("/proc/locks")
                .unwrap()
                .lines()
                .any(|l| l.contains("->") && l.contains(&format!(":{ino} ")))
        },
    );
    drop(lock);
    assert_eq!(watch.next(PATIENCE), "01DURINGTHEHOLD");
}

/// Lines a strict parser refuses as `bad-json`, and a line over the length limit, still say
/// plainly who sent them: each is refused, and its sender is told.
#[test]
fn a_sender_is_told_of_a_bad_json_or_too_long_line_whose_sender_is_readable() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let lines: Vec<(&str, String)> = vec![
        (
            "01DUPLICATEIDKEY",
            r#"{"id":"01DUPLICATEIDKEY","id":"01DUPLICATEIDKEY","from":"design","to":"web","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{"role":"agent","parts":[{"type":"text","text":"x"}]}}"#.to_owned(),
        ),
        (
            "01BYTEORDERMARK",
            format!("\u{feff}{}", crate::util::line("01BYTEORDERMARK", "design", "web", "note", "")),
        ),
        (
            "01RAWTABINSTRING",
            crate::util::line("01RAWTABINSTRING", "design", "web", "note", "").replace(" from ", "\tfrom "),
        ),
        (
            "01TWOOBJECTSGLUED",
            format!(
                "{}{}",
                crate::util::line("01TWOOBJECTSGLUED", "design", "web", "note", ""),
                crate::util::line("01THESECONDOBJECT", "design", "web", "note", "")
            ),
        ),
        (
            "01FARTOOLONGLINE",
            crate::util::line("01FARTOOLONGLINE", "design", "web", "note", "")
                .replace(" from design", &"y".repeat(2 << 20)),
        ),
    ];
    for (_, line) in &lines {
        bridge.append_raw("web", format!("{line}\n").as_bytes());
    }
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    let told: String = bridge
        .lines("design")
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    for (id, _) in &lines {
        assert_eq!(verdict_of(&bridge, "web", id).0, "r", "{id}");
        assert!(told.contains(id), "design was not told of {id}: {told}");
    }
}

/// A sender that repeats its mistake is told of the first refusal at once, then of the next
/// ones together, one notice for the run, at least 5 s after the last: its inbox is not
/// buried under one notice per line.
#[test]
fn a_sender_that_repeats_a_mistake_gets_one_notice_for_the_run() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let bad = |n: usize| {
        crate::util::line(
            &format!("01REPEATEDMISTAKE{n}"),
            "design",
            "web",
            "gossip",
            "",
        )
    };
    bridge.append_raw("web", format!("{}\n", bad(0)).as_bytes());
    bridge.wait_for(PATIENCE, "the first notice", |b| notices(b).len() == 1);
    for n in 1..5 {
        bridge.append_raw("web", format!("{}\n", bad(n)).as_bytes());
        barrier(&bridge);
    }
    assert_eq!(notices(&bridge).len(), 1, "told again within the spacing");
    // Another sender's mistake meanwhile is told at once, not with design's next notice.
    let other = crate::util::line("01ANOTHERSENDER", "human", "web", "gossip", "");
    bridge.append_raw("web", format!("{other}\n").as_bytes());
    bridge.wait_for(PATIENCE, "human's notice", |b| notices(b).len() == 2);
    assert_eq!(notices_naming(&bridge, "01ANOTHERSENDER"), 1);
    assert_eq!(
        notices_naming(&bridge, "01REPEATEDMISTAKE1"),
        0,
        "design's run still waits"
    );
    bridge.wait_for(PATIENCE, "the second notice", |b| notices(b).len() == 3);
    for n in 1..5 {
        assert_eq!(
            notices_naming(&bridge, &format!("01REPEATEDMISTAKE{n}")),
            1,
            "{n}"
        );
    }
    let told: Vec<i64> = notices(&bridge)
        .iter()
        .filter(|n| n["to"] == "design")
        .map(|n| {
            let at = n["createdAt"].as_str().unwrap();
            chrono::DateTime::parse_from_rfc3339(at)
                .unwrap()
                .timestamp_millis()
        })
        .collect();
    assert!(told[1] - told[0] >= 5000 - 100, "{told:?}");
    daemon.kill();
}

/// A reload that finds the default config file gone (moved away, or replaced by an editor a
/// moment later) keeps the config in use rather than falling back to the defaults silently.
#[test]
fn a_reload_with_the_config_file_gone_keeps_the_old_one() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.config("[[loop]]\nname = \"ci\"\n");
    let mut daemon = Daemon::start(&bridge, &[]);
    let config = bridge
        .tmp
        .path()
        .join("home/.config/doorbell/doorbell.toml");
    std::fs::rename(&config, config.with_extension("toml.moved")).unwrap();
    daemon.signal("HUP");
    daemon.expect_stderr("config not reloaded", Duration::from_secs(10));
    // Back, naming another folder: said, and this one judged on.
    let elsewhere = bridge.tmp.path().join("elsewhere");
    std::fs::write(
        &config,
        format!("dir = {elsewhere:?}\n\n[[loop]]\nname = \"ci\"\n"),
    )
    .unwrap();
    daemon.signal("HUP");
    daemon.expect_stderr("the config's 'dir' changed", Duration::from_secs(10));
    bridge.append_raw(
        "web",
        format!("{}\n", line("01FROMCI", "ci", "web", "note", "")).as_bytes(),
    );
    bridge.wait_for(PATIENCE, "the loop's note", |b| {
        judged_in(b, "web", 0).len() == 1
    });
    assert_eq!(verdict_of(&bridge, "web", "01FROMCI"), ("a".into(), None));
    stop(daemon);
}

/// A SIGHUP while the daemon starts (here while it rebuilds its index from a long journal;
/// `systemctl reload` right after a start) is a reload once it is ready. The signal's default
/// action ended the daemon, and systemd does not restart one a SIGHUP ended.
#[test]
fn a_sighup_while_the_daemon_starts_reloads_once_it_is_ready() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut lines = String::new();
    for n in 0..200_000 {
        lines.push_str(&line(&format!("01HUP{n:07}"), "design", "web", "note", ""));
        lines.push('\n');
    }
    bridge.append_raw("web", lines.as_bytes());
    bridge.doorbell(&["daemon", "--once"]).ok();
    for name in ["index.db", "index.db-wal", "index.db-shm"] {
        let _ = std::fs::remove_file(bridge.dir().join(".doorbell").join(name));
    }
    let mut daemon = Daemon::spawn_saying(
        bridge.command(&["daemon"]),
        "the index is missing",
        Duration::from_secs(30),
    );
    daemon.signal("HUP");
    daemon.expect_stderr("doorbell: judging", Duration::from_secs(60));
    daemon.expect_stderr("config reloaded", Duration::from_secs(10));
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon ended: {:?}",
        daemon.stderr_so_far()
    );
}
