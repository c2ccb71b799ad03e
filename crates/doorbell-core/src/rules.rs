//! The fifteen refusal rules, in the order in which the first that applies names a line's
//! refusal (DESIGN §3): this file is that order.
//!
//! 1. `line-too-long`
//! 2. `not-utf8`
//! 3. `bad-json`
//! 4. `response-without-correlation`
//! 5. `missing-field`
//! 6. `bad-field`
//! 7. `misaddressed`: the inbox's owner, then the other party of the request
//! 8. `unknown-sender`, and a loop's `bad-field` (a loop that sends what it may not)
//! 9. `borrowed-name`
//! 10. `id-reused`
//! 11. `unknown-request`
//! 12. `not-addressee`
//! 13. `request-closed`
//! 14. `bad-transition`
//! 15. `context-mismatch`
//!
//! Rules 1 to 7's first half need only the line and the inbox's owner ([`judge_stateless`]:
//! what `doorbell check` and a sender's pre-check apply); the rest need the registry and the
//! ledger ([`stateful`], through [`Ledger::judge`]). Parsing the envelope (rules 3 to 6) lives
//! in `judge.rs`, the ledger's state in `ledger.rs`; here is only their order.

use crate::judge::{check_fields, loop_refusal, parse_json, Limits, Registry};
use crate::ledger::{transition_allowed, Ledger, Side};
use crate::name::{is_builtin_loop, is_reserved_id};
use crate::verdict::{Refusal, RefusalReason as R, Verdict};
use crate::{Envelope, Kind, State};

/// Judge one line (without its `\n`) found in `owner`'s inbox.
///
/// `own_line` tells whether the judge itself wrote a line with this id (it journals every id
/// it writes); only such lines may use a built-in loop's name or a reserved id.
pub fn judge_line<'a>(
    line: &'a [u8],
    owner: &str,
    limits: &Limits,
    registry: &Registry,
    ledger: &Ledger,
    own_line: &dyn Fn(&str) -> bool,
) -> (Verdict, Option<Envelope<'a>>) {
    let stateless = judge_stateless(line, Some(owner), limits);
    judge_parsed(stateless, owner, registry, ledger, own_line)
}

/// [`judge_line`] given the line's stateless half (`judge_stateless` with the inbox's owner),
/// worked out beforehand, perhaps on another thread: the rules that need the registry and
/// the ledger.
pub fn judge_parsed<'a>(
    stateless: Result<Envelope<'a>, Refusal>,
    owner: &str,
    registry: &Registry,
    ledger: &Ledger,
    own_line: &dyn Fn(&str) -> bool,
) -> (Verdict, Option<Envelope<'a>>) {
    match stateless {
        Err(refusal) => (Verdict::Refused(refusal), None),
        Ok(envelope) => {
            let verdict = ledger.judge(&envelope, owner, registry, own_line);
            (verdict, Some(envelope))
        }
    }
}

/// The rules that need nothing but the line and, when known, the inbox's owner:
/// `line-too-long` to `misaddressed` (the owner part of it).
pub fn judge_stateless<'a>(
    line: &'a [u8],
    owner: Option<&str>,
    limits: &Limits,
) -> Result<Envelope<'a>, Refusal> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // 1. line-too-long
    if line.len() > limits.max_line_bytes {
        return Err(Refusal::new(
            R::LineTooLong,
            format!(
                "{} bytes, the limit is {}",
                line.len(),
                limits.max_line_bytes
            ),
        ));
    }
    // 2. not-utf8
    let text = std::str::from_utf8(line).map_err(|e| {
        Refusal::new(
            R::NotUtf8,
            format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )
    })?;
    // 3. bad-json
    let raw = parse_json(text)?;
    // 4.–6. response-without-correlation, missing-field, bad-field
    let envelope = check_fields(raw)?;
    // 7. misaddressed, its first half: the inbox's owner.
    if let Some(owner) = owner {
        if envelope.to != owner {
            return Err(Refusal::new(
                R::Misaddressed,
                format!(
                    "'to' is '{}' but this is the inbox of '{owner}'",
                    envelope.to
                ),
            ));
        }
    }
    Ok(envelope)
}

