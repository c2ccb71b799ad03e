//! A running daemon tells its watchers what it journals over `.doorbell/watch.sock`; a
//! watcher that loses it (the daemon stops or is killed, or lets it go for not reading)
//! reads the journal file from where it stands. Either way every accepted line is printed
//! once, in order.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use crate::util::{line, note_of, signal, Bridge, Daemon, Watch, WatchChild};

const PATIENCE: Duration = Duration::from_secs(20);

fn note(id: &str) -> String {
    format!("{}\n", line(id, "design", "web", "note", ""))
}

/// How many inotify instances the process holds: a watcher told by the daemon needs none.
fn inotify_instances(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy() == "anon_inode:inotify")
        .count()
}

#[test]
fn a_watcher_is_told_by_the_daemon_and_reads_the_files_when_it_goes() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start(&bridge, "web");
    let mut printed = Vec::new();
    for id in ["01TOLDONE", "01TOLDTWO"] {
        bridge.append_raw("web", note(id).as_bytes());
        printed.push(watch.next(PATIENCE));
    }
    // Told by the daemon: no file events at all.
    assert_eq!(inotify_instances(watch.id()), 0);

    // The daemon dies: the watcher watches the files and judges what comes itself.
    daemon.kill();
    bridge.append_raw("web", note("01ALONE").as_bytes());
    printed.push(watch.next(PATIENCE));
    assert_eq!(inotify_instances(watch.id()), 1);

    // A new daemon: the watcher is told by it again from the next change on.
    let daemon = Daemon::start(&bridge, &[]);
    for id in ["01TOLDAGAIN", "01TOLDLAST"] {
        bridge.append_raw("web", note(id).as_bytes());
        printed.push(watch.next(PATIENCE));
    }
    // (`notify` closes the instance on its own thread, a moment after it is let go.)
    let deadline = std::time::Instant::now() + PATIENCE;
    while inotify_instances(watch.id()) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the watcher still watches the files"
        );
        std::thread::yield_now();
    }
    // Nothing printed twice: the next line printed is the next one sent.
    bridge.append_raw("web", note("01SENTINEL").as_bytes());
    printed.push(watch.next(PATIENCE));
    assert_eq!(
        printed,
        [
            "01TOLDONE",
            "01TOLDTWO",
            "01ALONE",
            "01TOLDAGAIN",
            "01TOLDLAST",
            "01SENTINEL"
        ]
    );
    assert_eq!(bridge.verdicts().len(), 6, "{:?}", bridge.verdicts());
    daemon.kill();
}

#[test]
fn a_watcher_that_stops_reading_is_let_go_and_misses_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let mut watch = WatchChild::spawn_with(&bridge, "web", &["--keep-output"]);
    // Nobody reads what it prints: its pipe fills, it stops reading the socket, the
    // daemon's writes to it fill that too.
    let sent = send_batches(&bridge, "01B", 12);
    daemon.expect_stderr("a watcher that does not keep up is let go", PATIENCE);
    // Now it is read: everything, once, in order, the rest from the journal file.
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    assert_eq!(ids_from(&mut lines, sent.len()), sent);
    // And it goes on: a line sent now is printed next.
    bridge.append_raw("web", note("01AFTERWARDS").as_bytes());
    let value: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(value["envelope"]["id"], "01AFTERWARDS");
    drop(watch);
    daemon.kill();
}

