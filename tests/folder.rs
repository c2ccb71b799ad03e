//! The folder's life (DESIGN §9): what a user's machine does to a bridge folder — copy it,
//! restore it from a backup, move it to another disk — loses nothing from view and repeats
//! nothing.

use std::path::Path;

use crate::util::{line, Bridge};

const PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// `cp -a FROM TO`: every file gets a new inode, the bytes and times stay.
fn copy_folder(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// The folder copied with `cp -a` and the copy put in its place, as a restore from a
/// backup would: every file a new inode, the same bytes.
fn restore_with_new_inodes(bridge: &Bridge) {
    let copy = bridge.tmp.path().join("copy");
    copy_folder(&bridge.dir(), &copy);
    std::fs::remove_dir_all(bridge.dir()).unwrap();
    std::fs::rename(&copy, bridge.dir()).unwrap();
}

#[test]
fn a_copied_or_restored_folder_keeps_every_unread_message_and_repeats_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let first = bridge.send("design", "web", "read before the copy");
    bridge.read_json("web", &[]);
    let unread = bridge.send("design", "web", "unread at the copy");
    // A refused line: its sender (design) is told once.
    bridge.append_raw(
        "web",
        format!("{}\n", line("01BADTO", "design", "nobody", "note", "")).as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    let told = bridge.lines("design").len();
    assert_eq!(told, 1, "one refusal notice before the copy");

    // The copy replaces the original, as a restore from a backup would.
    restore_with_new_inodes(&bridge);

    // The unread message is still unread, and nothing already read comes back.
    assert_eq!(
        unread_of(&bridge, "web"),
        1,
        "status sees the unread message"
    );
    let read = bridge.read_json("web", &[]);
    let ids: Vec<&str> = read
        .iter()
        .map(|m| m["envelope"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [unread.trim()], "read {first} already");
    // No line was judged again: no duplicate verdicts, no second notice.
    let verdicts = bridge.verdicts();
    assert!(
        verdicts.iter().all(|v| v.2 != "duplicate"),
        "lines judged again as duplicates: {verdicts:?}"
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(
        bridge.lines("design").len(),
        told,
        "the refusal was told once"
    );
    // New traffic goes on as before.
    let after = bridge.send("design", "web", "after the restore");
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1);
    assert_eq!(read[0]["envelope"]["id"], after.trim());
}

fn unread_of(bridge: &Bridge, agent: &str) -> u64 {
    let status = bridge.doorbell(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(status.ok()).unwrap();
    status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == agent)
        .unwrap()["unread"]
        .as_u64()
        .unwrap()
}

/// Run `doorbell ARGS` as `nobody`, for whom a file's mode counts (root reads any file).
fn as_nobody(bridge: &Bridge, args: &[&str]) -> crate::util::Run {
    let mut command = std::process::Command::new("setpriv");
    bridge.env(&mut command);
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_doorbell"))
        .args(args);
    crate::util::run(command, None)
}

/// The whole folder belongs to nobody, as a user's own folder belongs to them.
fn give_to_nobody(bridge: &Bridge) {
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(bridge.tmp.path())
        .status()
        .unwrap();
    assert!(chown.success());
}

fn set_mode(bridge: &Bridge, agent: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bridge.inbox(agent), std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn an_unreadable_inbox_is_skipped_and_said_while_every_other_station_works() {
    let bridge = Bridge::with_agents(&["web", "design", "ops", "human"]);
    bridge.send("design", "web", "for web");
    bridge.send("web", "ops", "for ops");
    give_to_nobody(&bridge);
    let mode = |m: u32| set_mode(&bridge, "web", m);
    mode(0o000);
    let once = as_nobody(&bridge, &["daemon", "--once"]);
    assert_eq!(
        once.code, 0,
        "one unreadable inbox stopped the judge: {once:?}"
    );
    assert!(
        once.stderr.contains("web-inbox.jsonl") && once.stderr.contains("cannot read this inbox"),
        "{}",
        once.stderr
    );
    // Everyone else reads, and status works and says what is wrong.
    let read = as_nobody(&bridge, &["read", "ops", "--json"]);
    assert_eq!(read.code, 0, "{read:?}");
    assert_eq!(read.stdout.lines().count(), 1);
    let status = as_nobody(&bridge, &["status"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status.stderr.contains("web's inbox cannot be read"),
        "{}",
        status.stderr
    );
    // Made readable again: its message is judged and shown, nothing lost.
    mode(0o600);
    let read = as_nobody(&bridge, &["read", "web", "--json"]);
    assert_eq!(read.code, 0, "{read:?}");
    assert_eq!(read.stdout.lines().count(), 1, "{}", read.stdout);
}

/// A notice due to an inbox its owner made read-only: the daemon says so once (not at every
/// try, every few seconds for as long as it lasts), and `status` says why the notice waits.
#[test]
fn a_notice_to_an_inbox_that_cannot_be_written_is_said_once_and_in_status() {
    let patience = std::time::Duration::from_secs(20);
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    give_to_nobody(&bridge);
    set_mode(&bridge, "design", 0o400);
    let mut command = std::process::Command::new("setpriv");
    bridge.env(&mut command);
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_doorbell"))
        .arg("daemon");
    let mut daemon = crate::util::Daemon::spawn(command);
    let bad = |n: usize| {
        let line = crate::util::line(&format!("01BAD{n}"), "design", "web", "gossip", "");
        bridge.append_raw("web", format!("{line}\n").as_bytes());
    };
    bad(0);
    let cannot = "design's inbox cannot be written";
    bridge.wait_for(patience, "status to say why the notice waits", |b| {
        as_nobody(b, &["status"]).stderr.contains(cannot)
    });
    // More lines judged: each judging tries the notice again.
    bad(1);
    bad(2);
    bridge.wait_for(patience, "judged", |b| b.verdict_count() == 3);
    daemon.signal("TERM");
    daemon.wait_exit(patience);
    let said = daemon
        .finish_stderr(patience)
        .iter()
        .filter(|l| l.contains("could not write a notice"))
        .count();
    assert_eq!(said, 1, "{:?}", daemon.stderr_so_far());
}

#[test]
fn a_hard_linked_or_renamed_inbox_is_not_judged_again_and_no_sender_is_told_of_refusals() {
    for how in ["hard link", "rename"] {
        let bridge = Bridge::with_agents(&["web", "design", "human"]);
        for n in 0..3 {
            bridge.send("design", "web", &format!("message {n}"));
        }
        bridge.doorbell(&["daemon", "--once"]).ok();
        let judged = bridge.verdicts().len();
        let other = bridge.inbox("frontend");
        match how {
            "hard link" => std::fs::hard_link(bridge.inbox("web"), &other).unwrap(),
            _ => std::fs::rename(bridge.inbox("web"), &other).unwrap(),
        }
        let once = bridge.doorbell(&["daemon", "--once"]);
        assert_eq!(once.code, 0, "{how}: {once:?}");
        assert!(
            once.stderr.contains("web's file under another name"),
            "{how}: {}",
            once.stderr
        );
        // Nothing judged again: no `misaddressed` refusals, no notice to design.
        assert_eq!(
            bridge.verdicts().len(),
            judged,
            "{how}: {:?}",
            bridge.verdicts()
        );
        assert!(
            bridge.lines("design").is_empty(),
            "{how}: design was told of refusals"
        );
        let status = bridge.doorbell(&["status"]);
        assert!(
            status
                .stderr
                .contains("frontend-inbox.jsonl is web's inbox under another name"),
            "{how}: {}",
            status.stderr
        );
    }
}

/// A sender is never told "sent" for a line the judge will refuse: with web's inbox hard-linked
/// as frontend's, a message to frontend would be refused as misaddressed. `doorbell send`
/// refuses it and names the fix, and still sends to web; the shell sender cannot tell which
/// name the judge reads, so it writes to neither. Nothing is written either way.
#[test]
fn no_sender_is_told_sent_for_a_message_to_a_hard_linked_second_name() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.send("design", "web", "before the link");
    bridge.doorbell(&["daemon", "--once"]).ok();
    std::fs::hard_link(bridge.inbox("web"), bridge.inbox("frontend")).unwrap();
    bridge.doorbell(&["daemon", "--once"]).ok();
    let before = bridge.lines("web").len();
    let sent = bridge.doorbell(&["send", "--from", "design", "--to", "frontend", "hello"]);
    assert_ne!(sent.code, 0, "{sent:?}");
    assert!(sent.stdout.is_empty(), "{sent:?}");
    assert!(
        sent.stderr
            .contains("frontend-inbox.jsonl is web's inbox under another name")
            && sent.stderr.contains("nothing was sent"),
        "{sent:?}"
    );
    assert_eq!(bridge.lines("web").len(), before, "nothing written");
    for to in ["frontend", "web"] {
        let shell = bridge.script(&["--from", "design", "--to", to, "hello"], None);
        assert_eq!(shell.code, 2, "{to}: {shell:?}");
        assert!(
            shell.stderr.contains("(a hard link)") && shell.stderr.contains("nothing was written"),
            "{to}: {shell:?}"
        );
    }
    assert_eq!(bridge.lines("web").len(), before, "nothing written");
    // To the name the judge reads, `doorbell send` goes on sending, and it is accepted.
    let to_web = bridge.send("design", "web", "after the link");
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert!(
        bridge
            .verdicts()
            .iter()
            .all(|(_, _, verdict, _)| verdict == "accepted"),
        "{to_web}: {:?}",
        bridge.verdicts()
    );
}

#[test]
fn a_megabyte_of_blank_lines_is_one_refused_fragment_not_hundreds_of_megabytes() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut bytes = b"\n".repeat(1 << 20);
    bytes.extend_from_slice(b"  \t\r\n");
    bridge.append_raw("web", &bytes);
    let after = bridge.send("design", "web", "after the blanks");
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert!(
        once.stderr
            .contains("judged 2 lines: 1 accepted, 0 duplicate, 1 refused"),
        "{}",
        once.stderr
    );
    let state: u64 = std::fs::read_dir(bridge.dir().join(".doorbell"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        state < 256 * 1024,
        "1 MiB of blank lines made {state} bytes of state"
    );
    let verdicts = bridge.verdicts();
    assert_eq!(
        verdicts[0],
        (
            "web".to_owned(),
            0,
            "refused".to_owned(),
            Some("bad-json".to_owned())
        )
    );
    // The message after them reads as ever; the blanks are never shown.
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1);
    assert_eq!(read[0]["envelope"]["id"], after.trim());
}

#[test]
fn a_process_holding_an_inbox_lock_stops_neither_the_judge_nor_a_sender_for_good() {
    let bridge = Bridge::with_agents(&["web", "design", "ops", "human"]);
    // A refused line from web: its notice is due in web's own inbox.
    bridge.append_raw(
        "design",
        format!(
            "{}\n",
            line("01BADPRIO", "web", "design", "note", r#","priority":9"#)
        )
        .as_bytes(),
    );
    // Another process holds web's inbox lock and hangs.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .open(bridge.inbox("web"))
        .unwrap();
    held.lock().unwrap();
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let mut daemon = daemon;
    daemon.expect_stderr(
        "another process holds this inbox's lock",
        std::time::Duration::from_secs(30),
    );
    // Everything else is judged meanwhile.
    let id = bridge.send("design", "ops", "judged while web is locked");
    let watch = crate::util::Watch::start(&bridge, "ops");
    assert_eq!(watch.next(std::time::Duration::from_secs(30)), id.trim());
    // Senders to web get a clear error instead of hanging.
    let started = std::time::Instant::now();
    let sent = bridge.doorbell(&["send", "--from", "design", "--to", "web", "hello?"]);
    assert_eq!(sent.code, 1, "{sent:?}");
    assert!(
        sent.stderr.contains("locked by another process"),
        "{}",
        sent.stderr
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let script = bridge.script(&["--from", "design", "--to", "web", "--", "hello?"], None);
    assert_eq!(script.code, 1, "{script:?}");
    assert!(
        script.stderr.contains("locked by another process"),
        "{}",
        script.stderr
    );
    // Released: the notice is written, once, by the judge's own retries (every 2 s, however
    // many failed while the lock was held), nothing else coming to wake it.
    drop(held);
    daemon.expect_stderr("lock was released", std::time::Duration::from_secs(10));
    drop(watch);
    daemon.kill();
    let notices = bridge
        .lines("web")
        .iter()
        .filter(|l| String::from_utf8_lossy(l).contains("01BADPRIO"))
        .count();
    assert_eq!(notices, 1, "the refusal notice, written once");
}

/// Every id in `name`'s inbox with how often it appears.
fn id_counts(bridge: &Bridge, name: &str) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for bytes in bridge.lines(name) {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            if let Some(id) = value["id"].as_str() {
                *counts.entry(id.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// A bridge whose judge has rung, escalated, refused a line and told its sender, then
/// stopped; the config's path.
fn rung_and_stopped(bridge: &Bridge) -> String {
    let config = bridge.tmp.path().join("doorbell.toml");
    std::fs::write(
        &config,
        "[debts]\nring_after = \"1s\"\nbackoff = 1.0\nmax_rings = 1\nstalled_after = \"1s\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    bridge
        .doorbell(&[
            "send", "--to", "web", "--from", "design", "--kind", "request", "--id", "01HQREQ1",
            "the ETA?",
        ])
        .ok();
    bridge.send("web", "design", "an early note");
    bridge.append_raw(
        "web",
        format!("{}\n", line("01BADTO", "design", "nobody", "note", "")).as_bytes(),
    );
    let daemon = crate::util::Daemon::start(bridge, &["--config", &config]);
    // A second refusal once the first is told: two notices, which a rebuild must not merge
    // into a third.
    let notices = |b: &Bridge| {
        id_counts(b, "design")
            .keys()
            .filter(|id| id.starts_with("bridge:refused:"))
            .count()
    };
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the first notice",
        |b| notices(b) == 1,
    );
    bridge.append_raw(
        "web",
        format!("{}\n", line("01BADTO2", "design", "nobody", "note", "")).as_bytes(),
    );
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the second notice",
        |b| notices(b) == 2,
    );
    // The escalation and both notices read back and accepted: the kill interrupts nothing.
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "a ring, an escalation and the notices, judged",
        |b| {
            let journal = std::fs::read_to_string(b.dir().join(".doorbell/journal.jsonl"))
                .unwrap_or_default();
            let accepted: Vec<String> = journal
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|r| r["v"] == "a")
                .filter_map(|r| r["a"]["id"].as_str().map(str::to_owned))
                .collect();
            accepted.iter().any(|id| id.starts_with("escalation:"))
                && accepted
                    .iter()
                    .filter(|id| id.starts_with("bridge:refused:"))
                    .count()
                    == 2
        },
    );
    daemon.kill();
    config
}

/// Every id in the inboxes, with how often it appears.
fn everything_once(bridge: &Bridge) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    for name in ["web", "design", "human"] {
        for (id, n) in id_counts(bridge, name) {
            out.push((name.to_owned(), id, n));
        }
    }
    out
}

/// The last verdict the journal holds for each line, by (inbox, offset).
fn last_verdicts(
    bridge: &Bridge,
) -> std::collections::BTreeMap<(String, u64), (String, Option<String>)> {
    bridge
        .verdicts()
        .into_iter()
        .map(|(inbox, offset, verdict, reason)| ((inbox, offset), (verdict, reason)))
        .collect()
}

/// The refused log's entries, as (inbox, generation, offset), in order.
fn refused_log(bridge: &Bridge) -> Vec<(String, u64, u64)> {
    std::fs::read_to_string(bridge.dir().join(".doorbell/refused.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                r["inbox"].as_str().unwrap().to_owned(),
                r["generation"].as_u64().unwrap(),
                r["offset"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_lost_or_damaged_journal_repeats_no_ring_notice_or_verdict() {
    for damage in [
        "delete",
        "delete with the index",
        "truncate",
        "flip",
        "delete with the key",
        "the whole state folder",
    ] {
        let bridge = Bridge::with_agents(&["web", "design", "human"]);
        let config = rung_and_stopped(&bridge);
        let before = everything_once(&bridge);
        assert!(before.iter().all(|(_, _, n)| *n == 1), "{before:?}");
        let verdicts = last_verdicts(&bridge);
        let refusals = refused_log(&bridge);
        let state = bridge.dir().join(".doorbell");
        let journal = state.join("journal.jsonl");
        let bytes = std::fs::read(&journal).unwrap();
        let mut flipped = bytes.clone();
        match damage {
            "delete" => std::fs::remove_file(&journal).unwrap(),
            "delete with the index" => {
                std::fs::remove_file(&journal).unwrap();
                for file in ["index.db", "index.db-wal", "index.db-shm"] {
                    let _ = std::fs::remove_file(state.join(file));
                }
            }
            "truncate" => std::fs::write(&journal, &bytes[..bytes.len() / 3]).unwrap(),
            // The key made again: the judge's lines sealed under the lost one are still its.
            "delete with the key" => {
                std::fs::remove_file(&journal).unwrap();
                std::fs::remove_file(state.join("seal.key")).unwrap();
            }
            "the whole state folder" => std::fs::remove_dir_all(&state).unwrap(),
            _ => {
                // One bit of a ring's id in its intent: still valid JSON, a wrong id.
                let at = flipped.windows(5).position(|w| w == b"ring:").unwrap() + 7;
                flipped[at] ^= 1;
                std::fs::write(&journal, &flipped).unwrap();
            }
        }
        let once = bridge.doorbell(&["daemon", "--once", "--config", &config]);
        assert_eq!(once.code, 0, "{damage}: {once:?}");
        // Nothing written twice: every ring, escalation, notice and message once.
        assert_eq!(
            everything_once(&bridge),
            before,
            "{damage}: {}",
            once.stderr
        );
        // Every line has the verdict it had; the judge's own lines are not `borrowed-name`.
        assert_eq!(
            last_verdicts(&bridge),
            verdicts,
            "{damage}: {}",
            once.stderr
        );
        assert_eq!(
            refused_log(&bridge),
            refusals,
            "{damage}: each refusal logged once"
        );
        // What it found and what it did, said once.
        let said = once
            .stderr
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .filter(|l| !l.contains("cutting a torn record"))
            .count();
        let expected = match damage {
            "delete with the index" => 0,
            "delete with the key" => 2,
            _ => 1,
        };
        assert_eq!(said, expected, "{damage}: {}", once.stderr);
        if damage == "flip" {
            let kept: Vec<_> = std::fs::read_dir(&state)
                .unwrap()
                .filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("journal.damaged-")
                })
                .collect();
            assert_eq!(kept.len(), 1, "the damaged part is kept");
            let kept = std::fs::read(kept[0].path()).unwrap();
            assert!(
                !kept.is_empty() && flipped.ends_with(&kept),
                "the kept part is the journal's tail, from the damaged record"
            );
        }
        // And the bridge goes on: the request is still owed, and a new one is judged.
        let debts = bridge.doorbell(&["debts", "--json"]).ok().to_owned();
        assert!(debts.contains("01HQREQ1"), "{damage}: {debts}");
        bridge.send("design", "web", "after the damage");
        let read = bridge.read_json("web", &[]);
        assert_eq!(
            read.last().unwrap()["envelope"]["message"]["parts"][0]["text"],
            "after the damage",
            "{damage}"
        );
    }
}

#[test]
fn a_damaged_index_row_is_found_by_its_checksum_and_the_index_rebuilt() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let id = bridge.send("design", "web", "where the row points");
    let id = id.trim();
    bridge.doorbell(&["daemon", "--once"]).ok();
    // One value of one row changed, as a flipped byte would: the row still reads.
    let index = bridge.dir().join(".doorbell/index.db");
    let script = format!(
        "import sqlite3; c = sqlite3.connect({:?}); c.execute(\"UPDATE messages SET offset = offset + 7 WHERE id = '{id}'\"); c.commit()",
        index.to_str().unwrap()
    );
    let status = std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(status.success());
    // The reader that finds it says so, and shows nothing wrong.
    let found = bridge.doorbell(&["show", id]);
    assert_ne!(
        found.code, 0,
        "a damaged row was taken for a fact: {found:?}"
    );
    assert!(
        found.stderr.contains("checksum does not match"),
        "{}",
        found.stderr
    );
    // The next command's judge rebuilds the index from the journal; all is as before.
    let shown = bridge.doorbell(&["show", id]);
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(
        shown.stderr.contains("rebuilding it from the journal"),
        "{}",
        shown.stderr
    );
    assert!(
        shown.stdout.contains("where the row points"),
        "{}",
        shown.stdout
    );
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1);
    assert_eq!(read[0]["envelope"]["id"], id);
}

#[test]
fn an_inbox_renamed_away_and_back_under_a_running_daemon_changes_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.send("design", "web", "before");
    bridge.send("web", "design", "before too");
    let mut daemon = crate::util::Daemon::start(&bridge, &[]);
    bridge.wait_for(std::time::Duration::from_secs(20), "both judged", |b| {
        b.verdict_count() == 2
    });
    let away = bridge.inbox("mirror");
    let mark = daemon.stderr_mark();
    std::fs::rename(bridge.inbox("web"), &away).unwrap();
    daemon.expect_stderr_since(
        mark,
        "file under another name",
        std::time::Duration::from_secs(20),
    );
    // Back, and at once a line from web in design's inbox: the judge, stopped meanwhile,
    // wakes to both at once, and reads design's inbox first.
    daemon.signal("STOP");
    std::fs::rename(&away, bridge.inbox("web")).unwrap();
    bridge.append_raw(
        "design",
        format!("{}\n", line("01AFTERFROMWEB", "web", "design", "note", "")).as_bytes(),
    );
    bridge.append_raw(
        "web",
        format!("{}\n", line("01AFTERTOWEB", "design", "web", "note", "")).as_bytes(),
    );
    daemon.signal("CONT");
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "both new lines judged",
        |b| b.verdict_count() == 4,
    );
    // Before: the line from web was refused `unknown-sender`, web not yet a station again.
    let verdicts = bridge.verdicts();
    assert!(
        verdicts.iter().all(|v| v.2 == "accepted"),
        "{verdicts:?}\n{:?}",
        daemon.stderr_so_far()
    );
    daemon.kill();
}

#[test]
fn a_hard_link_that_outlives_a_replacement_of_the_inbox_is_not_judged_as_a_new_one() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    for n in 0..3 {
        bridge.send("design", "web", &format!("message {n}"));
    }
    bridge.doorbell(&["daemon", "--once"]).ok();
    std::fs::hard_link(bridge.inbox("web"), bridge.inbox("frontend")).unwrap();
    // web's file is replaced (a rename over it): the link keeps the old one.
    let fresh = bridge.dir().join("web-inbox.jsonl.new");
    std::fs::write(&fresh, b"").unwrap();
    std::fs::rename(&fresh, bridge.inbox("web")).unwrap();
    bridge.send("design", "web", "to the new file");
    // The judge that sees the new file first still knows the old one as web's current
    // file; the next one knows it only as an earlier one.
    bridge.doorbell(&["daemon", "--once"]).ok();
    bridge.send("design", "web", "and one more");
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    assert!(
        once.stderr.contains("web's file under another name"),
        "{}",
        once.stderr
    );
    // Before: its three lines refused as `misaddressed`, and design told so.
    let verdicts = bridge.verdicts();
    assert!(
        verdicts.iter().all(|v| v.0 != "frontend"),
        "the old file was judged as a new inbox: {verdicts:?}"
    );
    assert!(
        bridge.lines("design").is_empty(),
        "design was told of refusals"
    );
    let read = bridge.read_json("web", &[]);
    assert_eq!(
        read.last().unwrap()["envelope"]["message"]["parts"][0]["text"],
        "and one more"
    );
}

