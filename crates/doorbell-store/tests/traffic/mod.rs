//! A month of realistic traffic between six stations, generated from a seed, and judged by the
//! real judge in virtual time.
//!
//! [`Month::generate`] is pure: it plans every line (requests and their lives, broadcasts,
//! notes, refused lines, safe retries) at its virtual time, and keeps its own books of what
//! each line is meant to be and what each request went through. [`Month::judge`] then plays
//! the plan into a bridge folder the way the daemon would: before each line, whatever ring or
//! escalation falls due by then is written at its due time; the line is appended and its
//! inbox swept at the line's time; a refusal is told at once. The tests compare the report
//! with these books, never with the ledger the report is built from.
//!
//! The mix is the seed factory's: 440 requests (15 of them from three broadcasts), about 960
//! responses, 1,397 notes, plus 20 refused lines and 3 retries, over the 30 days from
//! 2026-10-01T00:00:00Z.

use std::path::Path;

use chrono::{DateTime, Duration, FixedOffset, SecondsFormat, TimeZone, Utc};
use doorbell_store::append::append_line;
use doorbell_store::{Bridge, BridgeLock, CatchUp, Config, Judge};
use serde_json::{json, Map, Value};

/// The stations, each with an inbox.
pub const STATIONS: [&str; 6] = ["ci", "design", "human", "marketing", "security", "web"];
pub const HUMAN: &str = "human";
pub const DAYS: i64 = 30;
pub const REQUESTS: usize = 440;
pub const NOTES: usize = 1397;
/// Picked among the first sixty for its shape: about 962 responses, web, design and ci owing,
/// a few questions for the person.
pub const SEED: u64 = 40;

/// `SplitMix64`: small, fast and good enough to shape traffic; fixed by its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias is far below what traffic shaping notices).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: usize) -> bool {
        self.below(1000) < per_mille
    }

    /// Uniform in `lo..hi` seconds.
    pub fn secs(&mut self, lo: i64, hi: i64) -> i64 {
        let width = u64::try_from(hi - lo).expect("hi > lo");
        lo + i64::try_from(self.next_u64() % width).expect("fits")
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// An item drawn by weight.
    pub fn weighted<'a, T>(&mut self, items: &'a [(usize, T)]) -> &'a T {
        let total: usize = items.iter().map(|(w, _)| w).sum();
        let mut roll = self.below(total);
        for (w, item) in items {
            if roll < *w {
                return item;
            }
            roll -= w;
        }
        unreachable!("the roll is below the total")
    }

    /// A ULID made at `at`, its 80 random bits from this generator.
    pub fn ulid(&mut self, at: DateTime<Utc>) -> String {
        let random = (u128::from(self.next_u64()) << 64 | u128::from(self.next_u64())) >> 48;
        let ms = u64::try_from(at.timestamp_millis()).expect("after 1970");
        ulid::Ulid::from_parts(ms, random).to_string()
    }
}

/// How long a station takes to act, in seconds. Agents are quick, mostly; the person is not.
fn delay(rng: &mut Rng, who: &str) -> i64 {
    let roll = rng.below(100);
    if who == HUMAN {
        match roll {
            0..25 => rng.secs(5 * 60, 3600),
            25..75 => rng.secs(3600, 10 * 3600),
            _ => rng.secs(10 * 3600, 36 * 3600),
        }
    } else {
        match roll {
            0..55 => rng.secs(2 * 60, 40 * 60),
            55..88 => rng.secs(40 * 60, 4 * 3600),
            _ => rng.secs(4 * 3600, 20 * 3600),
        }
    }
}

/// What the judge is meant to say about a planned line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    Accepted {
        from: String,
        kind: &'static str,
    },
    Duplicate,
    /// The reason code, and the station the bridge tells (a readable `from` with an inbox).
    Refused {
        reason: &'static str,
        told: Option<String>,
    },
}

