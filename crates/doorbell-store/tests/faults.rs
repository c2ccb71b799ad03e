//! Disk faults through the store's seam: a full disk (`ENOSPC`) and a read-only file system
//! (`EROFS`), starting at every kind of point (before anything, inside a journal record,
//! between records, in the checkpoint). Whatever the point: no panic, a clear error, no
//! corrupt journal or checkpoint, and once writes work again a reload judges every line
//! exactly once.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::fault::{self, Fault};
use doorbell_store::journal::{journal_path, Snapshot};
use doorbell_store::{Bridge, BridgeLock, Config, Error, Judge};

const AGENTS: [&str; 3] = ["web", "design", "human"];

fn note(id: &str, from: &str, to: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"a few words to make the record longer"}}]}}}}"#
    )
}

struct Setup {
    _dir: tempfile::TempDir,
    bridge: Bridge,
    judge: Judge,
    /// Lines appended, per inbox: their offsets.
    lines: BTreeMap<String, Vec<u64>>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in AGENTS {
        bridge.add_agent(agent).unwrap();
    }
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let judge = Judge::open(bridge.clone(), lock).unwrap();
    Setup {
        _dir: dir,
        bridge,
        judge,
        lines: BTreeMap::new(),
    }
}

impl Setup {
    /// Append `n` notes to every inbox, plus a refused line (a bad JSON fragment) to each.
    fn append(&mut self, tag: &str, n: usize) {
        for to in AGENTS {
            let path = self.bridge.inbox_path(to).unwrap();
            for i in 0..n {
                let from = if to == "web" { "design" } else { "web" };
                let offset =
                    append_line(&path, note(&format!("01{tag}{to}{i}"), from, to).as_bytes())
                        .unwrap();
                self.lines.entry(to.to_owned()).or_default().push(offset);
            }
            let offset = append_line(&path, br#"{"id":"#).unwrap();
            self.lines.entry(to.to_owned()).or_default().push(offset);
        }
    }

    /// Every verdict in the journal, per inbox and offset (current generation only: nothing
    /// here truncates or replaces).
    fn verdicts(&self) -> BTreeMap<(String, u64), usize> {
        let text = std::fs::read_to_string(journal_path(&self.bridge)).unwrap();
        let mut seen = BTreeMap::new();
        for line in text.lines() {
            let record: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a journal line that does not parse ({e}): {line}"));
            if ["a", "d", "r"].contains(&record["v"].as_str().unwrap()) {
                let key = (
                    record["in"].as_str().unwrap().to_owned(),
                    record["o"].as_u64().unwrap(),
                );
                *seen.entry(key).or_insert(0) += 1;
            }
        }
        seen
    }

    /// The journal and the checkpoint load; every line has exactly one verdict.
    fn assert_each_line_judged_once(&self) {
        let snapshot = Snapshot::load(&self.bridge).expect("checkpoint and journal load");
        let verdicts = self.verdicts();
        for (inbox, offsets) in &self.lines {
            for offset in offsets {
                assert_eq!(
                    verdicts.get(&(inbox.clone(), *offset)),
                    Some(&1),
                    "{inbox} at {offset}: {verdicts:?}"
                );
            }
            assert_eq!(
                snapshot.inboxes[inbox].judged_to,
                std::fs::metadata(self.bridge.inbox_path(inbox).unwrap())
                    .unwrap()
                    .len(),
                "{inbox} judged to its end"
            );
        }
        let judged: usize = self.lines.values().map(Vec::len).sum();
        assert_eq!(
            verdicts.len(),
            judged,
            "no verdict for anything but these lines"
        );
    }
}

fn is_fault(error: &Error, fault: Fault) -> bool {
    let code = match fault {
        Fault::NoSpace => libc::ENOSPC,
        Fault::ReadOnly => libc::EROFS,
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.raw_os_error() == Some(code);
        }
        source = e.source();
    }
    false
}

fn no_litter(dir: &Path) {
    for entry in std::fs::read_dir(dir.join(".doorbell")).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(
            !name.to_string_lossy().contains(".tmp."),
            "a temp file was left: {}",
            name.to_string_lossy()
        );
    }
}