#[test]
fn an_answer_to_a_request_in_an_unreadable_inbox_waits_instead_of_being_refused() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.append_raw(
        "web",
        format!("{}\n", line("01ASKWEB", "design", "web", "request", "")).as_bytes(),
    );
    bridge.append_raw(
        "design",
        format!(
            "{}\n",
            line(
                "01WEBANSWERS",
                "web",
                "design",
                "response",
                r#","correlatesTo":"01ASKWEB","state":"working""#
            )
        )
        .as_bytes(),
    );
    give_to_nobody(&bridge);
    let mode = |m: u32| set_mode(&bridge, "web", m);
    mode(0o000);
    let once = as_nobody(&bridge, &["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    // The request may be in the inbox that cannot be read: the answer waits, unjudged, and
    // web is told nothing (before: refused `unknown-request`, and web told so).
    assert_eq!(bridge.verdicts(), [], "{}", once.stderr);
    assert!(bridge.lines("web").len() == 1, "web was told of a refusal");
    mode(0o600);
    let once = as_nobody(&bridge, &["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    let verdicts = bridge.verdicts();
    assert_eq!(verdicts.len(), 2, "{verdicts:?}");
    assert!(verdicts.iter().all(|v| v.2 == "accepted"), "{verdicts:?}");
}

#[test]
fn a_damaged_journal_after_a_sealed_segment_is_cut_once_and_rebuilt() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.send("design", "web", "in the sealed segment");
    bridge.doorbell(&["daemon", "--once"]).ok();
    bridge.doorbell(&["compact"]).ok();
    // The live journal grows well past the sealed segment's length.
    for n in 0..20 {
        bridge.send("design", "web", &format!("in the live journal {n}"));
    }
    bridge.doorbell(&["daemon", "--once"]).ok();
    let before = everything_once(&bridge);
    let verdicts = last_verdicts(&bridge);
    let state = bridge.dir().join(".doorbell");
    for file in ["index.db", "index.db-wal", "index.db-shm"] {
        let _ = std::fs::remove_file(state.join(file));
    }
    // A byte of the live journal's last record.
    let journal = state.join("journal.jsonl");
    let mut bytes = std::fs::read(&journal).unwrap();
    let at = bytes.len() - 20;
    bytes[at] ^= 0x04;
    std::fs::write(&journal, &bytes).unwrap();
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    assert_eq!(everything_once(&bridge), before);
    assert_eq!(last_verdicts(&bridge), verdicts, "{}", once.stderr);
    // One cut, at the damaged record (before: a second cut, at the sealed segment's length,
    // as the retry read the live journal from the wrong place).
    let kept = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("journal.damaged-")
        })
        .count();
    assert_eq!(kept, 1, "{}", once.stderr);
}