/// One line to append, at its virtual time.
#[derive(Debug, Clone)]
pub struct Planned {
    pub at: DateTime<Utc>,
    pub seq: usize,
    pub inbox: String,
    pub line: String,
    pub expect: Expect,
}

/// A state change of a request, as planned.
#[derive(Debug, Clone)]
pub struct Change {
    pub at: DateTime<Utc>,
    pub from: String,
    pub state: &'static str,
}

/// The generator's books on one request.
#[derive(Debug, Clone)]
pub struct Book {
    pub id: String,
    pub requester: String,
    pub addressee: String,
    pub context: String,
    pub priority: u8,
    pub reply_by: Option<DateTime<Utc>>,
    /// The first line of its text.
    pub title: String,
    /// When it was sent, and so judged.
    pub at: DateTime<Utc>,
    /// Its state changes in order, all before the end of the month.
    pub changes: Vec<Change>,
}

impl Book {
    /// The state at the end of the month.
    pub fn state(&self) -> &'static str {
        self.changes.last().map_or("submitted", |c| c.state)
    }

    /// When the current state began.
    pub fn since(&self) -> DateTime<Utc> {
        self.changes.last().map_or(self.at, |c| c.at)
    }
}

/// A requester, its addressee, and what it asks for.
type Ask = (&'static str, &'static str, &'static [&'static str]);

/// Who asks whom for what, and how often.
#[rustfmt::skip]
const ASKS: [(usize, Ask); 22] = [
    (14, ("marketing", "web", &["pricing page copy", "landing page for the autumn campaign", "newsletter signup form", "UTM tags on the launch links", "pricing table: monthly | yearly toggle"])),
    (12, ("design", "web", &["new hero images", "dark-mode palette", "icon set v3", "spacing tokens in the CSS"])),
    (12, ("web", "ci", &["rerun the flaky e2e suite", "cache the node_modules step", "nightly build of the staging branch", "bump the runner image"])),
    (10, ("web", "design", &["mockups for the settings page", "empty-state illustrations", "a 512 px favicon", "the 404 page"])),
    (8, ("security", "web", &["rotate the staging API keys", "a CSP header for the app", "upgrade the vulnerable date library", "remove the debug endpoint"])),
    (6, ("security", "ci", &["pin the third-party actions", "secret scanning on pull requests", "an SBOM for the release"])),
    (6, ("ci", "web", &["fix the lint failure on main", "a test for the checkout flow", "split the bundle: the build is slow"])),
    (7, ("marketing", "design", &["banner set for the launch", "social cards", "the one-pager PDF"])),
    (3, ("design", "marketing", &["copy for the onboarding screens", "the tagline, final"])),
    (3, ("web", "marketing", &["final copy for the FAQ", "product names for the plans"])),
    (3, ("web", "security", &["review the login rate limit", "review the cookie flags"])),
    (2, ("ci", "security", &["review the new deploy token"])),
    (2, ("marketing", "security", &["may we name the pen-test firm?"])),
    (4, ("web", "human", &["approve the pricing change", "which analytics vendor?", "sign off the privacy text"])),
    (3, ("design", "human", &["pick one of the two logos", "budget for stock photos"])),
    (3, ("marketing", "human", &["OK to send the October newsletter?", "approve the ad spend"])),
    (2, ("security", "human", &["accept the pen-test scope", "who may hold the prod keys?"])),
    (5, ("human", "web", &["status of the launch", "fix the typo on the about page", "why is staging down?"])),
    (2, ("human", "design", &["a slide for the board meeting"])),
    (2, ("human", "marketing", &["numbers for the monthly update"])),
    (1, ("human", "ci", &["why did the release build fail?"])),
    (2, ("human", "security", &["summary of open findings"])),
];