#[test]
fn a_told_watcher_follows_an_inbox_replaced_under_it() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start(&bridge, "web");
    bridge.append_raw("web", note("01BEFORE").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01BEFORE");
    // A new file renamed over the inbox: a new generation, read from its start.
    let fresh = bridge.dir().join("web-inbox.jsonl.new");
    std::fs::write(&fresh, note("01REPLACED")).unwrap();
    std::fs::rename(&fresh, bridge.inbox("web")).unwrap();
    assert_eq!(watch.next(PATIENCE), "01REPLACED");
    bridge.append_raw("web", note("01AFTER").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01AFTER");
    assert_eq!(inotify_instances(watch.id()), 0);
    bridge.append_raw("web", note("01SENTINEL").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01SENTINEL");
    daemon.kill();
}

/// The cursor the watcher moved belongs to the inbox's old bytes: once the inbox is
/// truncated in place (the same inode) and written anew, the new generation is printed from
/// its start, not from where the old one stood.
#[test]
fn a_told_watcher_reads_an_inbox_truncated_in_place_from_its_start() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start(&bridge, "web");
    for id in ["01FIRSTLONGLINE", "01SECONDLONGLINE"] {
        bridge.append_raw("web", note(id).as_bytes());
        assert_eq!(watch.next(PATIENCE), id);
    }
    let end = std::fs::metadata(bridge.inbox("web")).unwrap().len();
    bridge.wait_for(PATIENCE, "the cursor moved past both", |b| {
        std::fs::read_to_string(b.dir().join("web-inbox.cursor"))
            .is_ok_and(|text| text.contains(&format!("\"offset\":{end}")))
    });
    std::fs::write(bridge.inbox("web"), note("01C")).unwrap(); // O_TRUNC: the same inode
    assert_eq!(watch.next(PATIENCE), "01C");
    for id in ["01D", "01E"] {
        bridge.append_raw("web", note(id).as_bytes());
        assert_eq!(watch.next(PATIENCE), id);
    }
    daemon.kill();
}

/// An inbox rewritten in place while the daemon could not look (stopped), with lines of the
/// same length whose last bytes are alike: only its first bytes tell it is another file.
#[test]
fn an_inbox_rewritten_in_place_with_only_its_head_changed_is_a_new_generation() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let same = |id: &str| {
        format!(
            r#"{{"id":"{id}","from":"design","to":"web","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"the same words every time"}}]}}}}"#
        ) + "\n"
    };
    let old = same("01HAAAAAAAAAAAAAAAAAAAAAAA") + &same("01HBBBBBBBBBBBBBBBBBBBBBBB");
    bridge.append_raw("web", old.as_bytes());
    bridge.wait_for(PATIENCE, "two judged", |b| b.verdict_count() == 2);
    daemon.signal("STOP");
    let new = same("01HCCCCCCCCCCCCCCCCCCCCCCC") + &same("01HDDDDDDDDDDDDDDDDDDDDDDD");
    assert_eq!(new.len(), old.len());
    std::fs::write(bridge.inbox("web"), new.as_bytes()).unwrap(); // O_TRUNC: the same inode
    daemon.signal("CONT");
    bridge.append_raw("web", same("01HEEEEEEEEEEEEEEEEEEEEEEE").as_bytes());
    bridge.wait_for(PATIENCE, "the new file's three lines judged", |b| {
        b.verdict_count() == 5
    });
    let ids: Vec<String> = bridge
        .journal()
        .iter()
        .filter(|r| r["v"] == "a")
        .filter_map(|r| r["a"]["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert!(ids.iter().any(|id| id.starts_with("01HCCCC")), "{ids:?}");
    daemon.kill();
}

/// Wait until web's `watch` has moved its cursor once: a move ends with its read log record.
fn wait_for_first_move(bridge: &Bridge) {
    crate::util::wait_for_text(
        &bridge.dir().join(".doorbell/reads/web.jsonl"),
        "\"via\":\"watch\"",
        PATIENCE,
    );
    // The read log is written just before the reader's turn is let go: a watch stopped in
    // between would hold the turn another reader waits for. Taking the turn's lock (and
    // letting it go at once) waits until the watch has let go.
    let lock = std::fs::File::open(bridge.dir().join(".doorbell/reads/web.lock")).unwrap();
    let (tx, taken) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(lock.lock().map(|()| lock));
    });
    let lock = taken
        .recv_timeout(PATIENCE)
        .expect("the watch kept the reader's turn")
        .unwrap();
    drop(lock);
}

/// A `watch` checks its cursor with one look at the path while the file there is the one it
/// last wrote; another reader's move (a new file) is still seen, so nothing is shown twice.
#[test]
fn a_watch_sees_a_cursor_moved_by_another_reader_while_it_waited() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start_keeping_output(&bridge, "web");
    bridge.append_raw("web", note("01MOVEDONE").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01MOVEDONE");
    // The watch moves its cursor after it prints: stopped before that move is over, it would
    // hold the reading that the other reader waits for.
    wait_for_first_move(&bridge);
    // The watch is stopped while another reader reads the next message and moves the cursor.
    let signal = |name: &str| signal(watch.id(), name);
    signal("STOP");
    bridge.append_raw("web", note("01MOVEDTWO").as_bytes());
    bridge.wait_for(PATIENCE, "two judged", |b| b.verdict_count() == 2);
    let read: Vec<String> = bridge
        .read_json("web", &[])
        .iter()
        .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(read, ["01MOVEDTWO"]);
    signal("CONT");
    bridge.append_raw("web", note("01MOVEDTHREE").as_bytes());
    assert_eq!(
        watch.next(PATIENCE),
        "01MOVEDTHREE",
        "the message the other reader showed is not shown again"
    );
    daemon.kill();
}

/// Moving a cursor makes one event beside the inboxes, its rename: the temp file is written
/// in `.doorbell/reads/`, which the judge does not watch, and the file a `watch` keeps open
/// afterwards is open for reading, so closing it at the next move says nothing either. A
/// `watch` printing a message does not wake the judge again for its cursor.
#[test]
fn a_cursor_move_makes_no_event_beside_the_inboxes_but_its_rename() {
    use notify::Watcher;
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start_keeping_output(&bridge, "web");
    // The first move makes the cursor file; the ones after replace it.
    bridge.append_raw("web", note("01EVENTSONE").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01EVENTSONE");
    wait_for_first_move(&bridge);
    let (tx, events) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let _ = tx.send(event);
    })
    .unwrap();
    watcher
        .watch(&bridge.dir(), notify::RecursiveMode::NonRecursive)
        .unwrap();
    // Three more moves: the file each move keeps open is closed by the next one. Each
    // line is sent once the one before it was moved over (the read log, outside the
    // folder watched, says so): a line printed before the last move would move with it.
    for id in ["01EVENTSTWO", "01EVENTSTHREE", "01EVENTSFOUR"] {
        bridge.append_raw("web", note(id).as_bytes());
        assert_eq!(watch.next(PATIENCE), id);
        let end = std::fs::metadata(bridge.inbox("web")).unwrap().len();
        crate::util::wait_for_text(
            &bridge.dir().join(".doorbell/reads/web.jsonl"),
            &format!("\"to\":{end},"),
            PATIENCE,
        );
    }
    // Every event up to the third rename of the cursor, in the order inotify gave them.
    let cursor = bridge.dir().join("web-inbox.cursor");
    let mut about_cursor = Vec::new();
    let mut moves = 0;
    let mut seen = Vec::new();
    while moves < 3 {
        let Ok(event) = events.recv_timeout(PATIENCE) else {
            let log = std::fs::read_to_string(bridge.dir().join(".doorbell/reads/web.jsonl"));
            panic!("the cursor was moved {moves} times of 3; events: {seen:?}; read log: {log:?}");
        };
        let event = event.unwrap();
        seen.push(format!("{:?} {:?}", event.kind, event.paths));
        let renamed = matches!(
            event.kind,
            notify::EventKind::Modify(notify::event::ModifyKind::Name(_))
        );
        for path in &event.paths {
            let name = path.file_name().unwrap().to_string_lossy();
            if renamed && *path == cursor {
                moves += 1;
            } else if *path == cursor || name.contains(".tmp.") {
                about_cursor.push(format!("{:?} {name}", event.kind));
            }
        }
    }
    assert!(
        about_cursor.is_empty(),
        "events beside the inboxes besides the renames: {about_cursor:?}"
    );
    daemon.kill();
}

