//! The two senders, `doorbell send` and `scripts/doorbell-send`, behave the same (DESIGN.md §1
//! and §5): any text arrives exactly as given (stdin drops trailing newlines only), nothing in
//! it is ever executed, NUL and invalid UTF-8 are refused, concurrent writers never tear or
//! interleave lines, and a fragment left by a killed writer spoils only itself.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;

use crate::util::{run, Bridge, Run};

/// Every message in this module goes from `web` to `design`.
const FROM: &str = "web";
const TO: &str = "design";

/// Which sender to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sender {
    Binary,
    Script,
}

const BOTH: [Sender; 2] = [Sender::Binary, Sender::Script];

/// How the text reaches the sender.
#[derive(Clone, Copy, Debug)]
enum Text<'a> {
    /// One argument after `--`.
    Arg(&'a str),
    /// `-` and these bytes on stdin.
    Stdin(&'a [u8]),
}

impl Text<'_> {
    fn args(self) -> Vec<&'static str> {
        match self {
            Text::Arg(_) => vec!["--to", TO, "--from", FROM, "--"],
            Text::Stdin(_) => vec!["--to", TO, "--from", FROM, "-"],
        }
    }
}

/// `doorbell send --to design --from web …`, run in the bridge's temporary directory so a
/// relative path in an executed payload would land there.
fn binary_send(bridge: &Bridge, text: Text<'_>) -> Run {
    let mut args = vec!["send"];
    args.extend(text.args());
    spawn(bridge, bridge.command(&args), text)
}

/// `sh scripts/doorbell-send --to design --from web …`, run like `binary_send`.
fn script_send(bridge: &Bridge, text: Text<'_>) -> Run {
    spawn(bridge, bridge.script_command(&text.args()), text)
}

fn spawn(bridge: &Bridge, mut command: std::process::Command, text: Text<'_>) -> Run {
    command.current_dir(bridge.tmp.path());
    match text {
        Text::Arg(arg) => {
            command.arg(arg);
            run(command, None)
        }
        Text::Stdin(bytes) => run(command, Some(bytes)),
    }
}

impl Sender {
    fn send(self, bridge: &Bridge, text: Text<'_>) -> Run {
        match self {
            Sender::Binary => binary_send(bridge, text),
            Sender::Script => script_send(bridge, text),
        }
    }
}

fn inbox_bytes(bridge: &Bridge) -> Vec<u8> {
    std::fs::read(bridge.inbox(TO)).unwrap()
}

fn text_of(envelope: &Value) -> Option<&str> {
    envelope["message"]["parts"][0]["text"].as_str()
}

// ------------------------------------------------------------------------------------------
// 1. Any text, both senders, both modes

/// The files an executed payload would create (see `text_strategy`), and the folder a
/// `; rm -rf x` payload would remove.
struct Canaries {
    created: Vec<PathBuf>,
    kept: PathBuf,
}

