//! Agent names and message ids: the only strings that ever become part of a path or a key.
//!
//! An agent name is `[a-z0-9][a-z0-9._-]{0,63}`, so `..`, `/` or NUL can never reach a file
//! name. An id is 1–128 of `[A-Za-z0-9._:-]`; ids with `:` are reserved for the built-in loops.

/// The judge's own senders. They are always known, never stations, and nobody else may use
/// their names.
pub const BUILTIN_LOOPS: [&str; 3] = ["bridge", "debt-loop", "report-loop"];

/// Which bytes `|b| allowed` allows, as a table looked up at one load a byte: names and ids
/// are checked on every line judged.
macro_rules! byte_table {
    (|$b:ident| $allowed:expr) => {{
        let mut table = [false; 256];
        let mut at = 0;
        while at < 256 {
            #[allow(clippy::cast_possible_truncation)]
            let $b = at as u8;
            table[at] = $allowed;
            at += 1;
        }
        table
    }};
}

/// Whether `name` is a valid agent name.
#[must_use]
pub fn is_agent_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let Some(first) = bytes.first() else {
        return false;
    };
    bytes.len() <= 64
        && (first.is_ascii_lowercase() || first.is_ascii_digit())
        && bytes[1..].iter().all(|&b| NAME_BYTES[usize::from(b)])
}

/// The bytes an agent's name goes on with: a-z 0-9 . _ -
static NAME_BYTES: [bool; 256] = byte_table!(|b| b.is_ascii_lowercase()
    || b.is_ascii_digit()
    || matches!(b, b'.' | b'_' | b'-'));

/// Whether `id` is a valid message id (reserved or not).
#[must_use]
pub fn is_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| ID_BYTES[usize::from(b)])
}

/// The bytes an id is made of: A-Z a-z 0-9 . _ : -
static ID_BYTES: [bool; 256] =
    byte_table!(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));

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

    /// Every byte, one at a time: the tables allow exactly the bytes the grammar names, and
    /// nothing past ASCII (a UTF-8 sequence's bytes included).
    #[test]
    fn names_and_ids_allow_exactly_their_bytes() {
        let name_rest = "abcdefghijklmnopqrstuvwxyz0123456789._-";
        let id = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-";
        for b in 0..=255u8 {
            let one = [b];
            let text = std::str::from_utf8(&one).ok();
            let allowed = |set: &str| set.as_bytes().contains(&b);
            assert_eq!(
                text.is_some_and(|t| is_id(&format!("x{t}"))),
                allowed(id),
                "id byte {b}"
            );
            assert_eq!(
                text.is_some_and(|t| is_agent_name(&format!("x{t}"))),
                allowed(name_rest),
                "name byte {b}"
            );
        }
        assert!(!is_id("é") && !is_agent_name("aé"), "not ASCII");
    }

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