/// The ids a `watch` prints, read on a thread, into a channel.
fn ids_of(output: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, ids) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { return };
            let value: serde_json::Value = serde_json::from_str(&line).unwrap();
            let id = value["envelope"]["id"].as_str().unwrap().to_owned();
            if tx.send(id).is_err() {
                return;
            }
        }
    });
    ids
}

/// `.doorbell/reads/` removed while a `watch` runs (a user clearing it, a restored folder):
/// the next reader makes a new reader lock there, and the watch, at its next turn, takes that
/// one rather than the removed file it holds open. Two readers never show the same message.
#[test]
fn a_watch_takes_the_reader_lock_that_is_there_now() {
    use std::io::Read;
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let daemon = Daemon::start(&bridge, &[]);
    let first = Watch::start_keeping_output(&bridge, "web");
    bridge.append_raw("web", note("01LOCKZERO").as_bytes());
    assert_eq!(first.next(PATIENCE), "01LOCKZERO");
    wait_for_first_move(&bridge);
    std::fs::remove_dir_all(bridge.dir().join(".doorbell/reads")).unwrap();
    let signal = |name: &str| signal(first.id(), name);
    // While the first is stopped, a second watch begins to print a message larger than its
    // pipe holds, and stays in that turn until the test reads its output.
    signal("STOP");
    let mut second = WatchChild::spawn_with(&bridge, "web", &["--keep-output"]);
    let padding = format!(r#","padding":"{}""#, "x".repeat(300_000));
    let big = format!("{}\n", line("01LOCKBIG", "design", "web", "note", &padding));
    bridge.append_raw("web", big.as_bytes());
    let mut output = second.0.stdout.take().unwrap();
    let (tx, began) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut first_byte = [0u8; 1];
        output.read_exact(&mut first_byte).unwrap();
        tx.send(()).unwrap();
        std::io::Cursor::new(first_byte.to_vec()).chain(output)
    });
    began
        .recv_timeout(PATIENCE)
        .expect("the second watch printed nothing");
    // The first goes on, told of the same message: it must wait for the second's turn.
    signal("CONT");
    let seconds = ids_of(reader.join().unwrap());
    assert_eq!(seconds.recv_timeout(PATIENCE).unwrap(), "01LOCKBIG");
    bridge.append_raw("web", note("01LOCKLAST").as_bytes());
    // Shown by one of the two, whichever takes the lock first.
    let mut shown: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + PATIENCE;
    while !shown.iter().any(|id| id == "01LOCKLAST") {
        assert!(
            std::time::Instant::now() < deadline,
            "the last message was not shown"
        );
        shown.extend(first.next_within(Duration::from_millis(20)));
        shown.extend(seconds.try_recv());
    }
    shown.extend(std::iter::from_fn(|| first.next_within(Duration::ZERO)));
    shown.sort();
    assert_eq!(
        shown,
        ["01LOCKLAST"],
        "the big message was shown by the second watch only"
    );
    daemon.kill();
}

/// What a `watch` says, stdout and stderr, in the order it reaches the test.
enum Said {
    Printed(String),
    Logged(String),
}

/// `doorbell watch web --json` with its debug log on: what it prints and what it logs.
struct Logged {
    child: WatchChild,
    said: std::sync::mpsc::Receiver<Said>,
}

impl Logged {
    fn start(bridge: &Bridge) -> Logged {
        let mut command = bridge.command(&["watch", "web", "--json", "--keep-output"]);
        command
            .env("DOORBELL_LOG", "warn,doorbell::watch=debug")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null());
        let mut child = WatchChild(command.spawn().unwrap());
        let (tx, said) = std::sync::mpsc::channel();
        let printed = ids_of(child.0.stdout.take().unwrap());
        let to = tx.clone();
        std::thread::spawn(move || {
            while let Ok(id) = printed.recv() {
                let _ = to.send(Said::Printed(id));
            }
        });
        let stderr = child.0.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(Said::Logged(line));
            }
        });
        Logged { child, said }
    }

    fn signal(&self, name: &str) {
        signal(self.child.0.id(), name);
    }

    /// The next id printed.
    #[track_caller]
    fn next(&self) -> String {
        loop {
            match self
                .said
                .recv_timeout(PATIENCE)
                .expect("watch printed nothing in time")
            {
                Said::Printed(id) => return id,
                Said::Logged(_) => {}
            }
        }
    }

    /// The ids printed up to and with `last`.
    #[track_caller]
    fn until(&self, mut ids: Vec<String>, last: &str) -> Vec<String> {
        while ids.last().map(String::as_str) != Some(last) {
            ids.push(self.next());
        }
        ids
    }

    /// After it woke to a file changed in place: `None` when it said so and waits, or the
    /// id it printed instead.
    #[track_caller]
    fn woken_to_a_changed_file(&self) -> Option<String> {
        loop {
            match self
                .said
                .recv_timeout(PATIENCE)
                .expect("the watch never woke")
            {
                Said::Printed(id) => return Some(id),
                Said::Logged(line) if line.contains("changed in place") => return None,
                Said::Logged(_) => {}
            }
        }
    }
}