/// A catch-up that hits the fault after `budget` bytes, then recovery.
fn catch_up_through(fault: Fault, budget: u64) {
    let mut s = setup();
    s.append("A", 5);
    s.judge.catch_up(Utc::now()).unwrap();
    s.judge.checkpoint().unwrap();
    s.append("B", 40);
    fault::inject(s.bridge.dir(), fault, budget);
    let failed = s.judge.catch_up(Utc::now());
    let error = failed.expect_err("40 lines need more than the budget");
    assert!(is_fault(&error, fault), "{error}");
    assert!(
        !error.to_string().is_empty() && error.to_string().contains(".doorbell"),
        "the error names the file: {error}"
    );
    // Until writes work, a reload fails cleanly (read-only) or works (full disk: nothing is
    // written by it) and the next catch-up fails again.
    let checkpoint = s.judge.checkpoint();
    assert!(checkpoint.is_err(), "a checkpoint cannot be written either");
    fault::clear(s.bridge.dir());
    no_litter(s.bridge.dir());
    // What is on disk is consistent as it stands: it loads.
    Snapshot::load(&s.bridge).expect("the journal and checkpoint load after the fault");
    s.judge.reload().expect("reload once writes work");
    s.judge.catch_up(Utc::now()).unwrap();
    s.judge.checkpoint().unwrap();
    s.assert_each_line_judged_once();
    // A fresh judge finds nothing left to do.
    let bridge = s.bridge.clone();
    drop(s.judge);
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let mut again = Judge::open(bridge, lock).unwrap();
    assert_eq!(again.catch_up(Utc::now()).unwrap().judged(), 0);
}

#[test]
fn a_full_disk_at_any_point_of_a_catch_up_loses_and_repeats_nothing() {
    // 0: nothing gets through; 1 and 150: inside the first record; the rest: between and
    // inside later records.
    for budget in [0, 1, 150, 700, 2_000, 5_000, 11_111] {
        catch_up_through(Fault::NoSpace, budget);
    }
}

#[test]
fn a_read_only_file_system_during_a_catch_up_loses_and_repeats_nothing() {
    catch_up_through(Fault::ReadOnly, 0);
}

#[test]
fn a_failed_checkpoint_leaves_the_last_good_one() {
    let mut s = setup();
    s.append("A", 10);
    s.judge.catch_up(Utc::now()).unwrap();
    s.judge.checkpoint().unwrap();
    let index = s.bridge.dir().join(".doorbell/index.db");
    let covered = || {
        doorbell_store::index::Index::open_read(&index)
            .unwrap()
            .expect("the index")
            .open_state()
            .unwrap()
            .journal_len
    };
    let saved = covered();
    s.append("B", 10);
    s.judge.sweep_all(Utc::now()).unwrap();
    for (fault, budget) in [
        (Fault::NoSpace, 0),
        (Fault::NoSpace, 300),
        (Fault::ReadOnly, 0),
    ] {
        fault::inject(s.bridge.dir(), fault, budget);
        let error = s
            .judge
            .checkpoint()
            .expect_err("the checkpoint cannot be written");
        assert!(is_fault(&error, fault), "{error}");
        fault::clear(s.bridge.dir());
        assert_eq!(covered(), saved, "the last good save is untouched");
        no_litter(s.bridge.dir());
        s.judge.reload().unwrap();
    }
    s.judge.catch_up(Utc::now()).unwrap();
    s.judge.checkpoint().unwrap();
    s.assert_each_line_judged_once();
}