/// Who writes notes, and about what.
#[rustfmt::skip]
const CHATTER: [(usize, (&str, &[&str])); 6] = [
    (25, ("web", &["deployed to staging", "FYI: the checkout page is slow today", "merged the header fix", "heads-up: renaming the API routes"])),
    (15, ("design", &["new drafts in the shared folder", "FYI: the font licence is renewed", "colour tokens updated"])),
    (20, ("ci", &["nightly build green", "nightly build red: 2 tests failed", "runner disk at 85%", "cache hit rate 92%"])),
    (10, ("security", &["weekly scan: no new findings", "a new advisory for the date library", "reminder: rotate tokens monthly"])),
    (15, ("marketing", &["campaign draft ready for review", "newsletter open rate 41%", "FYI: the launch moved a week"])),
    (15, ("human", &["thanks, looks good", "out tomorrow morning", "please keep the launch list current"])),
];

const REPLIES: [(&str, &str); 6] = [
    ("working", "on it"),
    ("input-required", "need one detail first: which variant?"),
    ("completed", "done, see the link in the thread"),
    ("failed", "could not do it: blocked upstream"),
    ("rejected", "not ours: please ask someone else"),
    ("canceled", "never mind, no longer needed"),
];

fn reply_text(state: &str, requester_side: bool) -> &'static str {
    if requester_side && state == "working" {
        return "here it is: use the second variant";
    }
    REPLIES
        .iter()
        .find(|(s, _)| *s == state)
        .map_or("", |(_, t)| t)
}

fn rfc(at: DateTime<Utc>, who: &str) -> String {
    // The person's machine writes local times with an offset; the agents write UTC.
    if who == HUMAN {
        let cest = FixedOffset::east_opt(2 * 3600).expect("valid offset");
        at.with_timezone(&cest)
            .to_rfc3339_opts(SecondsFormat::Secs, false)
    } else {
        at.to_rfc3339_opts(SecondsFormat::Millis, true)
    }
}

fn text_message(text: &str) -> Value {
    json!({"role": "agent", "parts": [{"type": "text", "text": text}]})
}

/// A month of planned traffic and the books kept on it.
pub struct Month {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Every line, in the order it is appended: by time, then by plan order.
    pub lines: Vec<Planned>,
    pub requests: Vec<Book>,
}

struct Gen {
    rng: Rng,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    lines: Vec<Planned>,
    requests: Vec<Book>,
}

impl Gen {
    fn push(&mut self, at: DateTime<Utc>, inbox: &str, line: String, expect: Expect) {
        assert!(
            at >= self.start && at < self.end,
            "{at} is outside the month"
        );
        let seq = self.lines.len();
        self.lines.push(Planned {
            at,
            seq,
            inbox: inbox.to_owned(),
            line,
            expect,
        });
    }

    fn accepted(&mut self, at: DateTime<Utc>, envelope: &Map<String, Value>) {
        let field = |k: &str| envelope[k].as_str().expect("a string field").to_owned();
        let kind = match envelope["kind"].as_str() {
            Some("request") => "request",
            Some("response") => "response",
            _ => "note",
        };
        let expect = Expect::Accepted {
            from: field("from"),
            kind,
        };
        let line = Value::Object(envelope.clone()).to_string();
        self.push(at, &field("to"), line, expect);
    }

