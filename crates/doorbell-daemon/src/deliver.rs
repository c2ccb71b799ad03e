//! Printing for a watcher. A `watch --json` whose output is a pipe hands that pipe to the
//! daemon over its socket (`SCM_RIGHTS`); from then on the judge writes each accepted line
//! of the agent's inbox to it as soon as it is journaled, and moves the agent's cursor after
//! the write, as the watch would have — one process woken per message instead of two.
//!
//! The lines go to the pipe through a small memory file the watch sends with its output (a
//! [`Record`]), whose file position the kernel moves in the same call that moves the bytes:
//! it outlives the daemon, so a watch whose daemon was killed at any instant knows exactly
//! what reached the pipe, and repeats nothing.
//!
//! The watch waits on its socket meanwhile. Whatever the daemon cannot do as the watch
//! would, it hands back: another reader is in its turn, the inbox is another file or
//! another generation, it changed in place under the judge, or a file could not be read.
//! The watch then prints from where the daemon stopped, as before, and may hand its output
//! over again later. A consumer that does not keep up never holds the judge: the pipe is
//! written without blocking (`SPLICE_F_NONBLOCK`; its flags, shared with the watch, are left
//! alone), and what does not fit waits for the pipe to take more (the
//! reading stays held meanwhile, as it would by a watch blocked in its write).

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use doorbell_store::append::open_inbox;
use doorbell_store::cursor::{Keeper, Position, Taken};
use doorbell_store::hash::Marker;
use doorbell_store::journal::{Appended, JudgedLine};
use doorbell_store::view::{is_json_object, push_json_line, InboxView, Updates, View};
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

/// A watch's record of what the daemon printed for it: a memory file (`memfd`) both hold,
/// through which every byte goes to the pipe. The daemon writes a batch of lines into it,
/// then names the batch in the header — where it lies, and the inbox offsets before and
/// after it — and then `splice`s it from the file's own position into the pipe. The kernel
/// moves that position in the same call that moves the bytes, and the position is shared
/// with the watch: whenever the daemon dies, what reached the pipe is exactly what lies
/// before it.
///
/// A splice puts the file's pages themselves into the pipe, and a reader (or whatever it
/// splices them on to) may hold them long after: nothing is ever written twice at an
/// offset, and the pages behind the position are let go only whole, in blocks no page of
/// the file straddles. A page taken out of the file stays, as it is, in the pipe.
#[derive(Debug)]
pub struct Record {
    file: File,
    /// Where the batch named in the header begins and ends in the file, and where the
    /// file's position stands (the next byte to send).
    start: u64,
    end: u64,
    pos: u64,
    /// The pages before this offset (past the header's) are let go.
    let_go: u64,
}

/// The pipe's size asked for (what an unprivileged process may: `fs.pipe-max-size`).
const PIPE_SIZE: usize = 1 << 20;

const HEADER: usize = 32;
/// The pages behind the position are let go in blocks of this size, on its multiples: the
/// largest page a memory file may be made of (a huge page), so that no page is ever cut in
/// two, which would clear the part let go in place, under the pipe.
const LET_GO: u64 = 2 << 20;
/// The lines begin in the block after the header's (a hole until then).
const DATA: u64 = LET_GO;

/// How a send went.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    All,
    /// The pipe is full; the rest waits.
    Part,
    /// The pipe's reader went away.
    Closed,
    Failed(String),
}

impl Record {
    /// A new record, saying that the lines before `printed_to` are printed.
    pub fn create(printed_to: u64) -> std::io::Result<Record> {
        let fd = rustix::fs::memfd_create(
            "doorbell-watch",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )?;
        let file = File::from(fd);
        rustix::fs::seek(&file, rustix::fs::SeekFrom::Start(DATA))?;
        let record = Record {
            file,
            start: DATA,
            end: DATA,
            pos: DATA,
            let_go: 0,
        };
        record.name_batch(printed_to, printed_to)?;
        Ok(record)
    }