impl Canaries {
    fn new(bridge: &Bridge) -> Canaries {
        let kept = bridge.tmp.path().join("x");
        std::fs::create_dir(&kept).unwrap();
        Canaries {
            created: vec![
                bridge.tmp.path().join("PWNED"),
                bridge.tmp.path().join("PWNED-abs"),
                bridge.dir().join("PWNED"),
                std::env::current_dir().unwrap().join("PWNED"),
            ],
            kept,
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for path in &self.created {
            prop_assert!(
                !path.exists(),
                "a payload was executed: {} exists",
                path.display()
            );
        }
        prop_assert!(
            self.kept.is_dir(),
            "a payload was executed: {} was removed",
            self.kept.display()
        );
        Ok(())
    }
}

/// Text mixing quotes, backslashes, every control character but NUL, DEL, non-ASCII, shell and
/// printf syntax, and arbitrary characters; sometimes starting with `-`, sometimes ending in
/// newlines.
fn text_strategy(tmp: &Path) -> impl Strategy<Value = String> {
    let abs = tmp.join("PWNED-abs").display().to_string();
    let tokens: Vec<String> = [
        "\"",
        "'",
        "\\",
        "\\\\",
        "\\\"",
        "\n",
        "\r",
        "\r\n",
        "\t",
        " ",
        "é",
        "日本",
        "🚀",
        "\u{2028}",
        "\u{2029}",
        "\u{feff}",
        "\u{85}",
        "$(touch PWNED)",
        "`touch PWNED`",
        "; rm -rf x",
        "&& rm -rf x",
        "| rm -rf x",
        "$HOME",
        "${HOME}",
        "$0",
        "$1",
        "$@",
        "*",
        "~",
        "%s",
        "%n",
        "%d",
        "%%",
        "%b",
        "\\n",
        "\\x41",
        "\\0",
        "\\c",
        "\\u0041",
        "-",
        "--",
        "-n",
        "-e",
        "--to",
        "--help",
        "EOF",
        "}",
        "{",
        "\"}]}",
        "\n\n",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        format!("$(touch {abs})"),
        format!("`touch {abs}`"),
        format!("; touch {abs}"),
    ])
    .collect();
    let piece = prop_oneof![
        4 => prop::sample::select(tokens),
        2 => (1u8..=0x1f).prop_map(|b| char::from(b).to_string()),
        1 => Just("\u{7f}".to_owned()),
        2 => any::<char>().prop_filter("no NUL in an argument", |c| *c != '\0').prop_map(String::from),
        2 => "[ -~]{0,8}",
    ];
    // Trailing newlines matter on stdin: draw them often.
    let end = prop_oneof![3 => Just(""), 1 => Just("\n"), 1 => Just("\r\n"), 1 => Just("\n\n\n")];
    (any::<bool>(), prop::collection::vec(piece, 0..16), end).prop_map(|(dash, pieces, end)| {
        let mut text = if dash { "-".to_owned() } else { String::new() };
        text.extend(pieces);
        text.push_str(end);
        text
    })
}

/// Send `text` and check that exactly one line was appended, that it is JSON with the printed
/// id; return its text.
fn sent_text(bridge: &Bridge, sender: Sender, text: Text<'_>) -> Result<String, TestCaseError> {
    let before = inbox_bytes(bridge);
    let run = sender.send(bridge, text);
    prop_assert_eq!(
        run.code,
        0,
        "{:?} {:?} failed: {}",
        sender,
        text,
        run.stderr
    );
    let after = inbox_bytes(bridge);
    prop_assert!(
        after.starts_with(&before),
        "{:?} changed what was there",
        sender
    );
    let appended = &after[before.len()..];
    let Some(line) = appended.strip_suffix(b"\n") else {
        return Err(TestCaseError::fail(format!(
            "{sender:?} appended no whole line"
        )));
    };
    prop_assert!(
        !line.contains(&b'\n'),
        "{:?} appended more than one line: {}",
        sender,
        String::from_utf8_lossy(appended)
    );
    let envelope: Value = serde_json::from_slice(line).map_err(|e| {
        TestCaseError::fail(format!(
            "{sender:?} wrote bad JSON ({e}): {}",
            String::from_utf8_lossy(line)
        ))
    })?;
    prop_assert_eq!(
        envelope["id"].as_str(),
        Some(run.stdout.trim_end()),
        "{:?} printed another id",
        sender
    );
    match text_of(&envelope) {
        Some(text) => Ok(text.to_owned()),
        None => Err(TestCaseError::fail(format!(
            "{sender:?} wrote no text: {envelope}"
        ))),
    }
}

fn both_senders_keep(
    bridge: &Bridge,
    canaries: &Canaries,
    text: &str,
) -> Result<(), TestCaseError> {
    // `-` as the text argument means stdin, even after `--`, for both senders.
    if text != "-" {
        let by_binary = sent_text(bridge, Sender::Binary, Text::Arg(text))?;
        let by_script = sent_text(bridge, Sender::Script, Text::Arg(text))?;
        prop_assert_eq!(
            &by_binary,
            &by_script,
            "the senders disagree on an argument"
        );
        prop_assert_eq!(&by_binary, text, "doorbell send changed the argument");
        prop_assert_eq!(&by_script, text, "doorbell-send changed the argument");
    }
    let expected = text.trim_end_matches('\n');
    let by_binary = sent_text(bridge, Sender::Binary, Text::Stdin(text.as_bytes()))?;
    let by_script = sent_text(bridge, Sender::Script, Text::Stdin(text.as_bytes()))?;
    prop_assert_eq!(&by_binary, &by_script, "the senders disagree on stdin");
    prop_assert_eq!(&by_binary, expected, "doorbell send changed stdin");
    prop_assert_eq!(&by_script, expected, "doorbell-send changed stdin");
    canaries.check()
}

