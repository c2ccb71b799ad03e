//! An agent's own read position, `<agent>-inbox.cursor`, beside its inbox.
//!
//! It records which file it belongs to (device, inode and a marker of the bytes before the
//! offset) and the offset, always the start of a line. It only moves forward, under `flock`,
//! and is replaced atomically. Before it is trusted it is checked against the inbox like the
//! judge's own positions: a cursor for a replaced or truncated inbox is not trusted.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::hash::Marker;
use crate::{Bridge, Error, Result};

/// The folder in `.doorbell/` of the agents' read logs.
pub const READS_DIR: &str = "reads";

thread_local! {
    /// The agents whose reader's turn this thread holds.
    static TURNS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn turn_taken(agent: &str) {
    TURNS.with(|turns| turns.borrow_mut().push(agent.to_owned()));
}

fn turn_ended(agent: &str) {
    TURNS.with(|turns| {
        let mut turns = turns.borrow_mut();
        if let Some(at) = turns.iter().position(|a| a == agent) {
            turns.remove(at);
        }
    });
}

/// Whether this thread is in `agent`'s reader's turn.
fn in_turn(agent: &str) -> bool {
    TURNS.with(|turns| turns.borrow().iter().any(|a| a == agent))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct CursorFile {
    version: u32,
    dev: u64,
    ino: u64,
    offset: u64,
    marker: Marker,
}

/// Where an agent's reading resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// No cursor yet: read from the start.
    Fresh,
    /// The cursor matches the inbox: resume here.
    At(u64),
    /// The cursor belongs to a file that was replaced or truncated: read the new one from 0.
    Replaced { stale_offset: u64 },
}

impl Position {
    #[must_use]
    pub fn offset(self) -> u64 {
        match self {
            Position::At(offset) => offset,
            Position::Fresh | Position::Replaced { .. } => 0,
        }
    }
}

fn read_cursor(path: &Path) -> Result<Option<CursorFile>> {
    Ok(read_held(path)?.and_then(|held| held.cursor))
}

/// A cursor file as a reader last read or wrote it, kept open. While it is open no other
/// file can have its inode number, so the same number, size and modification time at the
/// cursor's path mean that nobody replaced or rewrote it since.
#[derive(Debug)]
struct Held {
    file: File,
    stamp: Stamp,
    /// What it says (`None`: empty or unreadable, read from the start).
    cursor: Option<CursorFile>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// The stamp of what is at the cursor's path now (`None`: nothing).
fn stamp_at(path: &Path) -> Result<Option<Stamp>> {
    match fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some(Stamp::of(&meta))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("stat cursor", path)(e)),
    }
}

/// The cursor file, read and kept open; `None` when there is none (or it is a symlink, never
/// followed).
fn read_held(path: &Path) -> Result<Option<Held>> {
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            // A symlink is never followed: no cursor (messages shown again, never skipped);
            // the next advance replaces the link with a cursor file.
            tracing::warn!(path = %path.display(), "the cursor is a symlink, never followed: reading the inbox from the start");
            return Ok(None);
        }
        Err(e) => return Err(Error::io("open cursor", path)(e)),
    };
    // Stamped before it is read: a change after the stamp is seen at the next look.
    let meta = file.metadata().map_err(Error::io("stat cursor", path))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(Error::io("read cursor", path))?;
    Ok(Some(Held {
        file,
        stamp: Stamp::of(&meta),
        cursor: parse_cursor(path, &bytes),
    }))
}

fn parse_cursor(path: &Path, bytes: &[u8]) -> Option<CursorFile> {
    if bytes.trim_ascii().is_empty() {
        return None;
    }
    // Bytes that are not UTF-8 are as unreadable as torn JSON, and go the same way.
    match serde_json::from_slice(bytes) {
        Ok(cursor) => Some(cursor),
        Err(error) => {
            // Cursors are not synced (they may go back, never forward), so a power loss can
            // leave one unreadable: going back to the start is the safe direction.
            tracing::warn!(path = %path.display(), %error, "the cursor file cannot be read: reading the inbox from the start");
            None
        }
    }
}