    /// A random moment of the month, on a whole second.
    fn moment(&mut self, margin_secs: i64) -> DateTime<Utc> {
        self.start + Duration::seconds(self.rng.secs(0, DAYS * 86_400 - margin_secs))
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &mut self,
        at: DateTime<Utc>,
        id: String,
        from: &str,
        to: &str,
        context: Option<String>,
        title: String,
        detail: Option<&str>,
    ) {
        let priority = *self.rng.weighted(&[(8, 0u8), (70, 1), (17, 2), (5, 3)]);
        let reply_by = self
            .rng
            .chance(120)
            .then(|| at + Duration::seconds(self.rng.secs(10 * 60, 6 * 3600)));
        let mut envelope = Map::new();
        envelope.insert("id".into(), json!(id));
        envelope.insert("from".into(), json!(from));
        envelope.insert("to".into(), json!(to));
        envelope.insert("kind".into(), json!("request"));
        if let Some(context) = &context {
            envelope.insert("contextId".into(), json!(context));
        }
        if self.rng.chance(400) {
            let n = self.rng.below(200);
            envelope.insert(
                "taskId".into(),
                json!(format!("q-{}-{n:03}", at.format("%Y%m%d"))),
            );
        }
        if self.rng.chance(500) {
            envelope.insert("state".into(), json!("submitted"));
        }
        envelope.insert("createdAt".into(), json!(rfc(at, from)));
        if priority != 1 || self.rng.chance(200) {
            envelope.insert("priority".into(), json!(priority));
        }
        if let Some(reply_by) = reply_by {
            envelope.insert("replyBy".into(), json!(rfc(reply_by, from)));
        }
        let text = match detail {
            Some(detail) => format!("{title}\n{detail}"),
            None => title.clone(),
        };
        envelope.insert("message".into(), text_message(&text));
        self.accepted(at, &envelope);
        let mut book = Book {
            context: context.unwrap_or_else(|| id.clone()),
            id,
            requester: from.to_owned(),
            addressee: to.to_owned(),
            priority,
            reply_by,
            title,
            at,
            changes: Vec::new(),
        };
        self.live(&mut book);
        self.requests.push(book);
    }

