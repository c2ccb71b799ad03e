//! The daemon through disk faults: it says plainly that judging paused, keeps running, and
//! once writes work again judges every line exactly once. In process, with the store's fault
//! seam, so it runs everywhere; a real full tmpfs is in the integration tests' long form.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use doorbell_daemon::Options;
use doorbell_store::append::append_line;
use doorbell_store::fault::{self, Fault};
use doorbell_store::journal::journal_path;
use doorbell_store::{Bridge, BridgeLock, Config};
use notify::{RecursiveMode, Watcher};

/// The daemon's log, kept for the test to read; each write wakes the test.
#[derive(Clone)]
struct Log {
    text: Arc<Mutex<Vec<u8>>>,
    wake: Sender<()>,
}

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.lock().unwrap().extend_from_slice(buf);
        let _ = self.wake.send(());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;
    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap()).into_owned()
    }
}

fn note(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"design","to":"web","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"hello"}}]}}}}"#
    )
}

/// Verdicts in the journal by inbox offset (complete records only).
fn verdicts(bridge: &Bridge) -> BTreeMap<u64, usize> {
    let text = std::fs::read_to_string(journal_path(bridge)).unwrap_or_default();
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if record["in"] == "web" && ["a", "d", "r"].contains(&record["v"].as_str().unwrap_or("")) {
            *seen.entry(record["o"].as_u64().unwrap()).or_insert(0) += 1;
        }
    }
    seen
}

/// Wait for `done`, checking again at each wake (a log line, a change in the folder).
fn wait_until(wakes: &Receiver<()>, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for {what}");
        let _ = wakes.recv_timeout(left);
    }
}

#[test]
fn writes_failing_pause_judging_and_it_resumes_when_they_work() {
    let (wake, wakes) = channel();
    let log = Log {
        text: Arc::default(),
        wake: wake.clone(),
    };
    tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .init();
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design", "human"] {
        bridge.add_agent(agent).unwrap();
    }
    let inbox = bridge.inbox_path("web").unwrap();
    let mut watcher = notify::recommended_watcher(move |_| {
        let _ = wake.send(());
    })
    .unwrap();
    watcher
        .watch(&bridge.state_dir().unwrap(), RecursiveMode::NonRecursive)
        .unwrap();
    let options = Options {
        bridge: bridge.clone(),
        lock: BridgeLock::acquire(&bridge, "test").unwrap(),
        config_path: None,
        hangup: None,
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(doorbell_daemon::run(
            options,
            move |_| ready_tx.send(()).unwrap(),
            async {
                let _ = stop_rx.await;
            },
        ))
    });
    ready_rx.recv_timeout(Duration::from_secs(30)).unwrap();

    let mut offsets = vec![append_line(&inbox, note("01BEFORE").as_bytes()).unwrap()];
    wait_until(&wakes, "the first line's verdict", || {
        verdicts(&bridge).len() == 1
    });

    for (round, fault) in [Fault::NoSpace, Fault::ReadOnly].into_iter().enumerate() {
        let paused_before = log.text().matches("judging paused").count();
        fault::inject(bridge.dir(), fault, 0);
        for i in 0..5 {
            // Written past the seam (which covers the inbox too), as another process on a
            // healthy disk would.
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&inbox)
                .unwrap();
            offsets.push(file.metadata().unwrap().len());
            writeln!(file, "{}", note(&format!("01DURING{round}X{i}"))).unwrap();
        }
        wait_until(&wakes, "the pause to be logged", || {
            log.text().matches("judging paused").count() > paused_before
        });
        let resumed_before = log.text().matches("judging resumed").count();
        fault::clear(bridge.dir());
        wait_until(&wakes, "judging to resume", || {
            log.text().matches("judging resumed").count() > resumed_before
        });
        wait_until(&wakes, "every line's verdict", || {
            verdicts(&bridge).len() == offsets.len()
        });
    }
    stop_tx.send(()).unwrap();
    daemon.join().unwrap().unwrap();

    let verdicts = verdicts(&bridge);
    for offset in &offsets {
        assert_eq!(
            verdicts.get(offset),
            Some(&1),
            "line at {offset}: {verdicts:?}"
        );
    }
    assert_eq!(verdicts.len(), offsets.len());
    let text = log.text();
    println!("{text}");
    assert!(
        text.contains("No space left on device") && text.contains("Read-only file system"),
        "the log names the cause: {text}"
    );
    assert!(text.contains("stopped"), "{text}");
}
