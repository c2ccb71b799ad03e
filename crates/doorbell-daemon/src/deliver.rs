//! Printing for a watcher. A `watch --json` whose output is a pipe hands that pipe to the
//! daemon over its socket (`SCM_RIGHTS`); from then on the judge writes each accepted line
//! of the agent's inbox to it as soon as it is journaled, and moves the agent's cursor after
//! the write, as the watch would have — one process woken per message instead of two.
//!
//! How far the printing got is kept in a small memory file the watch sends with its output
//! (a [`Record`]): written right after each write to the pipe, it outlives the daemon, so a
//! watch whose daemon was killed carries on from there and repeats nothing the daemon
//! printed — unless the daemon died between a write and its record, microseconds apart.
//!
//! The watch waits on its socket meanwhile. Whatever the daemon cannot do as the watch
//! would, it hands back: another reader is in its turn, the inbox is another file or
//! another generation, it changed in place under the judge, or a file could not be read.
//! The watch then prints from where the daemon stopped, as before, and may hand its output
//! over again later. A consumer that does not keep up never holds the judge: the pipe is
//! written without blocking, and what does not fit waits for the pipe to take more (the
//! reading stays held meanwhile, as it would by a watch blocked in its write).

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use doorbell_store::append::open_inbox;
use doorbell_store::cursor::{Keeper, Position, Taken};
use doorbell_store::journal::Appended;
use doorbell_store::view::{push_json_line, InboxView, Updates, View};
use doorbell_store::Bridge;

/// What a watch asks: print `agent`'s accepted lines from `printed_to` on, of the inbox file
/// `dev`/`ino` in the judge's generation `gen`, as `--json` lines, to the pipe it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub printed_to: u64,
    pub dev: u64,
    pub ino: u64,
    pub gen: u32,
    pub agent: String,
}

impl Request {
    /// `deliver PRINTED_TO DEV INO GEN AGENT\n`.
    #[must_use]
    pub fn to_line(&self) -> String {
        format!(
            "deliver {} {} {} {} {}\n",
            self.printed_to, self.dev, self.ino, self.gen, self.agent
        )
    }

    #[must_use]
    pub fn parse(line: &str) -> Option<Request> {
        let mut words = line.strip_suffix('\n')?.split(' ');
        if words.next()? != "deliver" {
            return None;
        }
        let printed_to = words.next()?.parse().ok()?;
        let dev = words.next()?.parse().ok()?;
        let ino = words.next()?.parse().ok()?;
        let gen = words.next()?.parse().ok()?;
        let agent = words.next()?.to_owned();
        (words.next().is_none() && doorbell_core::name::is_agent_name(&agent)).then_some(Request {
            printed_to,
            dev,
            ino,
            gen,
            agent,
        })
    }
}

/// What the daemon says back, each a line: `delivering`, `refused REASON`, `closed` (the
/// pipe's reader went away), or `back`: the watch prints again itself, from where its
/// [`Record`] says.
pub const DELIVERING: &str = "delivering\n";
pub const CLOSED: &str = "closed\n";
pub const BACK: &str = "back\n";

/// How far a daemon printing for a watch got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Printed {
    /// The lines before this offset are whole in the pipe.
    pub printed_to: u64,
    /// `rest` ends the lines up to this offset, begun in the pipe: the watch writes it
    /// before anything else.
    pub upto: u64,
    pub rest: Vec<u8>,
}

/// A watch's record of [`Printed`]: a memory file (`memfd`) both hold. Its first 32 bytes
/// say `printed_to`, `upto`, the length of `rest` and which of two places holds `rest`; the
/// place not named is written first, then the header in one write of its page, so a daemon
/// killed at any instant leaves the old record or the new one, never a mix.
#[derive(Debug)]
pub struct Record {
    file: File,
    slot: u64,
}

const HEADER: usize = 32;
const SLOT_BASE: u64 = 4096;
const SLOT_SPAN: u64 = 1 << 32;

impl Record {
    /// A new record, saying that the lines before `printed_to` are printed.
    pub fn create(printed_to: u64) -> std::io::Result<Record> {
        let fd = rustix::fs::memfd_create(
            "doorbell-watch",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )?;
        let mut record = Record {
            file: File::from(fd),
            slot: 0,
        };
        record.save(&Printed {
            printed_to,
            upto: printed_to,
            rest: Vec::new(),
        })?;
        Ok(record)
    }