#[test]
fn a_notice_that_cannot_be_written_is_written_once_later() {
    let mut s = setup();
    // Lines misaddressed by stations: each sender is owed a notice.
    for (inbox, from, to) in [("human", "design", "web"), ("web", "design", "human")] {
        let path = s.bridge.inbox_path(inbox).unwrap();
        append_line(&path, note(&format!("01MIS{inbox}"), from, to).as_bytes()).unwrap();
    }
    // The inboxes cannot take a line; the journal (in .doorbell) still takes the intents.
    for agent in AGENTS {
        fault::inject(&s.bridge.inbox_path(agent).unwrap(), Fault::ReadOnly, 0);
    }
    let stats = s.judge.catch_up(Utc::now()).unwrap();
    assert_eq!(stats.notices, 0, "no notice could be written");
    for agent in AGENTS {
        fault::clear(&s.bridge.inbox_path(agent).unwrap());
    }
    let stats = s.judge.catch_up(Utc::now()).unwrap();
    assert!(stats.notices > 0, "the notices are written now");
    let again = s.judge.catch_up(Utc::now()).unwrap();
    assert_eq!(again.notices, 0, "and only once");
    s.judge.checkpoint().unwrap();
    let notices: usize = AGENTS
        .iter()
        .map(|a| {
            std::fs::read_to_string(s.bridge.inbox_path(a).unwrap())
                .unwrap()
                .matches(r#""id":"bridge:refused:"#)
                .count()
        })
        .sum();
    assert_eq!(notices, stats.notices as usize);
}

#[test]
fn an_append_the_disk_cuts_short_leaves_the_inbox_as_it_was() {
    let mut s = setup();
    let path = s.bridge.inbox_path("web").unwrap();
    append_line(&path, note("01BEFORE", "design", "web").as_bytes()).unwrap();
    let before = std::fs::read(&path).unwrap();
    // The disk fills 40 bytes into the next line.
    fault::inject(&path, Fault::NoSpace, 40);
    let error = append_line(&path, note("01RETRIED", "design", "web").as_bytes()).unwrap_err();
    assert!(is_fault(&error, Fault::NoSpace), "{error}");
    fault::clear(&path);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "a torn line was left"
    );
    // The sender tries again: one line, accepted, and no refusal for its sender.
    append_line(&path, note("01RETRIED", "design", "web").as_bytes()).unwrap();
    let stats = s.judge.catch_up(Utc::now()).unwrap();
    assert_eq!((stats.accepted, stats.refused, stats.notices), (2, 0, 0));
}

/// `status`'s warnings about the file system holding the judge's state.
fn room_warnings(view: &mut doorbell_store::View) -> Vec<String> {
    doorbell_store::board::status(view)
        .unwrap()
        .warnings
        .into_iter()
        .filter(|w| {
            w.contains("the judge journals every line") || w.contains("the judge cannot journal")
        })
        .collect()
}

/// With no judge running, `status` catches up first: on a full or read-only disk that
/// catch-up cannot write, and `status` shows what was journaled, saying why nothing new is.
#[test]
fn status_says_when_the_judges_disk_is_full_or_read_only() {
    let mut s = setup();
    s.append("ROOM", 2);
    s.judge.catch_up(Utc::now()).unwrap();
    s.judge.checkpoint().unwrap();
    drop(s.judge);
    let bridge = s.bridge;
    let dir = bridge.dir().to_path_buf();
    let (mut view, stopped) = doorbell_store::View::open_or_as_journaled(&bridge).unwrap();
    assert!(stopped.is_none());
    assert_eq!(room_warnings(&mut view), Vec::<String>::new());
    drop(view);

    let path = bridge.inbox_path("web").unwrap();
    append_line(&path, note("01AFTERFULL", "design", "web").as_bytes()).unwrap();
    for (fault, said) in [
        (Fault::NoSpace, ".doorbell has 0 KiB free"),
        (Fault::ReadOnly, ".doorbell is read-only"),
    ] {
        fault::inject(&dir, fault, 0);
        let opened = doorbell_store::View::open_or_as_journaled(&bridge);
        let (mut view, stopped) = opened.unwrap();
        let warnings = room_warnings(&mut view);
        let web = doorbell_store::board::status(&mut view)
            .unwrap()
            .agents
            .into_iter()
            .find(|a| a.name == "web")
            .unwrap();
        fault::clear(&dir);
        let stopped = stopped.expect("the catch-up could not write");
        assert!(stopped.is_no_room(), "{stopped}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains(said), "{warnings:?}");
        // What was journaled is shown; the line written since is not judged yet.
        assert_eq!(web.unread, 2, "{web:?}");
    }

    // Room again: the line is judged, and nothing is said of the disk.
    let (mut view, stopped) = doorbell_store::View::open_or_as_journaled(&bridge).unwrap();
    assert!(stopped.is_none());
    assert_eq!(room_warnings(&mut view), Vec::<String>::new());
    let web = doorbell_store::board::status(&mut view).unwrap().agents;
    assert_eq!(web.iter().find(|a| a.name == "web").unwrap().unread, 3);
}
