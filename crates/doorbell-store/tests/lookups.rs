//! The index's lookups for readers (threads, history, due and closed requests): a new index
//! is filled without them and gets them once its first catch-up has judged every inbox; one
//! whose first catch-up was cut short gets them when the judge next opens it.

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::index::index_path;
use doorbell_store::{Bridge, BridgeLock, Config, Judge, View};

/// What the readers look things up by, besides the primary keys.
const LOOKUPS: [&str; 8] = [
    "messages_by_thread",
    "messages_by_time",
    "others_by_id",
    "others_by_time",
    "requests_closed",
    "requests_open",
    "requests_open_from",
    "requests_open_to",
];

fn line(id: &str, kind: &str, extra: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"design","to":"web","kind":"{kind}"{extra},"createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"hi"}}]}}}}"#
    )
}

fn bridge() -> (tempfile::TempDir, Bridge) {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design"] {
        bridge.add_agent(agent).unwrap();
    }
    let inbox = bridge.inbox_path("web").unwrap();
    append_line(&inbox, line("01ASK", "request", "").as_bytes()).unwrap();
    append_line(&inbox, line("01NOTE", "note", "").as_bytes()).unwrap();
    (dir, bridge)
}

fn judge(bridge: &Bridge) -> Judge {
    let lock = BridgeLock::acquire(bridge, "test").unwrap();
    Judge::open(bridge.clone(), lock).unwrap()
}