fn validate(saved: Option<CursorFile>, inbox: &File) -> Result<Position> {
    let Some(saved) = saved else {
        return Ok(Position::Fresh);
    };
    let meta = inbox.metadata().map_err(|e| Error::Io {
        action: "stat inbox",
        path: "(inbox)".into(),
        source: e,
    })?;
    // Known by its bytes, like the judge knows an inbox: a copied or restored inbox (a new
    // inode, the same bytes) keeps its reader's place.
    let same =
        meta.len() >= saved.offset && saved.marker.matches(inbox, saved.offset).unwrap_or(false);
    Ok(if same {
        Position::At(saved.offset)
    } else {
        Position::Replaced {
            stale_offset: saved.offset,
        }
    })
}

/// Where `agent`'s reader stands, read while no other reader is in its turn (one may be
/// printing what it has not moved the cursor over yet); the turn is held until this is
/// dropped, so no reader moves on from it meanwhile.
pub struct Settled {
    /// Which file the cursor was saved for (its device and inode) and its offset there;
    /// `None` when the agent has no cursor (it read nothing yet).
    pub place: Option<(u64, u64, u64)>,
    /// A hash of everything the cursor says (its file, offset and the marker of the bytes
    /// before it; or that there is none): equal hashes, the same cursor.
    pub cursor: u64,
    _turn: Option<Reading>,
}

/// [`Settled`] for `agent`, at once: `None` when another reader (another process, or another
/// thread of this one) is in its turn, or the cursor cannot be read. This thread's own turn
/// (a command that catches up in it, before it loads the cursor) moves nothing meanwhile.
#[must_use]
pub fn settled_place(bridge: &Bridge, agent: &str) -> Option<Settled> {
    let turn = match reading_within(bridge, agent, std::time::Duration::ZERO) {
        Ok(turn) => Some(turn),
        Err(Error::ReaderBusy { .. }) if in_turn(agent) => None,
        Err(_) => return None,
    };
    let path = bridge.cursor_path(agent).ok()?;
    let cursor = read_cursor(&path).ok()?;
    let said = serde_json::to_vec(&cursor).unwrap_or_default();
    Some(Settled {
        place: cursor.map(|cursor| (cursor.dev, cursor.ino, cursor.offset)),
        cursor: xxhash_rust::xxh3::xxh3_64(&said),
        _turn: turn,
    })
}

/// Where `agent` resumes reading `inbox`.
pub fn load(bridge: &Bridge, agent: &str, inbox: &File) -> Result<Position> {
    let path = bridge.cursor_path(agent)?;
    validate(read_cursor(&path)?, inbox)
}

/// How long a cursor's move waits for another process that holds the cursor file locked
/// (doorbell's own moves hold it for a moment).
pub const CURSOR_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Lock the cursor file at `path`, waiting at most [`CURSOR_WAIT`].
fn lock_within(file: &File, path: &Path) -> Result<()> {
    crate::append::lock_file_within(file, path, CURSOR_WAIT, || Error::CursorLocked {
        path: path.to_path_buf(),
        secs: CURSOR_WAIT.as_secs_f64(),
    })
}

/// Open the cursor file and lock it, making sure the locked file is still the one at `path`
/// (a concurrent writer may have renamed a new one over it).
fn lock_cursor(path: &Path) -> Result<(File, fs::Metadata)> {
    loop {
        // Made when missing, yet opened for reading only: closing it then tells the judge's
        // watcher nothing (std's `create` wants write access, so the flag is given as is).
        let opened = OpenOptions::new()
            .read(true)
            .mode(0o600)
            .custom_flags(libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path);
        let file = match opened {
            // A symlink where the cursor belongs: remove the link (never what it points to).
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                fs::remove_file(path).map_err(Error::io("remove symlinked cursor", path))?;
                continue;
            }
            other => other.map_err(Error::io("open cursor", path))?,
        };
        lock_within(&file, path)?;
        let locked = file.metadata().map_err(Error::io("stat cursor", path))?;
        match fs::symlink_metadata(path) {
            Ok(now) if now.ino() == locked.ino() && now.dev() == locked.dev() => {
                return Ok((file, locked))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("stat cursor", path)(e)),
        }
    }
}

/// Move `agent`'s cursor on `inbox` forward to `offset` (the start of a line), and note in
/// the agent's read log that what lies between was read through `via` (`read`, `watch`,
/// `hook claude`, `mcp`). A cursor that is already further on the same file stays where it is.
pub fn advance(bridge: &Bridge, agent: &str, inbox: &File, offset: u64, via: &str) -> Result<()> {
    move_cursor(bridge, agent, inbox, offset, via, None, None, &mut None).map(drop)
}

