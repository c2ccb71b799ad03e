//! Two bridges in two folders, one conversation (DESIGN §11): bridge A has the station
//! `design` and the remote `web`; bridge B has the station `web` and the remote `design`.
//! Each serves its station over A2A to the other. Both run the real daemon; the exchange goes across, debts and rings hold
//! on both sides, and SIGKILLs of either daemon lose and repeat nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::util::{run_within, Bridge, Daemon};

const TOKEN: &str = "design-at-b-0123456789";

/// Bridge A (design's) and bridge B (web's), configured for each other, and B's port.
struct Pair {
    a: Bridge,
    b: Bridge,
    /// Where A's and B's gateways listen.
    ports: (u16, u16),
    /// Each port held until its side first starts, so that no other test's gateway takes
    /// it meanwhile (a side not yet started must be unreachable, not someone else).
    held: Mutex<(Option<OwnedFd>, Option<OwnedFd>)>,
}

/// The token both sides share, in a file of `bridge`'s (mode 0600).
fn token_file(bridge: &Bridge) -> std::path::PathBuf {
    let token = bridge.tmp.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    token
}

/// A port no other test of this run is given, held by a socket bound to it that does not
/// listen: a connection to it is refused, as to a station that is down, and no one else can
/// bind it until the socket is dropped.
fn free_port() -> (u16, OwnedFd) {
    use rustix::net::{bind, getsockname, socket_with, AddressFamily, SocketFlags, SocketType};
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        // Close-on-exec: a daemon started meanwhile must not hold it past its drop.
        let flags = SocketFlags::CLOEXEC;
        let socket = socket_with(AddressFamily::INET, SocketType::STREAM, flags, None).unwrap();
        bind(
            &socket,
            &std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0),
        )
        .unwrap();
        let address = getsockname(&socket).unwrap();
        let port = std::net::SocketAddr::try_from(address).unwrap().port();
        if GIVEN.lock().unwrap().insert(port) {
            return (port, socket);
        }
    }
}

impl Pair {
    fn new(debts: &str) -> Pair {
        Pair::knowing_web_as("web", debts)
    }

    /// A pair where A knows B's station `web` under the name `alias`.
    fn knowing_web_as(alias: &str, debts: &str) -> Pair {
        let a = Bridge::with_agents(&["design", "human"]);
        let b = Bridge::with_agents(&["web", "human"]);
        let ((port_a, held_a), (port_b, held_b)) = (free_port(), free_port());
        let ports = (port_a, port_b);
        // Each side's remote is a station on the other bridge, and calls this one: one
        // token, held by both, says so both ways.
        for (bridge, remote, far, port, theirs) in [
            (&a, alias, "web", ports.0, ports.1),
            (&b, "design", "design", ports.1, ports.0),
        ] {
            let remote =
                format!("name = \"{remote}\"\nurl = \"http://127.0.0.1:{theirs}/a2a/{far}\"");
            let listen = format!("[a2a]\nlisten = \"127.0.0.1:{port}\"\n");
            let token = token_file(bridge);
            bridge.config(&format!(
                "{listen}[[remote]]\n{remote}\ntoken_file = \"{}\"\n{debts}\n",
                token.display()
            ));
        }
        Pair {
            a,
            b,
            ports,
            held: Mutex::new((Some(held_a), Some(held_b))),
        }
    }

    fn start(bridge: &Bridge, port: u16) -> Daemon {
        let mut daemon = Daemon::start(bridge, &[]);
        let line = daemon.expect_stderr("serving A2A on", Duration::from_secs(10));
        assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
        daemon
    }

    fn start_a(&self) -> Daemon {
        drop(self.held.lock().unwrap().0.take());
        Pair::start(&self.a, self.ports.0)
    }

    fn start_b(&self) -> Daemon {
        drop(self.held.lock().unwrap().1.take());
        Pair::start(&self.b, self.ports.1)
    }
}