#[test]
fn any_text_arrives_exactly_and_the_same_from_both_senders() {
    let started = Instant::now();
    let bridge = Bridge::with_agents(&[FROM, TO]);
    let canaries = Canaries::new(&bridge);
    let config = Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&text_strategy(bridge.tmp.path()), |text| {
        both_senders_keep(&bridge, &canaries, &text)
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    canaries.check().unwrap();
    eprintln!("any_text: {:.1?}", started.elapsed());
}

#[test]
fn fixed_tricky_texts_arrive_exactly() {
    // The cases that matter most, every run, whatever the proptest draws.
    let bridge = Bridge::with_agents(&[FROM, TO]);
    let canaries = Canaries::new(&bridge);
    let abs = bridge.tmp.path().join("PWNED-abs").display().to_string();
    let controls: String = (1u8..0x20).chain([0x7f]).map(char::from).collect();
    let texts = [
        String::new(),
        controls,
        "-".repeat(2),
        "-n".to_owned(),
        "--to x".to_owned(),
        format!("$(touch {abs}) `touch {abs}` $(touch PWNED) `touch PWNED`; rm -rf x; $HOME"),
        "%s %n %d \\n \\\\x41 %b \\c".to_owned(),
        "é 日本 🚀 \u{2028} \u{10ffff}".to_owned(),
        "\n\nlead, trail\r\n\n\n".to_owned(),
        "\"quoted\" \\back\\slash\\".to_owned(),
    ];
    for text in &texts {
        both_senders_keep(&bridge, &canaries, text).unwrap();
    }
}

#[test]
fn nul_and_invalid_utf8_on_stdin_are_refused_by_both() {
    let bridge = Bridge::with_agents(&[FROM, TO]);
    let inputs: [(&str, &[u8]); 8] = [
        ("NUL inside", b"a\0b"),
        ("NUL alone", b"\0"),
        ("NUL before trailing newlines", b"text\0\n\n"),
        ("0xff", b"\xff"),
        ("0xff inside", b"ab\xffcd"),
        ("truncated 3-byte sequence at the end", b"ab\xe6\x97"),
        ("truncated 3-byte sequence inside", b"\xe6\x97x"),
        ("surrogate", b"\xed\xa0\x80"),
    ];
    for sender in BOTH {
        for (what, bytes) in inputs {
            let before = inbox_bytes(&bridge);
            let run = sender.send(&bridge, Text::Stdin(bytes));
            assert_eq!(run.code, 2, "{sender:?} did not refuse {what}: {run:?}");
            assert!(
                !run.stderr.is_empty(),
                "{sender:?} refused {what} without saying why"
            );
            assert_eq!(
                inbox_bytes(&bridge),
                before,
                "{sender:?} appended something for {what}"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// 2. Sixteen writers at once

const WRITERS: usize = 16;
const PER_WRITER: usize = 500;
const BIG: usize = 64 * 1024;

/// The text of a writer's message: `writer W seq S`, and every 50th one padded to 64 KiB with
/// characters that need escaping.
fn load_text(writer: usize, seq: usize) -> String {
    let mut text = format!("writer {writer} seq {seq}");
    if seq % 50 == 49 {
        text.push(' ');
        for c in "quote\" back\\slash tab\t newline\n cr\r ".chars().cycle() {
            if text.len() == BIG - 1 {
                break;
            }
            text.push(c);
        }
        text.push('.');
    }
    text
}

/// One writer: its messages in order, big ones on stdin, the rest as an argument. Returns the
/// ids it printed.
fn write_all(bridge: &Bridge, writer: usize) -> Vec<String> {
    let sender = if writer.is_multiple_of(2) {
        Sender::Script
    } else {
        Sender::Binary
    };
    (0..PER_WRITER)
        .map(|seq| {
            let text = load_text(writer, seq);
            let how = if text.len() == BIG {
                Text::Stdin(text.as_bytes())
            } else {
                Text::Arg(&text)
            };
            sender.send(bridge, how).ok().trim_end().to_owned()
        })
        .collect()
}

#[test]
fn sixteen_writers_never_tear_or_lose_a_line() {
    let bridge = Bridge::with_agents(&[FROM, TO]);
    let started = Instant::now();
    let printed: Vec<String> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let bridge = &bridge;
                scope.spawn(move || write_all(bridge, writer))
            })
            .collect();
        writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    eprintln!(
        "sixteen_writers: {} sends in {:.1?}",
        printed.len(),
        started.elapsed()
    );

    let bytes = inbox_bytes(&bridge);
    assert_eq!(
        bytes.last(),
        Some(&b'\n'),
        "the inbox ends in a partial line"
    );
    let lines: Vec<&[u8]> = bytes
        .strip_suffix(b"\n")
        .unwrap()
        .split(|&b| b == b'\n')
        .collect();
    assert_eq!(lines.len(), WRITERS * PER_WRITER, "lines in the inbox");
    let mut ids = HashSet::new();
    let mut seen: HashMap<(usize, usize), usize> = HashMap::new();
    for (number, line) in lines.iter().enumerate() {
        let envelope: Value = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!(
                "line {} is not JSON ({e}): {:.200}",
                number + 1,
                String::from_utf8_lossy(line)
            )
        });
        let id = envelope["id"].as_str().unwrap().to_owned();
        assert!(ids.insert(id.clone()), "id {id} appears twice");
        let text = text_of(&envelope).unwrap();
        let mut words = text.split(' ');
        let (Some("writer"), Some(writer), Some("seq"), Some(seq)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            panic!("line {} has an unexpected text: {text:.200}", number + 1);
        };
        let key: (usize, usize) = (writer.parse().unwrap(), seq.parse().unwrap());
        assert_eq!(
            text,
            load_text(key.0, key.1),
            "line {} has a changed text",
            number + 1
        );
        *seen.entry(key).or_default() += 1;
    }
    for writer in 0..WRITERS {
        for seq in 0..PER_WRITER {
            assert_eq!(
                seen.get(&(writer, seq)),
                Some(&1),
                "writer {writer} seq {seq}"
            );
        }
    }
    let printed: HashSet<String> = printed.into_iter().collect();
    assert_eq!(printed, ids, "the printed ids are not the ids in the inbox");
}

// ------------------------------------------------------------------------------------------
// 3. A writer killed mid-line

const FRAGMENT: &str = r#"{"id":"torn","from":"web","to":"design","kind":"no"#;

#[test]
fn a_torn_fragment_spoils_only_itself() {
    // Each sender once as the first writer after the crash, the one that must repair the tail.
    for order in [BOTH, [Sender::Script, Sender::Binary]] {
        let first = order[0];
        let bridge = Bridge::with_agents(&[FROM, TO]);
        bridge.append_raw(TO, FRAGMENT.as_bytes());
        let texts: Vec<String> = order
            .into_iter()
            .map(|sender| {
                let text = format!("after the tear, by {sender:?}");
                sender.send(&bridge, Text::Arg(&text)).ok();
                text
            })
            .collect();

        // The fragment is alone on its own line; both messages are whole lines after it.
        let lines: Vec<String> = bridge
            .lines(TO)
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{first:?} first: {lines:?}");
        assert_eq!(
            lines[0], FRAGMENT,
            "{first:?} first: the fragment was joined to another line"
        );
        assert_eq!(inbox_bytes(&bridge)[FRAGMENT.len()], b'\n');
        for (line, text) in lines[1..].iter().zip(&texts) {
            let envelope: Value = serde_json::from_str(line).unwrap();
            assert_eq!(text_of(&envelope), Some(text.as_str()));
        }

        // Offline check: the fragment, and only it, is refused.
        let path = bridge.inbox(TO);
        let path = path.to_str().unwrap();
        let check = bridge.doorbell(&["check", path]);
        assert_eq!(check.code, 2, "{check:?}");
        let named: Vec<&str> = check.stdout.lines().collect();
        assert_eq!(named.len(), 1, "{check:?}");
        assert!(
            named[0].starts_with(&format!("{path}:1: byte 0: bad-json")),
            "{check:?}"
        );
        let check = bridge.doorbell(&["check", "--json", path]);
        assert_eq!(check.code, 2, "{check:?}");
        let verdicts: Vec<(String, Value)> = check
            .stdout
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|r| {
                (
                    r["verdict"].as_str().unwrap().to_owned(),
                    r["reason"].clone(),
                )
            })
            .collect();
        assert_eq!(
            verdicts,
            [
                ("refused".to_owned(), Value::from("bad-json")),
                ("pass".to_owned(), Value::Null),
                ("pass".to_owned(), Value::Null),
            ]
        );

        // The judge catches up: the two messages are delivered, the fragment is not.
        let read = bridge.read_json(TO, &[]);
        let delivered: Vec<&str> = read
            .iter()
            .map(|r| text_of(&r["envelope"]).unwrap())
            .collect();
        assert_eq!(delivered, texts);
        assert!(read.iter().all(|r| r["envelope"]["id"] != "torn"));
        let refused: Vec<_> = bridge
            .verdicts()
            .into_iter()
            .filter(|v| v.2 == "refused")
            .collect();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(
            (refused[0].1, refused[0].3.as_deref()),
            (0, Some("bad-json"))
        );
    }
}