/// Move `agent`'s cursor on `inbox` back from `to` to `from`, when it still stands at `to`:
/// a read whose answer never reached its reader (an MCP client cancelled the call) is
/// undone. False when the cursor stands elsewhere (another reader moved it since), and it
/// is left there. The caller holds the agent's reading.
pub fn rewind(bridge: &Bridge, agent: &str, inbox: &File, from: u64, to: u64) -> Result<bool> {
    let path = bridge.cursor_path(agent)?;
    let (_file, _) = lock_cursor(&path)?;
    if validate(read_cursor(&path)?, inbox)? != Position::At(to) {
        return Ok(false);
    }
    let Some(record) = record_at(&path, inbox, from)? else {
        return Ok(false);
    };
    write_cursor(bridge, &path, record)?;
    Ok(true)
}

/// The cursor record of `inbox` at `offset`, with the marker of the bytes before it; `None`
/// when the file is shorter.
fn record_at(path: &Path, inbox: &File, offset: u64) -> Result<Option<CursorFile>> {
    let meta = inbox.metadata().map_err(Error::io("stat inbox", path))?;
    let marker = Marker::of(inbox, offset).map_err(Error::io("read inbox", path))?;
    Ok(marker.map(|marker| CursorFile {
        version: 1,
        dev: meta.dev(),
        ino: meta.ino(),
        offset,
        marker,
    }))
}

/// A cursor file locked for a move: the one a reader holds open, or one opened to lock it.
enum CursorLock<'a> {
    Held(&'a File),
    Opened { _file: File },
}

impl Drop for CursorLock<'_> {
    fn drop(&mut self) {
        match self {
            // Still open afterwards: let go of the lock itself.
            CursorLock::Held(file) => {
                let _ = file.unlock();
            }
            // Closing it lets go.
            CursorLock::Opened { .. } => {}
        }
    }
}

/// Lock `held`, the cursor file a reader kept open, when it is still the one at `path`.
fn lock_held<'a>(path: &Path, held: &'a Held) -> Result<Option<CursorLock<'a>>> {
    lock_within(&held.file, path)?;
    let lock = CursorLock::Held(&held.file);
    Ok((stamp_at(path)? == Some(held.stamp)).then_some(lock))
}