/// `debts --json` of a bridge: (request, debtor, creditor, state, rings) per debt.
fn debts(bridge: &Bridge) -> Vec<(String, String, String, String, u64)> {
    let doc: Value = serde_json::from_str(bridge.doorbell(&["debts", "--json"]).ok()).unwrap();
    doc["debts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let s = |k: &str| d[k].as_str().unwrap().to_owned();
            (
                s("request"),
                s("debtor"),
                s("creditor"),
                s("state"),
                d["rings"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The station's side: wait for what arrives for `agent`, as its agent would.
fn read_wait(bridge: &Bridge, agent: &str) -> Vec<Value> {
    bridge
        .doorbell(&["read", agent, "--wait", "--timeout", "30s", "--json"])
        .ok()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["envelope"].clone())
        .collect()
}

/// How many times each id occurs among an inbox's lines.
fn ids(bridge: &Bridge, inbox: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for line in bridge.lines(inbox) {
        let value: Value = serde_json::from_slice(&line).unwrap();
        *seen
            .entry(value["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    seen
}

#[test]
fn the_seed_exchange_goes_across_with_debts_and_rings_on_both_sides() {
    let pair = Pair::new("[debts]\nring_after = \"2s\"\n");
    let _b = pair.start_b();
    let _a = pair.start_a();
    let id = pair.a.request("design", "web", "ETA for the footer?");
    // It arrives at web's station on B, from design, once.
    let arrived = read_wait(&pair.b, "web");
    assert_eq!(arrived.len(), 1, "{arrived:?}");
    assert_eq!(
        (&arrived[0]["id"], &arrived[0]["from"]),
        (&Value::from(id.clone()), &Value::from("design"))
    );
    assert_eq!(
        arrived[0]["message"]["parts"][0]["text"],
        "ETA for the footer?"
    );
    // Both sides: web owes design.
    for bridge in [&pair.a, &pair.b] {
        let owed = debts(bridge);
        assert_eq!(owed.len(), 1, "{owed:?}");
        assert_eq!(
            (owed[0].0.as_str(), owed[0].1.as_str(), owed[0].2.as_str()),
            (id.as_str(), "web", "design")
        );
    }
    // web stays silent: B's doorbell rings web.
    let rung = read_wait(&pair.b, "web");
    assert_eq!(rung[0]["from"], "debt-loop", "{rung:?}");
    assert_eq!(rung[0]["correlatesTo"], Value::from(id.clone()));
    assert!(debts(&pair.b)[0].4 >= 1);
    // web answers working, then completed; design's wait on A ends completed.
    pair.b.reply(&id, "web", "working", &[], "on it");
    pair.b.reply(
        &id,
        "web",
        "completed",
        &["--data", r#"{"eta":"Friday"}"#],
        "Friday",
    );
    let waited = pair.a.doorbell(&["wait", &id, "--timeout", "30s"]);
    assert_eq!(waited.code, 0, "{}{}", waited.stdout, waited.stderr);
    assert!(waited.stdout.contains("completed"), "{}", waited.stdout);
    let answers = read_wait(&pair.a, "design");
    let said: Vec<(&str, &str)> = answers
        .iter()
        .map(|m| {
            (
                m["state"].as_str().unwrap(),
                m["message"]["parts"][0]["text"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(said, [("working", "on it"), ("completed", "Friday")]);
    assert_eq!(answers[1]["message"]["parts"][1]["data"]["eta"], "Friday");
    assert!(answers.iter().all(|m| m["from"] == "web"));
    assert!(debts(&pair.a).is_empty());
    assert!(debts(&pair.b).is_empty());
}

#[test]
fn the_other_bridge_asks_too() {
    let pair = Pair::new("");
    let _a = pair.start_a();
    let _b = pair.start_b();
    // web on B asks design on A; design answers on A; web's wait on B ends completed.
    let id = pair.b.request("web", "design", "the logo, SVG or PNG?");
    let arrived = read_wait(&pair.a, "design");
    assert_eq!(
        (&arrived[0]["id"], &arrived[0]["from"]),
        (&Value::from(id.clone()), &Value::from("web"))
    );
    pair.a.reply(&id, "design", "completed", &[], "SVG");
    let waited = pair.b.doorbell(&["wait", &id, "--timeout", "30s"]);
    assert_eq!(waited.code, 0, "{}{}", waited.stdout, waited.stderr);
    let answer = read_wait(&pair.b, "web");
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(answer[0]["message"]["parts"][0]["text"], "SVG");
    assert!(debts(&pair.a).is_empty());
    assert!(debts(&pair.b).is_empty());
}

#[test]
fn a_line_the_far_bridge_refuses_is_said_in_status() {
    let pair = Pair::new("");
    let mut a = pair.start_a();
    let _b = pair.start_b();
    // On B the token names design: a request from human on A cannot be from human there.
    let id = pair.a.request("human", "web", "who is on call?");
    a.expect_stderr("refused a line", Duration::from_secs(20));
    let said = pair.a.doorbell(&["status"]).stderr;
    assert!(said.contains("refused 1 line since"), "{said}");
    assert!(said.contains(&id), "{said}");
    assert!(!ids(&pair.b, "web").contains_key(&id));
}

/// A note about a task goes across from either side, while the task is open and after it
/// closed, once: the station's notes to the requester come by its bridge's forwarder, not
/// only while the requester's bridge still asks the far task for news.
#[test]
fn notes_about_a_task_cross_both_ways_before_and_after_it_closes() {
    let pair = Pair::new("");
    let _b = pair.start_b();
    let _a = pair.start_a();
    let id = pair.a.request("design", "web", "the logo files?");
    read_wait(&pair.b, "web");
    let note = |bridge: &Bridge, from: &str, to: &str, text: &str| {
        bridge
            .doorbell(&[
                "send",
                "--to",
                to,
                "--from",
                from,
                "--kind",
                "note",
                "--correlates-to",
                &id,
                text,
            ])
            .ok()
            .trim()
            .to_owned()
    };
    let said = |got: &[Value]| -> Vec<(String, String, String)> {
        got.iter()
            .map(|m| {
                let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
                (
                    s(&m["kind"]),
                    s(&m["correlatesTo"]),
                    s(&m["message"]["parts"][0]["text"]),
                )
            })
            .collect()
    };
    let open_note = note(&pair.b, "web", "design", "looking for them");
    assert_eq!(
        said(&read_wait(&pair.a, "design")),
        [("note".into(), id.clone(), "looking for them".into())]
    );
    pair.b.reply(&id, "web", "completed", &[], "uploaded");
    let waited = pair.a.doorbell(&["wait", &id, "--timeout", "30s"]);
    assert_eq!(waited.code, 0, "{}{}", waited.stdout, waited.stderr);
    assert_eq!(read_wait(&pair.a, "design").len(), 1);
    // After it closed: web's P.S. reaches design, design's thanks reaches web.
    let after = note(&pair.b, "web", "design", "P.S. the SVG is in /shared");
    assert_eq!(
        said(&read_wait(&pair.a, "design")),
        [(
            "note".into(),
            id.clone(),
            "P.S. the SVG is in /shared".into()
        )]
    );
    note(&pair.a, "design", "web", "thanks");
    assert_eq!(
        said(&read_wait(&pair.b, "web")),
        [("note".into(), id.clone(), "thanks".into())]
    );
    // Each once, and nothing refused on either side.
    let arrived = ids(&pair.a, "design");
    assert_eq!(
        (arrived[&open_note], arrived[&after]),
        (1, 1),
        "{arrived:?}"
    );
    for bridge in [&pair.a, &pair.b] {
        let status = bridge.doorbell(&["status"]).stderr;
        assert!(!status.contains("refused"), "{status}");
    }
}

/// design asks web across, then cancels while B is down; web, not knowing yet, writes
/// design a note about it. When B comes back, the cancel goes across and the note comes
/// back, once: A no longer asks for the closed task's history, so B sends the note itself.
#[test]
fn a_note_written_while_the_requesters_cancel_was_on_its_way_still_arrives() {
    let pair = Pair::new("");
    let b = pair.start_b();
    let _a = pair.start_a();
    let id = pair.a.request("design", "web", "the logo files?");
    read_wait(&pair.b, "web");
    drop(b);
    pair.a
        .doorbell(&["cancel", &id, "--from", "design", "never mind"])
        .ok();
    let note = pair
        .b
        .doorbell(&[
            "send",
            "--to",
            "design",
            "--from",
            "web",
            "--kind",
            "note",
            "--correlates-to",
            &id,
            "half done already",
        ])
        .ok()
        .trim()
        .to_owned();
    let _b = pair.start_b();
    let arrived = read_wait(&pair.a, "design");
    assert_eq!(arrived.len(), 1, "{arrived:?}");
    assert_eq!(arrived[0]["id"], Value::from(note.as_str()));
    assert_eq!(ids(&pair.a, "design")[&note], 1);
    let waited = pair.b.doorbell(&["wait", &id, "--timeout", "30s"]);
    assert_eq!(waited.code, 4, "cancelled on B too: {waited:?}");
    // Nothing refused or left untaken on either side (A may still say that B could not be
    // reached a moment ago: its forwarder tries again with backoff).
    for bridge in [&pair.a, &pair.b] {
        let status = bridge.doorbell(&["status"]).stderr;
        assert!(
            !status.contains("the bridge of the remote")
                && !status.contains("could not be taken here"),
            "{status}"
        );
    }
}

/// A's `[[remote]]` may name B's station otherwise than B does (`webb` for `web`): its
/// answers, which B writes as from `web`, are brought back all the same, as from `webb`.
#[test]
fn answers_come_back_from_a_remote_known_here_under_another_name() {
    let pair = Pair::knowing_web_as("webb", "");
    let _b = pair.start_b();
    let _a = pair.start_a();
    let id = pair.a.request("design", "webb", "ETA for the footer?");
    let arrived = read_wait(&pair.b, "web");
    assert_eq!(arrived[0]["id"], Value::from(id.clone()), "{arrived:?}");
    pair.b.reply(&id, "web", "completed", &[], "Friday");
    let waited = pair.a.doorbell(&["wait", &id, "--timeout", "30s"]);
    assert_eq!(waited.code, 0, "{}{}", waited.stdout, waited.stderr);
    let answers = read_wait(&pair.a, "design");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["from"], "webb");
    assert_eq!(answers[0]["message"]["parts"][0]["text"], "Friday");
    assert!(debts(&pair.a).is_empty());
    // web's P.S. after the answer comes across too, as from webb.
    pair.b
        .doorbell(&[
            "send",
            "--to",
            "design",
            "--from",
            "web",
            "--kind",
            "note",
            "--correlates-to",
            &id,
            "P.S. Friday noon",
        ])
        .ok();
    let ps = read_wait(&pair.a, "design");
    assert_eq!(ps.len(), 1, "{ps:?}");
    assert_eq!(
        (&ps[0]["from"], &ps[0]["correlatesTo"]),
        (&Value::from("webb"), &Value::from(id))
    );
}

/// An answer the far station gave that this bridge cannot take (here: its id is taken on
/// this bridge already) is not dropped without a word: `status` says so, and the request
/// stays open.
#[test]
fn an_answer_this_bridge_cannot_take_is_said_in_status() {
    let pair = Pair::new("");
    let _b = pair.start_b();
    let mut a = pair.start_a();
    let taken = pair.a.send("human", "design", "an id in use on A");
    let id = pair.a.request("design", "web", "ETA for the footer?");
    read_wait(&pair.b, "web");
    pair.b
        .reply(&id, "web", "completed", &["--id", &taken], "Friday");
    a.expect_stderr("is not taken", Duration::from_secs(30));
    let said = pair.a.doorbell(&["status"]).stderr;
    assert!(
        said.contains("1 answer from the remote 'web' could not be taken here"),
        "{said}"
    );
    assert!(said.contains(&taken), "{said}");
    assert_eq!(debts(&pair.a).len(), 1);
}

#[test]
fn an_unreachable_remote_waits_in_status_and_nothing_is_dropped() {
    let pair = Pair::new("");
    let mut a = pair.start_a();
    let id = pair.a.request("design", "web", "anyone there?");
    // B is not running: A says so, and keeps the line.
    a.expect_stderr("the remote cannot be reached", Duration::from_secs(10));
    let said = pair.a.doorbell(&["status"]).stderr;
    assert!(
        said.contains("the remote 'web' cannot be reached"),
        "{said}"
    );
    assert!(said.contains("lines waiting for it: 1"), "{said}");
    // B comes up: the line goes across, once.
    let _b = pair.start_b();
    let arrived = read_wait(&pair.b, "web");
    assert_eq!(arrived.len(), 1);
    assert_eq!(arrived[0]["id"], Value::from(id));
}

/// A station on another bridge has one reader here, the forwarder: `read`, `watch`, a hook
/// and an MCP call of it are refused before they show or take anything (a line they took
/// would never go across); `read --peek` shows what waits; the line still goes across once.
#[test]
fn a_station_on_another_bridge_is_read_only_by_its_forwarder() {
    let pair = Pair::new("");
    let mut a = pair.start_a();
    let id = pair.a.request("design", "web", "anyone there?");
    a.expect_stderr("the remote cannot be reached", Duration::from_secs(10));
    let within = Duration::from_secs(30);
    let prompt = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hooks/claude/UserPromptSubmit.json"),
    )
    .unwrap();
    // A hook's failure is never the harness's decision: exit 1, said on stderr.
    for (args, stdin, code) in [
        (&["read", "web"][..], None, 2),
        (&["read", "web", "--all"][..], None, 2),
        (&["read", "web", "--wait", "--timeout", "1s"][..], None, 2),
        (&["watch", "web"][..], None, 2),
        (
            &["hook", "UserPromptSubmit", "--agent", "web"][..],
            Some(&prompt),
            1,
        ),
    ] {
        let run = match stdin {
            None => run_within(pair.a.command(args), within),
            Some(input) => pair.a.doorbell_stdin(args, input),
        };
        assert_eq!(run.code, code, "{args:?}: {} {}", run.stdout, run.stderr);
        assert!(run.stdout.is_empty(), "{args:?} showed {}", run.stdout);
        assert!(
            run.stderr.contains("web is a station on another bridge"),
            "{args:?}: {}",
            run.stderr
        );
    }
    let peeked = pair.a.doorbell(&["read", "web", "--peek", "--json"]);
    assert!(peeked.ok().contains(&id), "{}", peeked.stdout);
    let _b = pair.start_b();
    let arrived = read_wait(&pair.b, "web");
    assert_eq!(arrived.len(), 1);
    assert_eq!(arrived[0]["id"], Value::from(id));
}

/// `[[remote]]` changed under a running daemon and SIGHUP: the forwarders and the gateway are
/// made at its start, so it says a restart is needed (readers already see the new file).
#[test]
fn a_remote_changed_at_sighup_is_said_to_need_a_restart() {
    let bridge = Bridge::with_agents(&["design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let token = token_file(&bridge);
    bridge.config(&format!(
        "[[remote]]\nname = \"web\"\nurl = \"http://127.0.0.1:9/a2a/web\"\ntoken_file = \"{}\"\n",
        token.display()
    ));
    daemon.signal("HUP");
    let said = daemon.expect_stderr(
        "take effect when the daemon starts",
        Duration::from_secs(10),
    );
    assert!(said.contains("restart"), "{said}");
}

/// Exchanges between the two bridges while either daemon is killed (SIGKILL) at random moments;
/// at the end every request and every answer is in its inbox exactly once, and nothing is
/// owed on either side.
fn exchanges_survive_sigkills(exchanges: usize, seed: u64) {
    let pair = Pair::new("");
    let mut a = Some(pair.start_a());
    let mut b = Some(pair.start_b());
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut sent = Vec::new();
    for round in 0..exchanges {
        let id = format!("q-{seed}-{round}");
        // A kill of A or B at a random point of this round's steps, then a restart.
        let victim = next(2);
        let at_step = next(4);
        let delay = Duration::from_millis(next(60));
        let steps: [&dyn Fn(); 4] = [
            &|| {
                pair.a
                    .doorbell(&[
                        "send", "--to", "web", "--from", "design", "--kind", "request", "--id",
                        &id, "ETA?",
                    ])
                    .ok();
            },
            &|| {
                let arrived = read_wait(&pair.b, "web");
                assert!(
                    arrived.iter().any(|m| m["id"] == id.as_str()),
                    "{arrived:?}"
                );
            },
            &|| {
                pair.b.reply(&id, "web", "working", &[], "on it");
            },
            &|| {
                pair.b.reply(&id, "web", "completed", &[], "done");
            },
        ];
        for (step, run) in steps.iter().enumerate() {
            if step as u64 == at_step {
                let daemon = if victim == 0 { a.take() } else { b.take() };
                let pair = &pair;
                let restarted = std::thread::scope(|scope| {
                    let killer = scope.spawn(move || {
                        // A random moment within the step: chaos, not a wait for a result.
                        std::thread::sleep(delay);
                        drop(daemon);
                        if victim == 0 {
                            pair.start_a()
                        } else {
                            pair.start_b()
                        }
                    });
                    run();
                    killer.join().unwrap()
                });
                if victim == 0 {
                    a = Some(restarted);
                } else {
                    b = Some(restarted);
                }
            } else {
                run();
            }
        }
        let waited = pair.a.doorbell(&["wait", &id, "--timeout", "60s"]);
        assert_eq!(
            waited.code, 0,
            "round {round}: {}{}",
            waited.stdout, waited.stderr
        );
        sent.push(id);
    }
    each_once(&pair, &sent);
    drop((a, b));
}

/// Every request once on each side; every answer once in design's inbox on A, and nothing
/// else there; nothing owed on either side.
fn each_once(pair: &Pair, sent: &[String]) {
    let at_b = ids(&pair.b, "web");
    let at_a = ids(&pair.a, "design");
    let answers = ids(&pair.b, "design");
    for id in sent {
        assert_eq!(at_b.get(id), Some(&1), "{id} in B's web inbox: {at_b:?}");
        assert_eq!(ids(&pair.a, "web").get(id), Some(&1));
    }
    assert_eq!(answers.len(), 2 * sent.len(), "{answers:?}");
    for (answer, n) in &answers {
        assert_eq!(*n, 1);
        assert_eq!(
            at_a.get(answer),
            Some(&1),
            "{answer} in A's design inbox: {at_a:?}"
        );
    }
    assert_eq!(
        at_a.len(),
        answers.len(),
        "A's design inbox holds only the answers: {at_a:?}"
    );
    assert!(debts(&pair.a).is_empty());
    assert!(debts(&pair.b).is_empty());
}

#[test]
fn sigkills_of_either_daemon_lose_and_repeat_nothing() {
    exchanges_survive_sigkills(8, 0x9E37_79B9_7F4A_7C15);
}

#[cfg(feature = "long")]
#[test]
fn sigkills_of_either_daemon_lose_and_repeat_nothing_long() {
    for seed in 1..=6 {
        exchanges_survive_sigkills(20, seed * 0x2545_F491_4F6C_DD1D);
    }
}