/// Cut web's inbox in place to `len` bytes; what was cut, to write back.
fn cut_in_place(bridge: &Bridge, len: u64) -> Vec<u8> {
    let inbox = bridge.inbox("web");
    let whole = std::fs::read(&inbox).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&inbox)
        .unwrap()
        .set_len(len)
        .unwrap();
    whole[len as usize..].to_vec()
}

/// Write back in place what [`cut_in_place`] cut: the same bytes, the same file.
fn write_back(bridge: &Bridge, cut: &[u8]) {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(bridge.inbox("web"))
        .unwrap();
    std::io::Write::write_all(&mut file, cut).unwrap();
}

fn inbox_len(bridge: &Bridge) -> u64 {
    std::fs::metadata(bridge.inbox("web")).unwrap().len()
}

/// A daemon and web's `watch`, which printed `zero`. The watch is stopped while `ids` are
/// judged (and, with `other_reads`, read by another reader); the judge is stopped and the
/// inbox cut in place after the first of them; the watch woken to the cut file; the rest
/// written back in place, the same bytes, and the judge let go (it finds nothing new). What
/// the watch printed when woken (`None`: it said it waits for the file to be whole).
fn woken_to_a_cut_inbox(
    bridge: &Bridge,
    zero: &str,
    ids: &[&str],
    other_reads: bool,
) -> (Daemon, Logged, Option<String>) {
    let daemon = Daemon::start(bridge, &[]);
    let watch = Logged::start(bridge);
    bridge.append_raw("web", note(zero).as_bytes());
    assert_eq!(watch.next(), zero);
    wait_for_first_move(bridge);
    watch.signal("STOP");
    let cut_at = inbox_len(bridge) + note(ids[0]).len() as u64;
    for id in ids {
        bridge.append_raw("web", note(id).as_bytes());
    }
    bridge.wait_for(PATIENCE, "all judged", |b| {
        b.verdict_count() == ids.len() + 1
    });
    if other_reads {
        let read: Vec<String> = bridge
            .read_json("web", &[])
            .iter()
            .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(read, ids);
    }
    daemon.signal("STOP");
    let cut = cut_in_place(bridge, cut_at);
    watch.signal("CONT");
    let first = watch.woken_to_a_changed_file();
    write_back(bridge, &cut);
    daemon.signal("CONT");
    (daemon, watch, first)
}

/// A `watch` woken while its inbox is cut in place (a restore with `cp` half done), before
/// the judge has read it so: it shows nothing of the file and moves no cursor until the file
/// is the one the judge read again, then shows what was accepted there, once (before: it
/// printed what was left and moved the cursor over the rest, never shown).
#[test]
fn a_watch_woken_while_its_inbox_is_cut_in_place_skips_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let ids = ["01CUTONE", "01CUTTWO", "01CUTTHREE"];
    let (daemon, watch, first) = woken_to_a_cut_inbox(&bridge, "01CUTZERO", &ids, false);
    bridge.append_raw("web", note("01CUTFOUR").as_bytes());
    assert_eq!(
        watch.until(first.into_iter().collect(), "01CUTFOUR"),
        ["01CUTONE", "01CUTTWO", "01CUTTHREE", "01CUTFOUR"]
    );
    daemon.kill();
}

/// The same, after another reader read on while the watch was stopped: the watch, woken to
/// the cut file, finds the cursor does not fit it; once the file is whole again the cursor
/// fits again, and what the other reader showed is not shown again (before: the watch kept
/// its first look, "the cursor is for another file", and printed from its own place).
#[test]
fn a_watch_woken_while_its_inbox_is_cut_in_place_repeats_nothing_another_reader_showed() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let ids = ["01OTHERONE", "01OTHERTWO"];
    let (daemon, watch, first) = woken_to_a_cut_inbox(&bridge, "01OTHERZERO", &ids, true);
    bridge.append_raw("web", note("01OTHERTHREE").as_bytes());
    assert_eq!(
        watch.until(first.into_iter().collect(), "01OTHERTHREE"),
        ["01OTHERTHREE"],
        "what the other reader showed is not shown again"
    );
    daemon.kill();
}

/// The daemon says so when it takes a watch's output over.
const DELIVERING: &str = "the daemon prints for a watch of the agent";

/// `batches` batches of 200 notes to web, each judged before the next is sent: the ids, in
/// order.
fn send_batches(bridge: &Bridge, prefix: &str, batches: usize) -> Vec<String> {
    let mut sent = Vec::new();
    for batch in 0..batches {
        let lines: String = (0..200)
            .map(|n| {
                let id = format!("{prefix}{batch:02}N{n:03}");
                let line = note(&id);
                sent.push(id);
                line
            })
            .collect();
        bridge.append_raw("web", lines.as_bytes());
        let judged = sent.len();
        bridge.wait_for(PATIENCE, "the batch judged", |b| {
            b.verdict_count() >= judged
        });
    }
    sent
}

