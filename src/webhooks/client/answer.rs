//! A receiver's answers read off a connection's bytes: the status, `Retry-After`, whether
//! the connection may carry more, and the body passed over (up to a limit).

use std::time::Duration;

use http::StatusCode;
use httparse::Status;

/// The most of an answer's head read; past it the answer is not HTTP we take.
const HEAD_LIMIT: usize = 16 * 1024;
/// The most of an answer's body read; past it the connection is not reused.
const BODY_LIMIT: usize = 64 * 1024;
/// The most bytes one unfinished answer may take (chunk framing and trailers included):
/// past it the receiver is sending something other than an answer we can finish.
const WIRE_LIMIT: usize = 1024 * 1024;
/// Headers an answer may carry; hyper's client takes as many.
const HEADERS: usize = 100;

/// What a receiver answered, as far as delivery cares.
#[derive(Debug)]
pub(in crate::webhooks) struct Answer {
    pub(in crate::webhooks) status: StatusCode,
    /// `Retry-After` in seconds; the HTTP-date form is taken as no advice.
    pub(in crate::webhooks) retry_after: Option<Duration>,
}

/// What the bytes read so far hold.
#[derive(Debug)]
pub(super) enum Read {
    /// Not yet a whole answer.
    Partial,
    /// An interim (1xx) answer, `used` bytes long; the real one follows.
    Interim { used: usize },
    /// A whole answer, `used` bytes long. When `last`, the connection carries no more: the
    /// receiver said so, or the body runs to the connection's end or past the limit.
    Whole {
        answer: Answer,
        used: usize,
        last: bool,
    },
    /// Not an answer this client can read; the connection is done with.
    Bad(String),
}

/// Reads the first answer in `bytes`.
pub(super) fn read(bytes: &[u8]) -> Read {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(bytes) {
        Ok(Status::Complete(head)) => head,
        Ok(Status::Partial) if bytes.len() > HEAD_LIMIT => {
            return Read::Bad("the receiver's answer has too long a head".into());
        }
        Ok(Status::Partial) => return Read::Partial,
        Err(err) => return Read::Bad(format!("the receiver's answer is not HTTP: {err}")),
    };
    let code = response.code.unwrap_or_default();
    let Ok(status) = StatusCode::from_u16(code) else {
        return Read::Bad(format!("the receiver answered status {code}"));
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Read::Bad("the receiver switched protocols".into());
    }
    if status.is_informational() {
        return Read::Interim { used: head };
    }
    let framing = match Framing::of(response.version, response.headers) {
        Ok(framing) => framing,
        Err(err) => return Read::Bad(err),
    };
    let answer = Answer {
        status,
        retry_after: framing.retry_after,
    };
    let whole = |body: usize, last: bool| Read::Whole {
        answer,
        used: head + body,
        last,
    };
    let rest = &bytes[head..];
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return whole(0, framing.close);
    }
    match framing.body {
        Body::Chunked => match chunked(rest) {
            Ok(Some(body)) => whole(body, framing.close),
            Ok(None) if rest.len() > WIRE_LIMIT => {
                Read::Bad("the receiver's chunked answer does not end".into())
            }
            Ok(None) => Read::Partial,
            Err(Chunks::TooLong) => whole(0, true),
            Err(Chunks::Bad) => Read::Bad("the receiver's chunked answer is malformed".into()),
        },
        Body::Length(length) if length > BODY_LIMIT => whole(0, true),
        Body::Length(length) if rest.len() >= length => whole(length, framing.close),
        Body::Length(_) => Read::Partial,
        // The status is known; the body, which nothing reads, ends with the connection.
        Body::ToTheEnd => whole(0, true),
    }
}

enum Body {
    Length(usize),
    Chunked,
    ToTheEnd,
}

/// How an answer's body is delimited, and the headers delivery reads.
struct Framing {
    body: Body,
    close: bool,
    retry_after: Option<Duration>,
}

