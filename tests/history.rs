//! History that does not live in memory (DESIGN §8.1): the index that holds it, migrating a
//! bridge written by the old whole-ledger checkpoint, rebuilding a lost or damaged index
//! without judging a line twice, and compacting old journal segments.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::util::{line, Bridge};

/// Copy `from` into `to`, files and folders, keeping each file's mode.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A bridge folder made by the previous release (whole-ledger `checkpoint.json`, no index),
/// left as a crash left it: a refusal's notice journaled as an intent and never written.
/// Its journal and cursor name the files by device and inode, so those are set to the copy's:
/// the folder as it stood on the disk it was made on.
fn old_bridge() -> Bridge {
    let bridge = Bridge::new();
    // The fixture's open request was made long ago: no ring may fall due while this runs.
    let config = bridge.tmp.path().join("home/.config/doorbell");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("doorbell.toml"),
        "[debts]\nring_after = \"36500d\"\n",
    )
    .unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-bridge");
    copy_tree(&fixture, &bridge.dir());
    let identity = |name: &str| {
        let meta = std::fs::metadata(bridge.inbox(name)).unwrap();
        (meta.dev(), meta.ino())
    };
    let journal_path = bridge.dir().join(".doorbell/journal.jsonl");
    let journal = std::fs::read_to_string(&journal_path).unwrap();
    let mut fixed = String::new();
    for record in journal.lines() {
        let mut record: serde_json::Value = serde_json::from_str(record).unwrap();
        if record["v"] == "m" {
            let (dev, ino) = identity(record["in"].as_str().unwrap());
            record["dev"] = dev.into();
            record["ino"] = ino.into();
        }
        fixed.push_str(&serde_json::to_string(&record).unwrap());
        fixed.push('\n');
    }
    std::fs::write(&journal_path, fixed).unwrap();
    let cursor_path = bridge.dir().join("web-inbox.cursor");
    let mut cursor: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cursor_path).unwrap()).unwrap();
    let (dev, ino) = identity("web");
    cursor["dev"] = dev.into();
    cursor["ino"] = ino.into();
    std::fs::write(&cursor_path, serde_json::to_vec(&cursor).unwrap()).unwrap();
    bridge
}

const NOTICE: &str = "bridge:refused:8a61caa13160d8a2c0e6f3e353b0d012";

fn count_in(bridge: &Bridge, inbox: &str, needle: &str) -> usize {
    std::fs::read_to_string(bridge.inbox(inbox))
        .unwrap()
        .matches(needle)
        .count()
}

/// Every verdict of the journal, keyed by where its line is: each line judged once.
fn judged_once(bridge: &Bridge) -> BTreeMap<(String, u64), String> {
    let mut seen = BTreeMap::new();
    for (inbox, offset, verdict, _) in bridge.verdicts() {
        let key = (inbox, offset);
        assert!(
            seen.insert(key.clone(), verdict).is_none(),
            "{key:?} judged twice"
        );
    }
    seen
}

fn show(bridge: &Bridge, id: &str) -> serde_json::Value {
    serde_json::from_str(bridge.doorbell(&["show", id, "--json"]).ok()).unwrap()
}

#[test]
fn a_bridge_of_the_old_format_opens_without_losing_a_verdict_a_cursor_or_an_intent() {
    let bridge = old_bridge();
    let state = bridge.dir().join(".doorbell");
    assert!(state.join("checkpoint.json").exists());
    assert!(!state.join("index.db").exists());
    let before = judged_once(&bridge);
    assert_eq!(
        count_in(&bridge, "design", NOTICE),
        0,
        "the intent is pending"
    );

    let once = bridge.doorbell(&["daemon", "--once"]);
    once.ok();
    assert!(state.join("index.db").exists());
    assert!(
        !state.join("checkpoint.json").exists() && !state.join("checkpoint.prev.json").exists(),
        "the old checkpoint is retired"
    );
    // The pending notice is written, once; nothing already judged is judged again.
    assert_eq!(count_in(&bridge, "design", NOTICE), 1);
    let after = judged_once(&bridge);
    for (key, verdict) in &before {
        assert_eq!(after.get(key), Some(verdict), "{key:?} kept its verdict");
    }
    assert_eq!(after.len(), before.len() + 1, "only the notice is new");
    // Verdicts, the ledger and the cursor as the old bridge had them.
    assert_eq!(
        show(&bridge, "01JV1REQUESTOPEN000000000A")["verdict"],
        "accepted"
    );
    assert_eq!(
        show(&bridge, "01JV1REQUESTDONE000000000B")["state"],
        "completed"
    );
    let bad = show(&bridge, "01JV1BAD");
    assert_eq!(
        (bad["verdict"].as_str(), bad["reason"].as_str()),
        (Some("refused"), Some("missing-field"))
    );
    let debts = bridge.doorbell(&["debts", "--json"]);
    let debts: serde_json::Value = serde_json::from_str(debts.ok()).unwrap();
    let ids: Vec<&str> = debts["debts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["request"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["01JV1REQUESTOPEN000000000A"]);
    assert_eq!(
        bridge.read_json("web", &[]).len(),
        0,
        "web had read both requests; the refused line is never shown"
    );
    let design: Vec<String> = bridge
        .read_json("design", &[])
        .iter()
        .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        design,
        [
            "01JV1NOTE0000000000000000C",
            "01JV1ANSWER00000000000000D",
            NOTICE
        ]
    );
    // A retry of an old message is still a duplicate: its id is found in the index.
    let retry = bridge.doorbell(&[
        "send",
        "--to",
        "design",
        "--from",
        "web",
        "--id",
        "01JV1NOTE0000000000000000C",
        "hello design",
    ]);
    assert_eq!(retry.ok().trim(), "01JV1NOTE0000000000000000C");
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(count_in(&bridge, "design", NOTICE), 1, "told once, ever");
    assert_eq!(judged_once(&bridge).len(), after.len());
}

