//! Arbitrary bytes as an inbox: read by the line reader and judged line by line against a
//! growing ledger. The body is `doorbell_store::fuzzing::read_and_judge`, which the stable
//! smoke test (`crates/doorbell-store/tests/fuzz_smoke.rs`) runs too.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    doorbell_store::fuzzing::read_and_judge(data);
});