// ------------------------------------------------------------------------------------------
// 5. The sender's word is the judge's word

/// The rules only the ledger knows: `doorbell send` checks them against the ledger as it
/// stands, the script cannot (the judge's verdict is final for both).
const STATEFUL: [&str; 7] = [
    "context-mismatch",
    "not-addressee",
    "misaddressed",
    "unknown-request",
    "request-closed",
    "bad-transition",
    "id-reused",
];

/// One send's flags, each picked from values the judge accepts and values it refuses.
#[derive(Debug, Clone)]
struct Flags {
    from: &'static str,
    to: &'static str,
    kind: Option<&'static str>,
    state: Option<&'static str>,
    /// Answer a request of this case's own (web asks design).
    correlates: Option<&'static str>,
    context: Option<&'static str>,
    task: Option<String>,
    priority: Option<&'static str>,
    reply_by: Option<&'static str>,
    /// `Some(true)`: a fresh id of the case's own; `Some(false)`: a reserved one.
    id: Option<bool>,
}

/// Values for each flag that the judge may refuse.
const ODD_FROM: [&str; 10] = [
    "web",
    "design",
    "ops",
    "review-loop",
    "cron",
    "ghost",
    "bridge",
    "debt-loop",
    "all",
    "Web",
];
const ODD_TO: [&str; 6] = ["design", "web", "chief", "ghost", "bridge", "cron"];
const ODD_KIND: [&str; 4] = ["request", "response", "note", "ask"];
const ODD_STATE: [&str; 6] = [
    "submitted",
    "working",
    "input-required",
    "completed",
    "canceled",
    "done",
];
const ODD_TASK: [usize; 3] = [0, 256, 257];
const ODD_PRIORITY: [&str; 4] = ["0", "3", "7", "high"];
const ODD_REPLY_BY: [&str; 4] = ["2h", "2026-12-31T10:00:00Z", "soon", "2026-13-01"];