    /// The record a watch sent: a memory file, nothing else.
    pub fn received(fd: OwnedFd) -> Result<Record, String> {
        if rustix::fs::fcntl_get_seals(&fd).is_err() {
            return Err("the record is not a memory file".into());
        }
        let mut record = Record {
            file: File::from(fd),
            slot: 0,
        };
        record.slot = record.header().map_err(|e| e.to_string())?[3];
        Ok(record)
    }

    fn header(&self) -> std::io::Result<[u64; 4]> {
        let mut bytes = [0u8; HEADER];
        self.file.read_exact_at(&mut bytes, 0)?;
        let mut words = [0u64; 4];
        for (word, bytes) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_le_bytes(bytes.try_into().expect("eight bytes"));
        }
        Ok(words)
    }

    pub fn save(&mut self, printed: &Printed) -> std::io::Result<()> {
        let slot = 1 - (self.slot & 1);
        let len = printed.rest.len() as u64;
        if len >= SLOT_SPAN - SLOT_BASE {
            return Err(std::io::Error::other(
                "too much begun in the pipe to record",
            ));
        }
        if len > 0 {
            self.file
                .write_all_at(&printed.rest, SLOT_BASE + slot * SLOT_SPAN)?;
        }
        let mut header = [0u8; HEADER];
        for (bytes, word) in
            header
                .chunks_exact_mut(8)
                .zip([printed.printed_to, printed.upto, len, slot])
        {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        self.file.write_all_at(&header, 0)?;
        self.slot = slot;
        Ok(())
    }

    pub fn load(&self) -> std::io::Result<Printed> {
        let [printed_to, upto, len, slot] = self.header()?;
        if slot > 1 || len >= SLOT_SPAN - SLOT_BASE || upto < printed_to {
            return Err(std::io::Error::other("a damaged watch record"));
        }
        let mut rest = vec![0; usize::try_from(len).map_err(std::io::Error::other)?];
        self.file
            .read_exact_at(&mut rest, SLOT_BASE + slot * SLOT_SPAN)?;
        Ok(Printed {
            printed_to,
            upto,
            rest,
        })
    }
}

impl std::os::fd::AsFd for Record {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Lines the pipe did not take whole: the rest of them, the offset they end the printing
/// at, and the reading held until they are out (the cursor has not moved past them).
#[derive(Debug)]
struct Pending {
    rest: Vec<u8>,
    upto: u64,
    _turn: Taken,
}

/// A watch's output, printed to by the daemon.
#[derive(Debug)]
pub struct Delivery {
    /// The watch's connection: it says nothing while its output is here, so anything it
    /// says (it hung up) ends this delivery.
    pub(crate) conn: Arc<UnixStream>,
    /// The pipe (non-blocking).
    pub(crate) out: Arc<File>,
    record: Record,
    agent: String,
    inbox: File,
    identity: (u64, u64),
    gen: u32,
    journal: InboxView,
    updates: Updates,
    keeper: Keeper,
    printed_to: u64,
    pending: Option<Pending>,
    /// The pipe was full: nothing is printed until it takes more.
    pub(crate) stalled: bool,
    lines: Vec<u8>,
}

/// How a step ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Printing goes on here.
    Going,
    /// The watch prints again itself; why.
    Back(String),
    /// The pipe's reader went away.
    Closed,
}

impl Delivery {
    /// Take over `request`'s printing to `out`, or say why not. The view is read from the
    /// files here; [`Delivery::catch_up`] brings it to the journal's end once the judge
    /// cannot append meanwhile.
    pub fn start(
        bridge: &Bridge,
        conn: Arc<UnixStream>,
        request: &Request,
        out: OwnedFd,
        record: OwnedFd,
    ) -> Result<Delivery, String> {
        let out = File::from(out);
        let record = Record::received(record)?;
        let kind = out.metadata().map_err(|e| e.to_string())?.file_type();
        if !kind.is_fifo() {
            return Err("the output is not a pipe".into());
        }
        let path = bridge
            .require_inbox(&request.agent)
            .map_err(|e| e.to_string())?;
        let inbox = open_inbox(&path, false).map_err(|e| e.to_string())?;
        let meta = inbox.metadata().map_err(|e| e.to_string())?;
        let identity = (meta.dev(), meta.ino());
        let keeper = Keeper::new(bridge, &request.agent).map_err(|e| e.to_string())?;
        let view = View::unjudged(bridge).map_err(|e| e.to_string())?;
        let journal = view
            .inbox(&request.agent, request.printed_to)
            .map_err(|e| e.to_string())?
            .unwrap_or_else(|| InboxView::empty(&request.agent));
        let judged = (
            journal.journal.dev,
            journal.journal.ino,
            journal.journal.gen,
        );
        if identity != (request.dev, request.ino)
            || judged != (request.dev, request.ino, request.gen)
        {
            return Err("the inbox is not the file the watch read".into());
        }
        let flags = rustix::fs::fcntl_getfl(&out).map_err(|e| e.to_string())?;
        rustix::fs::fcntl_setfl(&out, flags | rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| e.to_string())?;
        Ok(Delivery {
            conn,
            out: Arc::new(out),
            record,
            agent: request.agent.clone(),
            inbox,
            identity,
            gen: request.gen,
            journal,
            updates: view.updates(),
            keeper,
            printed_to: request.printed_to,
            pending: None,
            stalled: false,
            lines: Vec::new(),
        })
    }

