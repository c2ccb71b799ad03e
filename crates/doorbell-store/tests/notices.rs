//! Refusal notices spaced per sender (a long-running judge's): held back at most the
//! spacing, whatever the clock does.

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::judge::CatchUp;
use doorbell_store::{Bridge, BridgeLock, Config, Judge};

fn bad(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"design","to":"web","kind":"gossip","createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"hi"}}]}}}}"#
    )
}

/// The clock set back an hour after a notice: the next one to the same sender waits the
/// spacing (`notice_every`, 5 s by default) from now, not an hour and the spacing.
#[test]
fn a_clock_set_back_holds_a_notice_no_longer_than_the_spacing() {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design", "human"] {
        bridge.add_agent(agent).unwrap();
    }
    let path = bridge.inbox_path("web").unwrap();
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let mut judge = Judge::open(bridge, lock).unwrap();
    judge.space_notices();
    let now = Utc::now();
    append_line(&path, bad("01FIRSTMISTAKE").as_bytes()).unwrap();
    judge.sweep_all(now).unwrap();
    assert_eq!(
        judge.untold_due(now),
        Some(now),
        "a first notice is due at once"
    );
    judge.emit(now, &mut CatchUp::default()).unwrap();
    append_line(&path, bad("01SECONDMISTAKE").as_bytes()).unwrap();
    judge.sweep_all(now).unwrap();
    assert_eq!(
        judge.untold_due(now),
        Some(now + chrono::Duration::seconds(5))
    );
    let earlier = now - chrono::Duration::hours(1);
    assert_eq!(
        judge.untold_due(earlier),
        Some(earlier + chrono::Duration::seconds(5)),
        "held for the spacing from the clock's now"
    );
}