/// [`advance`], for a reader that may know the cursor file already (`known`: the file it
/// holds and the position it gave) and may keep its read log open in `log`. Returns the
/// cursor file written, kept open (`None`: none was written).
/// Move `agent`'s cursor on `inbox` to `offset`. With `expect`, only when the bytes before
/// `offset` are still those it marks ([`Error::ChangedInPlace`] otherwise): lines printed
/// as they were judged, without a look at the inbox, are read past only where it holds them.
#[allow(clippy::too_many_arguments)]
fn move_cursor(
    bridge: &Bridge,
    agent: &str,
    inbox: &File,
    offset: u64,
    via: &str,
    expect: Option<&Marker>,
    known: Option<(&Held, Position)>,
    log: &mut Option<File>,
) -> Result<Option<Held>> {
    let path = bridge.cursor_path(agent)?;
    // The file this reader holds, when nobody replaced it: its position is known. Otherwise
    // the file at the path, locked, then read and checked against the inbox.
    let mut locked = None;
    if let Some((held, position)) = known {
        locked = lock_held(&path, held)?.map(|lock| (lock, position));
    }
    let (_lock, current) = if let Some(known) = locked {
        known
    } else {
        let (file, _) = lock_cursor(&path)?;
        let current = validate(read_cursor(&path)?, inbox)?;
        (CursorLock::Opened { _file: file }, current)
    };
    if let Position::At(at) = current {
        if at >= offset {
            return Ok(None);
        }
    }
    let from = current.offset();
    let record = record_at(&path, inbox, offset)?;
    if let Some(expect) = expect {
        if record
            .as_ref()
            .is_none_or(|record| record.marker != *expect)
        {
            return Err(Error::ChangedInPlace { path });
        }
    }
    let Some(record) = record else {
        return Ok(None);
    };
    let (dev, ino) = (record.dev, record.ino);
    let written = write_cursor(bridge, &path, record)?;
    let read = ReadRecord {
        dev,
        ino,
        from,
        to: offset,
        via: via.to_owned(),
        at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    // The log says how; the cursor alone says whether. A log that cannot be written loses
    // only the "how".
    if let Err(error) = append_read(bridge, agent, &read, log) {
        tracing::warn!(%error, agent, "could not note the read in the read log");
    }
    Ok(Some(written))
}

/// Set once a cursor's rename from `.doorbell/reads/` failed for crossing a mount.
static BESIDE: AtomicBool = AtomicBool::new(false);

/// Replace the cursor file with `record`, and keep the new file open.
fn write_cursor(bridge: &Bridge, path: &Path, record: CursorFile) -> Result<Held> {
    let text = serde_json::to_string(&record).expect("a cursor always serialises");
    // Not synced: after a power loss a cursor may go back (messages shown again), never
    // forward; an fsync per message held up `watch` behind the disk. The temp file is made
    // in `.doorbell/reads/`, which the judge does not watch: beside the inboxes its creation,
    // write and close would wake the judge three times for nothing.
    let beside = path.parent().unwrap_or(Path::new("."));
    // A `reads` that is no folder (a symlink) is never written through: the read log warns
    // of it, and the temp file is made beside the cursor.
    let reads = (!BESIDE.load(Ordering::Relaxed))
        .then(|| reads_dir(bridge).ok())
        .flatten();
    let tmp_dir = reads.as_deref().unwrap_or(beside);
    let file = match crate::atomic::write_atomic_unsynced_via(path, tmp_dir, text.as_bytes()) {
        // `.doorbell/` on another mount (a volume, a bind mount): a rename cannot cross it,
        // so this process makes its temp files beside the cursor from now on.
        Err(Error::Io { source, .. })
            if source.raw_os_error() == Some(libc::EXDEV) && tmp_dir != beside =>
        {
            BESIDE.store(true, Ordering::Relaxed);
            crate::atomic::write_atomic_unsynced_via(path, beside, text.as_bytes())?
        }
        other => other?,
    };
    let meta = file.metadata().map_err(Error::io("stat cursor", path))?;
    Ok(Held {
        file,
        stamp: Stamp::of(&meta),
        cursor: Some(record),
    })
}

/// A reader that stays (`watch`): its reader lock stays open between readings, and its
/// cursor is checked against the inbox again only when the cursor file, the inbox file or
/// the inbox's generation changed since this reader last saw them (another reader moved it,
/// or the inbox is another file now).
#[derive(Debug)]
pub struct Keeper {
    lock: std::sync::Arc<File>,
    cursor: std::path::PathBuf,
    agent: String,
    known: Option<Known>,
    /// The agent's read log, open once.
    log: Option<File>,
}

/// The cursor file as a [`Keeper`] last read or wrote it, the inbox file (device, inode)
/// and generation it was checked against, and the position that gave.
#[derive(Debug)]
struct Known {
    held: Held,
    inbox: (u64, u64),
    gen: u32,
    position: Position,
}

impl Known {
    fn of(&self, inbox: (u64, u64), gen: u32) -> Option<(&Held, Position)> {
        (self.inbox == inbox && self.gen == gen).then_some((&self.held, self.position))
    }
}

/// A reading held by a [`Keeper`]: let go when dropped.
#[derive(Debug)]
pub struct Kept {
    lock: std::sync::Arc<File>,
    agent: String,
}

impl Drop for Kept {
    fn drop(&mut self) {
        let _ = self.lock.unlock();
        turn_ended(&self.agent);
    }
}

impl Keeper {
    pub fn new(bridge: &Bridge, agent: &str) -> Result<Keeper> {
        Ok(Keeper {
            lock: std::sync::Arc::new(reader_lock(bridge, agent)?),
            cursor: bridge.cursor_path(agent)?,
            agent: agent.to_owned(),
            known: None,
            log: None,
        })
    }

    /// Begin a reading, as [`reading_within`] does, waiting for another reader until
    /// `until` (`None`: as long as it reads).
    pub fn reading(&mut self, bridge: &Bridge, until: Option<std::time::Instant>) -> Result<Kept> {
        lock_reader(&mut self.lock, bridge, &self.agent, until)?;
        turn_taken(&self.agent);
        Ok(Kept {
            lock: std::sync::Arc::clone(&self.lock),
            agent: self.agent.clone(),
        })
    }

    /// Take the reading at once, or `None` when another reader is in its turn. For a reader
    /// that prints for another process (the daemon printing what a `watch` handed it): the
    /// turn is not this thread's, and the reading may be let go on another thread.
    pub fn try_reading(&mut self, bridge: &Bridge) -> Result<Option<Taken>> {
        loop {
            match self.lock.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::io("lock reader lock", "(reader lock)")(e))
                }
            }
            let links = self
                .lock
                .metadata()
                .map_err(Error::io("stat reader lock", "(reader lock)"))?
                .nlink();
            if links > 0 {
                return Ok(Some(Taken {
                    lock: std::sync::Arc::clone(&self.lock),
                }));
            }
            // Removed (a user cleared `.doorbell/reads/`): the lock the next reader takes.
            let _ = self.lock.unlock();
            self.lock = std::sync::Arc::new(reader_lock(bridge, &self.agent)?);
        }
    }

    /// Where the agent resumes reading `inbox` (whose device and inode are `identity`, in
    /// the judge's generation `gen`), as [`load`] says. One look at the cursor's path when
    /// it is still the file this reader last read or wrote.
    pub fn load(&mut self, inbox: &File, identity: (u64, u64), gen: u32) -> Result<Position> {
        if let Some((held, position)) = self.known.as_ref().and_then(|k| k.of(identity, gen)) {
            if stamp_at(&self.cursor)? == Some(held.stamp) {
                if let Position::At(_) = position {
                    return Ok(position);
                }
                // A cursor that did not match the inbox is matched again: the inbox may have
                // been half rewritten in place (a restore with `cp`) when it was looked at.
                let position = validate(held.cursor, inbox)?;
                if let Some(known) = &mut self.known {
                    known.position = position;
                }
                return Ok(position);
            }
        }
        let held = read_held(&self.cursor)?;
        let position = validate(held.as_ref().and_then(|held| held.cursor), inbox)?;
        self.known = held.map(|held| Known {
            held,
            inbox: identity,
            gen,
            position,
        });
        Ok(position)
    }

    /// Move the cursor, as [`advance`] does; the cursor file is read again only when
    /// another reader replaced it. With `expect`, only when the inbox still has the bytes
    /// that marker describes before `offset` ([`Error::ChangedInPlace`] otherwise).
    pub fn advance(
        &mut self,
        bridge: &Bridge,
        inbox: &File,
        (identity, gen): ((u64, u64), u32),
        offset: u64,
        via: &str,
        expect: Option<&Marker>,
    ) -> Result<()> {
        let known = self.known.as_ref().and_then(|k| k.of(identity, gen));
        let written = move_cursor(
            bridge,
            &self.agent,
            inbox,
            offset,
            via,
            expect,
            known,
            &mut self.log,
        )?;
        if let Some(held) = written {
            self.known = Some(Known {
                held,
                inbox: identity,
                gen,
                position: Position::At(offset),
            });
        }
        Ok(())
    }
}

