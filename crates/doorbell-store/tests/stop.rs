//! What a stopping judge owes files it alone can still reach.

use std::io::Write;
use std::sync::atomic::Ordering;

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::{Bridge, BridgeLock, Config, Judge};

fn note(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"design","to":"web","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"hi"}}]}}}}"#
    )
}

/// An inbox replaced (renamed over) while the judge was stopping: the old file's last lines
/// were never read, and after this process nobody could read them. `drain_replaced` reads
/// them even though the stop interrupted the sweep.
#[test]
fn a_stopping_judge_drains_a_replaced_inbox_it_had_not_finished() {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design", "human"] {
        bridge.add_agent(agent).unwrap();
    }
    let path = bridge.inbox_path("web").unwrap();
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let mut judge = Judge::open(bridge.clone(), lock).unwrap();
    append_line(&path, note("01OLDFIRST").as_bytes()).unwrap();
    assert_eq!(judge.catch_up(Utc::now()).unwrap().accepted, 1);

    // A late line in the old file, then a new file renamed over it; the stop comes before
    // any sweep.
    let mut old = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(old, "{}", note("01OLDLATE")).unwrap();
    drop(old);
    let new = dir.path().join("web-inbox.new");
    std::fs::write(&new, format!("{}\n", note("01NEWFIRST"))).unwrap();
    std::fs::rename(&new, &path).unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design", "human"] {
        bridge.add_agent(agent).unwrap();
    }
    let path = bridge.inbox_path("web").unwrap();
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let mut judge = Judge::open(bridge.clone(), lock).unwrap();
    append_line(&path, note("01OLDFIRST").as_bytes()).unwrap();
    assert_eq!(judge.catch_up(Utc::now()).unwrap().accepted, 1);
    let mut old = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(old, "{}", note("01OLDLATE")).unwrap();
    drop(old);
    std::fs::remove_file(&path).unwrap();
    judge.interrupt_flag().store(true, Ordering::Relaxed);
    judge.drain_replaced(Utc::now()).unwrap();
    assert!(judge.snapshot().ledger.is_claimed("01OLDLATE"));
}

/// The sweep that would drain a replaced inbox is interrupted by the stop: the old file must
/// not be forgotten, so the stopping judge still drains it.
#[test]
fn an_interrupted_drain_is_finished_by_the_stopping_judge() {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design", "human"] {
        bridge.add_agent(agent).unwrap();
    }
    let path = bridge.inbox_path("web").unwrap();
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let mut judge = Judge::open(bridge.clone(), lock).unwrap();
    append_line(&path, note("01OLDFIRST").as_bytes()).unwrap();
    assert_eq!(judge.catch_up(Utc::now()).unwrap().accepted, 1);
    let mut old = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(old, "{}", note("01OLDLATE")).unwrap();
    drop(old);
    let new = dir.path().join("web-inbox.new");
    std::fs::write(&new, format!("{}\n", note("01NEWFIRST"))).unwrap();
    std::fs::rename(&new, &path).unwrap();
    judge.interrupt_flag().store(true, Ordering::Relaxed);
    // The sweep the rename's event starts, interrupted by the stop.
    assert!(judge.sweep(&["web".to_owned()], Utc::now()).is_err());
    judge.drain_replaced(Utc::now()).unwrap();
    assert!(judge.snapshot().ledger.is_claimed("01OLDLATE"));
    assert!(judge.snapshot().ledger.is_claimed("01NEWFIRST"));
}
