//! What a stopping judge owes files it alone can still reach.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::index::index_path;
use doorbell_store::{Bridge, BridgeLock, Config, Judge};

fn note(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"design","to":"web","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"hi"}}]}}}}"#
    )
}

/// A bridge of web, design and human, its judge, and web's inbox's path.
fn judged_empty() -> (tempfile::TempDir, Bridge, Judge, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design", "human"] {
        bridge.add_agent(agent).unwrap();
    }
    let path = bridge.inbox_path("web").unwrap();
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let judge = Judge::open(bridge.clone(), lock).unwrap();
    (dir, bridge, judge, path)
}

/// A bridge whose judge has accepted one line in `web`'s inbox (whose path comes back).
fn judged_once() -> (tempfile::TempDir, Judge, PathBuf) {
    let (dir, _, mut judge, path) = judged_empty();
    append_line(&path, note("01OLDFIRST").as_bytes()).unwrap();
    assert_eq!(judge.catch_up(Utc::now()).unwrap().accepted, 1);
    (dir, judge, path)
}

/// A line the judge has not read, appended to the file now at `path`.
fn late_line(path: &Path) {
    let mut old = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    writeln!(old, "{}", note("01OLDLATE")).unwrap();
}

/// A new file, with one line, renamed over the inbox at `path`.
fn replace(dir: &Path, path: &Path) {
    let new = dir.join("web-inbox.new");
    std::fs::write(&new, format!("{}\n", note("01NEWFIRST"))).unwrap();
    std::fs::rename(&new, path).unwrap();
}

/// An inbox replaced (renamed over) while the judge was stopping: the old file's last lines
/// were never read, and after this process nobody could read them. `drain_replaced` reads
/// them even though the stop interrupted the sweep.
#[test]
fn a_stopping_judge_drains_a_replaced_inbox_it_had_not_finished() {
    let (dir, mut judge, path) = judged_once();

    // A late line in the old file, then a new file renamed over it; the stop comes before
    // any sweep.
    late_line(&path);
    replace(dir.path(), &path);
    judge.interrupt_flag().store(true, Ordering::Relaxed);

    let stats = judge.drain_replaced(Utc::now()).unwrap();
    assert_eq!(
        stats.accepted, 2,
        "the old file's late line and the new file's line"
    );
    assert!(judge.snapshot().ledger.is_claimed("01OLDLATE"));
    assert!(judge.snapshot().ledger.is_claimed("01NEWFIRST"));
    assert!(
        judge.interrupt_flag().load(Ordering::Relaxed),
        "the stop still stands"
    );
    // Nothing was replaced since: nothing more to do.
    assert_eq!(judge.drain_replaced(Utc::now()).unwrap().judged(), 0);
}

/// Deleted rather than replaced: a deleted inbox is no longer listed, and its old file's late
/// line must still be read before the judge lets go of it.
#[test]
fn a_stopping_judge_drains_a_deleted_inbox() {
    let (_dir, mut judge, path) = judged_once();
    late_line(&path);
    std::fs::remove_file(&path).unwrap();
    judge.interrupt_flag().store(true, Ordering::Relaxed);
    judge.drain_replaced(Utc::now()).unwrap();
    assert!(judge.snapshot().ledger.is_claimed("01OLDLATE"));
}

/// The sweep that would drain a replaced inbox is interrupted by the stop: the old file must
/// not be forgotten, so the stopping judge still drains it.
#[test]
fn an_interrupted_drain_is_finished_by_the_stopping_judge() {
    let (dir, mut judge, path) = judged_once();
    late_line(&path);
    replace(dir.path(), &path);
    judge.interrupt_flag().store(true, Ordering::Relaxed);
    // The sweep the rename's event starts, interrupted by the stop.
    assert!(judge.sweep(&["web".to_owned()], Utc::now()).is_err());
    judge.drain_replaced(Utc::now()).unwrap();
    assert!(judge.snapshot().ledger.is_claimed("01OLDLATE"));
    assert!(judge.snapshot().ledger.is_claimed("01NEWFIRST"));
}