/// A line of a replaced inbox's old file that waits for its request while the new file
/// begins the next generation is judged at the end of the sweep, and its verdict counts:
/// it used to be journaled and then ignored as a stray of an older generation, so its
/// sender was never told (and an accepted one never reached the ledger).
#[test]
fn a_held_line_of_a_replaced_inbox_is_judged_and_its_sender_told() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let patience = std::time::Duration::from_secs(20);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    bridge.send("design", "web", "in the old file");
    bridge.wait_for(patience, "the first line judged", |b| {
        b.verdict_count() == 1
    });
    daemon.signal("STOP");
    let held = line(
        "01HELDINTHEOLDFILE",
        "design",
        "web",
        "response",
        r#","correlatesTo":"01NOSUCHREQUEST","state":"completed""#,
    );
    bridge.append_raw("web", format!("{held}\n").as_bytes());
    let fresh = bridge.dir().join(".web-inbox.jsonl.new");
    let note = line("01INTHENEWFILE", "design", "web", "note", "");
    std::fs::write(&fresh, format!("{note}\n")).unwrap();
    std::fs::rename(&fresh, bridge.inbox("web")).unwrap();
    daemon.signal("CONT");
    bridge.wait_for(patience, "design told of its refused line", |b| {
        b.lines("design")
            .iter()
            .any(|l| String::from_utf8_lossy(l).contains("01HELDINTHEOLDFILE"))
    });
    let refused: Vec<_> = bridge
        .journal()
        .into_iter()
        .filter(|r| r["v"] == "r")
        .map(|r| (r["id"].clone(), r["reason"].clone()))
        .collect();
    assert_eq!(
        refused,
        [("01HELDINTHEOLDFILE".into(), "unknown-request".into())],
        "{refused:?}"
    );
    assert!(bridge
        .read_json("web", &[])
        .iter()
        .any(|m| m["envelope"]["id"] == "01INTHENEWFILE"));
    daemon.kill();
}

