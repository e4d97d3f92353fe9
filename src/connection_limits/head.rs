//! Where each HTTP/1 request head starts and ends, read from the bytes as they arrive, so a
//! head too long, too slow or of too many lines gets our answer, not hyper's bare status.

/// Longest request head accepted, far under hyper's buffer limit so the answer is ours.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header lines accepted: hyper's own limit, which it answers with a bare 431.
pub const MAX_HEADER_LINES: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadVerdict {
    WithinLimits,
    /// The request line alone is longer than `MAX_HEAD_BYTES`.
    UriTooLong,
    /// The head is longer than `MAX_HEAD_BYTES` or has more than `MAX_HEADER_LINES` lines.
    HeadTooLarge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// Between requests: no byte of the next head yet (blank lines before it are skipped).
    #[default]
    Idle,
    Head,
    /// The head is complete; what follows is its body until the server answers.
    Body,
    /// HTTP/2 (prior knowledge): its frames are not heads, so nothing is watched.
    Off,
}

/// Follows one connection's heads. Lines end in LF, with or without CR before it, as
/// hyper's parser takes them; a blank line ends the head.
#[derive(Debug, Default)]
pub struct HeadScanner {
    phase: Phase,
    head_bytes: usize,
    lines_done: usize,
    line_len: usize,
    first_head_done: bool,
    /// The start of the first request line, to spot the HTTP/2 preface.
    request_line: [u8; PREFACE.len()],
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0";

impl HeadScanner {
    /// True while part of a head has arrived and its end has not.
    pub fn in_head(&self) -> bool {
        self.phase == Phase::Head
    }

    /// True while the next head's bytes are awaited or arriving (the header deadline runs).
    pub fn awaiting_head(&self) -> bool {
        matches!(self.phase, Phase::Idle | Phase::Head)
    }

    /// The server started answering: the client's next bytes are a new head (no operation
    /// reads a body, so no mid-body `100 Continue`: `no_operation_reads_a_request_body`).
    pub fn answered(&mut self) {
        if self.phase == Phase::Body {
            self.phase = Phase::Idle;
        }
    }

    /// Takes bytes just read; once it returns other than `WithinLimits`, answer and close.
    pub fn feed(&mut self, bytes: &[u8]) -> HeadVerdict {
        for &byte in bytes {
            match self.phase {
                Phase::Body | Phase::Off => return HeadVerdict::WithinLimits,
                Phase::Idle if matches!(byte, b'\r' | b'\n') => continue,
                Phase::Idle => self.start_head(),
                Phase::Head => {}
            }
            if let Some(verdict) = self.take(byte) {
                return verdict;
            }
        }
        HeadVerdict::WithinLimits
    }

    fn start_head(&mut self) {
        self.phase = Phase::Head;
        self.head_bytes = 0;
        self.lines_done = 0;
        self.line_len = 0;
    }

    /// One byte of a head; `Some` when the head is refused.
    fn take(&mut self, byte: u8) -> Option<HeadVerdict> {
        self.head_bytes += 1;
        if self.head_bytes > MAX_HEAD_BYTES {
            return Some(if self.lines_done == 0 {
                HeadVerdict::UriTooLong
            } else {
                HeadVerdict::HeadTooLarge
            });
        }
        match byte {
            b'\n' => self.end_line(),
            b'\r' => {}
            _ => {
                if self.line_len == 0 && self.lines_done > MAX_HEADER_LINES {
                    return Some(HeadVerdict::HeadTooLarge);
                }
                if self.lines_done == 0 && self.line_len < PREFACE.len() {
                    self.request_line[self.line_len] = byte;
                }
                self.line_len += 1;
            }
        }
        None
    }

    fn end_line(&mut self) {
        if self.line_len == 0 {
            self.phase = Phase::Body;
            self.first_head_done = true;
            return;
        }
        if self.lines_done == 0 && !self.first_head_done && self.request_line == *PREFACE {
            self.phase = Phase::Off;
            return;
        }
        self.lines_done += 1;
        self.line_len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_with(headers: usize) -> Vec<u8> {
        let mut head = b"DELETE /plants/1 HTTP/1.1\r\n".to_vec();
        for n in 0..headers {
            head.extend_from_slice(format!("x-h{n}: v\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        head
    }

    #[test]
    fn a_whole_head_byte_by_byte_then_its_body_then_the_next_head() {
        let mut scanner = HeadScanner::default();
        assert!(scanner.awaiting_head() && !scanner.in_head());
        for byte in head_with(3) {
            assert_eq!(scanner.feed(&[byte]), HeadVerdict::WithinLimits);
        }
        assert!(!scanner.awaiting_head());
        assert_eq!(
            scanner.feed(&[b'x'; MAX_HEAD_BYTES * 2]),
            HeadVerdict::WithinLimits
        );
        scanner.answered();
        assert!(scanner.awaiting_head() && !scanner.in_head());
        assert_eq!(
            scanner.feed(b"\r\nGET / HTTP/1.1\r\n"),
            HeadVerdict::WithinLimits
        );
        assert!(scanner.in_head());
    }

    #[test]
    fn hyper_s_header_count_is_the_limit() {
        let mut scanner = HeadScanner::default();
        assert_eq!(
            scanner.feed(&head_with(MAX_HEADER_LINES)),
            HeadVerdict::WithinLimits
        );
        assert!(!scanner.awaiting_head());
        let mut scanner = HeadScanner::default();
        assert_eq!(
            scanner.feed(&head_with(MAX_HEADER_LINES + 1)),
            HeadVerdict::HeadTooLarge
        );
    }

    #[test]
    fn a_long_request_line_is_414_and_a_long_header_431() {
        let mut scanner = HeadScanner::default();
        let long_path = format!("DELETE /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(scanner.feed(long_path.as_bytes()), HeadVerdict::UriTooLong);
        let mut scanner = HeadScanner::default();
        let long_header = format!(
            "GET / HTTP/1.1\r\nx: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(
            scanner.feed(long_header.as_bytes()),
            HeadVerdict::HeadTooLarge
        );
    }

    #[test]
    fn http2_prior_knowledge_is_left_alone() {
        let mut scanner = HeadScanner::default();
        assert_eq!(
            scanner.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            HeadVerdict::WithinLimits
        );
        assert_eq!(
            scanner.feed(&[0; MAX_HEAD_BYTES * 2]),
            HeadVerdict::WithinLimits
        );
        assert!(!scanner.awaiting_head());
    }
}