/// A valid send (a note, a request, a loop's request, the addressee's answer) with its
/// optional flags, then, in most cases, one or two flags changed to any value of its list.
fn flags_strategy() -> impl Strategy<Value = Flags> {
    let shape = prop::sample::select(vec![
        ("web", "design", None, None, None),
        ("ops", "web", Some("note"), None, None),
        ("design", "chief", Some("request"), None, None),
        (
            "review-loop",
            "design",
            Some("request"),
            Some("submitted"),
            None,
        ),
        ("cron", "web", Some("note"), None, None),
        ("design", "web", None, Some("working"), Some("own")),
        (
            "design",
            "web",
            Some("response"),
            Some("completed"),
            Some("own"),
        ),
        (
            "design",
            "web",
            Some("response"),
            Some("input-required"),
            Some("own"),
        ),
    ]);
    let optional = (
        prop::option::of(prop::sample::select(vec!["ctx-1", "ctx 1"])),
        prop::option::of(prop::sample::select(ODD_TASK.to_vec())),
        prop::option::of(prop::sample::select(vec!["0", "3"])),
        prop::option::of(prop::sample::select(vec!["2h", "2026-12-31T10:00:00Z"])),
        prop::option::of(prop::bool::weighted(0.9)),
    );
    let changes = prop::collection::vec((0..7usize, 0..10usize, any::<bool>()), 0..=2);
    (shape, optional, changes).prop_map(
        |(
            (from, to, kind, state, correlates),
            (context, task, priority, reply_by, id),
            changes,
        )| {
            let mut flags = Flags {
                from,
                to,
                kind,
                state,
                correlates,
                context,
                task: task.map(|n| "x".repeat(n)),
                priority,
                reply_by,
                id,
            };
            for (field, pick, drop) in changes {
                let some = |values: &[&'static str]| (!drop).then(|| values[pick % values.len()]);
                match field {
                    0 => flags.from = ODD_FROM[pick],
                    1 => flags.to = ODD_TO[pick % ODD_TO.len()],
                    2 => flags.kind = some(&ODD_KIND),
                    3 => flags.state = some(&ODD_STATE),
                    4 => flags.correlates = some(&["own", "bad id", "own"]),
                    5 => flags.priority = some(&ODD_PRIORITY),
                    _ => flags.reply_by = some(&ODD_REPLY_BY),
                }
            }
            flags
        },
    )
}

impl Flags {
    /// The arguments for one sender; `own` names the sender's own request and id.
    fn args(&self, own: &str) -> Vec<String> {
        let mut args: Vec<String> = vec!["--from".into(), self.from.into()];
        args.extend(["--to".into(), self.to.into()]);
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                args.push(format!("--{name}"));
                args.push(value);
            }
        };
        flag("kind", self.kind.map(Into::into));
        flag("state", self.state.map(Into::into));
        flag(
            "correlates-to",
            self.correlates
                .map(|c| if c == "own" { own.to_owned() } else { c.into() }),
        );
        flag("context-id", self.context.map(Into::into));
        flag("task-id", self.task.clone());
        flag("priority", self.priority.map(Into::into));
        flag("reply-by", self.reply_by.map(Into::into));
        flag(
            "id",
            self.id.map(|fresh| {
                if fresh {
                    format!("{own}-line")
                } else {
                    format!("{own}:x")
                }
            }),
        );
        args.extend(["--".into(), "parity".into()]);
        args
    }
}

