//! doorbell's protocol as pure data: the envelope, names and ids, the judgement of one
//! line with its reason codes, and the ledger of requests and debts.
//!
//! This crate never touches a file, a clock or the network. Callers hand it bytes and the
//! judge's current time; everything it returns is a value. That keeps every rule testable
//! with plain data and makes a verdict a pure function of the line and the ledger.

pub mod debts;
pub mod duration;
pub mod envelope;
pub mod judge;
pub mod ledger;
pub mod name;
pub mod notice;
pub mod report;
pub mod rules;
pub mod trace;
pub mod verdict;

pub use envelope::{Envelope, Kind, MessageSummary, State};
pub use judge::{is_base64, Limits, Registry};
pub use ledger::{Accepted, Archive, Changes, Debt, Ledger, Request};
pub use name::{is_agent_name, is_id, is_reserved_id, BUILTIN_LOOPS};
pub use rules::{judge_line, judge_parsed, judge_stateless};
pub use verdict::{Refusal, RefusalReason, Verdict};