/// A daemon a restore stopped: it says `said` and exits 1. Then a message is sent, a daemon
/// started again, and what `web` reads: that message's id, and the ids read, in order.
fn stopped_and_started_again(
    bridge: &Bridge,
    mut daemon: crate::util::Daemon,
    said: &str,
) -> (String, Vec<String>) {
    let patience = std::time::Duration::from_secs(20);
    daemon.expect_stderr(said, patience);
    assert_eq!(
        daemon.wait_exit(patience),
        Some(1),
        "stopped, to be started again"
    );
    let after = bridge.send("design", "web", "after");
    let _again = crate::util::Daemon::start(bridge, &[]);
    (after, bridge.read_ids("web"))
}

/// `.doorbell/` restored from a backup while the daemon runs: its lock file is a new one,
/// which any other judge may take. The daemon sees the folder go (or its lock replaced, at
/// its next sweep), says so and stops (exit 1, so systemd starts it again), rather than
/// judge on into files nobody reads.
/// Started again, it judges from the restored state, and each message is read once.
#[test]
fn a_state_folder_restored_under_the_daemon_stops_it() {
    let patience = std::time::Duration::from_secs(20);
    let bridge = Bridge::with_agents(&["web", "design"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let first = bridge.send("design", "web", "one");
    bridge.wait_for(patience, "one judged", |b| b.verdict_count() == 1);
    let state = bridge.dir().join(".doorbell");
    let backup = bridge.tmp.path().join("state-backup");
    copy_folder(&state, &backup);
    let second = bridge.send("design", "web", "two");
    bridge.wait_for(patience, "two judged", |b| b.verdict_count() == 2);
    // The restore: the folder as it was, every file a new one.
    std::fs::remove_dir_all(&state).unwrap();
    copy_folder(&backup, &state);
    let (third, read) = stopped_and_started_again(&bridge, daemon, "while this judge ran");
    assert_eq!(read, [first, second, third]);
}

/// The journal restored from a backup while the daemon runs, the lock file kept (`rsync`
/// skips what did not change; `cp -a backup/. folder/` writes into the files in place):
/// the daemon's journal is no longer what it wrote. It stops at its next sweep (exit 1);
/// started again, it judges from the restored state: each message read once, nobody told
/// a refusal.
#[test]
fn a_journal_restored_under_the_daemon_with_the_lock_kept_stops_it() {
    let patience = std::time::Duration::from_secs(20);
    for how in ["copied into", "renamed over"] {
        let bridge = Bridge::with_agents(&["web", "design"]);
        let daemon = crate::util::Daemon::start(&bridge, &[]);
        let first = bridge.send("design", "web", "one");
        bridge.wait_for(patience, "one judged", |b| b.verdict_count() == 1);
        let journal = bridge.dir().join(".doorbell/journal.jsonl");
        let backup = bridge.tmp.path().join("journal.backup");
        std::fs::copy(&journal, &backup).unwrap();
        let second = bridge.send("design", "web", "two");
        bridge.wait_for(patience, "two judged", |b| b.verdict_count() == 2);
        if how == "copied into" {
            std::fs::copy(&backup, &journal).unwrap();
        } else {
            let beside = bridge.dir().join(".doorbell/journal.restored");
            std::fs::copy(&backup, &beside).unwrap();
            std::fs::rename(&beside, &journal).unwrap();
        }
        // The next line's sweep finds it.
        let third = bridge.send("design", "web", "three");
        let (after, read) =
            stopped_and_started_again(&bridge, daemon, "was replaced while this judge ran");
        assert_eq!(read, [first, second, third, after], "{how}");
        assert!(
            bridge.read_json("design", &[]).is_empty(),
            "{how}: a notice"
        );
    }
}

/// The journal restored under the daemon while nothing arrives, a ring due: the ring's own
/// turn finds it, before it journals the ring past what the restore left. (The restore must
/// come before the ring is due: 5 s leaves room for a test thread held up under load.)
#[test]
fn a_journal_restored_under_the_daemon_is_found_by_a_ring_due_with_nothing_arriving() {
    let patience = std::time::Duration::from_secs(20);
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.config("[debts]\nring_after = \"5s\"\n");
    let mut daemon = crate::util::Daemon::start(&bridge, &[]);
    let journal = bridge.dir().join(".doorbell/journal.jsonl");
    let backup = bridge.tmp.path().join("journal.backup");
    std::fs::copy(&journal, &backup).unwrap();
    bridge.request("design", "web", "ETA?");
    bridge.wait_for(patience, "the request judged", |b| b.verdict_count() == 1);
    std::fs::copy(&backup, &journal).unwrap();
    daemon.expect_stderr("was replaced while this judge ran", patience);
    assert_eq!(daemon.wait_exit(patience), Some(1));
    assert!(
        !std::fs::read_to_string(bridge.inbox("web"))
            .unwrap()
            .contains("\"debt-loop\""),
        "rung from a journal restored under it"
    );
}

/// The whole folder restored from a backup while the daemon runs (`rm -rf`, then the copy
/// in its place): the watch ended with the folder, so no event would ever come again. The
/// daemon sees the folder go, stops (exit 1), and started again judges what is there, each
/// message read once.
#[test]
fn a_whole_folder_restored_under_the_daemon_stops_it() {
    let patience = std::time::Duration::from_secs(20);
    let bridge = Bridge::with_agents(&["web", "design"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let first = bridge.send("design", "web", "one");
    bridge.wait_for(patience, "one judged", |b| b.verdict_count() == 1);
    let backup = bridge.tmp.path().join("backup");
    copy_folder(&bridge.dir(), &backup);
    std::fs::remove_dir_all(bridge.dir()).unwrap();
    copy_folder(&backup, &bridge.dir());
    let (second, read) = stopped_and_started_again(&bridge, daemon, "while this judge ran");
    assert_eq!(read, [first, second]);
}

/// An inbox restored to an older copy and then written on with lines of the same length and
/// text as those the restore took away (a bot's fixed notes; ids are of one width) ends where
/// the judge stopped, with the same last bytes but for the last line's id. The judge knows it
/// is another file by that line: the new messages are judged and read, each once.
#[test]
fn an_inbox_restored_and_written_on_to_the_same_length_is_not_taken_for_the_old() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    for _ in 0..23 {
        bridge.send("human", "web", "ok");
    }
    let inbox = bridge.inbox("web");
    let backup = bridge.tmp.path().join("web-inbox.backup");
    std::fs::copy(&inbox, &backup).unwrap();
    for _ in 0..2 {
        bridge.send("human", "web", "ok");
    }
    assert_eq!(bridge.read_json("web", &[]).len(), 25);
    // The restore, then two more of the same: the inbox is as long as before the restore.
    let before = std::fs::metadata(&inbox).unwrap().len();
    std::fs::copy(&backup, &inbox).unwrap();
    let new: Vec<String> = (0..2).map(|_| bridge.send("human", "web", "ok")).collect();
    assert_eq!(
        std::fs::metadata(&inbox).unwrap().len(),
        before,
        "the same length"
    );
    assert_eq!(bridge.read_ids("web"), new, "the new messages, once");
    for id in &new {
        bridge.doorbell(&["show", id]).ok();
    }
}

/// A restored inbox (new inode) whose marked bytes went with the journal's lost last
/// record: its last accepted line, found whole at its offset by its fingerprint, and each
/// line judged after it, found by its bytes, say it is the same inbox and nothing is judged
/// again. A file with another message there is a new generation, its message accepted, even
/// when the refused line after it is the same (a refused line's bytes, `not json`, can be
/// any file's); so is one whose refused line is another, or became a message. A run of lines
/// that name nobody, refused as one, is known again line by line the same way.
#[test]
fn an_inbox_whose_mark_was_lost_is_known_by_its_last_lines_judged_and_only_by_them() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Case {
        Same,
        SameAfterRefused,
        OtherLine,
        OtherLineThenRefused,
        RefusedChanged,
        RefusedAfter,
        SameAfterRun,
        RunChanged,
    }
    for case in [
        Case::Same,
        Case::SameAfterRefused,
        Case::OtherLine,
        Case::OtherLineThenRefused,
        Case::RefusedChanged,
        Case::RefusedAfter,
        Case::SameAfterRun,
        Case::RunChanged,
    ] {
        let bridge = Bridge::with_agents(&["web", "human"]);
        let id = bridge.send("human", "web", "ok");
        let after: &[u8] = match case {
            Case::Same | Case::OtherLine => b"",
            // Lines that name nobody, refused as one run.
            Case::SameAfterRun | Case::RunChanged => b"not json\n\n{}\nnot json\n",
            _ => b"not json\n",
        };
        bridge.append_raw("web", after);
        bridge.doorbell(&["daemon", "--once"]).ok();
        let journal =
            std::fs::read_to_string(bridge.dir().join(".doorbell/journal.jsonl")).unwrap();
        let last = journal.lines().last().unwrap();
        let record: serde_json::Value = serde_json::from_str(last).unwrap();
        assert_eq!(
            (record["v"].as_str(), record["in"].as_str()),
            (Some("m"), Some("web")),
            "{case:?}: the last record marks the bytes judged: {last}"
        );
        assert!(record["marker"].is_object(), "{last}");

        restore_with_new_inodes(&bridge);
        let inbox = bridge.inbox("web");
        let bytes = std::fs::read_to_string(&inbox).unwrap();
        // What is put in the inbox's place, as a new file.
        let (replaced, new) = match case {
            Case::Same | Case::SameAfterRefused | Case::SameAfterRun => (None, None),
            Case::RunChanged => {
                // The run's last line another of the same length.
                let at = bytes.rfind("not json\n").unwrap();
                let changed = format!("{}NOT JSON\n", &bytes[..at]);
                (Some(changed), Some(id.clone()))
            }
            Case::OtherLine | Case::OtherLineThenRefused => {
                // Another message of the same length where the last one was.
                let last = if id.ends_with('X') { 'Y' } else { 'X' };
                let other = format!("{}{last}", &id[..id.len() - 1]);
                (Some(bytes.replace(&id, &other)), Some(other))
            }
            Case::RefusedChanged => {
                // Another refused line of the same length where the refused one was.
                (
                    Some(bytes.replace("not json\n", "NOT JSON\n")),
                    Some(id.clone()),
                )
            }
            Case::RefusedAfter => {
                // The refused line taken out, and a message written after.
                let kept = bytes.replace("not json\n", "");
                let later = line("01LATER", "human", "web", "note", "");
                (Some(format!("{kept}{later}\n")), Some("01LATER".to_owned()))
            }
        };
        if let Some(replaced) = replaced {
            let path = bridge.tmp.path().join("web-inbox.new");
            std::fs::write(&path, replaced).unwrap();
            std::fs::rename(&path, &inbox).unwrap();
        }
        lose_the_journals_last_record(&bridge);
        let once = bridge.doorbell(&["daemon", "--once"]);
        assert_eq!(once.code, 0, "{once:?}");
        let gens = generations(&bridge, "web");
        let read = bridge.read_ids("web");
        match (case, new) {
            (Case::Same | Case::SameAfterRefused | Case::SameAfterRun, _) | (_, None) => {
                assert_eq!(gens, [0].into(), "the same inbox: {}", once.stderr);
                assert_eq!(read, [id], "shown once");
            }
            (Case::OtherLine | Case::OtherLineThenRefused, Some(other)) => {
                assert_eq!(gens, [0, 1].into(), "a new generation: {}", once.stderr);
                assert_eq!(read, [other], "the new file's message");
            }
            (Case::RefusedChanged | Case::RunChanged, Some(_)) => {
                assert_eq!(gens, [0, 1].into(), "a new generation: {}", once.stderr);
                assert_eq!(read, [id], "the message once: {}", once.stderr);
            }
            (Case::RefusedAfter, Some(later)) => {
                assert_eq!(gens, [0, 1].into(), "a new generation: {}", once.stderr);
                assert_eq!(read, [id, later], "each message once: {}", once.stderr);
            }
        }
    }
}

/// A restored inbox whose newest mark was lost, an older one kept: the older mark knows the
/// bytes up to itself only, and the lines judged since are found again by the last one
/// accepted. The same file keeps its generation; a file with another message after the
/// older mark is a new generation, and its message is judged, not passed over as judged.
#[test]
fn an_inbox_whose_newest_mark_was_lost_is_known_by_the_lines_judged_since_the_mark_before() {
    for other in [false, true] {
        let bridge = Bridge::with_agents(&["web", "human"]);
        let first = bridge.send("human", "web", "one");
        bridge.doorbell(&["daemon", "--once"]).ok();
        let second = bridge.send("human", "web", "two");
        bridge.doorbell(&["daemon", "--once"]).ok();
        let journal_path = bridge.dir().join(".doorbell/journal.jsonl");
        let journal = std::fs::read_to_string(&journal_path).unwrap();
        let marks: Vec<serde_json::Value> = journal
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["v"] == "m" && r["in"] == "web" && r["marker"].is_object())
            .collect();
        assert_eq!(marks.len(), 2, "a mark after each message: {journal}");
        let last = journal.lines().last().unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(last).unwrap(),
            marks[1]
        );

        restore_with_new_inodes(&bridge);
        let inbox = bridge.inbox("web");
        let mut expected = vec![first.clone(), second.clone()];
        if other {
            // Another message of the same length where the second was.
            let last = if second.ends_with('X') { 'Y' } else { 'X' };
            let replacement = format!("{}{last}", &second[..second.len() - 1]);
            let bytes = std::fs::read_to_string(&inbox).unwrap();
            let path = bridge.tmp.path().join("web-inbox.new");
            std::fs::write(&path, bytes.replace(&second, &replacement)).unwrap();
            std::fs::rename(&path, &inbox).unwrap();
            expected[1] = replacement;
        }
        // The last record, the newest mark, lost.
        lose_the_journals_last_record(&bridge);
        let once = bridge.doorbell(&["daemon", "--once"]);
        assert_eq!(once.code, 0, "{once:?}");
        let gens = generations(&bridge, "web");
        let expected_gens = if other { [0, 1].into() } else { [0].into() };
        assert_eq!(gens, expected_gens, "other {other}: {}", once.stderr);
        assert_eq!(
            bridge.read_ids("web"),
            expected,
            "each message once: {}",
            once.stderr
        );
    }
}