impl Framing {
    fn of(version: Option<u8>, headers: &[httparse::Header<'_>]) -> Result<Self, String> {
        // HTTP/1.0 closes unless it says otherwise.
        let mut close = version != Some(1);
        let mut length = None;
        let mut encoded = None;
        let mut retry_after = None;
        for header in headers {
            let value = String::from_utf8_lossy(header.value);
            let value = value.trim();
            let name = header.name;
            if name.eq_ignore_ascii_case("content-length") {
                let parsed = value.parse::<usize>().ok();
                if parsed.is_none() || length.is_some_and(|known| Some(known) != parsed) {
                    return Err("the receiver's answer has a bad Content-Length".into());
                }
                length = parsed;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                let last = value.rsplit(',').next().unwrap_or_default().trim();
                encoded = Some(last.eq_ignore_ascii_case("chunked"));
            } else if name.eq_ignore_ascii_case("connection") {
                for token in value.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case("keep-alive") && version == Some(0) {
                        close = false;
                    }
                }
            } else if name.eq_ignore_ascii_case("retry-after") {
                retry_after = value.parse().ok().map(Duration::from_secs);
            }
        }
        // Transfer-Encoding wins over Content-Length (RFC 9112, 6.3), and a message with
        // both, or chunked from HTTP/1.0, may be framed otherwise by whatever is between
        // us and the receiver: the connection carries no answer after it.
        if encoded.is_some() && (length.is_some() || version == Some(0)) {
            close = true;
        }
        let body = match (encoded, length) {
            (Some(true), _) => Body::Chunked,
            (Some(false), _) | (None, None) => Body::ToTheEnd,
            (None, Some(length)) => Body::Length(length),
        };
        Ok(Self {
            body,
            close,
            retry_after,
        })
    }
}

enum Chunks {
    TooLong,
    Bad,
}

/// The length of a chunked body with its trailers, once all of it is in `bytes`.
fn chunked(bytes: &[u8]) -> Result<Option<usize>, Chunks> {
    let mut at = 0;
    let mut body: u64 = 0;
    loop {
        let (used, size) = match httparse::parse_chunk_size(&bytes[at..]) {
            Ok(Status::Complete(found)) => found,
            Ok(Status::Partial) => return Ok(None),
            Err(_) => return Err(Chunks::Bad),
        };
        at += used;
        if size == 0 {
            break;
        }
        body += size;
        if body > BODY_LIMIT as u64 {
            return Err(Chunks::TooLong);
        }
        // Under the limit, so it fits a usize.
        let end = at + size as usize;
        match bytes.get(end..end + 2) {
            None => return Ok(None),
            Some(b"\r\n") => at = end + 2,
            Some(_) => return Err(Chunks::Bad),
        }
    }
    // Trailer lines, then an empty one.
    loop {
        let rest = &bytes[at..];
        let Some(line) = rest.windows(2).position(|pair| pair == b"\r\n") else {
            return if rest.len() > HEAD_LIMIT {
                Err(Chunks::Bad)
            } else {
                Ok(None)
            };
        };
        at += line + 2;
        if line == 0 {
            return Ok(Some(at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> (u16, usize, bool, Option<Duration>) {
        match read(bytes) {
            Read::Whole { answer, used, last } => {
                (answer.status.as_u16(), used, last, answer.retry_after)
            }
            other => panic!("not whole: {other:?}"),
        }
    }

    #[test]
    fn answers_are_read_to_their_end_and_no_further() {
        let next = b"HTTP/1.1 204 No Content\r\n\r\n";
        let mut bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".to_vec();
        bytes.extend_from_slice(next);
        assert_eq!(whole(&bytes), (200, bytes.len() - next.len(), false, None));
        assert_eq!(whole(next), (204, next.len(), false, None));

        let chunked = b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\nx-trailer: 1\r\n\r\n";
        assert_eq!(
            whole(chunked),
            (503, chunked.len(), false, Some(Duration::from_secs(7)))
        );
        for cut in 1..chunked.len() {
            assert!(
                matches!(read(&chunked[..cut]), Read::Partial),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_connection_the_answer_ends_is_not_reused() {
        let closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 0\r\n\r\n";
        assert!(whole(closing).2);
        assert!(whole(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n").2);
        assert!(
            !whole(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n").2
        );
        assert!(whole(b"HTTP/1.1 200 OK\r\n\r\nuntil the end").2);
        let both =
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(whole(both), (200, both.len(), true, None));
        let long = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
            BODY_LIMIT + 1
        );
        assert!(whole(long.as_bytes()).2);
    }

    #[test]
    fn what_is_not_an_answer_is_refused() {
        assert!(matches!(
            read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"),
            Read::Interim { used: 25 }
        ));
        for bad in [
            &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        ] {
            assert!(matches!(read(bad), Read::Bad(_)), "{bad:?}");
        }
        let mut endless = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n".to_vec();
        assert!(matches!(read(&endless), Read::Partial));
        while endless.len() <= WIRE_LIMIT + 1024 {
            endless.extend_from_slice(b"x-trailer: more\r\n");
        }
        assert!(matches!(read(&endless), Read::Bad(_)));
    }
}