    /// Read what the judge journaled since the view was read, and print it.
    pub fn catch_up(&mut self, bridge: &Bridge) -> Outcome {
        if let Err(e) = self.updates.follow(&mut self.journal) {
            return Outcome::Back(e.to_string());
        }
        self.step(bridge)
    }

    /// What the judge just journaled: print what it accepted for this agent.
    pub fn take(&mut self, bridge: &Bridge, appended: &Appended) -> Outcome {
        if let Err(e) = self.updates.take(appended, &mut self.journal) {
            return Outcome::Back(e.to_string());
        }
        if self.stalled {
            return Outcome::Going;
        }
        self.step(bridge)
    }

    /// The pipe takes more: write what waited, then what came meanwhile.
    pub fn resume(&mut self, bridge: &Bridge) -> Outcome {
        self.stalled = false;
        if let Some(mut pending) = self.pending.take() {
            match self.write(&pending.rest) {
                Wrote::All => {}
                Wrote::Part(n) => {
                    pending.rest.drain(..n);
                    let saved = self.begun(&pending);
                    self.pending = Some(pending);
                    self.stalled = true;
                    return saved.map_or_else(Outcome::Back, |()| Outcome::Going);
                }
                Wrote::Closed => return Outcome::Closed,
                Wrote::Failed(e) => {
                    self.pending = Some(pending);
                    return Outcome::Back(e);
                }
            }
            if let Err(e) = self.advance(bridge, pending.upto) {
                return Outcome::Back(e);
            }
            // The reading held since the lines were begun is let go here.
            drop(pending);
        }
        self.step(bridge)
    }

    /// Print the accepted lines past `printed_to`, then move the cursor, in the agent's
    /// reading, as `watch` does.
    fn step(&mut self, bridge: &Bridge) -> Outcome {
        if (self.journal.journal.dev, self.journal.journal.ino) != self.identity
            || self.journal.journal.gen != self.gen
        {
            return Outcome::Back("the judge reads another file or generation now".into());
        }
        let turn = match self.keeper.try_reading(bridge) {
            Ok(Some(turn)) => turn,
            Ok(None) => return Outcome::Back("another reader is in its turn".into()),
            Err(e) => return Outcome::Back(e.to_string()),
        };
        match self.print(bridge, turn) {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Back(e),
        }
    }

    fn print(&mut self, bridge: &Bridge, turn: Taken) -> Result<Outcome, String> {
        let position = self
            .keeper
            .load(&self.inbox, self.identity, self.gen)
            .map_err(|e| e.to_string())?;
        let meta = self.inbox.metadata().map_err(|e| e.to_string())?;
        if !self.journal.describes(&self.inbox, &meta) {
            return Ok(Outcome::Back(
                "the inbox changed in place since the judge read it".into(),
            ));
        }
        if let Position::At(at) = position {
            self.printed_to = self.printed_to.max(at);
        }
        let mut lines = std::mem::take(&mut self.lines);
        lines.clear();
        let agent = &self.agent;
        let upto = self
            .journal
            .accepted_messages(&self.inbox, self.printed_to, |offset, bytes, _| {
                push_json_line(&mut lines, agent, offset, bytes).map_err(std::io::Error::other)
            })
            .map_err(|e| e.to_string());
        let upto = match upto {
            Ok(upto) => upto,
            Err(e) => {
                self.lines = lines;
                return Err(e);
            }
        };
        let wrote = if lines.is_empty() {
            Wrote::All
        } else {
            self.write(&lines)
        };
        let outcome = match wrote {
            Wrote::All => {
                // Moved in the reading, then let go: no other reader shows these lines.
                let moved = self.advance(bridge, upto);
                drop(turn);
                moved?;
                Outcome::Going
            }
            Wrote::Part(0) => {
                // Nothing went in: print again, from the cursor, once the pipe takes more.
                self.stalled = true;
                Outcome::Going
            }
            Wrote::Part(n) => {
                let pending = Pending {
                    rest: lines[n..].to_vec(),
                    upto,
                    _turn: turn,
                };
                let saved = self.begun(&pending);
                self.pending = Some(pending);
                self.stalled = true;
                saved.map_or_else(Outcome::Back, |()| Outcome::Going)
            }
            Wrote::Closed => Outcome::Closed,
            Wrote::Failed(e) => Outcome::Back(e),
        };
        self.lines = lines;
        Ok(outcome)
    }