    /// Plan a request's life: who answers what, when. Some debtors go silent for good.
    fn live(&mut self, book: &mut Book) {
        let addressee = book.addressee.clone();
        let requester = book.requester.clone();
        let silent_rate = match addressee.as_str() {
            "web" => 60,
            "design" | "ci" => 50,
            HUMAN => 40,
            _ => 5,
        };
        let goes_silent = self.rng.chance(silent_rate);
        let mut steps: Vec<(&str, &'static str)> = Vec::new();
        let roll = self.rng.below(1000);
        if roll < 45 {
            steps.push((&addressee, "rejected"));
        } else if roll < 75 {
            if self.rng.chance(500) {
                steps.push((&addressee, "working"));
            }
            steps.push((&requester, "canceled"));
        } else if goes_silent && self.rng.chance(400) {
            // Never picked up.
        } else {
            let quick = self.rng.chance(250);
            if !quick {
                steps.push((&addressee, "working"));
                let mut beats = 0;
                while beats < 2 && self.rng.chance(350) {
                    steps.push((&addressee, "working"));
                    beats += 1;
                }
            }
            let mut finished = !goes_silent;
            if finished && !quick && self.rng.chance(180) {
                steps.push((&addressee, "input-required"));
                if self.rng.chance(40) {
                    // The requester never gives the input.
                    finished = false;
                } else {
                    steps.push((&requester, "working"));
                }
            }
            if finished {
                let outcome = if self.rng.chance(870) {
                    "completed"
                } else {
                    "failed"
                };
                steps.push((&addressee, outcome));
            }
        }
        let mut at = book.at;
        for (who, state) in steps {
            at += Duration::seconds(delay(&mut self.rng, who));
            if at >= self.end {
                break;
            }
            let to = if who == addressee {
                &requester
            } else {
                &addressee
            };
            let mut envelope = Map::new();
            envelope.insert("id".into(), json!(self.rng.ulid(at)));
            envelope.insert("from".into(), json!(who));
            envelope.insert("to".into(), json!(to));
            envelope.insert("kind".into(), json!("response"));
            envelope.insert("correlatesTo".into(), json!(book.id));
            if self.rng.chance(500) {
                envelope.insert("contextId".into(), json!(book.context));
            }
            envelope.insert("state".into(), json!(state));
            envelope.insert("createdAt".into(), json!(rfc(at, who)));
            envelope.insert(
                "message".into(),
                text_message(reply_text(state, who == requester)),
            );
            self.accepted(at, &envelope);
            book.changes.push(Change {
                at,
                from: who.to_owned(),
                state,
            });
        }
    }

    fn note(&mut self) {
        let (at, from, to, about) = if self.rng.chance(350) {
            // About a request, between its two parties.
            let book = self.rng.pick(&self.requests).clone();
            let (from, to) = if self.rng.chance(500) {
                (book.requester.clone(), book.addressee.clone())
            } else {
                (book.addressee.clone(), book.requester.clone())
            };
            let at = book.at + Duration::seconds(delay(&mut self.rng, &from));
            if at >= self.end {
                return self.note();
            }
            (at, from, to, Some(book))
        } else {
            let from = self.rng.weighted(&CHATTER).0.to_owned();
            let to = loop {
                let to = *self.rng.pick(&STATIONS);
                if to != from {
                    break to.to_owned();
                }
            };
            (self.moment(60), from, to, None)
        };
        let text = if let Some(book) = &about {
            format!("about {}: {}", book.id, book.title)
        } else {
            let (_, (_, topics)) = CHATTER
                .iter()
                .find(|(_, (f, _))| *f == from)
                .expect("every sender chatters");
            (*self.rng.pick(topics)).to_owned()
        };
        let mut envelope = Map::new();
        envelope.insert("id".into(), json!(self.rng.ulid(at)));
        envelope.insert("from".into(), json!(from));
        envelope.insert("to".into(), json!(to));
        envelope.insert("kind".into(), json!("note"));
        if let Some(book) = &about {
            envelope.insert("correlatesTo".into(), json!(book.id));
            envelope.insert("contextId".into(), json!(book.context));
        }
        envelope.insert("createdAt".into(), json!(rfc(at, &from)));
        envelope.insert("message".into(), text_message(&text));
        self.accepted(at, &envelope);
    }

    fn broadcast(&mut self, at: DateTime<Utc>, from: &str, title: &str) {
        let base = self.rng.ulid(at);
        for to in STATIONS.iter().filter(|s| **s != from) {
            self.request(
                at,
                format!("{base}.{to}"),
                from,
                to,
                Some(base.clone()),
                title.to_owned(),
                None,
            );
        }
    }

    fn refused(&mut self, inbox: &str, line: String, reason: &'static str, told: Option<&str>) {
        let at = self.moment(3600);
        self.push(
            at,
            inbox,
            line,
            Expect::Refused {
                reason,
                told: told.map(str::to_owned),
            },
        );
    }

    /// Twenty lines the judge must refuse, with a reason each: broken writers, forgetful
    /// ones, stale answers and wrong doors.
    fn refusals(&mut self) {
        let at = self.moment(3600);
        let id = self.rng.ulid(at);
        let torn = format!(
            r#"{{"id":"{id}","from":"ci","to":"web","kind":"note","createdAt":"{}","message":{{"role":"agent","parts":[{{"type":"text","text":"build 8"#,
            rfc(at, "ci")
        );
        // Not JSON, but it names its sender, a station: ci is told.
        self.refused("web", torn, "bad-json", Some("ci"));
        self.refused("ci", "deploy finished OK".into(), "bad-json", None);
        self.refused("design", "[1,2,3]".into(), "bad-json", None);
        self.refused("marketing", String::new(), "bad-json", None);
        self.refused(
            "security",
            r#"{"id":"a1"} {"id":"b2"}"#.into(),
            "bad-json",
            None,
        );
        // Missing fields: no createdAt, no message, no id, no to, no from.
        let missing: [(&str, &str, &str, &str, Option<&str>); 5] = [
            (
                "marketing",
                "design",
                "note",
                "createdAt",
                Some("marketing"),
            ),
            ("web", "ci", "request", "message", Some("web")),
            ("ci", "web", "note", "id", Some("ci")),
            ("design", "web", "note", "to", Some("design")),
            (HUMAN, "security", "note", "from", None),
        ];
        for (from, to, kind, drop, told) in missing {
            let at = self.moment(3600);
            let mut envelope = Map::new();
            envelope.insert("id".into(), json!(self.rng.ulid(at)));
            envelope.insert("from".into(), json!(from));
            envelope.insert("to".into(), json!(to));
            envelope.insert("kind".into(), json!(kind));
            envelope.insert("createdAt".into(), json!(rfc(at, from)));
            envelope.insert("message".into(), text_message("see the attached notes"));
            envelope.remove(drop);
            self.refused(
                to,
                Value::Object(envelope).to_string(),
                "missing-field",
                told,
            );
        }
        // Answers to requests that never were.
        for (from, to) in [
            ("web", "marketing"),
            ("design", "web"),
            ("ci", "security"),
            ("security", "web"),
        ] {
            let at = self.moment(3600);
            let line = json!({
                "id": self.rng.ulid(at), "from": from, "to": to, "kind": "response",
                "correlatesTo": self.rng.ulid(at - Duration::days(40)), "state": "completed",
                "createdAt": rfc(at, from), "message": text_message("done"),
            });
            self.refused(to, line.to_string(), "unknown-request", Some(from));
        }
        // Notes dropped into the wrong inbox.
        for (from, to, inbox) in [
            ("marketing", "web", "design"),
            ("web", "ci", "security"),
            ("ci", "design", "web"),
            ("security", "web", "human"),
        ] {
            let at = self.moment(3600);
            let line = json!({
                "id": self.rng.ulid(at), "from": from, "to": to, "kind": "note",
                "createdAt": rfc(at, from), "message": text_message("for your eyes"),
            });
            self.refused(inbox, line.to_string(), "misaddressed", Some(from));
        }
        self.stale_answers();
    }

    /// Two second answers to requests already completed.
    fn stale_answers(&mut self) {
        let closed: Vec<Book> = self
            .requests
            .iter()
            .filter(|b| {
                b.state() == "completed"
                    && b.addressee != HUMAN
                    && b.since() + Duration::hours(2) < self.end
            })
            .cloned()
            .collect();
        for _ in 0..2 {
            let book = self.rng.pick(&closed).clone();
            let at = book.since() + Duration::minutes(30);
            let line = json!({
                "id": self.rng.ulid(at), "from": book.addressee, "to": book.requester,
                "kind": "response", "correlatesTo": book.id, "state": "completed",
                "createdAt": rfc(at, &book.addressee), "message": text_message("done (again)"),
            });
            self.push(
                at,
                &book.requester,
                line.to_string(),
                Expect::Refused {
                    reason: "request-closed",
                    told: Some(book.addressee.clone()),
                },
            );
        }
    }

    /// Three notes sent twice, as a retry does: the same line again a minute and a half later.
    fn retries(&mut self) {
        let notes: Vec<Planned> = self
            .lines
            .iter()
            .filter(|p| {
                matches!(&p.expect, Expect::Accepted { kind: "note", .. })
                    && p.at + Duration::minutes(2) < self.end
            })
            .cloned()
            .collect();
        for _ in 0..3 {
            let note = self.rng.pick(&notes).clone();
            self.push(
                note.at + Duration::seconds(90),
                &note.inbox,
                note.line,
                Expect::Duplicate,
            );
        }
    }
}

impl Month {
    /// Plan the month of October 2026 from `seed`.
    pub fn generate(seed: u64) -> Month {
        let start = Utc.with_ymd_and_hms(2026, 10, 1, 0, 0, 0).unwrap();
        let end = start + Duration::days(DAYS);
        let mut gen = Gen {
            rng: Rng::new(seed),
            start,
            end,
            lines: Vec::new(),
            requests: Vec::new(),
        };
        let broadcasts = [
            (6 * 24 + 9, HUMAN, "Standup: post your status for the week"),
            (13 * 24 + 14, "security", "Confirm you rotated your tokens"),
            (
                29 * 24 + 14,
                "web",
                "Freeze: no deploys until the launch | please acknowledge",
            ),
        ];
        for (hours, from, title) in broadcasts {
            gen.broadcast(start + Duration::hours(hours), from, title);
        }
        let mut n = 0;
        while gen.requests.len() < REQUESTS {
            n += 1;
            let (from, to, topics) = *gen.rng.weighted(&ASKS);
            let at = gen.moment(600);
            let topic = *gen.rng.pick(topics);
            let detail = gen
                .rng
                .chance(300)
                .then_some("Details and links are in the tracker.");
            let id = gen.rng.ulid(at);
            gen.request(
                at,
                id,
                from,
                to,
                None,
                format!("REQUEST: {topic} (#{n})"),
                detail,
            );
        }
        for _ in 0..NOTES {
            gen.note();
        }
        gen.refusals();
        gen.retries();
        let mut lines = gen.lines;
        lines.sort_by_key(|p| (p.at, p.seq));
        Month {
            start,
            end,
            lines,
            requests: gen.requests,
        }
    }