    /// The record a watch sent: a memory file, nothing else.
    pub fn received(fd: OwnedFd) -> Result<Record, String> {
        if rustix::fs::fcntl_get_seals(&fd).is_err() {
            return Err("the record is not a memory file".into());
        }
        let file = File::from(fd);
        let [start, end, _, _] = header(&file).map_err(|e| e.to_string())?;
        let pos =
            rustix::fs::seek(&file, rustix::fs::SeekFrom::Current(0)).map_err(|e| e.to_string())?;
        if start != end || pos != end {
            return Err("the record holds lines not sent".into());
        }
        if pos < DATA {
            return Err("the record's lines would be written over its header".into());
        }
        // What an earlier daemon let go is let go again: a hole punched twice is one hole.
        Ok(Record {
            file,
            start,
            end,
            pos,
            let_go: 0,
        })
    }

    /// Write the header: the batch between `start` and `end` takes the printing from
    /// `before` to `after`. One write within one page: the old header or the new one.
    fn name_batch(&self, before: u64, after: u64) -> std::io::Result<()> {
        let mut bytes = [0u8; HEADER];
        for (bytes, word) in bytes
            .chunks_exact_mut(8)
            .zip([self.start, self.end, before, after])
        {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        self.file.write_all_at(&bytes, 0)
    }

    /// Put `lines`, which take the printing from `before` to `after`, next in line; the
    /// last batch was all sent.
    pub fn put(&mut self, lines: &[u8], before: u64, after: u64) -> std::io::Result<()> {
        debug_assert_eq!(self.pos, self.end);
        let sent = self.pos / LET_GO * LET_GO;
        if sent > self.let_go.max(DATA) {
            let from = self.let_go.max(DATA);
            rustix::fs::fallocate(
                &self.file,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                from,
                sent - from,
            )?;
            self.let_go = sent;
        }
        self.file.write_all_at(lines, self.end)?;
        self.start = self.end;
        self.end += lines.len() as u64;
        self.name_batch(before, after)
    }

    /// Send what is not sent yet into `pipe`, without waiting for room.
    pub fn send(&mut self, pipe: &File) -> Sent {
        use rustix::pipe::SpliceFlags;
        while self.pos < self.end {
            let len = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX);
            match rustix::pipe::splice(&self.file, None, pipe, None, len, SpliceFlags::NONBLOCK) {
                Ok(0) => return Sent::Failed("the record ended early".into()),
                Ok(n) => self.pos += n as u64,
                Err(rustix::io::Errno::AGAIN) => return Sent::Part,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::PIPE) => return Sent::Closed,
                Err(e) => return Sent::Failed(format!("writing to the watch's output: {e}")),
            }
        }
        Sent::All
    }

    /// What reached the pipe, as the watch reads it once the daemon is done or gone.
    pub fn load(&self) -> std::io::Result<Printed> {
        let [start, end, before, after] = header(&self.file)?;
        let pos = rustix::fs::seek(&self.file, rustix::fs::SeekFrom::Current(0))?;
        if start > end || after < before {
            return Err(std::io::Error::other("a damaged watch record"));
        }
        Ok(if pos >= end {
            Printed {
                printed_to: after,
                upto: after,
                rest: Vec::new(),
            }
        } else if pos <= start {
            Printed {
                printed_to: before,
                upto: before,
                rest: Vec::new(),
            }
        } else {
            let mut rest = vec![0; usize::try_from(end - pos).map_err(std::io::Error::other)?];
            self.file.read_exact_at(&mut rest, pos)?;
            Printed {
                printed_to: before,
                upto: after,
                rest,
            }
        })
    }
}

fn header(file: &File) -> std::io::Result<[u64; 4]> {
    let mut bytes = [0u8; HEADER];
    file.read_exact_at(&mut bytes, 0)?;
    let mut words = [0u64; 4];
    for (word, bytes) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_le_bytes(bytes.try_into().expect("eight bytes"));
    }
    Ok(words)
}