/// The journal's last record lost, and the index that held what it said.
fn lose_the_journals_last_record(bridge: &Bridge) {
    let path = bridge.dir().join(".doorbell/journal.jsonl");
    let journal = std::fs::read_to_string(&path).unwrap();
    let last = journal.lines().last().unwrap();
    std::fs::write(&path, &journal[..journal.len() - last.len() - 1]).unwrap();
    for file in ["index.db", "index.db-wal", "index.db-shm"] {
        let _ = std::fs::remove_file(bridge.dir().join(".doorbell").join(file));
    }
}

/// Lines that name `id` in `agent`'s inbox: the notices that told of it.
fn notices_naming(bridge: &Bridge, agent: &str, id: &str) -> usize {
    bridge
        .lines(agent)
        .iter()
        .filter(|l| String::from_utf8_lossy(l).contains(id))
        .count()
}

/// An inbox restored to an older copy is read again as a new generation. Its refused lines
/// are refused again, but their senders were told once already: a second notice for the same
/// line at the same place would repeat a message. A new refusal after the restore is told.
/// Judged by `daemon --once` runs (the first refusal saved in the index) and by one running
/// daemon (the first refusal not saved yet when the restore is read).
#[test]
fn an_inbox_restored_to_an_older_copy_tells_no_sender_twice_of_the_same_refused_line() {
    let patience = std::time::Duration::from_secs(20);
    for live in [false, true] {
        let bridge = Bridge::with_agents(&["web", "design", "human"]);
        let daemon = live.then(|| crate::util::Daemon::start(&bridge, &[]));
        let judge = |what: &str, done: &dyn Fn(&Bridge) -> bool| {
            if live {
                bridge.wait_for(patience, what, |b| done(b));
            } else {
                let once = bridge.doorbell(&["daemon", "--once"]);
                assert_eq!(once.code, 0, "{once:?}");
                assert!(done(&bridge), "{what}");
            }
        };
        bridge.send("design", "web", "before the bad line");
        let bad = line("01BADKINDBEFORETHEBACKUP", "design", "web", "gossip", "");
        bridge.append_raw("web", format!("{bad}\n").as_bytes());
        judge("the first refusal told", &|b| {
            notices_naming(b, "design", "01BADKINDBEFORETHEBACKUP") == 1
        });
        let inbox = bridge.inbox("web");
        let backup = bridge.tmp.path().join("web-inbox.backup");
        std::fs::copy(&inbox, &backup).unwrap();
        bridge.send("design", "web", "after the backup");
        judge("the third line judged", &|b| {
            b.verdicts().iter().filter(|v| v.0 == "web").count() == 3
        });
        // The restore as a backup tool does it: a new file renamed over the inbox.
        let restored = bridge.dir().join(".web-inbox.jsonl.restore");
        std::fs::copy(&backup, &restored).unwrap();
        std::fs::rename(&restored, &inbox).unwrap();
        let fresh = line("01BADKINDAFTERTHERESTORE", "design", "web", "gossip", "");
        bridge.append_raw("web", format!("{fresh}\n").as_bytes());
        judge("the new refusal told", &|b| {
            notices_naming(b, "design", "01BADKINDAFTERTHERESTORE") == 1
        });
        assert_eq!(
            notices_naming(&bridge, "design", "01BADKINDBEFORETHEBACKUP"),
            1,
            "live: {live}: told again of a line it was told of"
        );
        // Both refusals of the old line are on record, each in its generation.
        let refused: Vec<_> = bridge
            .journal()
            .into_iter()
            .filter(|r| r["v"] == "r" && r["id"] == "01BADKINDBEFORETHEBACKUP")
            .map(|r| r["g"].as_u64().unwrap_or(0))
            .collect();
        assert_eq!(refused, [0, 1], "live: {live}: {refused:?}");
        if let Some(daemon) = daemon {
            daemon.kill();
        }
    }
}