/// The bridge of the parity test: stations web, design and chief with inboxes, `ops` a
/// station of the config only, a loop with an owner and one without; a judge has run once,
/// so the names file is in place.
fn parity_bridge() -> Bridge {
    let bridge = Bridge::with_agents(&["web", "design", "chief"]);
    let config = bridge.tmp.path().join("home/.config/doorbell");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("doorbell.toml"),
        "[[agent]]\nname = \"ops\"\n\n[[loop]]\nname = \"review-loop\"\nowner = \"chief\"\n\n\
         [[loop]]\nname = \"cron\"\n",
    )
    .unwrap();
    bridge.doorbell(&["daemon", "--once"]).ok();
    bridge
}

/// The judge's verdict and reason for the line with this id.
fn verdict_of(bridge: &Bridge, id: &str) -> (String, Option<String>) {
    let shown = bridge.doorbell(&["show", id, "--json"]);
    let shown: Value = serde_json::from_str(shown.ok()).unwrap();
    (
        shown["verdict"].as_str().unwrap().to_owned(),
        shown["reason"].as_str().map(str::to_owned),
    )
}

/// How the cases ended: both sent, both refused, the binary foresaw a stateful refusal.
#[derive(Default)]
struct Ends {
    sent: usize,
    refused: usize,
    stateful: usize,
}

