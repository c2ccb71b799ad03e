//! `.doorbell/index.db`: what is looked up by key, on disk, so that memory holds only the
//! open state. Every accepted message by id (where it is, its thread, its fingerprint), every
//! line that was not accepted by position, every request, the judge's own ids, and the open
//! state a restart needs (each inbox's position, pending intents, untold refusals, refusal
//! counts), with the journal length it covers.
//!
//! The index is the checkpoint: the judge saves into it what changed since the last save, in
//! one `SQLite` transaction, after the journal it covers is synced. It is never ahead of the
//! journal, and it is never the truth: a missing or damaged index is rebuilt by replaying the
//! journal (nothing is judged again). Only the lock holder writes; anyone may read, and a
//! reader sees one consistent save.
//!
//! `SQLite` (WAL, `synchronous = NORMAL`): a save writes the pages it changes, not the whole
//! state; a reader opens it in well under a millisecond.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use doorbell_core::notice::RefusedLine;
use doorbell_core::{Archive, Kind, RefusalReason, Request, State};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::ids::IdFilter;
use crate::journal::{InboxJournal, Intent};
use crate::{Error, Result};

pub const INDEX_FILE: &str = "index.db";

/// Messages sent, by sender and kind.
pub type Sent = HashMap<(String, Kind), u64>;
/// Bumped whenever the tables change: an index of another version is rebuilt.
const VERSION: i64 = 6;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value, sum INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages(
    id TEXT PRIMARY KEY,
    inbox TEXT NOT NULL,
    gen INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    span INTEGER NOT NULL,
    seen_at INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    sender TEXT NOT NULL,
    kind INTEGER NOT NULL,
    correlates_to TEXT,
    context_id TEXT NOT NULL,
    state TEXT,
    fingerprint INTEGER NOT NULL,
    sum INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS others(
    inbox TEXT NOT NULL,
    gen INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    span INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    seen_at INTEGER NOT NULL,
    id TEXT,
    sender TEXT,
    reason TEXT,
    detail TEXT,
    sum INTEGER NOT NULL,
    PRIMARY KEY(inbox, gen, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS requests(
    id TEXT PRIMARY KEY,
    open INTEGER NOT NULL,
    due_at INTEGER,
    closed_at INTEGER,
    addressee TEXT NOT NULL,
    requester TEXT NOT NULL,
    data TEXT NOT NULL,
    sum INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS own(id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inboxes(name TEXT PRIMARY KEY, data TEXT NOT NULL, sum INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS intents(id TEXT PRIMARY KEY, inbox TEXT NOT NULL, line TEXT NOT NULL, sum INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS untold(key TEXT PRIMARY KEY, data TEXT NOT NULL, sum INTEGER NOT NULL) WITHOUT ROWID;
";

/// The lookups of the readers (threads, history, due and closed requests): none is asked by
/// the judge while it judges. A new index is filled without them and they are made once it
/// holds its first catch-up ([`IndexWriter::finish`]): sorting half a million rows once
/// costs under a second, keeping every insert's place in eight B-trees cost about half a
/// catch-up's time. A reader meanwhile gets the same answers, by scanning. A thread's first
/// message is found by its id, so the thread lookup holds only the messages of threads
/// another began (made full, it took 0.4 s of a 500,000-message catch-up; an index made so
/// before keeps it, and answers the same).
const LOOKUPS: &str = "
CREATE INDEX IF NOT EXISTS messages_by_thread ON messages(context_id) WHERE context_id != id;
CREATE INDEX IF NOT EXISTS messages_by_time ON messages(seen_at);
CREATE INDEX IF NOT EXISTS others_by_id ON others(id) WHERE id IS NOT NULL;
CREATE INDEX IF NOT EXISTS others_by_time ON others(seen_at);
CREATE INDEX IF NOT EXISTS requests_open ON requests(due_at) WHERE open;
CREATE INDEX IF NOT EXISTS requests_open_to ON requests(addressee) WHERE open;
CREATE INDEX IF NOT EXISTS requests_open_from ON requests(requester) WHERE open;
CREATE INDEX IF NOT EXISTS requests_closed ON requests(closed_at) WHERE closed_at IS NOT NULL;
";

/// Refusals by place, whatever their generation: a line read again after a restore is
/// found by where it is (`Index::refused_before`).
const OTHERS_BY_PLACE: &str = "CREATE INDEX IF NOT EXISTS others_by_place ON others(inbox, offset)";

/// The query of `Index::refused_before`. Without `INDEXED BY`, `SQLite` chose the primary key
/// (`inbox = ? AND gen < ?`): every refused line of a restored inbox scanned all the refusals
/// of the generations before it, and 20,000 of them took minutes.
const REFUSED_BEFORE: &str =
    "SELECT inbox, gen, offset, span, verdict, seen_at, id, sender, reason, detail, sum \
     FROM others INDEXED BY others_by_place \
     WHERE inbox = ?1 AND offset = ?2 AND gen < ?3 AND verdict = 'r'";

/// The write-ahead log is cut back to this when a small save starts it over after a
/// checkpoint. A catch-up grows it by about 0.9 KiB a message (its lookups hold a read
/// between saves, so no checkpoint finishes until it ends), and without a limit the file
/// kept that size for as long as the daemon ran: 455 MiB after 500,000 messages, beside a
/// 162 MiB index. A large save (a catch-up's) leaves the file as it is: cutting 450 MiB
/// back frees as many pages and blocks, 0.1-0.2 s on the catch-up's own path.
const WAL_LIMIT: &str = "PRAGMA journal_size_limit = 16777216";
/// No limit: the file stays as large as it grew.
const WAL_UNLIMITED: &str = "PRAGMA journal_size_limit = -1";

/// The writer's page cache between large saves.
const SMALL_CACHE: &str = "PRAGMA cache_size = -4096";
/// A save of at least this many rows (a catch-up's batch) gets [`LARGE_CACHE`].
const LARGE_SAVE_ROWS: usize = 2_000;
/// A page cache that holds what a catch-up's batch changes: with 4 MiB the transaction
/// spilled pages into the write-ahead log half way and read them back, and a catch-up of
/// 500,000 messages took an eighth longer (batches of 20,000 lines then; with 40,000, twice
/// this cache saved no time).
const LARGE_CACHE: &str = "PRAGMA cache_size = -32768";

/// Run a statement without parameters from the connection's cache: a read transaction is
/// begun and ended around every sweep, and parsing its SQL each time showed.
fn run_cached(conn: &Connection, statement: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(statement)?.execute([]).map(|_| ())
}

/// An accepted line, as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRow {
    pub id: String,
    pub inbox: String,
    pub gen: u32,
    pub offset: u64,
    pub span: u64,
    pub seen_at: i64,
    /// Its place in the order lines were accepted: the journal's `seq`-th accepted line,
    /// from 0. Lines judged in one pass share `seen_at`; this still orders them.
    pub seq: u64,
    pub from: String,
    pub kind: Kind,
    pub correlates_to: Option<String>,
    pub context_id: String,
    pub state: Option<State>,
    pub fingerprint: u64,
}

/// A row to be filled ([`MessageRow::fill_from`]).
impl Default for MessageRow {
    fn default() -> MessageRow {
        MessageRow {
            id: String::new(),
            inbox: String::new(),
            gen: 0,
            offset: 0,
            span: 0,
            seen_at: 0,
            seq: 0,
            from: String::new(),
            kind: Kind::Note,
            correlates_to: None,
            context_id: String::new(),
            state: None,
            fingerprint: 0,
        }
    }
}

/// A refused or duplicate line, as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherRow {
    pub inbox: String,
    pub gen: u32,
    pub offset: u64,
    pub span: u64,
    /// `d` (duplicate) or `r` (refused).
    pub duplicate: bool,
    pub seen_at: i64,
    pub id: Option<String>,
    pub from: Option<String>,
    pub reason: Option<String>,
    pub detail: Option<String>,
}

/// When the doorbell rings: what a request's saved due time was computed with.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    pub schedule: doorbell_core::debts::Schedule,
    pub human: String,
}

impl Timing {
    /// A short text that differs when the schedule does: saved beside the due times.
    #[must_use]
    pub fn key(&self) -> String {
        format!(
            "{}ms/{}/{}/{}",
            self.schedule.ring_after.as_millis(),
            self.schedule.backoff,
            self.schedule.max_rings,
            self.human
        )
    }

    /// When `request` next rings or is escalated, in milliseconds.
    #[must_use]
    pub fn due_at(&self, request: &Request) -> Option<i64> {
        doorbell_core::debts::next_due(request, &self.schedule, &self.human)
            .map(|(at, _)| at.timestamp_millis())
    }
}

/// What a save writes: everything that changed since the last one.
#[derive(Debug, Default)]
pub struct Changes {
    /// The ledger's change set (see `Ledger::take_changes`).
    pub seq: u64,
    /// The live journal segment, and how much of it the save covers.
    pub segment: u64,
    pub journal_len: u64,
    /// How many lines the journal it covers accepted: the next accepted line's `seq`.
    pub accepted: u64,
    pub messages: Vec<MessageRow>,
    pub others: Vec<OtherRow>,
    pub own: Vec<String>,
    pub requests: Vec<std::sync::Arc<Request>>,
    pub inboxes: Vec<(String, InboxJournal)>,
    /// The whole (small) open state, when it changed since the last save.
    pub intents: Option<BTreeMap<String, Intent>>,
    pub untold: Option<BTreeMap<String, RefusedLine>>,
    /// Refusals a recovered notice named before they were judged again (see `Snapshot`).
    pub told_ahead: Option<std::collections::BTreeSet<String>>,
    pub refused: Option<BTreeMap<RefusalReason, u64>>,
    /// The schedule the requests' due times are computed with.
    pub timing: Option<Timing>,
}

impl Changes {
    /// About how many bytes the rows take: what the fault seam charges a save.
    #[must_use]
    pub fn approximate_bytes(&self) -> usize {
        64 + self.messages.len() * 160
            + self.others.len() * 160
            + self.own.len() * 64
            + self.requests.len() * 300
            + self.inboxes.len() * 200
    }
}

/// The open state a judge or a reader starts from.
#[derive(Debug, Default)]
pub struct OpenState {
    pub segment: u64,
    pub journal_len: u64,
    /// See [`Changes::accepted`].
    pub accepted: u64,
    pub inboxes: BTreeMap<String, InboxJournal>,
    pub intents: BTreeMap<String, Intent>,
    pub untold: BTreeMap<String, RefusedLine>,
    pub told_ahead: std::collections::BTreeSet<String>,
    pub refused: BTreeMap<RefusalReason, u64>,
    /// What the saved due times were computed with (see [`Timing::key`]).
    pub timing: Option<String>,
}

/// `SQLite`'s error as the store's: a damaged file is [`Error::Index`] (the judge rebuilds
/// it); anything else (a full disk, a read-only file system, a busy lock) is a failed write
/// like any other, [`Error::IndexWrite`].
fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| {
        if is_damage(&e) {
            if is_damaged_file(&e) {
                mark_damaged(path);
            }
            Error::Index {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        } else {
            Error::IndexWrite {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        }
    }
}

/// The mark a reader leaves when it finds the index damaged (a checksum that does not
/// match, a corrupt page): the next judge to open rebuilds the index from the journal.
#[must_use]
pub fn damage_mark(index: &Path) -> PathBuf {
    index.with_extension("damaged")
}

fn mark_damaged(index: &Path) {
    let mark = damage_mark(index);
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&mark);
    if let Err(error) = made {
        tracing::warn!(mark = %mark.display(), %error, "could not mark the index damaged");
    }
}

/// Damage in the file itself, not a table this version does not know (which a new index
/// being made shows for a moment).
fn is_damaged_file(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    match e {
        rusqlite::Error::SqliteFailure(failure, _) => {
            matches!(failure.code, DatabaseCorrupt | NotADatabase)
        }
        rusqlite::Error::FromSqlConversionFailure(..) => true,
        _ => false,
    }
}

fn is_damage(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    let damaged = match e {
        rusqlite::Error::SqliteFailure(failure, _) => {
            matches!(failure.code, DatabaseCorrupt | NotADatabase)
        }
        // A column of the wrong type: not what doorbell wrote.
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => true,
        _ => false,
    };
    // Tables or columns not as this version makes them.
    let text = e.to_string();
    damaged
        || ["no such table", "no such column", "has no column named"]
            .iter()
            .any(|t| text.contains(t))
}

/// A row's checksum: its values in order, each self-delimiting, hashed. Written with every
/// row and checked whenever a row is read, so a flipped byte in the index is found (and the
/// index rebuilt from the journal), never taken for a fact.
#[derive(Default)]
struct RowSum(Vec<u8>);

impl RowSum {
    fn text(mut self, text: &str) -> RowSum {
        self.0.extend_from_slice(&(text.len() as u64).to_le_bytes());
        self.0.extend_from_slice(text.as_bytes());
        self
    }

    fn maybe(self, text: Option<&str>) -> RowSum {
        match text {
            Some(text) => self.int(1).text(text),
            None => self.int(0),
        }
    }

    fn int(mut self, n: i64) -> RowSum {
        self.0.extend_from_slice(&n.to_le_bytes());
        self
    }

    fn maybe_int(self, n: Option<i64>) -> RowSum {
        match n {
            Some(n) => self.int(1).int(n),
            None => self.int(0),
        }
    }

    /// The checksum, as `SQLite`'s signed integer holds it.
    #[allow(clippy::cast_possible_wrap)]
    fn sum(&self) -> i64 {
        xxhash_rust::xxh3::xxh3_64(&self.0) as i64
    }
}

/// `Ok` when a row's stored checksum (in `column`) is the one its values make.
fn check_sum(column: usize, stored: i64, values: &RowSum) -> rusqlite::Result<()> {
    if stored == values.sum() {
        return Ok(());
    }
    Err(rusqlite::Error::FromSqlConversionFailure(
        column,
        rusqlite::types::Type::Integer,
        "a row's checksum does not match its values: the index is damaged".into(),
    ))
}

fn message_sum(m: &MessageRow) -> RowSum {
    // The fingerprint's bits, as stored.
    #[allow(clippy::cast_possible_wrap)]
    let fingerprint = m.fingerprint as i64;
    RowSum::default()
        .text(&m.id)
        .text(&m.inbox)
        .int(i64::from(m.gen))
        .int(to_sql(m.offset))
        .int(to_sql(m.span))
        .int(m.seen_at)
        .int(to_sql(m.seq))
        .text(&m.from)
        .int(kind_code(m.kind))
        .maybe(m.correlates_to.as_deref())
        .text(&m.context_id)
        .maybe(m.state.map(State::as_str))
        .int(fingerprint)
}

fn other_sum(o: &OtherRow) -> RowSum {
    RowSum::default()
        .text(&o.inbox)
        .int(i64::from(o.gen))
        .int(to_sql(o.offset))
        .int(to_sql(o.span))
        .int(i64::from(o.duplicate))
        .int(o.seen_at)
        .maybe(o.id.as_deref())
        .maybe(o.from.as_deref())
        .maybe(o.reason.as_deref())
        .maybe(o.detail.as_deref())
}

/// A request row's columns, as `requests_where` reads them.
struct RequestColumns<'a> {
    id: &'a str,
    open: bool,
    due_at: Option<i64>,
    closed_at: Option<i64>,
    addressee: &'a str,
    requester: &'a str,
    data: &'a str,
}

impl RequestColumns<'_> {
    fn sum(&self) -> RowSum {
        RowSum::default()
            .text(self.id)
            .int(i64::from(self.open))
            .maybe_int(self.due_at)
            .maybe_int(self.closed_at)
            .text(self.addressee)
            .text(self.requester)
            .text(self.data)
    }
}

/// What a request query selects, in the order `request_of_row` reads it.
macro_rules! request_columns {
    () => {
        "id, open, due_at, closed_at, addressee, requester, data, sum"
    };
}

/// A request row's data, its checksum checked.
fn request_data(row: &rusqlite::Row<'_>) -> rusqlite::Result<String> {
    let (id, addressee, requester, data): (String, String, String, String) =
        (row.get(0)?, row.get(4)?, row.get(5)?, row.get(6)?);
    let columns = RequestColumns {
        id: &id,
        open: row.get(1)?,
        due_at: row.get(2)?,
        closed_at: row.get(3)?,
        addressee: &addressee,
        requester: &requester,
        data: &data,
    };
    check_sum(7, row.get(7)?, &columns.sum())?;
    Ok(data)
}

/// A key and its text, as the two-column tables keep them.
fn keyed_sum(key: &str, data: &str) -> RowSum {
    RowSum::default().text(key).text(data)
}

/// A `meta` value: an integer or a text.
fn meta_sum(key: &str, value: rusqlite::types::ValueRef<'_>) -> RowSum {
    let sum = RowSum::default().text(key);
    match value {
        rusqlite::types::ValueRef::Integer(n) => sum.int(1).int(n),
        rusqlite::types::ValueRef::Text(t) => sum.int(2).text(&String::from_utf8_lossy(t)),
        _ => sum.int(0),
    }
}

fn kind_code(kind: Kind) -> i64 {
    match kind {
        Kind::Request => 0,
        Kind::Response => 1,
        Kind::Note => 2,
    }
}

fn kind_of(code: i64) -> Kind {
    match code {
        0 => Kind::Request,
        1 => Kind::Response,
        _ => Kind::Note,
    }
}

/// The accepted message with an id.
const MESSAGE_BY_ID: &str = "SELECT id, inbox, gen, offset, span, seen_at, seq, sender, kind, \
     correlates_to, context_id, state, fingerprint, sum FROM messages WHERE id = ?1";

#[must_use]
pub fn index_path(state_dir: &Path) -> PathBuf {
    state_dir.join(INDEX_FILE)
}

/// One connection to the index, shared by whoever reads through it on one thread (the
/// ledger's archive and the queries of a view).
#[derive(Debug)]
pub struct Index {
    conn: Mutex<Connection>,
    path: PathBuf,
    /// Set when a lookup found the file damaged: the judge must not act on what it read.
    damaged: std::sync::atomic::AtomicBool,
    /// Whether lookups hold one read transaction until [`Index::release`]: taking `SQLite`'s
    /// locks once per line was a fifth of a catch-up.
    hold: std::sync::atomic::AtomicBool,
    /// Which ids `messages` may hold, once [`Index::filter_ids`] made it (see `ids.rs`).
    ids: std::sync::OnceLock<Arc<IdFilter>>,
}

impl Index {
    /// Open the index to read it; `None` when it does not exist yet.
    pub fn open_read(path: &Path) -> Result<Option<Index>> {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("stat index", path)(e)),
            Ok(meta) if !meta.file_type().is_file() => {
                return Err(Error::NotRegularFile {
                    path: path.to_path_buf(),
                })
            }
            Ok(_) => {}
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(sql(path))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql(path))?;
        // A catch-up asks the index once per line: the pages it walks stay in memory (up to
        // 16 MiB, allocated only as they are read).
        conn.execute_batch("PRAGMA cache_size = -16384")
            .map_err(sql(path))?;
        let index = Index {
            conn: Mutex::new(conn),
            path: path.to_path_buf(),
            damaged: std::sync::atomic::AtomicBool::new(false),
            hold: std::sync::atomic::AtomicBool::new(false),
            ids: std::sync::OnceLock::new(),
        };
        match index.check_version() {
            Ok(()) => Ok(Some(index)),
            // No table at all: the writer made the file and has not made its tables yet (a
            // first command's catch-up, a compaction). Nothing to read yet, nothing damaged.
            Err(_) if index.has_no_tables() => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn has_no_tables(&self) -> bool {
        self.conn()
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })
            .is_ok_and(|tables| tables == 0)
    }

    fn check_version(&self) -> Result<()> {
        let version: Option<i64> = self
            .conn()
            .query_row("SELECT value FROM meta WHERE key = 'version'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql(&self.path))?;
        if version == Some(VERSION) {
            Ok(())
        } else {
            Err(Error::Index {
                path: self.path.clone(),
                message: format!("version {version:?}, expected {VERSION}"),
            })
        }
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a lookup through the ledger's archive failed since the index was opened: what
    /// the ledger decided since may rest on a wrong answer.
    #[must_use]
    pub fn failed_lookup(&self) -> Option<Error> {
        self.damaged
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| Error::Index {
                path: self.path.clone(),
                message: "a lookup failed".into(),
            })
    }

    fn lookup_failed(&self, error: &rusqlite::Error) {
        // The ledger cannot fail; a read that fails reads as "not there", and the judge
        // checks this flag before it journals anything decided since.
        tracing::error!(path = %self.path.display(), %error, "could not read the index");
        if is_damaged_file(error) {
            mark_damaged(&self.path);
        }
        self.damaged
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keep a filter of the ids `messages` holds, so that a claim lookup of a new id is
    /// answered without a query: for a long-running judge, once everything it judged so far
    /// is saved. The filter takes every id claimed from now on (through the ledger's
    /// archive) and is filled with those saved on a thread of its own; until that read is
    /// done every lookup asks the index.
    pub fn filter_ids(self: &Arc<Index>) {
        // Sized by the file: a message takes about 540 bytes of it (a million messages, 543
        // MB), so 384 bytes an id errs on the large side, with room for more. A filter that
        // fills past its size only says "perhaps" more often.
        let saved = std::fs::metadata(&self.path).map_or(0, |meta| meta.len() / 384);
        let filter = Arc::new(IdFilter::with_capacity(saved + (1 << 18)));
        if self.ids.set(Arc::clone(&filter)).is_err() {
            return;
        }
        let path = self.path.clone();
        let started = std::thread::Builder::new()
            .name("ids".into())
            .spawn(move || match fill_ids(&path, &filter) {
                Ok(ids) => {
                    filter.set_ready();
                    tracing::info!(ids, bytes = filter.bytes(), "the id filter is ready");
                }
                Err(error) => {
                    tracing::warn!(%error, "no id filter: every id is looked up in the index");
                }
            });
        if let Err(error) = started {
            tracing::warn!(%error, "no id filter: every id is looked up in the index");
        }
    }

    /// Let lookups hold a read transaction, from the first until [`Index::release`]: for a
    /// judge, which releases it whenever its memory lets go of what a save wrote.
    pub fn hold_lookups(&self) {
        self.hold.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// End the lookups' read transaction, so the next one sees the latest save.
    pub fn release(&self) {
        if self.hold.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = self.end_read();
        }
    }

    /// The connection for a lookup, inside the held read transaction when there is one.
    fn lookup_conn(&self) -> MutexGuard<'_, Connection> {
        let conn = self.conn();
        if self.hold.load(std::sync::atomic::Ordering::Relaxed) && conn.is_autocommit() {
            if let Err(error) = run_cached(&conn, "BEGIN DEFERRED") {
                tracing::warn!(%error, "could not begin a read of the index");
            }
        }
        conn
    }

    /// Hold one read transaction until [`Index::end_read`], so that every query sees the
    /// same save.
    pub fn begin_read(&self) -> Result<()> {
        run_cached(&self.conn(), "BEGIN DEFERRED").map_err(sql(&self.path))
    }

    pub fn end_read(&self) -> Result<()> {
        let conn = self.conn();
        if conn.is_autocommit() {
            return Ok(());
        }
        run_cached(&conn, "COMMIT").map_err(sql(&self.path))
    }

    /// The open state as of the last save.
    pub fn open_state(&self) -> Result<OpenState> {
        let conn = self.conn();
        let e = sql(&self.path);
        let mut state = OpenState::default();
        let mut meta = conn
            .prepare_cached("SELECT key, value, sum FROM meta")
            .map_err(&e)?;
        let mut rows = meta.query([]).map_err(&e)?;
        while let Some(row) = rows.next().map_err(&e)? {
            let key: String = row.get(0).map_err(&e)?;
            let value = row.get_ref(1).map_err(&e)?;
            check_sum(2, row.get(2).map_err(&e)?, &meta_sum(&key, value)).map_err(&e)?;
            match key.as_str() {
                "journal_len" => {
                    state.journal_len =
                        u64::try_from(row.get::<_, i64>(1).map_err(&e)?).unwrap_or_default();
                }
                "refused" => {
                    let text: String = row.get(1).map_err(&e)?;
                    state.refused = self.decode(&text)?;
                }
                "told_ahead" => {
                    let text: String = row.get(1).map_err(&e)?;
                    state.told_ahead = self.decode(&text)?;
                }
                "timing" => state.timing = Some(row.get(1).map_err(&e)?),
                "segment" => {
                    state.segment = from_sql(row.get(1).map_err(&e)?);
                }
                "accepted" => {
                    state.accepted = from_sql(row.get(1).map_err(&e)?);
                }
                _ => {}
            }
        }
        drop(rows);
        drop(meta);
        state.inboxes = self.keyed(&conn, "SELECT name, data, sum FROM inboxes")?;
        let mut intents = conn
            .prepare_cached("SELECT id, inbox, line, sum FROM intents")
            .map_err(&e)?;
        let mut rows = intents.query([]).map_err(&e)?;
        while let Some(row) = rows.next().map_err(&e)? {
            let id: String = row.get(0).map_err(&e)?;
            let intent = Intent {
                inbox: row.get(1).map_err(&e)?,
                line: row.get(2).map_err(&e)?,
            };
            check_sum(3, row.get(3).map_err(&e)?, &intent_sum(&id, &intent)).map_err(&e)?;
            state.intents.insert(id, intent);
        }
        drop(rows);
        drop(intents);
        state.untold = self.keyed(&conn, "SELECT key, data, sum FROM untold")?;
        Ok(state)
    }

    /// The rows of a query of a key, its JSON and their checksum, decoded.
    fn keyed<T: serde::de::DeserializeOwned>(
        &self,
        conn: &Connection,
        query: &str,
    ) -> Result<BTreeMap<String, T>> {
        let e = sql(&self.path);
        let mut statement = conn.prepare_cached(query).map_err(&e)?;
        let mut rows = statement.query([]).map_err(&e)?;
        let mut out = BTreeMap::new();
        while let Some(row) = rows.next().map_err(&e)? {
            let key: String = row.get(0).map_err(&e)?;
            let data: String = row.get(1).map_err(&e)?;
            check_sum(2, row.get(2).map_err(&e)?, &keyed_sum(&key, &data)).map_err(&e)?;
            out.insert(key, self.decode(&data)?);
        }
        Ok(out)
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, text: &str) -> Result<T> {
        serde_json::from_str(text).map_err(|e| Error::Index {
            path: self.path.clone(),
            message: e.to_string(),
        })
    }

    /// Every open request as last saved.
    pub fn open_requests(&self) -> Result<Vec<Request>> {
        self.requests_where(
            concat!("SELECT ", request_columns!(), " FROM requests WHERE open"),
            [],
        )
    }

    /// The open requests of which `station` is a party: the addressee, or the requester (a
    /// loop's owner for a loop's request).
    pub fn open_requests_of(&self, station: &str) -> Result<Vec<Request>> {
        self.requests_where(
            // Two searches of the partial indexes (an OR would scan every open request).
            concat!(
                "SELECT ",
                request_columns!(),
                " FROM requests WHERE id IN (SELECT id FROM requests WHERE open AND \
                 addressee = ?1 UNION ALL SELECT id FROM requests WHERE open AND requester = ?1)"
            ),
            [station],
        )
    }

    /// The ids of the requests of a broadcast: `<id>.<station>`.
    pub fn broadcast_requests(&self, id: &str) -> Result<Vec<String>> {
        let conn = self.conn();
        let e = sql(&self.path);
        let mut statement = conn
            .prepare_cached("SELECT id FROM requests WHERE id > ?1 AND id < ?2 ORDER BY id")
            .map_err(&e)?;
        let rows = statement
            .query_map([format!("{id}."), format!("{id}/")], |r| r.get(0))
            .map_err(&e)?;
        rows.collect::<rusqlite::Result<Vec<String>>>().map_err(e)
    }

    /// The open requests that ring or are escalated at or before `at` (milliseconds), by
    /// the due times saved with them.
    pub fn due_by(&self, at: i64) -> Result<Vec<Request>> {
        self.requests_where(
            concat!(
                "SELECT ",
                request_columns!(),
                " FROM requests WHERE open AND due_at <= ?1"
            ),
            [at],
        )
    }

    /// The earliest saved due time of an open request.
    pub fn first_due(&self) -> Result<Option<i64>> {
        self.conn()
            .prepare_cached("SELECT min(due_at) FROM requests WHERE open")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(sql(&self.path))
    }

    /// Every request addressed to `addressee` (by `requester` only, when given), in id order.
    pub fn requests_to(&self, addressee: &str, requester: Option<&str>) -> Result<Vec<Request>> {
        match requester {
            Some(requester) => self.requests_where(
                concat!(
                    "SELECT ",
                    request_columns!(),
                    " FROM requests WHERE addressee = ?1 AND requester = ?2 ORDER BY id"
                ),
                [addressee, requester],
            ),
            None => self.requests_where(
                concat!(
                    "SELECT ",
                    request_columns!(),
                    " FROM requests WHERE addressee = ?1 ORDER BY id"
                ),
                [addressee],
            ),
        }
    }

    /// Requests closed at or after `since` (milliseconds).
    pub fn closed_since(&self, since: i64) -> Result<Vec<Request>> {
        self.requests_where(
            concat!(
                "SELECT ",
                request_columns!(),
                " FROM requests WHERE closed_at IS NOT NULL AND closed_at >= ?1"
            ),
            [since],
        )
    }

    fn requests_where(&self, query: &str, args: impl rusqlite::Params) -> Result<Vec<Request>> {
        let conn = self.conn();
        let e = sql(&self.path);
        let mut statement = conn.prepare_cached(query).map_err(&e)?;
        let mut rows = statement.query(args).map_err(&e)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(&e)? {
            let data = request_data(row).map_err(&e)?;
            out.push(self.decode(&data)?);
        }
        Ok(out)
    }

    /// Whether the judge wrote (or means to write) a line with this id.
    pub fn is_own(&self, id: &str) -> Result<bool> {
        self.conn()
            .prepare_cached("SELECT 1 FROM own WHERE id = ?1")
            .and_then(|mut s| s.exists([id]))
            .map_err(sql(&self.path))
    }

    /// The accepted message `id`.
    pub fn message(&self, id: &str) -> Result<Option<MessageRow>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare_cached(MESSAGE_BY_ID)
            .map_err(sql(&self.path))?;
        statement
            .query_row([id], message_row)
            .optional()
            .map_err(sql(&self.path))
    }

    /// [`Index::message`] for the judge: a read that fails reads as none and marks the index
    /// failed, which the judge checks before it journals (see `failed_lookup`).
    pub fn placed(&self, id: &str) -> Option<MessageRow> {
        let conn = self.conn();
        let found = conn
            .prepare_cached(MESSAGE_BY_ID)
            .and_then(|mut statement| statement.query_row([id], message_row).optional());
        found.unwrap_or_else(|error| {
            self.lookup_failed(&error);
            None
        })
    }

    /// Every accepted message of thread `context`, in the order the judge accepted them:
    /// the one that began it (its id is the thread's) by its key, the rest by
    /// `messages_by_thread`, which holds only them (a third of a backlog's messages).
    pub fn thread(&self, context: &str) -> Result<Vec<MessageRow>> {
        let conn = self.conn();
        let e = sql(&self.path);
        let mut statement = conn
            .prepare_cached(
                "SELECT id, inbox, gen, offset, span, seen_at, seq, sender, kind, correlates_to, \
                 context_id, state, fingerprint, sum FROM messages \
                 WHERE context_id = ?1 AND context_id != id \
                 UNION ALL \
                 SELECT id, inbox, gen, offset, span, seen_at, seq, sender, kind, correlates_to, \
                 context_id, state, fingerprint, sum FROM messages \
                 WHERE id = ?1 AND context_id = id",
            )
            .map_err(&e)?;
        let rows = statement.query_map([context], message_row).map_err(&e)?;
        let mut out: Vec<MessageRow> = rows.collect::<rusqlite::Result<_>>().map_err(&e)?;
        out.sort_by_key(|m| m.seq);
        Ok(out)
    }

    /// Refused or duplicate lines that carried id `id`, oldest first.
    pub fn others_with_id(&self, id: &str) -> Result<Vec<OtherRow>> {
        self.others_where(
            "SELECT inbox, gen, offset, span, verdict, seen_at, id, sender, reason, detail, sum \
             FROM others WHERE id = ?1 ORDER BY seen_at",
            params![id],
        )
    }

    /// The lines not accepted in `inbox`'s generation `gen` that start between `from` and
    /// `to`, and the one before `from` (a run of refusals judged as one may go on past it):
    /// each one's offset and span.
    pub fn others_between(
        &self,
        inbox: &str,
        gen: u32,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let rows = self.others_where(
            "SELECT inbox, gen, offset, span, verdict, seen_at, id, sender, reason, detail, sum \
             FROM others WHERE inbox = ?1 AND gen = ?2 AND offset < ?4 AND offset >= coalesce(\
             (SELECT max(offset) FROM others WHERE inbox = ?1 AND gen = ?2 AND offset < ?3), ?3)",
            params![inbox, gen, to_sql(from), to_sql(to)],
        )?;
        Ok(rows
            .into_iter()
            .map(|r| (r.offset, r.span.max(1)))
            .collect())
    }

    /// Refused lines at `offset` of `inbox` in the generations before `gen`: what a line read
    /// again after a restore was judged before. A read that fails reads as none and marks the
    /// index failed, which the judge checks before it journals (see `failed_lookup`).
    pub fn refused_before(&self, inbox: &str, gen: u32, offset: u64) -> Vec<OtherRow> {
        let conn = self.conn();
        let found = conn
            .prepare_cached(REFUSED_BEFORE)
            .and_then(|mut statement| {
                statement
                    .query_map(params![inbox, to_sql(offset), gen], other_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            });
        found.unwrap_or_else(|error| {
            self.lookup_failed(&error);
            Vec::new()
        })
    }

    fn others_where(&self, query: &str, args: impl rusqlite::Params) -> Result<Vec<OtherRow>> {
        let conn = self.conn();
        let e = sql(&self.path);
        let mut statement = conn.prepare_cached(query).map_err(&e)?;
        let rows = statement.query_map(args, other_row).map_err(&e)?;
        rows.collect::<rusqlite::Result<_>>().map_err(e)
    }

    /// What was sent (by sender and kind) and refused (by reason) since `since`.
    pub fn activity_since(&self, since: i64) -> Result<(Sent, HashMap<String, u64>)> {
        let conn = self.conn();
        let e = sql(&self.path);
        let mut sent = HashMap::new();
        let mut statement = conn
            .prepare_cached(
                "SELECT sender, kind, count(*) FROM messages WHERE seen_at >= ?1 GROUP BY sender, kind",
            )
            .map_err(&e)?;
        let mut rows = statement.query([since]).map_err(&e)?;
        while let Some(row) = rows.next().map_err(&e)? {
            let from: String = row.get(0).map_err(&e)?;
            let kind = kind_of(row.get(1).map_err(&e)?);
            let n: i64 = row.get(2).map_err(&e)?;
            sent.insert((from, kind), u64::try_from(n).unwrap_or_default());
        }
        drop(rows);
        drop(statement);
        let mut refused = HashMap::new();
        let mut statement = conn
            .prepare_cached(
                "SELECT reason, count(*) FROM others WHERE seen_at >= ?1 AND verdict = 'r' GROUP BY reason",
            )
            .map_err(&e)?;
        let mut rows = statement.query([since]).map_err(&e)?;
        while let Some(row) = rows.next().map_err(&e)? {
            let reason: Option<String> = row.get(0).map_err(&e)?;
            let n: i64 = row.get(1).map_err(&e)?;
            refused.insert(
                reason.unwrap_or_default(),
                u64::try_from(n).unwrap_or_default(),
            );
        }
        Ok((sent, refused))
    }
}

/// `rows` in the order of their primary key, rows of one key in their own order (the last
/// one written wins). A catch-up's batch of 40,000 lines holds ids from all over the table:
/// written in key order, each page of the B-tree is visited once rather than again for every
/// row, and the requests' rows (a request, then its answers') took 40% less time.
fn by_key<T>(rows: &[T], key: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut sorted: Vec<&T> = rows.iter().collect();
    sorted.sort_by(|a, b| key(a).cmp(key(b)));
    sorted
}

fn to_sql(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn from_sql(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

fn message_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<MessageRow> {
    let message = MessageRow {
        id: row.get(0)?,
        inbox: row.get(1)?,
        gen: row.get(2)?,
        offset: from_sql(row.get(3)?),
        span: from_sql(row.get(4)?),
        seen_at: row.get(5)?,
        seq: from_sql(row.get(6)?),
        from: row.get(7)?,
        kind: kind_of(row.get(8)?),
        correlates_to: row.get(9)?,
        context_id: row.get(10)?,
        state: row
            .get::<_, Option<String>>(11)?
            .and_then(|s| State::parse(&s)),
        // Stored as the signed 64-bit integer `SQLite` has; the bits are the fingerprint's.
        #[allow(clippy::cast_sign_loss)]
        fingerprint: row.get::<_, i64>(12)? as u64,
    };
    check_sum(13, row.get(13)?, &message_sum(&message))?;
    Ok(message)
}

fn other_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<OtherRow> {
    let other = OtherRow {
        inbox: row.get(0)?,
        gen: row.get(1)?,
        offset: from_sql(row.get(2)?),
        span: from_sql(row.get(3)?),
        duplicate: row.get::<_, String>(4)? == "d",
        seen_at: row.get(5)?,
        id: row.get(6)?,
        from: row.get(7)?,
        reason: row.get(8)?,
        detail: row.get(9)?,
    };
    check_sum(10, row.get(10)?, &other_sum(&other))?;
    Ok(other)
}

fn intent_sum(id: &str, intent: &Intent) -> RowSum {
    RowSum::default()
        .text(id)
        .text(&intent.inbox)
        .text(&intent.line)
}

/// The ledger's archive: claims and requests asked of the index by key.
#[derive(Debug, Clone)]
pub struct IndexArchive(pub Arc<Index>);

/// Read every id of `messages` into `filter`, in one read of the index.
fn fill_ids(path: &Path, filter: &IdFilter) -> Result<u64> {
    let Some(index) = Index::open_read(path)? else {
        return Ok(0);
    };
    let conn = index.conn();
    let e = sql(path);
    let mut ids = conn.prepare("SELECT id FROM messages").map_err(&e)?;
    let mut rows = ids.query([]).map_err(&e)?;
    let mut count = 0;
    while let Some(row) = rows.next().map_err(&e)? {
        filter.insert(
            row.get_ref(0)
                .map_err(&e)?
                .as_str()
                .map_err(|err| e(err.into()))?,
        );
        count += 1;
    }
    Ok(count)
}

impl Archive for IndexArchive {
    fn claimed(&self, id: &str) {
        if let Some(filter) = self.0.ids.get() {
            filter.insert(id);
        }
    }

    fn claim(&self, id: &str) -> Option<u64> {
        let index = &self.0;
        // Certainly never claimed: nothing to ask.
        if index.ids.get().is_some_and(|filter| !filter.may_hold(id)) {
            return None;
        }
        let found = index
            .lookup_conn()
            .prepare_cached(MESSAGE_BY_ID)
            .and_then(|mut s| s.query_row([id], message_row).optional());
        match found {
            Ok(found) => found.map(|m| m.fingerprint),
            Err(error) => {
                index.lookup_failed(&error);
                None
            }
        }
    }

    fn request(&self, id: &str) -> Option<Request> {
        let index = &self.0;
        let found = index
            .lookup_conn()
            .prepare_cached(concat!(
                "SELECT ",
                request_columns!(),
                " FROM requests WHERE id = ?1"
            ))
            .and_then(|mut s| s.query_row([id], request_data).optional());
        match found {
            Ok(Some(data)) => match serde_json::from_str(&data) {
                Ok(request) => Some(request),
                Err(error) => {
                    index.lookup_failed(&rusqlite::Error::FromSqlConversionFailure(
                        0,
                        rusqlite::types::Type::Text,
                        Box::new(error),
                    ));
                    None
                }
            },
            Ok(None) => None,
            Err(error) => {
                index.lookup_failed(&error);
                None
            }
        }
    }
}

/// The one writer of the index: the lock holder's, on whichever thread saves.
#[derive(Debug)]
pub struct IndexWriter {
    conn: Connection,
    path: PathBuf,
    /// A new index being filled: the readers' lookups wait for [`IndexWriter::finish`].
    lookups_deferred: bool,
    /// Whether the write-ahead log is cut back ([`WAL_LIMIT`]): between small saves, not
    /// during a catch-up's large ones.
    log_limited: bool,
}

impl IndexWriter {
    /// Open the index for writing, creating it (and its tables) when missing.
    pub fn open(path: &Path) -> Result<IndexWriter> {
        crate::fault::check(path).map_err(Error::io("open index", path))?;
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_file() => {
                return Err(Error::NotRegularFile {
                    path: path.to_path_buf(),
                });
            }
            Ok(_) => {}
            // Made private before `SQLite` opens it: `SQLite` gives its journal files the
            // database's mode.
            Err(_) => {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(path)
                    .map_err(Error::io("create index", path))?;
            }
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(sql(path))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql(path))?;
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
            .and_then(|()| conn.execute_batch(SMALL_CACHE))
            .map_err(sql(path))?;
        let mut writer = IndexWriter {
            conn,
            path: path.to_path_buf(),
            lookups_deferred: false,
            log_limited: false,
        };
        writer.create_tables()?;
        // Made at every open rather than in the schema: an index of this version made
        // before it gets it once, with no rebuild.
        writer
            .conn
            .execute_batch(OTHERS_BY_PLACE)
            .map_err(sql(path))?;
        Ok(writer)
    }

    fn create_tables(&mut self) -> Result<()> {
        let e = sql(&self.path);
        // Nothing to do (and nothing written) when the tables are there.
        let current: Option<i64> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'version'", [], |r| {
                r.get(0)
            })
            .optional()
            .unwrap_or(None);
        if current == Some(VERSION) {
            return Ok(());
        }
        let tx = self.conn.transaction().map_err(&e)?;
        tx.execute_batch(SCHEMA).map_err(&e)?;
        let version: Option<i64> = tx
            .query_row("SELECT value FROM meta WHERE key = 'version'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(&e)?;
        match version {
            None => {
                tx.execute(
                    "INSERT INTO meta(key, value, sum) VALUES ('version', ?1, ?2)",
                    [
                        VERSION,
                        meta_sum("version", rusqlite::types::ValueRef::Integer(VERSION)).sum(),
                    ],
                )
                .map_err(&e)?;
            }
            Some(VERSION) => {}
            Some(other) => {
                return Err(Error::Index {
                    path: self.path.clone(),
                    message: format!("version {other}, expected {VERSION}"),
                })
            }
        }
        tx.commit().map_err(e)
    }

    /// Make the index `ListTasks` finds a caller's requests by (addressee, requester). Only
    /// a bridge with `[[remote]]` callers makes it: every save of a request pays for each
    /// index, and a bridge without callers would pay for nothing (a catch-up of 200,000
    /// messages took 7% longer with it).
    pub fn ensure_pair_index(&mut self) -> Result<()> {
        self.conn
            .execute_batch(
                "CREATE INDEX IF NOT EXISTS requests_by_pair ON requests(addressee, requester, id)",
            )
            .map_err(sql(&self.path))
    }

    /// Make the readers' lookups ([`LOOKUPS`]) where they are missing: a new index once
    /// it holds its first catch-up, or one whose first catch-up was cut short. Nothing is
    /// written when they are there.
    pub fn finish(&mut self) -> Result<()> {
        self.conn.execute_batch(LOOKUPS).map_err(sql(&self.path))?;
        self.lookups_deferred = false;
        Ok(())
    }

    /// A new index: its lookups are made by [`IndexWriter::finish`] once it is filled.
    pub fn defer_lookups(&mut self) {
        self.lookups_deferred = true;
    }

    /// The index's file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the lookups wait for [`IndexWriter::finish`].
    #[must_use]
    pub fn lookups_deferred(&self) -> bool {
        self.lookups_deferred
    }

    /// Write `changes` in one transaction. A large one (a catch-up's batch) is given a
    /// page cache that holds the pages it changes, and the memory is let go after it.
    pub fn save(&mut self, changes: &Changes) -> Result<()> {
        let large = changes.messages.len() + changes.others.len() + changes.requests.len()
            >= LARGE_SAVE_ROWS;
        if large == self.log_limited {
            // The log's size is no part of the save: a failure here is said, and the save
            // goes on.
            let limit = if large { WAL_UNLIMITED } else { WAL_LIMIT };
            match self.conn.query_row(limit, [], |_| Ok(())) {
                Ok(()) => self.log_limited = !large,
                Err(error) => {
                    tracing::warn!(path = %self.path.display(), %error, "could not set the index's log limit");
                }
            }
        }
        if !large {
            return self.write(changes);
        }
        run_cached(&self.conn, LARGE_CACHE).map_err(sql(&self.path))?;
        let saved = self.write(changes);
        // The save stands whatever happens here: memory not given back is no failed save.
        if let Err(error) = run_cached(&self.conn, SMALL_CACHE)
            .and_then(|()| run_cached(&self.conn, "PRAGMA shrink_memory"))
        {
            tracing::warn!(path = %self.path.display(), %error, "could not shrink the index's page cache after a large save");
        }
        saved
    }

    #[allow(clippy::too_many_lines)] // one statement per table, in one transaction
    fn write(&mut self, changes: &Changes) -> Result<()> {
        // The fault seam sees a save as one write of about its rows' size: `SQLite`'s commit is
        // atomic, so a full disk fails the whole transaction and leaves the last save.
        let need = changes.approximate_bytes();
        let allowed =
            crate::fault::allow(&self.path, need).map_err(Error::io("write index", &self.path))?;
        if allowed < need {
            return Err(Error::io("write index", &self.path)(
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        let e = sql(&self.path);
        let tx = self.conn.transaction().map_err(&e)?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO messages(id, inbox, gen, offset, span, seen_at, seq, \
                     sender, kind, correlates_to, context_id, state, fingerprint, sum) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                )
                .map_err(&e)?;
            for m in by_key(&changes.messages, |m| &m.id) {
                // The fingerprint's bits, stored as `SQLite`'s signed integer.
                #[allow(clippy::cast_possible_wrap)]
                let fingerprint = m.fingerprint as i64;
                insert
                    .execute(params![
                        m.id,
                        m.inbox,
                        m.gen,
                        to_sql(m.offset),
                        to_sql(m.span),
                        m.seen_at,
                        to_sql(m.seq),
                        m.from,
                        kind_code(m.kind),
                        m.correlates_to,
                        m.context_id,
                        m.state.map(State::as_str),
                        fingerprint,
                        message_sum(m).sum(),
                    ])
                    .map_err(&e)?;
            }
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO others(inbox, gen, offset, span, verdict, seen_at, id, \
                     sender, reason, detail, sum) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(&e)?;
            for o in &changes.others {
                insert
                    .execute(params![
                        o.inbox,
                        o.gen,
                        to_sql(o.offset),
                        to_sql(o.span),
                        if o.duplicate { "d" } else { "r" },
                        o.seen_at,
                        o.id,
                        o.from,
                        o.reason,
                        o.detail,
                        other_sum(o).sum(),
                    ])
                    .map_err(&e)?;
            }
            let mut insert = tx
                .prepare_cached("INSERT OR IGNORE INTO own(id) VALUES (?1)")
                .map_err(&e)?;
            for id in &changes.own {
                insert.execute([id]).map_err(&e)?;
            }
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO requests(id, open, due_at, closed_at, addressee, \
                     requester, data, sum) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(&e)?;
            for r in by_key(&changes.requests, |r| &r.id) {
                let data = serde_json::to_string(&**r).expect("a request always serialises");
                let columns = RequestColumns {
                    id: &r.id,
                    open: r.is_open(),
                    due_at: changes.timing.as_ref().and_then(|t| t.due_at(r)),
                    closed_at: r.closed_at.map(|t| t.timestamp_millis()),
                    addressee: &r.addressee,
                    requester: r.requester_station(),
                    data: &data,
                };
                insert
                    .execute(params![
                        columns.id,
                        columns.open,
                        columns.due_at,
                        columns.closed_at,
                        columns.addressee,
                        columns.requester,
                        columns.data,
                        columns.sum().sum(),
                    ])
                    .map_err(&e)?;
            }
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO inboxes(name, data, sum) VALUES (?1, ?2, ?3)",
                )
                .map_err(&e)?;
            for (name, inbox) in &changes.inboxes {
                let data = serde_json::to_string(inbox).expect("an inbox always serialises");
                let sum = keyed_sum(name, &data).sum();
                insert.execute(params![name, data, sum]).map_err(&e)?;
            }
            if let Some(intents) = &changes.intents {
                tx.execute("DELETE FROM intents", []).map_err(&e)?;
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO intents(id, inbox, line, sum) VALUES (?1, ?2, ?3, ?4)",
                    )
                    .map_err(&e)?;
                for (id, intent) in intents {
                    let sum = intent_sum(id, intent).sum();
                    insert
                        .execute(params![id, intent.inbox, intent.line, sum])
                        .map_err(&e)?;
                }
            }
            if let Some(untold) = &changes.untold {
                tx.execute("DELETE FROM untold", []).map_err(&e)?;
                let mut insert = tx
                    .prepare_cached("INSERT INTO untold(key, data, sum) VALUES (?1, ?2, ?3)")
                    .map_err(&e)?;
                for (key, line) in untold {
                    let data = serde_json::to_string(line).expect("a refusal always serialises");
                    let sum = keyed_sum(key, &data).sum();
                    insert.execute(params![key, data, sum]).map_err(&e)?;
                }
            }
            let mut meta = tx
                .prepare_cached("INSERT OR REPLACE INTO meta(key, value, sum) VALUES (?1, ?2, ?3)")
                .map_err(&e)?;
            let mut text = |key: &str, value: &str| {
                let sum = meta_sum(key, rusqlite::types::ValueRef::Text(value.as_bytes())).sum();
                meta.execute(params![key, value, sum]).map(|_| ())
            };
            if let Some(refused) = &changes.refused {
                let data = serde_json::to_string(refused).expect("counts always serialise");
                text("refused", &data).map_err(&e)?;
            }
            if let Some(timing) = &changes.timing {
                text("timing", &timing.key()).map_err(&e)?;
            }
            if let Some(told) = &changes.told_ahead {
                let data = serde_json::to_string(told).expect("keys always serialise");
                text("told_ahead", &data).map_err(&e)?;
            }
            let mut int = |key: &str, value: i64| {
                let sum = meta_sum(key, rusqlite::types::ValueRef::Integer(value)).sum();
                meta.execute(params![key, value, sum]).map(|_| ())
            };
            int("segment", to_sql(changes.segment)).map_err(&e)?;
            int("journal_len", to_sql(changes.journal_len)).map_err(&e)?;
            int("accepted", to_sql(changes.accepted)).map_err(&e)?;
        }
        tx.commit().map_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::{Changes, Index, IndexWriter, Kind, MessageRow, REFUSED_BEFORE};

    fn row(id: &str, offset: u64) -> MessageRow {
        MessageRow {
            id: id.into(),
            inbox: "web".into(),
            gen: 0,
            offset,
            span: 10,
            seen_at: 0,
            seq: offset,
            from: "design".into(),
            kind: Kind::Note,
            correlates_to: None,
            context_id: id.into(),
            state: None,
            fingerprint: 7,
        }
    }

    /// A row's checksum is the xxh3 of its values' bytes one after another, as indexes
    /// already on disk were summed: a row short enough for xxh3's one-block path and one
    /// long enough for its striped path.
    #[test]
    fn a_rows_checksum_is_the_xxh3_of_its_values_laid_end_to_end() {
        for data in ["{}".to_owned(), "x".repeat(5_000)] {
            let mut bytes = Vec::new();
            for text in ["01ID", "web", "design"] {
                bytes.extend_from_slice(&(text.len() as u64).to_le_bytes());
                bytes.extend_from_slice(text.as_bytes());
            }
            for n in [1_i64, 0, -7] {
                bytes.extend_from_slice(&n.to_le_bytes());
            }
            bytes.extend_from_slice(&(data.len() as u64).to_le_bytes());
            bytes.extend_from_slice(data.as_bytes());
            let sum = super::RowSum::default()
                .text("01ID")
                .text("web")
                .text("design")
                .maybe_int(Some(0))
                .int(-7)
                .text(&data)
                .sum();
            #[allow(clippy::cast_possible_wrap)]
            let expected = xxhash_rust::xxh3::xxh3_64(&bytes) as i64;
            assert_eq!(sum, expected, "{} bytes", bytes.len());
        }
    }

    /// A save writes its rows in key order, but two rows of one id in one save (a line
    /// placed again within a batch) still leave the later one.
    #[test]
    fn the_last_row_of_an_id_in_a_save_is_the_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.db");
        let mut writer = IndexWriter::open(&path).unwrap();
        let messages = vec![
            row("c", 0),
            row("b", 10),
            row("a", 20),
            row("b", 30),
            row("a", 40),
        ];
        writer
            .save(&Changes {
                messages,
                ..Changes::default()
            })
            .unwrap();
        let index = Index::open_read(&path).unwrap().unwrap();
        let offset = |id: &str| index.message(id).unwrap().map(|m| m.offset);
        assert_eq!(
            (offset("a"), offset("b"), offset("c")),
            (Some(40), Some(30), Some(0))
        );
    }

    /// A catch-up's saves grow the write-ahead log while the judge's lookups hold a read,
    /// and leave it so; once the lookups let go and a live (small) save starts the log over,
    /// the file is cut back to the limit, not kept at its largest for as long as the daemon
    /// runs.
    #[test]
    fn the_log_a_catch_up_grew_is_cut_back_by_the_first_live_saves() {
        const LIMIT: u64 = 16 << 20;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.db");
        let wal = dir.path().join("index.db-wal");
        let log = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        let mut writer = IndexWriter::open(&path).unwrap();
        let index = Index::open_read(&path).unwrap().unwrap();
        // The judge's lookups between saves: a read begun and held.
        index.begin_read().unwrap();
        let _ = index.message("000000001").unwrap();
        let save = |writer: &mut IndexWriter, at: u64, rows: u64| {
            // Ids spread over the key space: every save rewrites pages all through it.
            let messages = (0..rows)
                .map(|n| row(&format!("{:09}", (n * 7_919 + at) % 40_000), n))
                .collect();
            writer
                .save(&Changes {
                    messages,
                    ..Changes::default()
                })
                .unwrap();
        };
        let mut saves = 0;
        while log() <= LIMIT {
            save(&mut writer, saves, 4_000);
            saves += 1;
            assert!(saves < 400, "the log never grew past the limit");
        }
        index.end_read().unwrap();
        // A catch-up's large save keeps the file as it grew.
        let grown = log();
        save(&mut writer, saves, 4_000);
        save(&mut writer, saves + 1, 4_000);
        assert!(log() >= grown, "{} bytes after a large save", log());
        // Live saves: once the log holds a checkpoint's worth again (1,000 pages) the
        // checkpoint finishes, and the next save starts the log over and cuts it back.
        let mut live = 0;
        while log() > LIMIT {
            save(&mut writer, saves + 2 + live, 100);
            live += 1;
            assert!(
                live < 100,
                "the log is {} bytes after {live} live saves",
                log()
            );
        }
    }

    /// A reader that opens the index between its file being made and its tables (a first
    /// catch-up, a compaction) finds nothing to read yet, not a damaged index; a file that is
    /// not a database is still damaged.
    #[test]
    fn an_index_without_its_tables_yet_is_none_not_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.db");
        std::fs::write(&path, b"").unwrap();
        assert!(Index::open_read(&path).unwrap().is_none());
        drop(IndexWriter::open(&path).unwrap());
        assert!(Index::open_read(&path).unwrap().is_some());
        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![7u8; 8192]).unwrap();
        assert!(Index::open_read(&garbage).is_err());
    }

    /// A restored inbox asks once per refused line: the lookup must go by place, never scan
    /// the refusals of a whole inbox.
    #[test]
    fn a_refusal_is_looked_up_by_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let writer = IndexWriter::open(&dir.path().join("index.db")).unwrap();
        let plan: String = writer
            .conn
            .query_row(
                &format!("EXPLAIN QUERY PLAN {REFUSED_BEFORE}"),
                rusqlite::params!["web", 0, 1],
                |row| row.get(3),
            )
            .unwrap();
        assert!(
            plan.contains("USING INDEX others_by_place (inbox=? AND offset=?"),
            "{plan}"
        );
    }
}