/// A reading taken by [`Keeper::try_reading`]: let go when dropped, on whichever thread.
#[derive(Debug)]
pub struct Taken {
    lock: std::sync::Arc<File>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let _ = self.lock.unlock();
    }
}

/// An agent's reading, held from loading its cursor to moving it: two readers of one agent
/// (two `read` loops, a hook and a `watch`) never show the same message. Dropping it lets go.
#[derive(Debug)]
pub struct Reading {
    _lock: std::sync::Arc<File>,
    agent: String,
}

impl Drop for Reading {
    fn drop(&mut self) {
        turn_ended(&self.agent);
    }
}

/// How long a reader that must not hang (`read`, a hook, an MCP call) waits for another
/// reader of the same agent to finish its turn. A turn takes milliseconds, but a `watch`
/// whose output nobody reads (a paused pager, Ctrl-Z) stays in its turn until it is read.
pub const READER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Begin `agent`'s reading if no other reader holds it for longer than `within`; after that,
/// [`Error::ReaderBusy`] names the holder.
pub fn reading_within(
    bridge: &Bridge,
    agent: &str,
    within: std::time::Duration,
) -> Result<Reading> {
    let mut lock = std::sync::Arc::new(reader_lock(bridge, agent)?);
    lock_reader(
        &mut lock,
        bridge,
        agent,
        Some(std::time::Instant::now() + within),
    )?;
    turn_taken(agent);
    Ok(Reading {
        _lock: lock,
        agent: agent.to_owned(),
    })
}