/// Traffic of every verdict: requests (one answered), a note, a retry, a refusal with its
/// notice.
fn traffic(bridge: &Bridge) {
    let ask = |id: &str| {
        bridge
            .doorbell(&[
                "send", "--to", "web", "--from", "design", "--kind", "request", "--id", id,
                "question",
            ])
            .ok();
    };
    ask("01HQREQ1");
    ask("01HQREQ2");
    bridge
        .doorbell(&[
            "reply",
            "01HQREQ1",
            "--from",
            "web",
            "--state",
            "completed",
            "yes",
        ])
        .ok();
    bridge.send("web", "design", "a note");
    bridge.append_raw(
        "web",
        format!("{}\n", line("01HQREQ2", "design", "web", "request", "")).as_bytes(),
    );
    bridge.append_raw(
        "web",
        format!(
            "{}\n",
            line(
                "01HQBAD",
                "design",
                "web",
                "response",
                r#","state":"completed""#
            )
        )
        .as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
}

fn index_files(bridge: &Bridge) -> Vec<std::path::PathBuf> {
    ["index.db", "index.db-wal", "index.db-shm"]
        .iter()
        .map(|f| bridge.dir().join(".doorbell").join(f))
        .collect()
}

/// What a person sees of the bridge: the ledger, one message of each verdict, a thread.
fn seen(bridge: &Bridge) -> Vec<String> {
    let mut out = Vec::new();
    for id in ["01HQREQ1", "01HQREQ2", "01HQBAD"] {
        let mut shown = show(bridge, id);
        // Whether it was read is a fact of the cursor, not of the index.
        shown.as_object_mut().unwrap().remove("read");
        out.push(shown.to_string());
    }
    out.push(bridge.doorbell(&["debts", "--json"]).ok().to_owned());
    out.push(
        bridge
            .doorbell(&["thread", "01HQREQ1", "--json"])
            .ok()
            .to_owned(),
    );
    out
}

fn rebuilds_without_judging_twice(damage: impl FnOnce(&Bridge)) {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    traffic(&bridge);
    let before = judged_once(&bridge);
    let views = seen(&bridge);
    let notices = count_in(&bridge, "design", "bridge:refused:");
    assert_eq!(notices, 1);
    damage(&bridge);
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert!(
        once.stderr.contains("rebuilding it from the journal"),
        "{}",
        once.stderr
    );
    assert!(once.stderr.contains("judged 0 lines"), "{}", once.stderr);
    assert_eq!(judged_once(&bridge), before, "nothing judged again");
    assert_eq!(count_in(&bridge, "design", "bridge:refused:"), notices);
    assert_eq!(seen(&bridge), views);
    // And it goes on: a retry is a duplicate, a new request is one.
    bridge
        .doorbell(&[
            "send", "--to", "web", "--from", "design", "--kind", "request", "--id", "01HQREQ3",
            "more",
        ])
        .ok();
    let mut retry = bridge.lines("web")[0].clone();
    assert!(String::from_utf8_lossy(&retry).contains("01HQREQ1"));
    retry.push(b'\n');
    bridge.append_raw("web", &retry);
    bridge.doorbell(&["daemon", "--once"]).ok();
    let after = judged_once(&bridge);
    let verdicts: Vec<&String> = after
        .iter()
        .filter(|(k, _)| !before.contains_key(k))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(verdicts, ["accepted", "duplicate"]);
}

#[test]
fn a_lost_index_is_rebuilt_from_the_journal_without_judging_twice() {
    rebuilds_without_judging_twice(|bridge| {
        for file in index_files(bridge) {
            let _ = std::fs::remove_file(file);
        }
    });
}

#[test]
fn a_damaged_index_is_rebuilt_from_the_journal_without_judging_twice() {
    rebuilds_without_judging_twice(|bridge| {
        std::fs::write(&index_files(bridge)[0], b"SQLite format 3\0 but not really").unwrap();
    });
}

#[test]
fn an_index_ahead_of_its_journal_is_rebuilt() {
    // The journal of a restored backup that is older than the index beside it: the index
    // claims judging the journal never recorded, so it is not trusted.
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    traffic(&bridge);
    let journal = bridge.dir().join(".doorbell/journal.jsonl");
    let old = std::fs::read(&journal).unwrap();
    bridge.send("design", "web", "later");
    bridge.doorbell(&["daemon", "--once"]).ok();
    std::fs::write(&journal, &old).unwrap();
    let before = judged_once(&bridge);
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert!(
        once.stderr
            .contains("the journal is shorter than the index says"),
        "{}",
        once.stderr
    );
    // The line the journal lost is judged (once) again; nothing else is.
    let after = judged_once(&bridge);
    assert_eq!(after.len(), before.len() + 1);
    assert_eq!(count_in(&bridge, "design", "bridge:refused:"), 1);
}

#[test]
fn compact_seals_and_compresses_the_journal_and_every_view_stays() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    traffic(&bridge);
    let views = seen(&bridge);
    let state = bridge.dir().join(".doorbell");
    let journal = std::fs::metadata(state.join("journal.jsonl"))
        .unwrap()
        .len();
    let run = bridge.doorbell(&["compact"]);
    run.ok();
    assert!(
        run.stderr.contains("sealed journal segment 0"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("compressed 1 sealed segments"),
        "{}",
        run.stderr
    );
    let packed = std::fs::metadata(state.join("journal/00000000.jsonl.gz"))
        .unwrap()
        .len();
    assert!(packed < journal, "{packed} bytes packed from {journal}");
    assert!(!state.join("journal/00000000.jsonl").exists());
    assert_eq!(
        std::fs::metadata(state.join("journal.jsonl"))
            .unwrap()
            .len(),
        0
    );
    assert_eq!(seen(&bridge), views);

    // The live segment goes on; an exact retry of a line sealed away is still a duplicate.
    let mut retry = bridge.lines("web")[0].clone();
    retry.push(b'\n');
    bridge.append_raw("web", &retry);
    bridge.doorbell(&["daemon", "--once"]).ok();
    let verdicts: Vec<String> = bridge.verdicts().into_iter().map(|v| v.2).collect();
    assert_eq!(verdicts, ["duplicate"]);

    // A lost index is rebuilt from the compressed segment and the live one.
    for file in index_files(&bridge) {
        let _ = std::fs::remove_file(file);
    }
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert!(once.stderr.contains("judged 0 lines"), "{}", once.stderr);
    assert_eq!(seen(&bridge), views);
    // A second compaction seals the next segment.
    let run = bridge.doorbell(&["compact"]);
    assert!(
        run.stderr.contains("sealed journal segment 1"),
        "{}",
        run.stderr
    );
    assert!(state.join("journal/00000001.jsonl.gz").exists());
    // With nothing new, a third has nothing to seal, and says so (no judge runs).
    let run = bridge.doorbell(&["compact"]);
    assert!(
        run.stderr
            .contains("the live journal is empty: nothing to seal"),
        "{}",
        run.stderr
    );
}

/// A daemon judges a new id without asking the index once its id filter is filled from the
/// index (`ids.rs`); an old id, known only to the index, must still be found: a copy is a
/// duplicate and another line under it is refused, whether the filter or the index says so.
#[test]
fn old_ids_known_only_to_the_index_are_found_through_the_id_filter() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let note = |id: &str, text: &str| {
        format!(
            "{}\n",
            line(id, "design", "web", "note", "").replace(&format!("{id} from design"), text)
        )
    };
    let old: String = (0..500)
        .map(|n| note(&format!("01OLD{n:04}"), "then"))
        .collect();
    bridge.append_raw("web", old.as_bytes());
    bridge.doorbell(&["daemon", "--once"]).ok();
    let mut daemon = crate::util::Daemon::start(&bridge, &[]);
    daemon.expect_stderr("the id filter is ready", std::time::Duration::from_secs(20));
    assert!(
        daemon
            .stderr_so_far()
            .iter()
            .any(|l| l.contains("the id filter is ready") && l.contains("ids=500")),
        "{:?}",
        daemon.stderr
    );
    let again = note("01OLD0007", "then");
    let reused = note("01OLD0009", "something else");
    let fresh = note("01NEWONE", "now");
    bridge.append_raw("web", format!("{again}{reused}{fresh}").as_bytes());
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "three more verdicts",
        |b| b.verdicts().len() == 503,
    );
    let verdicts = bridge.verdicts();
    let last: Vec<(&str, Option<&str>)> = verdicts[500..]
        .iter()
        .map(|(_, _, verdict, reason)| (verdict.as_str(), reason.as_deref()))
        .collect();
    assert_eq!(
        last,
        [
            ("duplicate", None),
            ("refused", Some("id-reused")),
            ("accepted", None)
        ]
    );
    daemon.kill();
}
