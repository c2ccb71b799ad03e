//! Agent names and message ids: the only strings that ever become part of a path or a key.
//!
//! An agent name is `[a-z0-9][a-z0-9._-]{0,63}`, so `..`, `/` or NUL can never reach a file
//! name. An id is 1–128 of `[A-Za-z0-9._:-]`; ids with `:` are reserved for the built-in loops.

/// The judge's own senders. They are always known, never stations, and nobody else may use
/// their names.
pub const BUILTIN_LOOPS: [&str; 3] = ["bridge", "debt-loop", "report-loop"];

/// Whether `name` is a valid agent name.
#[must_use]
pub fn is_agent_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let Some(first) = bytes.first() else {
        return false;
    };
    bytes.len() <= 64
        && (first.is_ascii_lowercase() || first.is_ascii_digit())
        && bytes[1..].iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// Whether `id` is a valid message id (reserved or not).
#[must_use]
pub fn is_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Whether `id` belongs to the built-in loops (ULIDs never contain `:`).
#[must_use]
pub fn is_reserved_id(id: &str) -> bool {
    id.contains(':')
}

/// Whether `name` is one of the built-in loops.
#[must_use]
pub fn is_builtin_loop(name: &str) -> bool {
    BUILTIN_LOOPS.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names() {
        for good in ["web", "a", "0", "web-2", "a.b_c", &"a".repeat(64)] {
            assert!(is_agent_name(good), "{good}");
        }
        for bad in [
            "",
            "Web",
            "-web",
            ".web",
            "..",
            "a/b",
            "a\0",
            "wéb",
            &"a".repeat(65),
            "a b",
        ] {
            assert!(!is_agent_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn ids() {
        assert!(is_id("01JF3W8Q2M6V4Z9K7T1R5B0C8D"));
        assert!(is_id("ring:abc.1"));
        assert!(is_reserved_id("ring:abc.1"));
        assert!(!is_reserved_id("01JF3W8Q2M6V4Z9K7T1R5B0C8D"));
        assert!(is_id(&"x".repeat(128)));
        assert!(!is_id(&"x".repeat(129)));
        assert!(!is_id(""));
        assert!(!is_id("a b"));
        assert!(!is_id("a/b"));
    }
}