/// Take `agent`'s reader lock, waiting for another reader until `until` (without end for
/// `None`), then [`Error::ReaderBusy`]. A lock file that is no longer at its path (removed
/// with `.doorbell/reads/`, or a restored folder) is let go, and the one there now taken:
/// that is the one the next reader takes.
fn lock_reader(
    lock: &mut std::sync::Arc<File>,
    bridge: &Bridge,
    agent: &str,
    until: Option<std::time::Instant>,
) -> Result<()> {
    let began = std::time::Instant::now();
    loop {
        wait_for_reader(lock, agent, began, until)?;
        let links = lock
            .metadata()
            .map_err(Error::io("stat reader lock", "(reader lock)"))?
            .nlink();
        if links > 0 {
            return Ok(());
        }
        let _ = lock.unlock();
        *lock = std::sync::Arc::new(reader_lock(bridge, agent)?);
    }
}

/// Lock `file`, the reader lock of `agent`, once no other reader holds it, or until `until`.
fn wait_for_reader(
    file: &File,
    agent: &str,
    began: std::time::Instant,
    until: Option<std::time::Instant>,
) -> Result<()> {
    let Some(until) = until else {
        return file
            .lock()
            .map_err(Error::io("lock reader lock", "(reader lock)"));
    };
    let mut pause = std::time::Duration::from_millis(1);
    // Past `until`, a lock no process is seen to hold was let go of while this one looked:
    // it is tried again (a few times, for a system that shows no holders at all).
    let mut unseen = 0;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < until => {
                std::thread::sleep(
                    pause.min(until.saturating_duration_since(std::time::Instant::now())),
                );
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => match crate::lock::flock_holder(file) {
                None if unseen < 3 => unseen += 1,
                holder => {
                    return Err(Error::ReaderBusy {
                        agent: agent.to_owned(),
                        holder: holder
                            .unwrap_or_else(|| "a process this one cannot see".to_owned()),
                        secs: (began.elapsed() + std::time::Duration::from_millis(500)).as_secs(),
                    })
                }
            },
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::io("lock reader lock", "(reader lock)")(e))
            }
        }
    }
}

/// The reader lock of `agent`, which every reader that moves a cursor takes. A station on
/// another bridge has one reader here, the forwarder, which moves its cursor once the far
/// side has the line: a message another reader took would never reach it.
fn reader_lock(bridge: &Bridge, agent: &str) -> Result<File> {
    if let Some(url) = bridge.forwarded_to(agent) {
        return Err(Error::Refused {
            message: format!(
                "{agent} is a station on another bridge ({url}): what lands in its inbox here is forwarded there, and reading it here would take it away; `doorbell read {agent} --peek` shows it without taking it, `doorbell status` says what waits"
            ),
        });
    }
    crate::lock::open_lock_file(&read_log_path(bridge, agent)?.with_extension("lock"))
}

/// How much of the read log is read at a time, from its end.
const CHUNK: u64 = 64 * 1024;

/// One advance of a cursor, in `.doorbell/reads/<agent>.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadRecord {
    pub dev: u64,
    pub ino: u64,
    pub from: u64,
    pub to: u64,
    /// How the agent read it: `read`, `watch`, `hook claude`, `mcp`, ...
    pub via: String,
    pub at: String,
}

/// `.doorbell/reads/`: the read logs, and the temp files of cursors being replaced.
/// Never followed through a symlink, like the rest of `.doorbell/`.
fn reads_dir(bridge: &Bridge) -> Result<std::path::PathBuf> {
    let dir = bridge.state_dir()?.join(READS_DIR);
    match fs::symlink_metadata(&dir) {
        Ok(meta) if meta.file_type().is_dir() => Ok(dir),
        Ok(_) => Err(Error::NotRegularFile { path: dir }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                // Made meanwhile by another reader: looked at again.
                Ok(()) | Err(_) if dir.symlink_metadata().is_ok_and(|m| m.is_dir()) => Ok(dir),
                Ok(()) => Err(Error::NotRegularFile { path: dir }),
                Err(e) => Err(Error::io("create folder", &dir)(e)),
            }
        }
        Err(e) => Err(Error::io("stat", &dir)(e)),
    }
}

fn read_log_path(bridge: &Bridge, agent: &str) -> Result<std::path::PathBuf> {
    let dir = reads_dir(bridge)?;
    bridge.cursor_path(agent)?; // a valid name
    Ok(dir.join(format!("{agent}.jsonl")))
}

