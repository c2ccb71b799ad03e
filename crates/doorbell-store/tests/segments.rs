//! Sealed journal segments (DESIGN §8.1): a roll that dies at any of its steps, and an index
//! rebuilt from sealed, compressed and live segments, never applies a record twice.

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::index::{index_path, Changes, IndexWriter};
use doorbell_store::{segments, Bridge, BridgeLock, Config, Judge, View};

fn line(id: &str, from: &str, to: &str, kind: &str, extra: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"{kind}"{extra},"createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"hi"}}]}}}}"#
    )
}

struct Setup {
    _dir: tempfile::TempDir,
    bridge: Bridge,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
        for agent in ["web", "design", "human"] {
            bridge.add_agent(agent).unwrap();
        }
        Setup { _dir: dir, bridge }
    }

    fn judge(&self) -> Judge {
        let lock = BridgeLock::acquire(&self.bridge, "test").unwrap();
        Judge::open(self.bridge.clone(), lock).unwrap()
    }

    fn append(&self, inbox: &str, line: &str) {
        append_line(&self.bridge.inbox_path(inbox).unwrap(), line.as_bytes()).unwrap();
    }

    /// A request answered twice: replayed twice, it would count four responses.
    fn conversation(&self, id: &str) {
        self.append("web", &line(id, "design", "web", "request", ""));
        for (n, state) in ["working", "completed"].iter().enumerate() {
            self.append(
                "design",
                &line(
                    &format!("{id}.r{n}"),
                    "web",
                    "design",
                    "response",
                    &format!(r#","correlatesTo":"{id}","state":"{state}""#),
                ),
            );
        }
    }

    fn state(&self) -> std::path::PathBuf {
        self.bridge.state_dir().unwrap()
    }

    fn live(&self) -> std::path::PathBuf {
        self.state().join("journal.jsonl")
    }

    /// The request as the index and journal say, without judging.
    fn responses(&self, id: &str) -> u32 {
        View::unjudged(&self.bridge)
            .unwrap()
            .request(id)
            .map(|r| r.responses)
            .unwrap_or_default()
    }
}

#[test]
fn a_roll_that_died_after_the_index_moved_on_is_finished_not_replayed() {
    let s = Setup::new();
    let mut judge = s.judge();
    s.conversation("01ROLL");
    assert_eq!(judge.catch_up(Utc::now()).unwrap().accepted, 3);
    judge.checkpoint().unwrap();
    // Steps 1 and 2 of a roll, then the process dies before step 3.
    segments::seal(&s.state(), &s.live(), 0).unwrap();
    IndexWriter::open(&index_path(&s.state()))
        .unwrap()
        .save(&Changes {
            segment: 1,
            journal_len: 0,
            ..Changes::default()
        })
        .unwrap();
    drop(judge);
    assert!(std::fs::metadata(s.live()).unwrap().len() > 0);

    let mut judge = s.judge();
    assert_eq!(std::fs::metadata(s.live()).unwrap().len(), 0, "step 3 done");
    assert_eq!(judge.catch_up(Utc::now()).unwrap().judged(), 0);
    judge.checkpoint().unwrap();
    drop(judge);
    assert_eq!(s.responses("01ROLL"), 2, "each response applied once");
    // And the bridge goes on in segment 1.
    s.conversation("01NEXT");
    let mut judge = s.judge();
    assert_eq!(judge.catch_up(Utc::now()).unwrap().accepted, 3);
    judge.checkpoint().unwrap();
    drop(judge);
    assert_eq!(s.responses("01NEXT"), 2);
    assert_eq!(s.responses("01ROLL"), 2);
}

#[test]
fn a_roll_that_died_after_sealing_goes_on_from_the_same_file() {
    let s = Setup::new();
    let mut judge = s.judge();
    s.conversation("01SEAL");
    judge.catch_up(Utc::now()).unwrap();
    judge.checkpoint().unwrap();
    segments::seal(&s.state(), &s.live(), 0).unwrap();
    drop(judge);
    let mut judge = s.judge();
    assert_eq!(judge.catch_up(Utc::now()).unwrap().judged(), 0);
    // The next roll finds its link made already.
    judge.roll().unwrap();
    assert_eq!(std::fs::metadata(s.live()).unwrap().len(), 0);
    drop(judge);
    assert_eq!(s.responses("01SEAL"), 2);
    assert_eq!(segments::list(&s.state()).unwrap().len(), 1);
}

#[test]
fn an_index_is_rebuilt_from_sealed_compressed_and_live_segments() {
    let s = Setup::new();
    let mut judge = s.judge();
    s.conversation("01SEG0");
    judge.catch_up(Utc::now()).unwrap();
    judge.roll().unwrap();
    s.conversation("01SEG1");
    judge.catch_up(Utc::now()).unwrap();
    judge.roll().unwrap();
    s.conversation("01LIVE");
    judge.catch_up(Utc::now()).unwrap();
    judge.checkpoint().unwrap();
    drop(judge);
    let compressed = segments::compress_below(&s.state(), 2).unwrap();
    assert_eq!(compressed.segments, 2);
    let sealed = segments::list(&s.state()).unwrap();
    assert!(sealed.iter().all(|s| s.compressed), "{sealed:?}");

    for file in ["index.db", "index.db-wal", "index.db-shm"] {
        let _ = std::fs::remove_file(s.state().join(file));
    }
    let mut judge = s.judge();
    assert_eq!(
        judge.catch_up(Utc::now()).unwrap().judged(),
        0,
        "nothing judged again"
    );
    // A retry of a line from the oldest segment is still a duplicate.
    s.append("web", &line("01SEG0", "design", "web", "request", ""));
    let again = judge.catch_up(Utc::now()).unwrap();
    assert_eq!((again.accepted, again.duplicate), (0, 1));
    judge.checkpoint().unwrap();
    drop(judge);
    for id in ["01SEG0", "01SEG1", "01LIVE"] {
        assert_eq!(s.responses(id), 2, "{id}");
    }
    // Nothing is left unpacked beside the segments.
    let names: Vec<String> = std::fs::read_dir(segments::segments_dir(&s.state()))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| n.ends_with(".jsonl.gz")), "{names:?}");
}