/// The ids of `agent`'s inbox, in its order.
fn ids_in_inbox(bridge: &Bridge, agent: &str) -> Vec<String> {
    bridge
        .lines(agent)
        .iter()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_slice(line).unwrap();
            value["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The ids read from `lines`, `count` of them.
fn ids_from(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    count: usize,
) -> Vec<String> {
    (0..count)
        .map(|_| {
            let value: serde_json::Value =
                serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
            value["envelope"]["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// A `watch --json` into a pipe hands the pipe to the daemon, which prints each message
/// itself and moves the cursor: the watch sleeps, stopped even, and nothing waits for it.
/// The daemon killed, the watch prints again, from where the daemon's record says.
#[test]
fn a_watch_hands_its_pipe_to_the_daemon_and_takes_it_back_when_the_daemon_dies() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start(&bridge, "web");
    daemon.expect_stderr(DELIVERING, PATIENCE);
    // The daemon writes without blocking on a file description of its own: the watch's
    // stdout (and any other writer's to that pipe) blocks as it did.
    let fdinfo = std::fs::read_to_string(format!("/proc/{}/fdinfo/1", watch.id())).unwrap();
    let flags = fdinfo
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .map(|flags| u32::from_str_radix(flags.trim(), 8).unwrap())
        .unwrap();
    assert_eq!(
        flags & 0o4000,
        0,
        "O_NONBLOCK on the watch's stdout: {fdinfo}"
    );
    signal(watch.id(), "STOP");
    let mut printed = Vec::new();
    for id in ["01HANDEDONE", "01HANDEDTWO"] {
        bridge.append_raw("web", note(id).as_bytes());
        printed.push(watch.next(PATIENCE));
    }
    // Read, as a watch reads: another reader finds nothing unread.
    assert!(bridge.read_json("web", &[]).is_empty());
    let log = std::fs::read_to_string(bridge.dir().join(".doorbell/reads/web.jsonl")).unwrap();
    assert!(log.contains("\"via\":\"watch\""), "{log}");
    signal(watch.id(), "CONT");
    daemon.kill();
    for id in ["01ALONE", "01ALONEAGAIN"] {
        bridge.append_raw("web", note(id).as_bytes());
        printed.push(watch.next(PATIENCE));
    }
    assert_eq!(
        printed,
        ["01HANDEDONE", "01HANDEDTWO", "01ALONE", "01ALONEAGAIN"]
    );
}

/// The daemon stopped while it prints for a watch: it hands the pipe back, and the watch
/// goes on from the files; nothing is lost or shown twice.
#[test]
fn a_daemon_that_stops_hands_the_pipe_back() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let watch = Watch::start(&bridge, "web");
    daemon.expect_stderr(DELIVERING, PATIENCE);
    bridge.append_raw("web", note("01BEFORESTOP").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01BEFORESTOP");
    signal(daemon.child.id(), "TERM");
    assert!(daemon.child.wait().unwrap().success());
    bridge.append_raw("web", note("01AFTERSTOP").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01AFTERSTOP");
    assert_eq!(watch.next_within(Duration::from_millis(200)), None);
}

/// A consumer that reads nothing for a while: the daemon's writes to the full pipe wait
/// without holding the judge, and each line comes out once, in order, when it reads.
#[test]
fn a_pipe_that_fills_while_the_daemon_prints_misses_nothing_and_holds_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    // The watch sleeps throughout: only the daemon prints.
    signal(watch.0.id(), "STOP");
    // Far more than the pipe holds (the daemon asks for 1 MiB).
    let sent = send_batches(&bridge, "01P", 40);
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    assert_eq!(ids_from(&mut lines, sent.len()), sent);
    bridge.append_raw("web", note("01PAFTER").as_bytes());
    assert_eq!(ids_from(&mut lines, 1), ["01PAFTER"]);
    signal(watch.0.id(), "CONT");
}

/// A burst from sixteen writers at once: the daemon prints some of it on the judge's thread
/// and some on its socket's, and the watch's pipe gets every line once, in the inbox's
/// order, and the line after the burst after it.
#[test]
fn a_burst_from_many_writers_is_printed_once_each_in_the_inboxs_order() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    std::thread::scope(|scope| {
        for writer in 0..16 {
            let bridge = &bridge;
            scope.spawn(move || {
                for n in 0..100 {
                    bridge.append_raw("web", note(&format!("01B{writer:02}N{n:03}")).as_bytes());
                }
            });
        }
    });
    let in_inbox = ids_in_inbox(&bridge, "web");
    assert_eq!(in_inbox.len(), 1600);
    assert_eq!(ids_from(&mut lines, in_inbox.len()), in_inbox);
    bridge.append_raw("web", note("01BAFTER").as_bytes());
    assert_eq!(ids_from(&mut lines, 1), ["01BAFTER"]);
}

/// The daemon killed again and again while it prints a burst for a watch (on the judge's
/// thread and on its socket's), with writers going on meanwhile: each time the watch takes
/// its pipe back and prints the rest itself. Over the rounds (a daemon and a watch each,
/// the cursor carried from one to the next) its readers get every line once, in the inbox's
/// order.
#[test]
fn a_daemon_killed_again_and_again_while_it_prints_bursts_repeats_and_loses_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut got = Vec::new();
    for round in 0..5_usize {
        let mut daemon = Daemon::start(&bridge, &[]);
        let mut watch = WatchChild::spawn(&bridge, "web");
        daemon.expect_stderr(DELIVERING, PATIENCE);
        let lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
        let (printed, ids) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let value: serde_json::Value = serde_json::from_str(&line).unwrap();
                let id = value["envelope"]["id"].as_str().unwrap().to_owned();
                if printed.send(id).is_err() {
                    return;
                }
            }
        });
        let before = bridge.verdict_count();
        std::thread::scope(|scope| {
            for writer in 0..4 {
                let bridge = &bridge;
                scope.spawn(move || {
                    for n in 0..100 {
                        let id = format!("01K{round}W{writer}N{n:03}");
                        bridge.append_raw("web", note(&id).as_bytes());
                    }
                });
            }
            // Killed once it has judged part of the burst, while the writers write on.
            let part = before + 40 * (round % 4 + 1);
            bridge.wait_for(PATIENCE, "part of the burst judged", |b| {
                b.verdict_count() >= part
            });
            daemon.kill();
        });
        let written = bridge.lines("web").len();
        while got.len() < written {
            let id = ids
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("round {round}: {} of {written} lines", got.len()));
            got.push(id);
        }
        assert!(ids.recv_timeout(Duration::from_millis(100)).is_err());
        let _ = watch.0.kill();
        let _ = watch.0.wait();
    }
    let in_inbox = ids_in_inbox(&bridge, "web");
    assert_eq!(in_inbox.len(), 2000);
    assert_eq!(got, in_inbox);
}