/// Append `record` to the agent's read log, opening it into `log` when it is not open yet.
fn append_read(
    bridge: &Bridge,
    agent: &str,
    record: &ReadRecord,
    log: &mut Option<File>,
) -> Result<()> {
    let mut line = serde_json::to_vec(record).expect("a read record always serialises");
    line.push(b'\n');
    // A log deleted or replaced meanwhile (nobody else still names the file this reader
    // holds) is opened again, so no record goes where no one can read it.
    if log
        .as_ref()
        .is_some_and(|file| file.metadata().map_or(true, |meta| meta.nlink() == 0))
    {
        *log = None;
    }
    let file = if let Some(file) = log {
        file
    } else {
        let path = read_log_path(bridge, agent)?;
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(Error::io("open read log", &path))?;
        log.insert(file)
    };
    // Under the cursor's lock: one writer at a time, one write per record.
    std::io::Write::write_all(file, &line).map_err(Error::io("write read log", "(read log)"))
}

/// How the message at `offset` of the inbox file `(dev, ino)` was read, from the newest end
/// of the agent's read log: the scan stops at the first advance that ends at or before it.
pub fn read_via(
    bridge: &Bridge,
    agent: &str,
    dev: u64,
    ino: u64,
    offset: u64,
) -> Option<ReadRecord> {
    let path = read_log_path(bridge, agent).ok()?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .ok()?;
    let mut end = file.metadata().ok()?.len();
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let start = end.saturating_sub(CHUNK);
        let mut chunk = vec![0; usize::try_from(end - start).ok()?];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut chunk, start).ok()?;
        chunk.extend_from_slice(&carry);
        let mut lines: Vec<&[u8]> = chunk.split(|b| *b == b'\n').collect();
        // The first piece may be a line cut by the chunk's start: keep it for the next round.
        let first = if start > 0 {
            lines.remove(0).to_vec()
        } else {
            Vec::new()
        };
        for line in lines.iter().rev() {
            let Ok(record) = serde_json::from_slice::<ReadRecord>(line) else {
                continue;
            };
            if (record.dev, record.ino) != (dev, ino) {
                continue;
            }
            if record.from <= offset && offset < record.to {
                return Some(record);
            }
            if record.to <= offset {
                return None;
            }
        }
        if start == 0 {
            return None;
        }
        carry = first;
        end = start;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileExt, MetadataExt};

    use super::*;
    use crate::Config;

    /// A move that says which bytes it reads past is made only while the inbox holds them
    /// there: changed in place since, the cursor stays, and the change is named.
    #[test]
    fn a_move_past_marked_bytes_is_made_only_while_the_inbox_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
        let path = bridge.add_agent("web").unwrap();
        std::fs::write(&path, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n").unwrap();
        let inbox = File::open(&path).unwrap();
        let meta = inbox.metadata().unwrap();
        let file = ((meta.dev(), meta.ino()), 0);
        let marked = |offset| Marker::of(&inbox, offset).unwrap().unwrap();
        let mut keeper = Keeper::new(&bridge, "web").unwrap();
        keeper
            .advance(&bridge, &inbox, file, 11, "test", Some(&marked(11)))
            .unwrap();
        assert_eq!(load(&bridge, "web", &inbox).unwrap(), Position::At(11));
        let before = marked(22);
        let in_place = || std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // The second line rewritten in place, to the same length.
        in_place().write_all_at(b"{\"id\":\"B\"}", 11).unwrap();
        let moved = keeper.advance(&bridge, &inbox, file, 22, "test", Some(&before));
        assert!(
            matches!(moved, Err(Error::ChangedInPlace { .. })),
            "{moved:?}"
        );
        assert_eq!(load(&bridge, "web", &inbox).unwrap(), Position::At(11));
        // Cut short: the bytes are not there at all.
        let cut = marked(22);
        in_place().set_len(15).unwrap();
        let moved = keeper.advance(&bridge, &inbox, file, 22, "test", Some(&cut));
        assert!(matches!(moved, Err(Error::ChangedInPlace { .. })));
        assert_eq!(load(&bridge, "web", &inbox).unwrap(), Position::At(11));
        // Without a marker to hold it to, a move goes as it always did.
        keeper
            .advance(&bridge, &inbox, file, 11, "test", None)
            .unwrap();
    }
}