impl std::os::fd::AsFd for Record {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Lines the pipe did not take whole (the rest waits in the record): the offset they end
/// the printing at, and the reading held until they are out (the cursor has not moved
/// past them).
#[derive(Debug)]
struct Pending {
    upto: u64,
    /// The judge's marker of `upto`, when the lines were printed as judged.
    expect: Option<Marker>,
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
    /// files here; [`Delivery::catch_up`] brings it to the journal's end, and what the
    /// judge appends from the moment it was queued for this delivery is taken after
    /// ([`Delivery::take`] passes over what was read already).
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
        // Each step's lines take a slot of the pipe of their own (a page spliced in is not
        // merged with the next): more slots, so that a burst does not fill the pipe.
        let _ = rustix::pipe::fcntl_setpipe_size(&out, PIPE_SIZE);
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

    /// Read what the judge journaled since the view was read, and print it (unless the pipe
    /// is full: then it waits, as [`Delivery::take`]'s does, for the pipe to take more).
    pub fn catch_up(&mut self, bridge: &Bridge) -> Outcome {
        if let Err(e) = self.updates.follow(&mut self.journal) {
            return Outcome::Back(e.to_string());
        }
        if self.stalled {
            return Outcome::Going;
        }
        self.step(bridge, &[])
    }

    /// What the judge just journaled, in the order it was: print what it accepted for this
    /// agent, in one step. The lines it judged come with it: those are printed as they were
    /// judged, without reading the inbox again, when they are every line to print.
    pub fn take(&mut self, bridge: &Bridge, appended: &[Arc<Appended>]) -> Outcome {
        for appended in appended {
            if let Err(e) = self.updates.take(appended, &mut self.journal) {
                return Outcome::Back(e.to_string());
            }
        }
        if self.stalled {
            return Outcome::Going;
        }
        self.step(bridge, appended)
    }

    /// The pipe takes more: write what waited, then what came meanwhile.
    pub fn resume(&mut self, bridge: &Bridge) -> Outcome {
        self.stalled = false;
        if let Some(pending) = self.pending.take() {
            match self.record.send(&self.out) {
                Sent::All => {}
                Sent::Part => {
                    self.pending = Some(pending);
                    self.stalled = true;
                    return Outcome::Going;
                }
                Sent::Closed => return Outcome::Closed,
                Sent::Failed(e) => {
                    self.pending = Some(pending);
                    return Outcome::Back(e);
                }
            }
            // The reading held since the lines were begun is let go here.
            if let Err(e) = self.advance(bridge, pending.upto, pending.expect.as_ref()) {
                return Outcome::Back(e);
            }
        }
        self.step(bridge, &[])
    }

    /// Print the accepted lines past `printed_to`, then move the cursor, in the agent's
    /// reading, as `watch` does. `judged`: what the judge just told, with the lines it read.
    fn step(&mut self, bridge: &Bridge, judged: &[Arc<Appended>]) -> Outcome {
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
        match self.print(bridge, turn, judged) {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Back(e),
        }
    }

