//! Verdicts and reason codes. Every line ends in exactly one verdict; a refusal carries the
//! first reason that applies in the precedence order of the contract, which is the order of
//! the `RefusalReason` variants.

use std::fmt;

/// Why a line was refused, in precedence order: when several apply, the first one wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefusalReason {
    LineTooLong,
    NotUtf8,
    BadJson,
    ResponseWithoutCorrelation,
    MissingField,
    BadField,
    Misaddressed,
    UnknownSender,
    BorrowedName,
    IdReused,
    UnknownRequest,
    NotAddressee,
    RequestClosed,
    BadTransition,
    ContextMismatch,
}

impl RefusalReason {
    /// Every reason, in precedence order.
    pub const ALL: [RefusalReason; 15] = [
        Self::LineTooLong,
        Self::NotUtf8,
        Self::BadJson,
        Self::ResponseWithoutCorrelation,
        Self::MissingField,
        Self::BadField,
        Self::Misaddressed,
        Self::UnknownSender,
        Self::BorrowedName,
        Self::IdReused,
        Self::UnknownRequest,
        Self::NotAddressee,
        Self::RequestClosed,
        Self::BadTransition,
        Self::ContextMismatch,
    ];

    /// The reason code as it appears in files, notices and `--json` output.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::LineTooLong => "line-too-long",
            Self::NotUtf8 => "not-utf8",
            Self::BadJson => "bad-json",
            Self::ResponseWithoutCorrelation => "response-without-correlation",
            Self::MissingField => "missing-field",
            Self::BadField => "bad-field",
            Self::Misaddressed => "misaddressed",
            Self::UnknownSender => "unknown-sender",
            Self::BorrowedName => "borrowed-name",
            Self::IdReused => "id-reused",
            Self::UnknownRequest => "unknown-request",
            Self::NotAddressee => "not-addressee",
            Self::RequestClosed => "request-closed",
            Self::BadTransition => "bad-transition",
            Self::ContextMismatch => "context-mismatch",
        }
    }

    /// Parse a reason code.
    #[must_use]
    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Whether offline `check` can decide this reason without the registry or the ledger.
    #[must_use]
    pub fn is_stateless(self) -> bool {
        self <= Self::Misaddressed
    }

    /// How a sender fixes a line refused for this reason.
    #[must_use]
    pub fn fix(self) -> &'static str {
        match self {
            Self::LineTooLong => "send a shorter message, or point to a file with a file part",
            Self::NotUtf8 => "write the line as UTF-8",
            Self::BadJson => "write one JSON object per line, ending in a newline",
            Self::ResponseWithoutCorrelation => {
                "name the request a response answers with correlatesTo (doorbell reply ID)"
            }
            Self::MissingField => "add the missing field (doorbell send fills every required field)",
            Self::BadField => "fix the field's type or value (see docs/PROTOCOL.md)",
            Self::Misaddressed => {
                "write to the inbox of the agent named in `to`; a response goes to the other party of its request"
            }
            Self::UnknownSender => "send as a known station or loop (doorbell agent list)",
            Self::BorrowedName => "built-in loop names and ids with ':' are reserved for the bridge",
            Self::IdReused => "use a fresh id; reuse an id only to retry the very same message",
            Self::UnknownRequest => "correlatesTo must name an accepted request (doorbell debts)",
            Self::NotAddressee => "only the addressee may send that state; the requester may only cancel or give input",
            Self::RequestClosed => "the request is already closed; send a new request",
            Self::BadTransition => "that state cannot follow the request's current state (see docs/PROTOCOL.md)",
            Self::ContextMismatch => "a response keeps its request's contextId; leave contextId out",
        }
    }
}

impl serde::Serialize for RefusalReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

impl<'de> serde::Deserialize<'de> for RefusalReason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let code = std::borrow::Cow::<'de, str>::deserialize(d)?;
        RefusalReason::from_code(&code)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown reason code '{code}'")))
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A refused line's reason and a short description of what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: RefusalReason,
    pub detail: String,
}

impl Refusal {
    pub fn new(reason: RefusalReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

/// The judge's final word on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// The same id and envelope as an accepted line: a safe retry, counted once.
    Duplicate,
    Refused(Refusal),
}

impl Verdict {
    #[must_use]
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Duplicate => "duplicate",
            Verdict::Refused(_) => "refused",
        }
    }
}
