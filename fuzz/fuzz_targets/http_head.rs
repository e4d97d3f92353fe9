//! The request-head scanner under the connection wrapper: however the bytes are split
//! into reads, it reaches the same verdict at the same place, and it never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plantstore::connection_limits::head::{HeadScanner, HeadVerdict};

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    bytes: Vec<u8>,
    /// Read sizes to split `bytes` into (0 counts as 1); the rest in one read.
    splits: Vec<u8>,
    /// After which read the server starts an answer (the next bytes are a new head).
    answered_after: Option<u8>,
}

/// Feeds `bytes` in reads of the given sizes; returns the first refusal and the byte
/// offset of the read it came in, or the scanner's final state.
fn scan(
    bytes: &[u8],
    sizes: &mut dyn Iterator<Item = usize>,
    answer_at: Option<usize>,
) -> (HeadVerdict, usize, bool, bool) {
    let mut scanner = HeadScanner::default();
    let mut at = 0;
    let mut reads = 0;
    while at < bytes.len() {
        let size = sizes
            .next()
            .unwrap_or(bytes.len())
            .max(1)
            .min(bytes.len() - at);
        let end = at + size;
        let verdict = scanner.feed(&bytes[at..end]);
        if verdict != HeadVerdict::WithinLimits {
            return (verdict, end, false, false);
        }
        if answer_at == Some(reads) {
            scanner.answered();
        }
        reads += 1;
        at = end;
    }
    (
        HeadVerdict::WithinLimits,
        at,
        scanner.in_head(),
        scanner.awaiting_head(),
    )
}

fuzz_target!(|input: Input| {
    let Input {
        bytes,
        splits,
        answered_after,
    } = input;
    if answered_after.is_some() {
        // Where the answer falls depends on the split, so only "no panic" holds here.
        let mut sizes = splits.iter().map(|&s| usize::from(s));
        let _ = scan(&bytes, &mut sizes, answered_after.map(usize::from));
        return;
    }
    let (whole, _, whole_in_head, whole_awaiting) = scan(&bytes, &mut std::iter::empty(), None);
    let mut one_by_one = std::iter::repeat(1);
    let (single, single_end, in_head, awaiting) = scan(&bytes, &mut one_by_one, None);
    assert_eq!(
        whole, single,
        "the verdict depends on how the bytes were split"
    );
    let mut sizes = splits.iter().map(|&s| usize::from(s));
    let (split, _, split_in_head, split_awaiting) = scan(&bytes, &mut sizes, None);
    assert_eq!(
        whole, split,
        "the verdict depends on how the bytes were split"
    );
    if whole == HeadVerdict::WithinLimits {
        assert_eq!((whole_in_head, whole_awaiting), (in_head, awaiting));
        assert_eq!((split_in_head, split_awaiting), (in_head, awaiting));
    } else {
        // A refusal needs more than the limit's worth of bytes.
        assert!(
            single_end > plantstore::connection_limits::head::MAX_HEAD_BYTES
                || bytes[..single_end].iter().filter(|&&b| b == b'\n').count()
                    > plantstore::connection_limits::head::MAX_HEADER_LINES
        );
    }
});
