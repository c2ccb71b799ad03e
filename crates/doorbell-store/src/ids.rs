//! Which ids the index may hold: a Bloom filter a long-running judge keeps so that a line
//! with a new id (nearly every line) is judged without asking the index.
//!
//! It only ever says "certainly not" or "perhaps". It holds every id of the index's
//! `messages` as of a read begun after it was made, plus every id claimed since it was made
//! (a claim is saved only after it is made, so nothing saved escapes both). Until the read
//! is done it is not ready and every lookup goes to the index, as without it. A filter that
//! fills past what it was sized for still never says "certainly not" of an id it holds; it
//! only says "perhaps" more often.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bits per id it is sized for: about 1% of new ids still ask the index.
const BITS_PER_ID: u64 = 10;
/// Bits set per id.
const HASHES: u64 = 7;

#[derive(Debug)]
pub struct IdFilter {
    words: Vec<AtomicU64>,
    /// The number of bits, a power of two, minus one.
    mask: u64,
    ready: AtomicBool,
}

impl IdFilter {
    /// A filter for about `ids` ids, not ready.
    #[must_use]
    pub fn with_capacity(ids: u64) -> IdFilter {
        let bits = (ids.max(1024) * BITS_PER_ID).next_power_of_two();
        let words = usize::try_from(bits / 64).unwrap_or(usize::MAX);
        IdFilter {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            mask: bits - 1,
            ready: AtomicBool::new(false),
        }
    }

    fn bits(&self, id: &str) -> impl Iterator<Item = u64> + '_ {
        let hash = xxhash_rust::xxh3::xxh3_128(id.as_bytes());
        // Two halves of one hash make the seven (Kirsch and Mitzenmacher).
        #[allow(clippy::cast_possible_truncation)]
        let (first, second) = (hash as u64, (hash >> 64) as u64 | 1);
        (0..HASHES).map(move |i| first.wrapping_add(i.wrapping_mul(second)) & self.mask)
    }

    pub fn insert(&self, id: &str) {
        for bit in self.bits(id) {
            let word = usize::try_from(bit / 64).unwrap_or(0);
            self.words[word].fetch_or(1 << (bit % 64), Ordering::Relaxed);
        }
    }

    /// False only when `id` was never inserted (and the filter is ready).
    #[must_use]
    pub fn may_hold(&self, id: &str) -> bool {
        if !self.ready.load(Ordering::Acquire) {
            return true;
        }
        self.bits(id).all(|bit| {
            let word = usize::try_from(bit / 64).unwrap_or(0);
            self.words[word].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0
        })
    }

    /// Every id of the index is in: from now on "certainly not" can be said.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// The memory it takes, in bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inserted_id_is_always_perhaps_and_few_new_ones_are() {
        let filter = IdFilter::with_capacity(20_000);
        let id = |n: u32| format!("01JZ{n:022}");
        for n in 0..20_000 {
            filter.insert(&id(n));
        }
        // Not ready: everything is "perhaps".
        assert!(filter.may_hold(&id(1_000_000)));
        filter.set_ready();
        assert!((0..20_000).all(|n| filter.may_hold(&id(n))));
        let false_positives = (1_000_000..1_100_000)
            .filter(|n| filter.may_hold(&id(*n)))
            .count();
        // Sized for 20,000 at 10 bits each (rounded up to a power of two): well under 2%.
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
        // Filled far past its size it says "perhaps" more, never "certainly not" wrongly.
        for n in 20_000..200_000 {
            filter.insert(&id(n));
        }
        assert!((0..200_000).all(|n| filter.may_hold(&id(n))));
    }
}
