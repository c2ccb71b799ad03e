//! A thread as a trace (seed 003: "measure total pipeline time, first message to last, and
//! identify where bottlenecks occur"): how long the thread took, how long each message came
//! after the one before, and who held the thread longest. The wait before a message is laid
//! at the door of whoever received the message before it: the thread was in their hands.
//!
//! Pure: fed the thread's messages with the judge's times, in the order they were accepted.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// One message of a thread, as the trace needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub id: String,
    pub from: String,
    pub to: String,
    /// When the judge accepted it.
    pub at: DateTime<Utc>,
}

/// How long one message came after the one before, and who held the thread meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Wait {
    pub id: String,
    pub from: String,
    pub to: String,
    pub since_last_secs: i64,
    /// Who had the thread before this message (the previous message's recipient).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// An agent's share of a thread's time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub agent: String,
    pub secs: i64,
    pub waits: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    pub messages: usize,
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
    pub total_secs: i64,
    pub steps: Vec<Wait>,
    /// Every holder, the longest first (ties by name).
    pub held: Vec<Held>,
}

impl Trace {
    /// Who held the thread longest, if anyone held it at all.
    #[must_use]
    pub fn longest(&self) -> Option<&Held> {
        self.held.first().filter(|h| h.secs > 0)
    }
}

/// The trace of a thread's messages, in the order they were accepted; `None` for none.
#[must_use]
pub fn trace(steps: &[Step]) -> Option<Trace> {
    let first = steps.first()?;
    let last = steps.last()?;
    let mut waits = Vec::with_capacity(steps.len());
    let mut held: Vec<Held> = Vec::new();
    let mut previous: Option<&Step> = None;
    // Who has the thread: the recipient of its last message from a station. A ring, an
    // escalation or a notice (from a built-in loop) hands nothing over: the debtor still has
    // the thread while the human is told.
    let mut has_it: Option<&String> = None;
    for step in steps {
        let (since, holder) = match previous {
            None => (0, None),
            Some(before) => ((step.at - before.at).num_seconds().max(0), has_it),
        };
        if let Some(holder) = holder {
            match held.iter_mut().find(|h| &h.agent == holder) {
                Some(h) => {
                    h.secs += since;
                    h.waits += 1;
                }
                None => held.push(Held {
                    agent: holder.clone(),
                    secs: since,
                    waits: 1,
                }),
            }
        }
        waits.push(Wait {
            id: step.id.clone(),
            from: step.from.clone(),
            to: step.to.clone(),
            since_last_secs: since,
            held_by: holder.cloned(),
        });
        previous = Some(step);
        if has_it.is_none() || !crate::name::is_builtin_loop(&step.from) {
            has_it = Some(&step.to);
        }
    }
    held.sort_by(|a, b| b.secs.cmp(&a.secs).then_with(|| a.agent.cmp(&b.agent)));
    Some(Trace {
        messages: steps.len(),
        first: first.at,
        last: last.at,
        total_secs: (last.at - first.at).num_seconds().max(0),
        steps: waits,
        held,
    })
}

/// A duration for a person: "45 s", "12 min", "2 h 5 min", "3 d 4 h".
#[must_use]
pub fn span(secs: i64) -> String {
    match secs {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min", s / 60),
        s if s < 86_400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        s => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: &str, from: &str, to: &str, secs: i64) -> Step {
        Step {
            id: id.into(),
            from: from.into(),
            to: to.into(),
            at: DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap(),
        }
    }

    /// Each holder's agent, time and waits, as the trace orders them.
    fn held_of(t: &Trace) -> Vec<(&str, i64, u32)> {
        t.held
            .iter()
            .map(|h| (h.agent.as_str(), h.secs, h.waits))
            .collect()
    }

    #[test]
    fn the_wait_before_a_message_is_held_by_the_previous_recipient() {
        let t = trace(&[
            step("r1", "design", "web", 0),
            step("a1", "web", "design", 600),
            step("a2", "design", "web", 660),
            step("a3", "web", "design", 4260),
        ])
        .unwrap();
        assert_eq!((t.messages, t.total_secs), (4, 4260));
        let since: Vec<i64> = t.steps.iter().map(|s| s.since_last_secs).collect();
        assert_eq!(since, [0, 600, 60, 3600]);
        assert_eq!(t.steps[0].held_by, None);
        assert_eq!(t.steps[1].held_by.as_deref(), Some("web"));
        assert_eq!(held_of(&t), [("web", 4200, 2), ("design", 60, 1)]);
        assert_eq!(t.longest().unwrap().agent, "web");
        assert_eq!(span(4200), "1 h 10 min");
    }

    /// Rings and an escalation hand nothing over: the wait until the answer is the debtor's,
    /// not the human's the escalation went to.
    #[test]
    fn a_ring_or_an_escalation_leaves_the_thread_with_the_debtor() {
        let t = trace(&[
            step("r1", "design", "web", 0),
            step("ring:1", "debt-loop", "web", 1800),
            step("escalation:1", "debt-loop", "human", 5400),
            step("a1", "web", "design", 90_000),
        ])
        .unwrap();
        let by: Vec<Option<&str>> = t.steps.iter().map(|s| s.held_by.as_deref()).collect();
        assert_eq!(by, [None, Some("web"), Some("web"), Some("web")]);
        assert_eq!(held_of(&t), [("web", 90_000, 3)]);
    }

    #[test]
    fn one_message_is_a_trace_of_no_time_and_none_is_none() {
        let t = trace(&[step("n1", "web", "design", 5)]).unwrap();
        assert_eq!((t.total_secs, t.held.len()), (0, 0));
        assert!(t.longest().is_none());
        assert!(trace(&[]).is_none());
    }
}