    /// Record lines begun in the pipe, before anything else happens.
    fn begun(&mut self, pending: &Pending) -> Result<(), String> {
        self.record
            .save(&Printed {
                printed_to: self.printed_to,
                upto: pending.upto,
                rest: pending.rest.clone(),
            })
            .map_err(|e| format!("recording what was printed: {e}"))
    }

    /// Move the cursor to `upto` once the lines before it are out: recorded for the watch
    /// first, right after the write.
    fn advance(&mut self, bridge: &Bridge, upto: u64) -> Result<(), String> {
        if upto > self.printed_to {
            self.record
                .save(&Printed {
                    printed_to: upto,
                    upto,
                    rest: Vec::new(),
                })
                .map_err(|e| format!("recording what was printed: {e}"))?;
            let file = (self.identity, self.gen);
            self.keeper
                .advance(bridge, &self.inbox, file, upto, "watch")
                .map_err(|e| e.to_string())?;
            self.printed_to = upto;
        }
        Ok(())
    }

    fn write(&self, bytes: &[u8]) -> Wrote {
        let mut out = &*self.out;
        match out.write(bytes) {
            Ok(n) if n == bytes.len() => Wrote::All,
            Ok(n) => Wrote::Part(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Wrote::Part(0),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Wrote::Closed,
            Err(e) => Wrote::Failed(format!("writing to the watch's output: {e}")),
        }
    }

    /// Tell the watch how this ended, and give its output back as it was (blocking).
    pub fn end(self, outcome: &Outcome) {
        if let Ok(flags) = rustix::fs::fcntl_getfl(&*self.out) {
            let _ = rustix::fs::fcntl_setfl(&*self.out, flags - rustix::fs::OFlags::NONBLOCK);
        }
        let said = match outcome {
            Outcome::Closed => CLOSED,
            Outcome::Going | Outcome::Back(_) => BACK,
        };
        if let Outcome::Back(why) = outcome {
            tracing::debug!(agent = %self.agent, why, "the watch prints itself again");
        }
        // The watch reads it at once (it waits for nothing else); a watch that cannot take
        // it sees the connection close, and carries on from its record all the same.
        let mut conn = &*self.conn;
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(1)));
        let _ = conn.write_all(said.as_bytes());
    }
}

enum Wrote {
    All,
    Part(usize),
    Closed,
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_the_last_save_whole_and_only_a_memory_file_is_one() {
        let mut record = Record::create(10).unwrap();
        let received = Record::received(record.file.try_clone().unwrap().into()).unwrap();
        assert_eq!(
            received.load().unwrap(),
            Printed {
                printed_to: 10,
                upto: 10,
                rest: Vec::new()
            }
        );
        // A long rest, then a shorter one in the other place: the header names which.
        for (upto, rest) in [
            (90, vec![b'a'; 5000]),
            (95, b"bc\n".to_vec()),
            (95, Vec::new()),
        ] {
            let printed = Printed {
                printed_to: 20,
                upto,
                rest,
            };
            record.save(&printed).unwrap();
            assert_eq!(received.load().unwrap(), printed);
        }
        let plain = tempfile::tempfile().unwrap();
        assert!(Record::received(plain.into()).is_err());
    }

    #[test]
    fn a_request_reads_back_as_written_and_nothing_else_is_one() {
        let request = Request {
            printed_to: 42,
            dev: 7,
            ino: 9,
            gen: 3,
            agent: "web-2".into(),
        };
        assert_eq!(Request::parse(&request.to_line()), Some(request));
        for bad in [
            "deliver 1 2 3 4\n",
            "deliver 1 2 3 4 web extra\n",
            "deliver 1 2 3 -4 web\n",
            "deliver 1 2 3 4 web",
            "deliver 1 2 3 4 ../web\n",
            "watch 1 2 3 4 web\n",
        ] {
            assert_eq!(Request::parse(bad), None, "{bad:?}");
        }
    }
}