fn senders_agree(
    bridge: &Bridge,
    ends: &mut Ends,
    case: usize,
    flags: &Flags,
) -> Result<(), TestCaseError> {
    let mut outcomes = Vec::new();
    for sender in BOTH {
        // Each sender answers a request of its own, so one's answer cannot close the other's.
        let own = format!("c{case}-{sender:?}");
        bridge
            .doorbell(&[
                "send", "--from", "web", "--to", "design", "--kind", "request", "--id", &own, "ask",
            ])
            .ok();
        let args = flags.args(&own);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let before: Vec<usize> = ["web", "design", "chief"]
            .iter()
            .map(|a| bridge.lines(a).len())
            .collect();
        let run = match sender {
            Sender::Binary => bridge.doorbell(&[&["send"], &args[..]].concat()),
            Sender::Script => bridge.script(&args, None),
        };
        let after: Vec<usize> = ["web", "design", "chief"]
            .iter()
            .map(|a| bridge.lines(a).len())
            .collect();
        let written = after.iter().sum::<usize>() - before.iter().sum::<usize>();
        prop_assert!(
            run.code == 0 || run.code == 2,
            "{sender:?} failed at run time: {}",
            run.stderr
        );
        prop_assert_eq!(
            written,
            usize::from(run.code == 0),
            "{:?} exited {} and wrote {} lines: {}",
            sender,
            run.code,
            written,
            run.stderr
        );
        outcomes.push(run);
    }
    let (binary, script) = (&outcomes[0], &outcomes[1]);
    let stateful = STATEFUL
        .iter()
        .find(|code| binary.stderr.contains(&format!("refused: {code}:")));
    if stateful.is_none() {
        prop_assert_eq!(
            binary.code,
            script.code,
            "the senders disagree on {:?}\nbinary: {}{}\nscript: {}{}",
            flags,
            binary.stdout,
            binary.stderr,
            script.stdout,
            script.stderr
        );
    }
    match (stateful, binary.code) {
        (Some(_), _) => ends.stateful += 1,
        (None, 0) => ends.sent += 1,
        (None, _) => ends.refused += 1,
    }
    // Whatever a sender reported sent, the judge accepts, except the stateful refusal the
    // binary foresaw and the script could not.
    bridge.doorbell(&["daemon", "--once"]).ok();
    for (sender, run) in BOTH.iter().zip(&outcomes) {
        if run.code != 0 {
            continue;
        }
        let id = run.stdout.trim();
        let (verdict, reason) = verdict_of(bridge, id);
        if let (Sender::Script, Some(code)) = (sender, stateful) {
            prop_assert_eq!(
                reason.as_deref(),
                Some(*code),
                "the judge should refuse what the binary foresaw: {:?}",
                flags
            );
        } else {
            prop_assert_eq!(
                verdict.as_str(),
                "accepted",
                "{:?} said sent for a line the judge refused ({:?}): {:?}",
                sender,
                reason,
                flags
            );
        }
    }
    Ok(())
}