/// `status` says when an inbox began a new generation, and when the file is shorter than
/// what was judged of the one before: messages after the backup are gone from it, which a
/// person should know rather than find in the daemon's log.
/// A message read before its inbox was rewritten (`sed -i 1d`: a new file in its place):
/// `show` says it was read, in an earlier file of the inbox, as `status` and `read` agree;
/// not "not read yet" at a byte the new file holds another line at.
#[test]
fn show_says_a_message_read_before_its_inbox_was_rewritten_was_read_there() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let ids: Vec<String> = (1..=3)
        .map(|n| bridge.send("design", "web", &format!("m{n}")))
        .collect();
    assert_eq!(bridge.read_json("web", &[]).len(), 3);
    let inbox = bridge.inbox("web");
    let text = std::fs::read_to_string(&inbox).unwrap();
    let rewritten = bridge.dir().join(".web-inbox.sed");
    std::fs::write(&rewritten, text.split_once('\n').unwrap().1).unwrap();
    std::fs::rename(&rewritten, &inbox).unwrap();
    assert!(bridge.read_json("web", &[]).is_empty(), "read before");
    let shown: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["show", &ids[1], "--json"]).ok()).unwrap();
    assert_eq!(shown["read"], true, "{shown}");
    let text = bridge.doorbell(&["show", &ids[1]]);
    assert!(
        text.ok()
            .contains("in an earlier file of web-inbox.jsonl (replaced since),"),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains("not read yet"), "{}", text.stdout);
}

#[test]
fn status_says_an_inbox_was_restored_to_an_older_copy() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.send("design", "web", "kept by the backup");
    let inbox = bridge.inbox("web");
    let backup = bridge.tmp.path().join("web-inbox.backup");
    std::fs::copy(&inbox, &backup).unwrap();
    bridge.send("design", "web", "lost with the restore");
    bridge.send("web", "design", "an answer");
    assert_eq!(bridge.doorbell(&["daemon", "--once"]).code, 0);
    let status = bridge.doorbell(&["status"]);
    assert!(!status.stderr.contains("restored"), "{}", status.stderr);
    let restored = bridge.dir().join(".web-inbox.jsonl.restore");
    std::fs::copy(&backup, &restored).unwrap();
    std::fs::rename(&restored, &inbox).unwrap();
    assert_eq!(bridge.doorbell(&["daemon", "--once"]).code, 0);
    let status = bridge.doorbell(&["status"]);
    assert!(
        status
            .stderr
            .contains("web's inbox was truncated, replaced or restored"),
        "{}",
        status.stderr
    );
    assert!(
        status
            .stderr
            .contains("some of its lines are no longer in it (restored from an older copy"),
        "{}",
        status.stderr
    );
    // web read nothing of the file replaced: it is told what it will not be shown.
    assert!(
        status
            .stderr
            .contains("web had not read all of the file before, and is not shown what of it is no longer in the file"),
        "{}",
        status.stderr
    );
    assert!(
        !status.stderr.contains("design's inbox was"),
        "{}",
        status.stderr
    );
    // Written on past where the file before was judged to: the lines are no more in it than
    // they were, and it is still said.
    for n in 0..3 {
        bridge.send("design", "web", &format!("after the restore {n}"));
    }
    assert_eq!(bridge.doorbell(&["daemon", "--once"]).code, 0);
    let status = bridge.doorbell(&["status"]);
    assert!(
        status
            .stderr
            .contains("; other lines stand now where the file before was judged ("),
        "{}",
        status.stderr
    );
    assert!(
        status
            .stderr
            .contains("bytes): some of its lines are no longer in it"),
        "{}",
        status.stderr
    );
    assert!(
        status
            .stderr
            .contains("web had not read all of the file before"),
        "{}",
        status.stderr
    );
}

/// A notice the start-up catch-up could not write, because another process held the
/// sender's inbox lock, is written once the lock goes, with nothing else arriving to wake
/// the judge.
#[test]
fn a_notice_held_back_at_start_up_is_written_when_the_lock_goes() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let bad = line("01BADATSTARTUP", "design", "web", "gossip", "");
    bridge.append_raw("web", format!("{bad}\n").as_bytes());
    let held = std::fs::OpenOptions::new()
        .read(true)
        .open(bridge.inbox("design"))
        .unwrap();
    held.lock().unwrap();
    let mut daemon = crate::util::Daemon::start(&bridge, &[]);
    daemon.expect_stderr(
        "another process holds this inbox's lock",
        std::time::Duration::from_secs(30),
    );
    drop(held);
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "design told of its refused line",
        |b| notices_naming(b, "design", "01BADATSTARTUP") == 1,
    );
    daemon.kill();
}

/// Only a refusal made before word for word goes untold after a new generation: a line at
/// the same place with the same id but another fault is told, and so is any line without an
/// id (a notice could not tell it from the earlier one).
#[test]
fn a_new_fault_at_the_same_place_after_a_truncation_is_told() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let gossip = line("01SAMEIDANOTHERFAULT", "design", "web", "gossip", "");
    let idless = r#"{"from":"design","to":"web","kind":"note","text":"first"}"#;
    bridge.append_raw("web", format!("{gossip}\n{idless}\n").as_bytes());
    assert_eq!(bridge.doorbell(&["daemon", "--once"]).code, 0);
    let told = |b: &Bridge| b.lines("design").len();
    assert_eq!(told(&bridge), 1, "one notice for both refusals");
    // The inbox emptied (`: > web-inbox.jsonl`), then lines as long as the first two, in
    // the same places, each with a fault of its own.
    std::fs::write(bridge.inbox("web"), b"").unwrap();
    assert_eq!(bridge.doorbell(&["daemon", "--once"]).code, 0);
    let other = line("01SAMEIDANOTHERFAULT", "design", "web", "notice", "");
    let idless_too = r#"{"from":"design","to":"web","kind":"note","text":"other"}"#;
    assert_eq!(other.len(), gossip.len());
    assert_eq!(idless_too.len(), idless.len());
    bridge.append_raw("web", format!("{other}\n{idless_too}\n").as_bytes());
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    let notices = bridge.lines("design");
    assert_eq!(notices.len(), 2, "a second notice");
    let last = String::from_utf8_lossy(&notices[1]).into_owned();
    assert!(last.contains("'notice'"), "{last}");
    assert!(last.contains("2 lines"), "both refusals told: {last}");
}