/// A daemon, and a `watch --json` of web whose pipe it prints to.
fn printing_for_watch(bridge: &Bridge) -> (Daemon, WatchChild) {
    let mut daemon = Daemon::start(bridge, &[]);
    let watch = WatchChild::spawn(bridge, "web");
    daemon.expect_stderr(DELIVERING, PATIENCE);
    (daemon, watch)
}

/// A hundred notes of 2 KB, `PREFIX` `BATCH` `N` `n`, their ids added to `sent`.
fn long_batch(prefix: &str, batch: usize, sent: &mut Vec<String>) -> String {
    (0..100)
        .map(|n| {
            let id = format!("{prefix}{batch:02}N{n:03}");
            let line = note_of(&id, "design", "web", 2000);
            sent.push(id);
            line
        })
        .collect()
}

/// The pipe holds the pages the daemon printed from until they are read: a reader that
/// falls a pipe's worth behind, over megabytes, still reads every line whole and in order.
#[test]
fn a_reader_a_pipe_behind_reads_every_line_whole_across_megabytes() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    let mut read = |count: usize, got: &mut Vec<String>| {
        for _ in 0..count {
            let line = lines.next().expect("a line").expect("UTF-8");
            let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!(
                    "{e}: a line printed damaged: {}",
                    &line[..line.len().min(300)]
                )
            });
            got.push(value["envelope"]["id"].as_str().unwrap().to_owned());
        }
    };
    let (mut sent, mut got) = (Vec::new(), Vec::new());
    // 2,400 lines of 2 KB: the reader falls 80 KB further behind with each batch, until the
    // pipe is full, and stays there.
    for batch in 0..24 {
        bridge.append_raw("web", long_batch("01W", batch, &mut sent).as_bytes());
        read(60, &mut got);
    }
    read(sent.len() - got.len(), &mut got);
    assert_eq!(got, sent);
}

/// A daemon under a file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`) that prints
/// past it into a watch's record: the write fails instead of SIGXFSZ killing the daemon. The
/// watch takes its output back and prints on, and the daemon goes on judging.
#[test]
fn a_file_size_limit_reached_while_printing_for_a_watch_stops_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut command = std::process::Command::new("sh");
    bridge.env(&mut command);
    command.args([
        "-c",
        r#"ulimit -f 16384 && exec "$0" daemon"#,
        crate::util::BIN,
    ]);
    let mut daemon = Daemon::spawn(command);
    // 8 MiB in `sh`'s blocks of 512 bytes, 16 MiB in `bash`'s: read, not assumed.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", daemon.child.id())).unwrap();
    let limit: usize = limits
        .lines()
        .find(|l| l.starts_with("Max file size"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .expect("the daemon's file-size limit");
    let watch = Watch::start(&bridge, "web");
    daemon.expect_stderr(DELIVERING, PATIENCE);
    // More than the limit in printed lines of 2 KB: the record's first write past it fails.
    let (mut sent, mut got) = (Vec::new(), Vec::new());
    let batches = limit / (100 * 2000) + 1;
    for batch in 0..batches {
        bridge.append_raw("web", long_batch("01Z", batch, &mut sent).as_bytes());
        while got.len() < sent.len() {
            got.push(watch.next(PATIENCE));
        }
    }
    assert_eq!(got, sent, "every line once, in order");
    daemon.expect_stderr("past the file-size limit", PATIENCE);
    bridge.append_raw("web", note("01AFTER").as_bytes());
    assert_eq!(watch.next(PATIENCE), "01AFTER");
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon is still running"
    );
}