#[allow(clippy::too_many_lines)] // the precedence order reads best as one list
pub(crate) fn stateful(
    ledger: &Ledger,
    envelope: &Envelope<'_>,
    owner: &str,
    registry: &Registry,
    own_line: &dyn Fn(&str) -> bool,
) -> Result<Verdict, Refusal> {
    let from = &*envelope.from;
    let request = envelope
        .correlates_to
        .as_deref()
        .and_then(|id| ledger.find_request(id));
    let request = request.as_deref();
    // 7. misaddressed, its second half: the other party of the request. (The first half, the
    // inbox's owner, is a stateless rule: `judge_stateless` checked it.)
    debug_assert_eq!(envelope.to, owner, "the stateless rules run first");
    if let (Kind::Response, Some(request)) = (envelope.kind, request) {
        // A loop's request is answered to its owner, who also speaks for it.
        let requester = request.requester_station();
        let expected = if from == request.addressee {
            Some(requester)
        } else if from == request.requester || from == requester {
            Some(request.addressee.as_str())
        } else {
            None
        };
        let fine = match expected {
            Some(expected) => envelope.to == expected,
            None => envelope.to == requester || envelope.to == request.addressee,
        };
        if !fine {
            return Err(Refusal::new(
                R::Misaddressed,
                format!(
                    "a response to {} from '{from}' goes to '{}', not '{}'",
                    request.id,
                    expected.unwrap_or(requester),
                    envelope.to
                ),
            ));
        }
    }
    // 8. unknown-sender
    if !registry.knows(from) {
        return Err(Refusal::new(
            R::UnknownSender,
            format!("'{from}' is not a known station or loop"),
        ));
    }
    if let Some(why) = loop_refusal(registry, from, envelope.kind) {
        return Err(Refusal::new(R::BadField, why));
    }
    // 9. borrowed-name
    let reserved = is_builtin_loop(from) || is_reserved_id(&envelope.id);
    if reserved && !own_line(&envelope.id) {
        return Err(Refusal::new(
            R::BorrowedName,
            if is_builtin_loop(from) {
                format!("'{from}' is a built-in loop of the bridge")
            } else {
                format!(
                    "id '{}' contains ':', which is reserved for the bridge",
                    envelope.id
                )
            },
        ));
    }
    // 10. id-reused (or a duplicate: a safe retry)
    if let Some(fingerprint) = ledger.find_claim(&envelope.id) {
        return if fingerprint == envelope.fingerprint {
            Ok(Verdict::Duplicate)
        } else {
            Err(Refusal::new(
                R::IdReused,
                format!("id '{}' was already used by another message", envelope.id),
            ))
        };
    }
    let Some(correlates_to) = envelope.correlates_to.as_deref() else {
        return Ok(Verdict::Accepted);
    };
    // 11. unknown-request
    let Some(request) = request else {
        return Err(Refusal::new(
            R::UnknownRequest,
            format!("'correlatesTo' names '{correlates_to}', which is no accepted request"),
        ));
    };
    if envelope.kind != Kind::Response {
        return Ok(Verdict::Accepted);
    }
    let state = envelope.state.expect("a response always has a state");
    // 12. not-addressee
    let side = match request.side_of(from, state) {
        None => {
            return Err(Refusal::new(
                R::NotAddressee,
                format!(
                    "'{from}' is not a party of {} ({} asked {})",
                    request.id, request.requester, request.addressee
                ),
            ))
        }
        Some(Side::Requester) if !matches!(state, State::Working | State::Canceled) => {
            return Err(Refusal::new(
                R::NotAddressee,
                format!(
                    "only the addressee '{}' may send {state}; the requester may cancel or give input",
                    request.addressee
                ),
            ))
        }
        Some(side) => side,
    };
    // 13. request-closed
    if request.state.is_terminal() {
        return Err(Refusal::new(
            R::RequestClosed,
            format!("{} is already {}", request.id, request.state),
        ));
    }
    // 14. bad-transition
    if !transition_allowed(request.state, side, state) {
        let who = match side {
            Side::Addressee => "the addressee",
            Side::Requester => "the requester",
        };
        return Err(Refusal::new(
            R::BadTransition,
            format!(
                "{who} cannot move {} from {} to {state}",
                request.id, request.state
            ),
        ));
    }
    // 15. context-mismatch
    if let Some(context) = envelope.context_id.as_deref() {
        if context != request.context_id {
            return Err(Refusal::new(
                R::ContextMismatch,
                format!(
                    "contextId '{context}' but {} is in '{}'",
                    request.id, request.context_id
                ),
            ));
        }
    }
    Ok(Verdict::Accepted)
}