/// `status` says what no reader shows: an inbox whose last line has had no newline for a
/// while, and an inbox locked by another process while the bridge's notices wait for it,
/// naming the process.
#[test]
fn status_names_an_unfinished_line_and_a_lock_that_holds_notices_back() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let complete = line("01COMPLETELINE", "design", "web", "note", "");
    bridge.append_raw("web", format!("{complete}\n").as_bytes());
    let status = bridge.doorbell(&["status"]);
    assert!(!status.stderr.contains("unfinished"), "{}", status.stderr);
    let unfinished = line("01NONEWLINEYET", "design", "web", "note", "");
    bridge.append_raw("web", unfinished.as_bytes());
    // Just written: a writer may be between the bytes of its line.
    let status = bridge.doorbell(&["status"]);
    assert!(!status.stderr.contains("unfinished"), "{}", status.stderr);
    bridge.age_inbox("web", 60);
    let status = bridge.doorbell(&["status"]);
    assert!(
        status.stderr.contains(&format!(
            "web's inbox ends in an unfinished line ({} bytes with no newline, last written 1 min",
            unfinished.len()
        )),
        "{}",
        status.stderr
    );
    // A refusal whose notice cannot go in: design's inbox is locked by this process (a
    // shared lock is enough to keep a notice out).
    let bad = line("01BADWHILELOCKED", "design", "human", "gossip", "");
    bridge.append_raw("human", format!("{bad}\n").as_bytes());
    let held = std::fs::File::open(bridge.inbox("design")).unwrap();
    held.lock_shared().unwrap();
    assert_eq!(bridge.doorbell(&["daemon", "--once"]).code, 0);
    let status = bridge.doorbell(&["status"]);
    let holder = format!(
        "design's inbox is locked by another process (pid {}",
        std::process::id()
    );
    assert!(status.stderr.contains(&holder), "{}", status.stderr);
    assert!(
        status.stderr.contains("1 line the bridge wrote for it"),
        "{}",
        status.stderr
    );
    drop(held);
    assert_eq!(bridge.doorbell(&["daemon", "--once"]).code, 0);
    assert_eq!(notices_naming(&bridge, "design", "01BADWHILELOCKED"), 1);
    let status = bridge.doorbell(&["status"]);
    assert!(!status.stderr.contains("is locked"), "{}", status.stderr);
}

/// A sender that writes to a file named close to an inbox (`Web-inbox.jsonl`,
/// `web-inbox.json`) writes where nothing reads: `status` names the file and the inbox it
/// was likely meant to be, so the message is not left unseen. A copy of an inbox
/// (`web-inbox.jsonl.bak`) and an empty file are no such mistake.
#[test]
fn status_names_a_file_named_close_to_an_inbox_that_nothing_reads() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let line = line("01NEARMISS", "design", "web", "note", "");
    for name in ["Web-inbox.jsonl", "web-inbox.json", "web-inbox.jsonl.bak"] {
        std::fs::write(bridge.dir().join(name), format!("{line}\n")).unwrap();
    }
    std::fs::write(bridge.dir().join("Design-inbox.jsonl"), "").unwrap();
    let status = bridge.doorbell(&["status"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    for name in ["Web-inbox.jsonl", "web-inbox.json"] {
        let warning = status
            .stderr
            .lines()
            .find(|l| l.contains(&format!("/{name} is no inbox")))
            .unwrap_or_else(|| panic!("no warning for {name}: {}", status.stderr));
        assert!(
            warning.contains("was it meant to be web-inbox.jsonl?"),
            "{warning}"
        );
    }
    for name in ["web-inbox.jsonl.bak", "Design-inbox.jsonl"] {
        assert!(
            !status.stderr.contains(&format!("/{name} is no inbox")),
            "{}",
            status.stderr
        );
    }
}

/// An inbox rewritten with a line before its reader's cursor removed (`sed -i`, with or without
/// a daemon): the file is new, its lines are duplicates of the old file's. Those the reader
/// had read stay read; those it had not are shown, once each, never hidden.
#[test]
fn an_inbox_rewritten_before_its_cursor_still_shows_what_was_unread_and_only_that() {
    for daemon in [false, true] {
        let bridge = Bridge::with_agents(&["web", "design"]);
        let running = daemon.then(|| crate::util::Daemon::start(&bridge, &[]));
        bridge.append_raw("web", b"garbage the sender never meant\n");
        let texts = ["one", "two", "three"];
        let shown = || bridge.read_ids("web");
        // "one" is read; "two" and "three" are not.
        let mut ids = vec![bridge.send("design", "web", texts[0])];
        if daemon {
            // `read` shows what the daemon judged so far: the line once it has a verdict.
            bridge.wait_for(
                std::time::Duration::from_secs(20),
                "the first line judged",
                |b| b.verdict_count() == 2,
            );
        }
        assert_eq!(shown(), ids, "daemon {daemon}");
        ids.extend(texts[1..].iter().map(|t| bridge.send("design", "web", t)));
        // All judged (and unread) before the rewrite.
        if daemon {
            bridge.wait_for(
                std::time::Duration::from_secs(20),
                "the lines judged",
                |b| b.verdict_count() == 1 + texts.len(),
            );
        } else {
            bridge.doorbell(&["daemon", "--once"]).ok();
        }
        // The garbage line goes, as `sed -i 1d` does it: a new file in the inbox's place.
        let inbox = bridge.inbox("web");
        let bytes = std::fs::read(&inbox).unwrap();
        let rest = &bytes[bytes.iter().position(|b| *b == b'\n').unwrap() + 1..];
        let tmp = bridge.dir().join("web-inbox.sed");
        std::fs::write(&tmp, rest).unwrap();
        std::fs::rename(&tmp, &inbox).unwrap();
        if daemon {
            bridge.wait_for(
                std::time::Duration::from_secs(20),
                "the rewritten inbox judged",
                |b| b.verdict_count() == 4 + texts.len(),
            );
        }
        assert_eq!(shown(), ids[1..], "daemon {daemon}");
        assert!(shown().is_empty(), "daemon {daemon}: shown twice");
        drop(running);
    }
}

/// A copy shown again after a rewrite is no second message: the request it carries, answered
/// before, stays answered, and its id is claimed once.
#[test]
fn a_copy_shown_again_after_a_rewrite_is_no_second_message() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let asked = bridge.request("design", "web", "which colour?");
    bridge.reply(&asked, "web", "completed", &[], "navy");
    bridge.doorbell(&["daemon", "--once"]).ok();
    // A line put in front: a new file, the request a copy in it; web never read it.
    let inbox = bridge.inbox("web");
    let mut bytes = b"a line in front\n".to_vec();
    bytes.extend(std::fs::read(&inbox).unwrap());
    let tmp = bridge.dir().join("web-inbox.new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, &inbox).unwrap();
    let shown: Vec<serde_json::Value> = bridge.read_json("web", &[]);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0]["envelope"]["id"], asked.as_str());
    let debts = bridge.doorbell(&["debts", "--json"]);
    assert_eq!(debts.ok().trim(), r#"{"debts":[]}"#);
    let show: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["show", &asked, "--json"]).ok()).unwrap();
    assert_eq!(show["state"], "completed", "{show}");
}

#[test]
fn an_empty_inbox_restored_before_its_first_line_keeps_its_generation_through_a_lost_journal() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    // The judge knows every inbox, empty.
    bridge.doorbell(&["daemon", "--once"]).ok();
    restore_with_new_inodes(&bridge);
    // The first line of a restored (new inode) inbox, refused: its sender is told.
    bridge.append_raw(
        "web",
        format!("{}\n", line("01BADTO", "design", "nobody", "note", "")).as_bytes(),
    );
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    assert!(
        !once.stderr.contains("WARN"),
        "nothing was replaced: {}",
        once.stderr
    );
    let refusals = refused_log(&bridge);
    assert_eq!(refusals, [("web".to_owned(), 0, 0)]);
    assert_eq!(notices_naming(&bridge, "design", "01BADTO"), 1);

    // A judge that lost its journal and index reads the same files afresh: the same
    // refusal, under the same generation, is neither logged nor told again.
    let state = bridge.dir().join(".doorbell");
    for file in ["journal.jsonl", "index.db", "index.db-wal", "index.db-shm"] {
        let _ = std::fs::remove_file(state.join(file));
    }
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert_eq!(once.code, 0, "{once:?}");
    assert_eq!(refused_log(&bridge), refusals, "each refusal logged once");
    assert_eq!(notices_naming(&bridge, "design", "01BADTO"), 1, "told once");
}