    fn print(
        &mut self,
        bridge: &Bridge,
        turn: Taken,
        judged: &[Arc<Appended>],
    ) -> Result<Outcome, String> {
        let position = self
            .keeper
            .load(&self.inbox, self.identity, self.gen)
            .map_err(|e| e.to_string())?;
        if let Position::At(at) = position {
            self.printed_to = self.printed_to.max(at);
        }
        let mut lines = std::mem::take(&mut self.lines);
        lines.clear();
        // Printed as judged, the lines are read past only where the judge's marker of their
        // end still describes the inbox (checked as the cursor moves, with the bytes it
        // reads anyway): an inbox changed in place meanwhile keeps the cursor where it was.
        let judged_to = self.journal.journal.judged_to;
        let expect = self
            .journal
            .journal
            .mark
            .filter(|(at, _)| *at == judged_to)
            .map(|(_, marker)| marker);
        let judged = expect.and_then(|_| {
            judged_between(judged, &self.agent, self.gen, self.printed_to, judged_to)
        });
        let expect = judged.as_ref().and(expect);
        let upto = match judged {
            // The very bytes judged a moment ago: no look at the inbox.
            Some(judged) => judged
                .into_iter()
                .try_for_each(|(offset, bytes)| {
                    push_json_line(&mut lines, &self.agent, offset, bytes)
                })
                .map(|()| Some(judged_to))
                .map_err(|e| e.to_string()),
            None => self.read_accepted(&mut lines),
        };
        let upto = match upto {
            Ok(Some(upto)) => upto,
            Ok(None) => {
                self.lines = lines;
                return Ok(Outcome::Back(
                    "the inbox changed in place since the judge read it".into(),
                ));
            }
            Err(e) => {
                self.lines = lines;
                return Err(e);
            }
        };
        if upto == self.printed_to {
            self.lines = lines;
            return Ok(Outcome::Going);
        }
        let put = self.record.put(&lines, self.printed_to, upto);
        self.lines = lines;
        put.map_err(|e| format!("recording what is printed: {e}"))?;
        Ok(match self.record.send(&self.out) {
            Sent::All => {
                // Moved in the reading, then let go: no other reader shows these lines.
                let moved = self.advance(bridge, upto, expect.as_ref());
                drop(turn);
                moved?;
                Outcome::Going
            }
            Sent::Part => {
                self.pending = Some(Pending {
                    upto,
                    expect,
                    _turn: turn,
                });
                self.stalled = true;
                Outcome::Going
            }
            Sent::Closed => Outcome::Closed,
            Sent::Failed(e) => {
                self.pending = Some(Pending {
                    upto,
                    expect,
                    _turn: turn,
                });
                Outcome::Back(e)
            }
        })
    }