#[test]
fn both_senders_refuse_what_the_judge_would_and_nothing_else() {
    let started = Instant::now();
    let bridge = parity_bridge();
    let names = std::fs::read_to_string(bridge.dir().join(".doorbell/names")).unwrap();
    assert!(names.contains("loop review-loop chief\n"), "{names}");
    assert!(
        names.contains("loop cron\n") && names.contains("station ops\n"),
        "{names}"
    );
    let cases = if cfg!(feature = "long") { 600 } else { 96 };
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let case = std::cell::Cell::new(0);
    let ends = std::cell::RefCell::new(Ends::default());
    let mut runner = TestRunner::new(config);
    let result = runner.run(&flags_strategy(), |flags| {
        case.set(case.get() + 1);
        senders_agree(&bridge, &mut ends.borrow_mut(), case.get(), &flags)
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    let ends = ends.into_inner();
    eprintln!(
        "parity: {cases} cases: both sent {}, both refused {}, stateful {}; {:.1?}",
        ends.sent,
        ends.refused,
        ends.stateful,
        started.elapsed()
    );
    // Each kind of end must occur, or the cases test less than they seem to.
    assert!(ends.sent > 0 && ends.refused > 0, "a one-sided run");
}

/// `--reply-by` times out of range (a month 13, a 30 February, hour 29, offset +29:00, a
/// duration past the year 9999, an offset that carries the time past it in UTC) are refused by both senders, as the judge refuses them;
/// times in range (a leap day, a leap second, an offset) are sent by both and accepted.
#[test]
fn both_senders_refuse_a_reply_by_the_judge_would_and_send_the_rest() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let send = |sender: &str, reply_by: &str| -> Run {
        let args = [
            "--from",
            "design",
            "--to",
            "web",
            "--kind",
            "request",
            "--reply-by",
            reply_by,
            "hi",
        ];
        if sender == "binary" {
            let mut full = vec!["send"];
            full.extend(args);
            bridge.doorbell(&full)
        } else {
            bridge.script(&args, None)
        }
    };
    let mut ids = Vec::new();
    for (reply_by, code) in [
        ("2026-13-01T00:00:00Z", 2),
        ("2026-02-30T00:00:00Z", 2),
        ("2026-01-01T29:00:00Z", 2),
        ("2026-01-01T10:00:00+29:00", 2),
        ("3000000d", 2),
        // Past the four-digit years once in UTC: the offset carries the day over.
        ("9999-12-31T23:59:59-01:00", 2),
        ("0000-01-01T00:00:00+01:00", 2),
        ("9999-12-31T22:59:59-01:00", 0),
        ("0000-01-01T01:00:00+01:00", 0),
        ("2028-02-29T10:00:00Z", 0),
        ("2026-12-31T23:59:60Z", 0),
        ("2026-02-28T10:00:00+05:30", 0),
        ("2h", 0),
    ] {
        for sender in ["binary", "script"] {
            let run = send(sender, reply_by);
            assert_eq!(run.code, code, "{sender} {reply_by}: {run:?}");
            if code == 0 {
                ids.push(run.stdout.trim().to_owned());
            }
        }
    }
    bridge.doorbell(&["daemon", "--once"]).ok();
    for id in &ids {
        assert_eq!(verdict_of(&bridge, id).0, "accepted", "{id}");
    }
}

/// The shell sender holds a line to the judge's limit, as the daemon publishes it (not a
/// fixed 1 MiB), measured without its newline as the judge measures it: over is refused by
/// both senders; exactly at it is sent by both and accepted.
#[test]
fn both_senders_hold_a_line_to_the_judges_limit_and_no_less() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.config("max_line_bytes = 2000\n");
    // The judge publishes its names and limit.
    bridge.doorbell(&["daemon", "--once"]).ok();
    let over = "x".repeat(1950);
    let script = bridge.script(
        &["--from", "design", "--to", "web", "-"],
        Some(over.as_bytes()),
    );
    assert_eq!(script.code, 2, "{script:?}");
    let binary = bridge.doorbell_stdin(
        &["send", "--from", "design", "--to", "web", "-"],
        over.as_bytes(),
    );
    assert_eq!(binary.code, 2, "{binary:?}");
    // A line of exactly the limit: the envelope around one letter, measured, then filled.
    let small = bridge.script(&["--from", "design", "--to", "web", "x"], None);
    assert_eq!(small.code, 0, "{small:?}");
    let around = bridge.lines("web").last().unwrap().len() - 1;
    let exact = "y".repeat(2000 - around);
    let script = bridge.script(
        &["--from", "design", "--to", "web", "-"],
        Some(exact.as_bytes()),
    );
    assert_eq!(script.code, 0, "{script:?}");
    assert_eq!(bridge.lines("web").last().unwrap().len(), 2000);
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(verdict_of(&bridge, script.stdout.trim()).0, "accepted");
}

/// A station of the config with no inbox yet may send notes, but not requests: the answer
/// would go to its inbox, and its addressee would owe a debt no reply can pay. Both senders
/// say so, and write nothing.
#[test]
fn both_senders_refuse_a_request_from_a_station_without_an_inbox() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.config("[[agent]]\nname = \"ops\"\n");
    // The daemon publishes the config's names for the shell sender.
    bridge.doorbell(&["daemon", "--once"]).ok();
    let ask = [
        "--from",
        "ops",
        "--to",
        "web",
        "--kind",
        "request",
        "rotate the keys?",
    ];
    let sent = bridge.doorbell(&[&["send"][..], &ask].concat());
    let script = bridge.script(&ask, None);
    for run in [sent, script] {
        assert_eq!(run.code, 2, "{run:?}");
        assert!(run.stderr.contains("doorbell agent add ops"), "{run:?}");
    }
    assert!(bridge.lines("web").is_empty());
    bridge.send("ops", "web", "a note goes");
    bridge
        .script(&["--from", "ops", "--to", "web", "and so does this"], None)
        .ok();
    assert_eq!(bridge.lines("web").len(), 2);
}