/// The lookups the index has now, by name.
fn lookups(bridge: &Bridge) -> Vec<String> {
    let conn = rusqlite::Connection::open(index_path(&bridge.state_dir().unwrap())).unwrap();
    let mut names = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%' AND name != 'others_by_place' ORDER BY name")
        .unwrap();
    names
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[test]
fn a_new_index_gets_its_lookups_once_its_first_catch_up_judged_every_inbox() {
    let (_dir, bridge) = bridge();
    let mut judge = judge(&bridge);
    assert_eq!(
        lookups(&bridge),
        Vec::<String>::new(),
        "filled without them"
    );
    let caught_up = judge.catch_up(Utc::now()).unwrap();
    assert_eq!(caught_up.accepted, 2);
    assert_eq!(lookups(&bridge), LOOKUPS);
    drop(judge);
    // What the catch-up judged is in the index, found through them.
    let view = View::unjudged(&bridge).unwrap();
    assert!(view.request("01ASK").is_some_and(|r| r.is_open()));
    assert_eq!(view.thread("01ASK").unwrap().len(), 1);
}

#[test]
fn an_index_whose_first_catch_up_was_cut_short_gets_its_lookups_at_the_next_open() {
    let (_dir, bridge) = bridge();
    // The judge that made the index stops before its catch-up ends (killed, or interrupted).
    drop(judge(&bridge));
    assert_eq!(lookups(&bridge), Vec::<String>::new());
    // A reader meanwhile gets its answers all the same.
    assert!(View::unjudged(&bridge).unwrap().request("01ASK").is_none());
    let judge = judge(&bridge);
    assert_eq!(lookups(&bridge), LOOKUPS, "made before anything is judged");
    drop(judge);
}

#[test]
fn an_index_rebuilt_under_a_running_judge_gets_its_lookups_at_once() {
    let (_dir, bridge) = bridge();
    let mut judge = judge(&bridge);
    judge.save_in_background();
    judge.catch_up(Utc::now()).unwrap();
    assert_eq!(lookups(&bridge), LOOKUPS);
    // What the judge does when the index fails a lookup: its files go, and the daemon's
    // retry reloads from the journal, then only sweeps (no catch-up comes again).
    doorbell_store::checkpoint::discard(&index_path(&bridge.state_dir().unwrap())).unwrap();
    judge.reload().unwrap();
    assert_eq!(lookups(&bridge), LOOKUPS);
    judge.sweep_all(Utc::now()).unwrap();
    judge.checkpoint().unwrap();
    drop(judge);
    assert!(View::unjudged(&bridge)
        .unwrap()
        .request("01ASK")
        .is_some_and(|r| r.is_open()));
}

/// A thread's first message is found by its id, the rest through `messages_by_thread`, which
/// holds only messages of a thread another began: the whole thread, and no scan.
#[test]
fn a_thread_is_found_whole_through_its_first_id_and_a_lookup_of_the_rest() {
    let (_dir, bridge) = bridge();
    let answer = r#"{"id":"01ANSWER","from":"web","to":"design","kind":"response","correlatesTo":"01ASK","contextId":"01ASK","state":"completed","createdAt":"2026-11-29T10:01:00Z","message":{"role":"agent","parts":[{"type":"text","text":"done"}]}}"#;
    append_line(&bridge.inbox_path("design").unwrap(), answer.as_bytes()).unwrap();
    let mut judge = judge(&bridge);
    assert_eq!(judge.catch_up(Utc::now()).unwrap().accepted, 3);
    drop(judge);
    let view = View::unjudged(&bridge).unwrap();
    let thread: Vec<String> = view
        .thread("01ASK")
        .unwrap()
        .into_iter()
        .map(|m| m.row.id)
        .collect();
    assert_eq!(thread, ["01ASK", "01ANSWER"]);
    assert_eq!(view.thread("01NOTE").unwrap().len(), 1);
    let conn = rusqlite::Connection::open(index_path(&bridge.state_dir().unwrap())).unwrap();
    let in_lookup: i64 = conn
        .query_row(
            "SELECT count(*) FROM messages INDEXED BY messages_by_thread \
             WHERE context_id = '01ASK' AND context_id != id",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        in_lookup, 1,
        "the answer, not the request that began the thread"
    );
    // Partial: a backlog's requests and notes, each a thread of its own, are not in it.
    let partial: bool = conn
        .query_row(
            "SELECT partial FROM pragma_index_list('messages') WHERE name = 'messages_by_thread'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert!(partial, "only messages of a thread another began");
}

/// Fill a new index's tables behind the judge's back (rows the judge never reads), so that
/// making its lookups takes a while: what a real backlog of hundreds of thousands does.
fn fill_index(bridge: &Bridge, rows: u64) {
    let conn = rusqlite::Connection::open(index_path(&bridge.state_dir().unwrap())).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut message = tx
            .prepare(
                "INSERT INTO messages(id, inbox, gen, offset, span, seen_at, seq, sender, kind, \
                 correlates_to, context_id, state, fingerprint, sum) \
                 VALUES (?1, 'zz', 0, ?2, 1, ?3, ?2, 'zz', 0, NULL, ?4, NULL, 0, 0)",
            )
            .unwrap();
        let mut other = tx
            .prepare(
                "INSERT INTO others(inbox, gen, offset, span, verdict, seen_at, id, sender, \
                 reason, detail, sum) VALUES ('zz', 0, ?1, 1, 'r', ?2, ?3, 'zz', 'x', 'x', 0)",
            )
            .unwrap();
        for n in 0..rows {
            let n = i64::try_from(n).unwrap();
            let scrambled = (n * 7919) % 1_000_003;
            message
                .execute(rusqlite::params![
                    format!("ZZ{n:012}"),
                    n,
                    scrambled,
                    format!("ZC{scrambled:012}")
                ])
                .unwrap();
            other
                .execute(rusqlite::params![
                    n,
                    scrambled,
                    format!("ZO{scrambled:012}")
                ])
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// A catch-up of a new index that fails after its lookups were started (here the journal
/// cannot take the notice's intent), and the judge dropped: the next judge, which may take
/// the bridge the moment it is let go, must find nobody writing the index.
#[test]
fn a_judge_dropped_while_its_lookups_are_made_lets_the_bridge_go_only_after_them() {
    use doorbell_store::fault::{self, Fault};
    let (_dir, bridge) = bridge();
    // A line misaddressed by a station: its sender is owed a notice, which the catch-up
    // journals (an intent) after it started the lookups.
    let misaddressed = r#"{"id":"01MIS","from":"design","to":"web","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{"role":"agent","parts":[{"type":"text","text":"hi"}]}}"#;
    bridge.add_agent("human").unwrap();
    append_line(
        &bridge.inbox_path("human").unwrap(),
        misaddressed.as_bytes(),
    )
    .unwrap();
    let mut judge = judge(&bridge);
    fill_index(&bridge, 200_000);
    // Everything judged now: the catch-up's own sweep journals nothing.
    judge.sweep_all(Utc::now()).unwrap();
    assert!(judge.has_untold(), "a notice is owed");
    // The journal takes one more byte: the checkpoint before the lookups is saved (nothing to
    // write, its sync goes through), the notice's intent is not.
    let journal = doorbell_store::journal::journal_path(&bridge);
    fault::inject(&journal, Fault::NoSpace, 1);
    let dropping = std::thread::spawn(move || {
        let failed = judge.catch_up(Utc::now());
        drop(judge);
        failed.map(|_| ())
    });
    // Whoever waits for the bridge (another command: `after_catch_ups`) takes it the moment
    // it is free.
    let lock = loop {
        if let Some(lock) = BridgeLock::try_acquire(&bridge, "next").unwrap() {
            break lock;
        }
        std::thread::yield_now();
    };
    let conn = rusqlite::Connection::open(index_path(&bridge.state_dir().unwrap())).unwrap();
    conn.busy_timeout(std::time::Duration::ZERO).unwrap();
    let writable = conn.execute_batch("BEGIN IMMEDIATE; COMMIT;");
    let failed = dropping.join().unwrap();
    fault::clear(&journal);
    assert!(failed.is_err(), "the catch-up could not journal its intent");
    drop(lock);
    writable.expect(
        "the bridge was let go while the dropped judge's thread still held the index's write lock",
    );
}
