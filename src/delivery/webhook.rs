//! A webhook endpoint: one POST per attempt, signed with the endpoint's secrets as they are
//! when it is sent, and what the answer means.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use plantstore_store::destinations::Event;
use reqwest::{
    Client, StatusCode, Url,
    header::{self, HeaderMap},
};
use tokio::sync::watch;

use super::{
    attempt::Attempt,
    event::{body, event_id},
    signature::Signer,
};
use crate::{config::DeliveryConfig, telemetry::one_line};

/// Most of an answer's body read: enough to reuse the connection after a short reply.
const BODY_READ: usize = 64 * 1024;
/// How long an unused connection to a receiver is kept: receivers close theirs after a few
/// seconds (Node.js after 5, gunicorn after 2), and a request sent as one closes fails.
const IDLE: Duration = Duration::from_secs(2);

/// One endpoint's URL, taken apart once, and an HTTP client of its own for its keep-alives.
pub(super) struct WebhookClient {
    client: Client,
    /// As stored, less any fragment. Credentials in it (`https://user:pass@…`) are taken
    /// out of each request by reqwest and sent as HTTP Basic, as browsers and curl do.
    url: Url,
    /// The secrets as the lease now has them: a rotation changes them mid-delivery.
    signer: watch::Receiver<Arc<Signer>>,
}

impl WebhookClient {
    /// `http2`: HTTP/2 with prior knowledge (on https, ALPN picks it). Errors omit the URL.
    pub(super) fn new(
        text: &str,
        http2: bool,
        config: &DeliveryConfig,
        signer: watch::Receiver<Arc<Signer>>,
    ) -> Result<Self, String> {
        let timeout = config.webhook_timeout;
        let unusable = |what: &str| format!("the endpoint's stored URL cannot be used: {what}");
        let mut url = Url::parse(text).map_err(|err| unusable(&err.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(unusable("not http or https with a host"));
        }
        url.set_fragment(None);
        // HTTP(S)_PROXY and NO_PROXY are read from the environment, as for the JWKS.
        let mut client = Client::builder()
            .user_agent(USER_AGENT)
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .connect_timeout(timeout)
            .timeout(timeout)
            .pool_idle_timeout(IDLE);
        if http2 {
            client = client.http2_prior_knowledge();
        }
        let client = client
            .build()
            .map_err(|err| format!("cannot make an HTTP client: {}", describe(err)))?;
        Ok(Self {
            client,
            url,
            signer,
        })
    }

    /// Signs (so a retry after a rotation has the new secret) and POSTs `event`. A redirect
    /// is a failure to show, not a place to send signed events; no error names the URL.
    pub(super) async fn post(&self, event: &Event) -> Attempt {
        // Only in a test build: a fault caused on purpose, to show that a panic in one
        // destination's delivery is caught and shown (tests/api/webhooks/delivery.rs).
        #[cfg(feature = "fault-injection")]
        if self.url.path() == "/panic-on-purpose" {
            panic!("a fault injected on purpose");
        }
        let id = event_id(event);
        let body = body(event);
        let timestamp = Utc::now().timestamp();
        let signer = Arc::clone(&self.signer.borrow());
        let signature = match signer.header(&id, timestamp, body.as_bytes()) {
            Ok(signature) => signature,
            Err(error) => return Attempt::failed(error),
        };
        let request = self
            .client
            .post(self.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp)
            .header("webhook-signature", signature)
            .body(body);
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(err) => return Attempt::failed(describe(err)),
        };
        let status = response.status();
        let retry_after = retry_after(response.headers(), Utc::now());
        // The answer is its status: the body is read only so that the connection can
        // carry the next request, and a body that fails or runs long just closes it.
        let mut read = 0;
        while read <= BODY_READ {
            match response.chunk().await {
                Ok(Some(chunk)) => read += chunk.len(),
                Ok(None) | Err(_) => break,
            }
        }
        match status {
            status if status.is_success() => Attempt::Delivered,
            StatusCode::GONE => Attempt::Gone,
            status => Attempt::Failed {
                error: format!("the receiver answered {status}"),
                retry_after,
            },
        }
    }
}

/// A failed request told so an operator can act, without the URL (it may hold credentials).
fn describe(err: reqwest::Error) -> String {
    let err = err.without_url();
    if err.is_timeout() {
        return if err.is_connect() {
            "cannot connect within the timeout".into()
        } else {
            "no answer within the timeout".into()
        };
    }
    // reqwest's own line is general ("error sending request"); the cause is at the end
    // of its chain ("Connection refused (os error 111)").
    one_line(&err)
}

/// `Retry-After` in seconds or any HTTP date form RFC 9110 accepts, as a wait from `now`.
fn retry_after(headers: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let text = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now.into()).unwrap_or_default())
}

const USER_AGENT: &str = concat!("plantstore/", env!("CARGO_PKG_VERSION"));

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn config() -> DeliveryConfig {
        crate::config::Config::defaults().serve.webhooks
    }

    fn signer() -> watch::Receiver<Arc<Signer>> {
        let signing = plantstore_store::destinations::Signing {
            secret: crate::delivery::signature::new_secret(),
            previous_secret: None,
        };
        watch::channel(Arc::new(Signer::new(&signing))).1
    }

    #[test]
    fn credentials_leave_the_url_for_a_basic_header() {
        let target = WebhookClient::new(
            "https://user:p%40ss@hooks.example:8443/in?x=1#frag",
            false,
            &config(),
            signer(),
        )
        .expect("a usable URL");
        let request = target
            .client
            .post(target.url.clone())
            .build()
            .expect("a request");
        assert_eq!(request.url().as_str(), "https://hooks.example:8443/in?x=1");
    }

    #[test]
    fn an_unusable_url_is_explained_without_the_url() {
        let err = WebhookClient::new("ftp://secret@example.com/x", false, &config(), signer())
            .err()
            .expect("ftp refused");
        assert!(
            err.contains("not http or https") && !err.contains("secret"),
            "{err}"
        );
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_as_a_date() {
        let now = DateTime::parse_from_rfc3339("2026-11-25T10:00:00Z")
            .expect("a time")
            .with_timezone(&Utc);
        let after = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static(value));
            retry_after(&headers, now)
        };
        assert_eq!(after("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            after("Wed, 25 Nov 2026 10:01:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(after("Wed, 25 Nov 2026 09:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(after("soon"), None);
    }
}