/// A `watch` waiting for its reader's turn while its empty inbox is replaced: the judge goes
/// on with the new file as the same generation, and the watch reads that file, not the one
/// it had open.
#[test]
fn a_watch_waiting_for_its_turn_reads_the_new_file_of_an_inbox_replaced_before_its_first_line() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let _daemon = crate::util::Daemon::start(&bridge, &[]);
    // Another reader of web holds its turn.
    let reads = bridge.dir().join(".doorbell/reads");
    std::fs::create_dir_all(&reads).unwrap();
    let held = std::fs::File::create(reads.join("web.lock")).unwrap();
    held.lock().unwrap();
    let watch = crate::util::Watch::start(&bridge, "web");
    crate::util::wait_in_proc(PATIENCE, "the watch to open web's inbox and lock", || {
        crate::util::has_open(watch.id(), "web-inbox.jsonl")
            && crate::util::has_open(watch.id(), "reads/web.lock")
    });
    // The empty inbox is replaced, and the new file's first line judged.
    std::fs::remove_file(bridge.inbox("web")).unwrap();
    bridge.doorbell(&["agent", "add", "web"]).ok();
    let first = bridge.send("design", "web", "L1 first");
    let first = first.trim();
    bridge.wait_for(PATIENCE, "the first line judged", |b| {
        b.verdicts()
            .iter()
            .any(|v| v.0 == "web" && v.2 == "accepted")
    });
    drop(held);
    let second = bridge.send("design", "web", "L2 second");
    assert_eq!(watch.next(PATIENCE), first);
    assert_eq!(watch.next(PATIENCE), second.trim());
    assert!(bridge.read_json("web", &[]).is_empty(), "both read once");
}

/// Whether process `pid` holds `path` open, for appending when `append` (a sender opens an
/// inbox for appending only to write its line; `sh` opens it on fd 9 for reading, to lock).
fn holds_open(pid: u32, path: &Path, append: bool) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        let flags = || {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .unwrap_or(0)
        };
        std::fs::read_link(fd.path()).is_ok_and(|target| target == path)
            && (!append || flags() & 0o2000 != 0)
    })
}

#[test]
fn a_sender_waiting_for_the_lock_of_an_inbox_rotated_meanwhile_writes_to_the_new_file() {
    for script in [false, true] {
        let bridge = Bridge::with_agents(&["web", "design"]);
        let inbox = bridge.inbox("design");
        let held = std::fs::File::open(&inbox).unwrap();
        held.lock().unwrap();
        let args = ["--from", "web", "--to", "design", "--", "hello design"];
        let mut command = if script {
            bridge.script_command(&args)
        } else {
            let mut send = vec!["send"];
            send.extend(args);
            bridge.command(&send)
        };
        let sender = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = sender.id();
        crate::util::wait_in_proc(
            std::time::Duration::from_secs(20),
            "the sender to open the inbox and wait for its lock",
            || holds_open(pid, &inbox, !script),
        );
        // Rotated while the sender waits: the old file renamed away, a new one in its place.
        let rotated = bridge.dir().join("design-inbox.jsonl.1");
        std::fs::rename(&inbox, &rotated).unwrap();
        std::fs::File::create(&inbox).unwrap();
        drop(held);
        let out = sender.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "script {script}: {stderr}");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let new = std::fs::read_to_string(&inbox).unwrap();
        assert!(
            new.contains(&id),
            "script {script}: not in the inbox: {new:?}"
        );
        assert_eq!(std::fs::read(&rotated).unwrap(), b"", "script {script}");
        let shown = bridge.doorbell(&["show", &id]);
        assert_eq!(shown.code, 0, "script {script}: {shown:?}");
    }
}

#[test]
fn a_line_written_through_a_hard_link_of_an_inbox_is_judged_as_that_inbox_s_at_once() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "before the link");
    let _daemon = crate::util::Daemon::start(&bridge, &[]);
    bridge.wait_for(std::time::Duration::from_secs(20), "the first line", |b| {
        b.verdicts().len() == 1
    });
    std::fs::hard_link(bridge.inbox("web"), bridge.inbox("frontend")).unwrap();
    bridge.append_raw(
        "frontend",
        format!("{}\n", line("01VIATHELINK", "design", "web", "note", "")).as_bytes(),
    );
    // Nothing else is written: the write under the other name must be enough.
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the line written through the link, judged as web's",
        |b| {
            b.verdicts().iter().any(|(inbox, offset, verdict, _)| {
                inbox == "web" && *offset > 0 && verdict == "accepted"
            })
        },
    );
}

#[test]
fn senders_wait_for_a_held_inbox_lock_as_long_as_their_timeout_says() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let asked = bridge.request("web", "design", "ETA?");
    let held = std::fs::File::open(bridge.inbox("web")).unwrap();
    held.lock().unwrap();
    let sent = bridge.doorbell(&[
        "send",
        "--from",
        "design",
        "--to",
        "web",
        "--timeout",
        "300ms",
        "hello?",
    ]);
    let replied = bridge.doorbell(&[
        "reply",
        &asked,
        "--from",
        "design",
        "--state",
        "working",
        "--timeout",
        "300ms",
        "on it",
    ]);
    for run in [sent, replied] {
        assert_eq!(run.code, 1, "{run:?}");
        assert!(
            run.stderr.contains("locked by another process for 0.3 s"),
            "{}",
            run.stderr
        );
    }
    let bad = bridge.doorbell(&[
        "send",
        "--from",
        "design",
        "--to",
        "web",
        "--timeout",
        "soon",
        "x",
    ]);
    assert_eq!(bad.code, 2, "{bad:?}");
    let script = bridge.script(
        &[
            "--from",
            "design",
            "--to",
            "web",
            "--timeout",
            "0.3",
            "--",
            "hello?",
        ],
        None,
    );
    assert_eq!(script.code, 1, "{script:?}");
    assert!(
        script
            .stderr
            .contains("locked by another process for 0.3 s"),
        "{}",
        script.stderr
    );
    let bad = bridge.script(&["--to", "web", "--timeout", "soon", "x"], None);
    assert_eq!(bad.code, 2, "{bad:?}");
    drop(held);
    assert!(bridge
        .lines("web")
        .iter()
        .all(|l| !String::from_utf8_lossy(l).contains("on it")));
}

/// The texts of what `agent` reads now.
/// The generations the journal's records of `inbox` name.
fn generations(bridge: &Bridge, inbox: &str) -> std::collections::BTreeSet<u64> {
    bridge
        .journal()
        .iter()
        .filter(|r| r["in"] == inbox)
        .map(|r| r["g"].as_u64().unwrap_or(0))
        .collect()
}

fn read_texts(bridge: &Bridge, agent: &str) -> Vec<String> {
    bridge
        .read_json(agent, &[])
        .iter()
        .map(|r| {
            r["envelope"]["message"]["parts"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// An inbox's older bytes come back after a file in between that its reader never read (a
/// backup restored after a truncation, an inbox renamed back after a new one was made): what
/// the reader had not read of the older file is shown from its copy, once, and what the
/// file in between held is said lost, never "read". Both were hidden: the cursor's offset,
/// of the older file, was taken for one in the file in between.
#[test]
fn unread_lines_come_back_with_their_file_after_a_file_in_between() {
    // A backup restored after a truncation, with no daemon.
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.send("design", "web", "m1");
    assert_eq!(read_texts(&bridge, "web"), ["m1"]);
    bridge.send("design", "web", "m2 unread");
    bridge.doorbell(&["status"]).ok();
    let backup = std::fs::read(bridge.inbox("web")).unwrap();
    std::fs::write(bridge.inbox("web"), b"").unwrap();
    let m3 = bridge.send("design", "web", "m3 in between");
    bridge.doorbell(&["status"]).ok();
    std::fs::write(bridge.inbox("web"), &backup).unwrap();
    let status = bridge.doorbell(&["status"]);
    status.ok();
    assert!(
        status
            .stderr
            .contains("web had read none of the file before"),
        "{}",
        status.stderr
    );
    assert_eq!(read_texts(&bridge, "web"), ["m2 unread"]);
    assert!(read_texts(&bridge, "web").is_empty(), "shown once");
    let shown = bridge.doorbell(&["show", &m3]);
    assert!(shown.ok().contains("not read yet"), "{}", shown.stdout);

    // An inbox renamed away, a new one made and written, then the first renamed back.
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.send("design", "web", "m1");
    assert_eq!(read_texts(&bridge, "web"), ["m1"]);
    bridge.send("design", "web", "m2 unread");
    let away = bridge.dir().join("web-away.jsonl");
    std::fs::rename(bridge.inbox("web"), &away).unwrap();
    bridge.doorbell(&["agent", "add", "web"]).ok();
    bridge.send("design", "web", "m3 in between");
    std::fs::rename(&away, bridge.inbox("web")).unwrap();
    bridge.send("design", "web", "m4");
    assert_eq!(read_texts(&bridge, "web"), ["m2 unread", "m4"]);
}