/// A daemon killed in the middle of a burst leaves lines unjudged, and a killed process
/// lets go of its sockets and its lock in no set order: its watch, told it was gone while
/// the lock was still held, went on to watch the files and judged nothing until the next
/// write came. It judges them once the lock goes. (The order is the kernel's: six rounds.)
#[test]
fn a_watch_judges_what_its_killed_daemon_left_unjudged() {
    for round in 0..6 {
        let bridge = Bridge::with_agents(&["web", "design", "human"]);
        let mut daemon = Daemon::start(&bridge, &[]);
        let watch = Watch::start(&bridge, "web");
        daemon.expect_stderr(DELIVERING, PATIENCE);
        let mut sent = Vec::new();
        let burst: String = (0..30).map(|b| long_batch("01K", b, &mut sent)).collect();
        bridge.append_raw("web", burst.as_bytes());
        // The first lines are out: the daemon is in the middle of the burst.
        let mut got = vec![watch.next(PATIENCE)];
        daemon.kill();
        while got.len() < sent.len() {
            got.push(watch.next(PATIENCE));
        }
        assert_eq!(got, sent, "round {round}");
    }
}

/// A line edited in place after it was judged, while a full pipe held it back: the daemon
/// does not print what no longer reads as a message. It hands the pipe back, and the watch
/// passes over the line, as it passes over every damaged line, and prints the rest.
#[test]
fn a_line_damaged_in_place_before_the_daemon_printed_it_is_passed_over() {
    use std::os::unix::fs::FileExt;
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    // The pipe full before the first line: the daemon's first print waits, and every line
    // judged after it waits unprinted (a daemon that prints a step late, behind the judge,
    // would otherwise take the damaged line into a print before the damage).
    let filler = fill_pipe(&watch);
    // 1.6 MB with nobody reading.
    let mut sent = Vec::new();
    for batch in 0..8 {
        bridge.append_raw("web", long_batch("01F", batch, &mut sent).as_bytes());
    }
    // Judged and printed as far as the pipe takes; what comes next waits for it, unread.
    let full = sent.len();
    bridge.wait_for(PATIENCE, "the batches judged", |b| {
        b.verdict_count() >= full
    });
    let start = std::fs::metadata(bridge.inbox("web")).unwrap().len();
    let damaged = note("01DAMAGED");
    bridge.append_raw("web", format!("{damaged}{}", note("01LAST")).as_bytes());
    sent.push("01LAST".into());
    let judged = sent.len() + 1;
    bridge.wait_for(PATIENCE, "all judged", |b| b.verdict_count() >= judged);
    // Its first byte overwritten, in place: the same length, no longer an object.
    let inbox = std::fs::OpenOptions::new()
        .write(true)
        .open(bridge.inbox("web"))
        .unwrap();
    inbox.write_all_at(b"x", start).unwrap();
    drop(inbox);
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    for _ in 0..filler {
        assert_eq!(lines.next().unwrap().unwrap(), "#");
    }
    let got = ids_from(&mut lines, sent.len());
    assert_eq!(got, sent);
    bridge.append_raw("web", note("01AFTER").as_bytes());
    assert_eq!(ids_from(&mut lines, 1), ["01AFTER"]);
}

/// Fill the output pipe of `watch` through a second writer (the pipe opened again through
/// `/proc`) until it takes no more: how many lines of `#` it holds.
fn fill_pipe(watch: &WatchChild) -> usize {
    use rustix::fs::{open, Mode, OFlags};
    let end = open(
        format!("/proc/{}/fd/1", watch.0.id()).as_str(),
        OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    // Writes of at most a page to a pipe go in whole or not at all.
    let page = "#\n".repeat(2048);
    let mut bytes = 0;
    for chunk in [page.as_bytes(), b"#\n"] {
        loop {
            match rustix::io::write(&end, chunk) {
                Ok(n) => {
                    assert_eq!(n, chunk.len(), "a write of at most a page is whole");
                    bytes += n;
                }
                Err(rustix::io::Errno::AGAIN) => break,
                Err(e) => panic!("filling the pipe: {e}"),
            }
        }
    }
    bytes / 2
}

/// The watch killed while the daemon prints for it: the daemon lets the pipe go, so its
/// reader sees the end, as it would have without the daemon.
#[test]
fn a_killed_watch_ends_its_pipe_though_the_daemon_printed_to_it() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    let output = watch.0.stdout.take().unwrap();
    // Each line the pipe's reader gets, then None at its end.
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    bridge.append_raw("web", note("01BEFOREKILL").as_bytes());
    // Killed once the daemon printed for it (waiting on the pipe itself: a `read` of the
    // inbox meanwhile would be another reader, and take the line first when it can).
    let printed = lines.recv_timeout(PATIENCE).expect("the line printed");
    assert!(
        printed
            .as_deref()
            .is_some_and(|l| l.contains("01BEFOREKILL")),
        "{printed:?}"
    );
    watch.0.kill().unwrap();
    watch.0.wait().unwrap();
    assert_eq!(
        lines.recv_timeout(PATIENCE).expect("the pipe ends"),
        None,
        "nothing more, then the end"
    );
}

/// The watch's exit status, waited for on a thread of its own: the test waits for it with a
/// deadline.
fn exit_of(watch: &mut WatchChild) -> std::sync::mpsc::Receiver<std::process::ExitStatus> {
    let (tx, exited) = std::sync::mpsc::channel();
    let mut child = std::mem::replace(
        &mut watch.0,
        std::process::Command::new("true").spawn().unwrap(),
    );
    std::thread::spawn(move || {
        let _ = tx.send(child.wait().unwrap());
    });
    exited
}