    /// Play the month into a new bridge folder at `dir`, judged in virtual time.
    pub fn judge(&self, dir: &Path) -> Judged {
        let bridge = Bridge::create(dir, Config::default()).expect("bridge folder");
        for station in STATIONS {
            bridge.add_agent(station).expect("inbox");
        }
        let lock = BridgeLock::acquire(&bridge, "test").expect("the lock");
        let mut judge = Judge::open(bridge.clone(), lock).expect("the judge");
        let mut judged = Judged {
            bridge,
            passes: 0,
            notices: 0,
        };
        for planned in &self.lines {
            judged.ring_until(&mut judge, planned.at);
            let path = judged.bridge.inbox_path(&planned.inbox).expect("a station");
            append_line(&path, planned.line.as_bytes()).expect("append");
            let stats = judge
                .sweep(std::slice::from_ref(&planned.inbox), planned.at)
                .expect("sweep");
            let got = (stats.accepted, stats.duplicate, stats.refused);
            let want = match planned.expect {
                Expect::Accepted { .. } => (1, 0, 0),
                Expect::Duplicate => (0, 1, 0),
                Expect::Refused { .. } => (0, 0, 1),
            };
            assert_eq!(got, want, "verdict on {} at {}", planned.line, planned.at);
            if judge.has_untold() {
                // The daemon tells a refusal within its short notice window: here, at once.
                judged.emit(&mut judge, planned.at);
            }
        }
        judged.ring_until(&mut judge, self.end);
        judge.checkpoint().expect("checkpoint");
        judged
    }
}

/// A judged month: the bridge folder (its index holds what the judge knows).
pub struct Judged {
    pub bridge: Bridge,
    /// Passes of the doorbell (emit) made.
    pub passes: u64,
    /// Lines the judge wrote: rings, escalations and refusal notices.
    pub notices: u64,
}

impl Judged {
    /// Write every ring and escalation due by `until`, each pass at its due time, as the
    /// daemon does when it wakes for the earliest one.
    fn ring_until(&mut self, judge: &mut Judge, until: DateTime<Utc>) {
        while let Some(due) = judge.next_due().filter(|due| *due <= until) {
            let before = self.notices;
            self.emit(judge, due);
            assert!(self.notices > before, "a pass at {due} wrote nothing");
        }
    }

    fn emit(&mut self, judge: &mut Judge, at: DateTime<Utc>) {
        let mut stats = CatchUp::default();
        let targets = judge.emit(at, &mut stats).expect("emit");
        let again = judge.sweep(&targets, at).expect("sweep the notices");
        assert_eq!(
            (again.accepted, again.refused),
            (stats.notices, 0),
            "the judge's own lines are accepted"
        );
        self.passes += 1;
        self.notices += stats.notices;
    }
}
