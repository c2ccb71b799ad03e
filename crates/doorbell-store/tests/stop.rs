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