    /// The accepted lines past `printed_to`, read from the inbox into `lines` as `--json`
    /// lines: how far they take the printing, or `None` when the inbox changed in place
    /// since the judge read it.
    fn read_accepted(&mut self, lines: &mut Vec<u8>) -> Result<Option<u64>, String> {
        let meta = self.inbox.metadata().map_err(|e| e.to_string())?;
        if !self.journal.describes(&self.inbox, &meta) {
            return Ok(None);
        }
        let agent = &self.agent;
        // The lines were judged a moment ago, as they read now unless the inbox changed in
        // place (which `describes` sees for all but an edit inside the file): they go out
        // without being judged again, only checked to be one JSON object still (a scan that
        // builds nothing), so that what is printed is JSON. One that is not is left to the
        // watch, which passes over it with a warning, as it does every damaged line.
        self.journal
            .accepted_lines(&self.inbox, self.printed_to, |offset, bytes| {
                if !is_json_object(bytes) {
                    return Err(std::io::Error::other(format!(
                        "the line at {offset} changed since it was judged"
                    )));
                }
                push_json_line(lines, agent, offset, bytes).map_err(std::io::Error::other)
            })
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// Move the cursor to `upto` once the lines before it are out (with `expect`, only
    /// where the inbox still has the bytes the judge marked there).
    fn advance(
        &mut self,
        bridge: &Bridge,
        upto: u64,
        expect: Option<&Marker>,
    ) -> Result<(), String> {
        if upto > self.printed_to {
            let file = (self.identity, self.gen);
            self.keeper
                .advance(bridge, &self.inbox, file, upto, "watch", expect)
                .map_err(|e| e.to_string())?;
            self.printed_to = upto;
        }
        Ok(())
    }

    /// Tell the watch how this ended: its output is its own again.
    pub fn end(self, outcome: &Outcome) {
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

/// The accepted lines of `agent`'s inbox (generation `gen`) between the offsets `from` and
/// `to`, as the judge read them, when `judged` names a verdict for every line between them,
/// one after the other: each line to print is then one of them. `None` when any line between
/// is not named (judged earlier, or its copy left out), or its bytes are not there.
fn judged_between<'a>(
    judged: &'a [Arc<Appended>],
    agent: &str,
    gen: u32,
    from: u64,
    to: u64,
) -> Option<Vec<(u64, &'a [u8])>> {
    let mut lines: Vec<&JudgedLine> = judged
        .iter()
        .flat_map(|appended| &appended.lines)
        .filter(|line| line.inbox == agent && line.gen == gen && line.offset < to)
        .filter(|line| line.offset.saturating_add(line.span) > from)
        .collect();
    // Held lines are judged after those written after them.
    lines.sort_by_key(|line| line.offset);
    let mut at = from;
    let mut accepted = Vec::new();
    for line in lines {
        if line.offset != at || line.span == 0 {
            return None;
        }
        if line.accepted {
            let bytes = line.bytes.as_deref()?;
            if bytes.len() as u64 + 1 != line.span {
                return None;
            }
            accepted.push((line.offset, bytes));
        }
        at += line.span;
    }
    (at == to).then_some(accepted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(inbox: &str, gen: u32, offset: u64, line: &str, accepted: bool) -> JudgedLine {
        JudgedLine {
            inbox: inbox.into(),
            gen,
            offset,
            span: line.len() as u64 + 1,
            accepted,
            bytes: accepted.then(|| line.as_bytes().to_vec()),
        }
    }

    fn telling(lines: Vec<JudgedLine>) -> Arc<Appended> {
        Arc::new(Appended {
            lines,
            ..Appended::default()
        })
    }

    /// A line is printed as judged only when every line from where the printing stands to
    /// where judging stands was judged in what was just told, one after the other; else the
    /// inbox is read.
    #[test]
    fn lines_are_printed_as_judged_only_when_what_was_told_covers_every_line_between() {
        let a = r#"{"id":"a"}"#; // 10 bytes and a break: 0..11
        let b = "not json"; // 11..20
        let c = r#"{"id":"c"}"#; // 20..31
        let told = [
            telling(vec![
                judged("web", 1, 0, a, true),
                judged("design", 1, 11, b, false),
            ]),
            // A held line judged after the line written after it.
            telling(vec![
                judged("web", 1, 20, c, true),
                judged("web", 1, 11, b, false),
            ]),
        ];
        let between = |from, to| judged_between(&told, "web", 1, from, to);
        let all = vec![(0, a.as_bytes()), (20, c.as_bytes())];
        assert_eq!(between(0, 31), Some(all));
        // From where another reader moved the cursor; up to where judging stands.
        assert_eq!(between(11, 31), Some(vec![(20, c.as_bytes())]));
        assert_eq!(between(0, 11), Some(vec![(0, a.as_bytes())]));
        assert_eq!(between(31, 31), Some(vec![]));
        // Not at a line's start, or past what was told: the inbox is read.
        assert_eq!(between(5, 31), None);
        assert_eq!(between(0, 25), None);
        assert_eq!(between(0, 40), None);
        assert_eq!(between(31, 11), None);
        // Another generation, or another inbox, was told nothing of.
        assert_eq!(judged_between(&told, "web", 2, 0, 31), None);
        assert_eq!(judged_between(&told, "design", 1, 0, 20), None);
        // A line between missing (its copy left out): the inbox is read.
        let gap = [telling(vec![
            judged("web", 1, 0, a, true),
            judged("web", 1, 20, c, true),
        ])];
        assert_eq!(judged_between(&gap, "web", 1, 0, 31), None);
        assert_eq!(
            judged_between(&gap, "web", 1, 20, 31),
            Some(vec![(20, c.as_bytes())])
        );
        // An accepted line without its bytes, or with bytes its span does not cover.
        let bare = JudgedLine {
            bytes: None,
            ..judged("web", 1, 0, a, true)
        };
        let short = JudgedLine {
            span: 5,
            ..judged("web", 1, 0, a, true)
        };
        assert_eq!(
            judged_between(&[telling(vec![bare])], "web", 1, 0, 11),
            None
        );
        assert_eq!(
            judged_between(&[telling(vec![short])], "web", 1, 0, 11),
            None
        );
        // A line told twice is no run of lines.
        let twice = [
            telling(vec![judged("web", 1, 0, a, true)]),
            telling(vec![judged("web", 1, 0, a, true)]),
        ];
        assert_eq!(judged_between(&twice, "web", 1, 0, 11), None);
    }

    #[test]
    fn a_record_says_exactly_what_reached_the_pipe_and_only_a_memory_file_is_one() {
        use std::io::Read;
        let printed = |printed_to, upto, rest: &[u8]| Printed {
            printed_to,
            upto,
            rest: rest.to_vec(),
        };
        let mut record = Record::create(10).unwrap();
        // The watch's copy: the same file, the same position.
        let watch = Record::received(record.file.try_clone().unwrap().into()).unwrap();
        assert_eq!(watch.load().unwrap(), printed(10, 10, b""));
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        let (mut reader, writer) = (File::from(reader), File::from(writer));
        rustix::pipe::fcntl_setpipe_size(&writer, 16384).unwrap();

        record.put(b"one\n", 10, 20).unwrap();
        assert_eq!(watch.load().unwrap(), printed(10, 10, b""), "not sent yet");
        assert_eq!(record.send(&writer), Sent::All);
        assert_eq!(watch.load().unwrap(), printed(20, 20, b""));

        // More than the pipe holds: what did not go in is the rest.
        let mut big = vec![b'x'; 40_000];
        big.push(b'\n');
        record.put(&big, 20, 30).unwrap();
        assert_eq!(record.send(&writer), Sent::Part);
        let loaded = watch.load().unwrap();
        assert_eq!((loaded.printed_to, loaded.upto), (20, 30));
        let mut got = vec![0; 4096];
        let n = reader.read(&mut got).unwrap();
        got.truncate(n);
        assert!(!loaded.rest.is_empty() && big.ends_with(&loaded.rest));
        // Drained, the rest goes in, and the record says so.
        let mut all = got;
        while record.send(&writer) == Sent::Part {
            let mut more = vec![0; 4096];
            let n = reader.read(&mut more).unwrap();
            all.extend_from_slice(&more[..n]);
        }
        assert_eq!(watch.load().unwrap(), printed(30, 30, b""));
        drop(writer);
        reader.read_to_end(&mut all).unwrap();
        let mut expected = b"one\n".to_vec();
        expected.extend_from_slice(&big);
        assert_eq!(all, expected);

        let plain = tempfile::tempfile().unwrap();
        assert!(Record::received(plain.into()).is_err());
    }

    /// The pipe holds the record's pages until they are read: with the reader a pipe's
    /// worth behind over several blocks let go, every byte reads back as it was put.
    #[test]
    fn pages_the_pipe_still_holds_are_never_written_over() {
        use std::io::Read;
        let mut record = Record::create(0).unwrap();
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        let (mut reader, writer) = (File::from(reader), File::from(writer));
        rustix::pipe::fcntl_setpipe_size(&writer, 1 << 20).unwrap();
        let (mut put, mut got) = (Vec::new(), Vec::new());
        let mut read = |got: &mut Vec<u8>, len: usize| {
            let mut buf = vec![0; len];
            let n = reader.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        };
        for batch in 0..400u64 {
            // Batches that end inside a page, each byte telling where it was put.
            let lines: Vec<u8> = (0..20_011u64)
                .map(|n| u8::try_from((batch * 7 + n) % 251).unwrap())
                .collect();
            record.put(&lines, batch, batch + 1).unwrap();
            put.extend_from_slice(&lines);
            while record.send(&writer) == Sent::Part {
                read(&mut got, 16_384);
            }
            read(&mut got, 12_000);
        }
        drop(writer);
        reader.read_to_end(&mut got).unwrap();
        assert!(put.len() as u64 > 3 * LET_GO);
        assert!(got == put, "what the pipe gave differs from what was put");
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