/// `doorbell watch web --json | head -n 1`: the reader takes the line the daemon printed and
/// goes away, and nothing more comes. The watch ends all the same, without waiting for a
/// next message to fail to write.
#[test]
fn a_watch_whose_reader_went_away_after_its_last_line_ends() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    let mut head = std::process::Command::new("head")
        .args(["-n", "1"])
        .stdin(std::process::Stdio::from(watch.0.stdout.take().unwrap()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    bridge.append_raw("web", note("01ONLYLINE").as_bytes());
    let exited = exit_of(&mut watch);
    assert!(head.wait().unwrap().success(), "head read the line");
    let status = exited.recv_timeout(PATIENCE).expect("the watch ends");
    assert!(status.success(), "{status:?}");
}

/// The pipe's reader gone while the daemon prints: the watch ends, as it would have.
#[test]
fn a_watch_whose_reader_went_away_ends_though_the_daemon_printed() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    drop(watch.0.stdout.take());
    bridge.append_raw("web", note("01NOBODYREADS").as_bytes());
    let exited = exit_of(&mut watch);
    let status = exited.recv_timeout(PATIENCE).expect("the watch ends");
    assert!(status.success(), "{status:?}");
}

/// The id of the next line `lines` prints, once it is checked to be web's inbox's own line
/// at the offset it names.
#[track_caller]
fn next_as_in_inbox(
    bridge: &Bridge,
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> String {
    let printed: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let offset = usize::try_from(printed["offset"].as_u64().unwrap()).unwrap();
    let inbox = std::fs::read(bridge.inbox("web")).unwrap();
    let end = offset + inbox[offset..].iter().position(|b| *b == b'\n').unwrap();
    let own: serde_json::Value = serde_json::from_slice(&inbox[offset..end]).unwrap();
    assert_eq!(printed["envelope"], own, "the line printed at {offset}");
    printed["envelope"]["id"].as_str().unwrap().to_owned()
}

/// What the daemon prints for a watch as it was judged is what the inbox holds at the
/// offset it names, line for line: accepted lines amid refused ones, blank lines, a run of
/// bad lines and a duplicate, each write judged and printed before the next.
#[test]
fn a_line_printed_as_judged_is_the_inboxs_own_at_its_offset() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let (_daemon, mut watch) = printing_for_watch(&bridge);
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    for i in 0..24 {
        let id = format!("01JUDGED{i:03}");
        let write = match i % 4 {
            0 => note(&id),
            1 => format!("\n{}not json\n{{\n", note(&id)),
            2 => format!("{}{}", note(&format!("01JUDGED{:03}", i - 2)), note(&id)),
            _ => format!("   \n{}\n", note(&id)),
        };
        bridge.append_raw("web", write.as_bytes());
        assert_eq!(next_as_in_inbox(&bridge, &mut lines), id, "write {i}");
    }
    // Nothing else was printed between: not the duplicates, not the refused lines.
    bridge.append_raw("web", note("01JUDGEDLAST").as_bytes());
    assert_eq!(ids_from(&mut lines, 1), ["01JUDGEDLAST"]);
}

/// A response read before its request (the request sits in another inbox, unread yet) is
/// held, and the note written after it judged first: the daemon still prints web's lines
/// once each, in the inbox's order, each the inbox's own bytes at the offset it names.
#[test]
fn a_held_response_and_the_note_after_it_are_printed_in_the_inboxs_order() {
    let bridge = Bridge::with_agents(&["web", "design", "zeta", "human"]);
    let (daemon, mut watch) = printing_for_watch(&bridge);
    let mut lines = BufReader::new(watch.0.stdout.take().unwrap()).lines();
    bridge.append_raw("web", note("01HELDFIRST").as_bytes());
    assert_eq!(ids_from(&mut lines, 1), ["01HELDFIRST"]);
    // Both inboxes written while the daemon cannot look: web's first in its sweep. (Its
    // `signal` waits until the whole process has stopped: a `kill -STOP` returns before.)
    daemon.signal("STOP");
    let answer = format!(
        "{}\n{}",
        line(
            "01HELDANSWER",
            "zeta",
            "web",
            "response",
            r#","correlatesTo":"01HELDASK","state":"working""#
        ),
        note("01HELDAFTER")
    );
    let start = inbox_len(&bridge);
    let after = start + answer.find('\n').unwrap() as u64 + 1;
    bridge.append_raw("web", answer.as_bytes());
    let ask = format!("{}\n", line("01HELDASK", "web", "zeta", "request", ""));
    bridge.append_raw("zeta", ask.as_bytes());
    daemon.signal("CONT");
    for id in ["01HELDANSWER", "01HELDAFTER"] {
        assert_eq!(next_as_in_inbox(&bridge, &mut lines), id);
    }
    // The answer was held: the note after it was journaled first.
    let journaled: Vec<u64> = bridge
        .verdicts()
        .into_iter()
        .filter(|(inbox, offset, ..)| inbox == "web" && *offset >= start)
        .map(|(_, offset, ..)| offset)
        .collect();
    assert_eq!(journaled, [after, start]);
    bridge.append_raw("web", note("01HELDLAST").as_bytes());
    assert_eq!(ids_from(&mut lines, 1), ["01HELDLAST"]);
}
