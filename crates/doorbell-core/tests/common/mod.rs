//! What the core's tests share: envelopes built from a few fields, as JSON lines.
//! Each test file uses part of it.
#![allow(dead_code)]

use serde_json::{json, Map, Value};

/// An envelope under construction: `msg(kind, id, from, to)` fills the required fields,
/// `.set(..)`/`.unset(..)` change the rest, `.line()` writes the JSON text.
#[derive(Clone)]
pub struct Msg(pub Map<String, Value>);

pub fn msg(kind: &str, id: &str, from: &str, to: &str) -> Msg {
    let mut fields = Map::new();
    fields.insert("id".into(), id.into());
    fields.insert("from".into(), from.into());
    fields.insert("to".into(), to.into());
    fields.insert("kind".into(), kind.into());
    fields.insert("createdAt".into(), "2026-09-03T01:26:51Z".into());
    fields.insert(
        "message".into(),
        json!({"role": "agent", "parts": [{"type": "text", "text": format!("{kind} {id}")}]}),
    );
    Msg(fields)
}

pub fn request(id: &str, from: &str, to: &str) -> Msg {
    msg("request", id, from, to)
}

pub fn response(id: &str, from: &str, to: &str, re: &str, state: &str) -> Msg {
    msg("response", id, from, to)
        .set("correlatesTo", re)
        .set("state", state)
}

pub fn note(id: &str, from: &str, to: &str) -> Msg {
    msg("note", id, from, to)
}

impl Msg {
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.0.insert(key.into(), value.into());
        self
    }

    pub fn unset(mut self, key: &str) -> Self {
        self.0.remove(key);
        self
    }

    pub fn text(self, text: &str) -> Self {
        self.set(
            "message",
            json!({"parts": [{"type": "text", "text": text}]}),
        )
    }

    pub fn to(&self) -> String {
        self.0["to"].as_str().expect("to is a string").to_owned()
    }

    pub fn line(&self) -> String {
        serde_json::to_string(&self.0).expect("a map serialises")
    }
}