/// A sweep stopped while the first line of an inbox was held (a response whose request was
/// not read yet) journaled verdicts past it and no mark. A different file that then takes
/// the inbox's path is a new generation: the verdicts of the old file's lines are not its
/// lines'.
#[test]
fn a_new_file_after_a_sweep_stopped_behind_a_held_first_line_is_judged_whole() {
    use doorbell_store::journal::{journal_path, JournalWriter, Record, Word};

    let (dir, bridge, mut judge, path) = judged_empty();
    judge.catch_up(Utc::now()).unwrap();
    drop(judge);

    // What the stopped sweep left: the old file's second line refused, nothing before it.
    let first = note("01NEWFIRST");
    let second = note("01NEWSECOND");
    let at = first.len() as u64 + 1;
    let journal = journal_path(&bridge);
    let len = std::fs::metadata(&journal).unwrap().len();
    let mut writer = JournalWriter::open(&journal, len).unwrap();
    let mut record = Record::new("web", 0, at, Word::Refused, Utc::now().timestamp_millis());
    record.span = second.len() as u64 + 1;
    record.reason = Some("misaddressed".to_owned());
    record.detail = Some("a line of the old file".to_owned());
    writer.append(&record).unwrap();
    writer.sync().unwrap();
    drop(writer);

    // Another file at the inbox's path, whose second line is at that very offset.
    let new = dir.path().join("web-inbox.new");
    std::fs::write(&new, format!("{first}\n{second}\n")).unwrap();
    std::fs::rename(&new, &path).unwrap();

    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let stats = doorbell_store::judge::once(bridge.clone(), lock).unwrap();
    assert_eq!(stats.accepted, 2, "{stats:?}");
    let view = doorbell_store::View::open(&bridge).unwrap();
    assert!(view.message("01NEWSECOND").unwrap().is_some());
}

/// A judge dropped while its saving thread has a batch in flight (a long catch-up that failed
/// after it handed a batch over, `judge::once` or the daemon's start-up): the next judge, which
/// may take the bridge the moment it is let go, must find nothing of the old one still writing
/// the index. Here the save is kept in flight by a connection that holds the index's write
/// lock until the bridge is free (what a slow save of 40,000 lines on a busy disk does).
#[test]
fn a_judge_dropped_with_a_save_in_flight_lets_the_bridge_go_only_after_it() {
    let (_dir, bridge, mut judge, inbox) = judged_empty();
    append_line(&inbox, note("01FIRST").as_bytes()).unwrap();
    judge.catch_up(Utc::now()).unwrap();
    judge.checkpoint().unwrap();
    judge.save_in_background();
    append_line(&inbox, note("01LATE").as_bytes()).unwrap();
    judge.sweep_all(Utc::now()).unwrap();

    let index = index_path(&bridge.state_dir().unwrap());
    let blocker = rusqlite::Connection::open(&index).unwrap();
    let landed = |conn: &rusqlite::Connection| -> bool {
        conn.query_row(
            "SELECT count(*) FROM messages WHERE id = '01LATE'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    };
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(
        judge.checkpoint_in_background().unwrap(),
        "the batch is handed to the saving thread"
    );
    drop(judge);
    let next = BridgeLock::try_acquire(&bridge, "next")
        .unwrap()
        .expect("the dropped judge let the bridge go");
    let taken = Instant::now();
    blocker.execute_batch("COMMIT").unwrap();
    // A save still waiting for the index's lock takes it now: `SQLite`'s busy handler tries
    // again within 100 ms. Watch for it, without sleeping, ten times as long.
    let until = taken + Duration::from_secs(1);
    let mut after = None;
    while Instant::now() < until {
        if landed(&blocker) {
            after = Some(taken.elapsed());
            break;
        }
        std::thread::yield_now();
    }
    drop(next);
    assert!(
        after.is_none(),
        "the dropped judge's saving thread wrote its batch into the index {after:?} after the \
         next judge took the bridge"
    );
}
