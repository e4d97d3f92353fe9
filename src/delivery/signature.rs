//! Standard Webhooks signing: endpoint secrets and the `webhook-signature` header.

use base64::{Engine, engine::general_purpose::STANDARD};
use hmac::{Hmac, KeyInit, Mac};
use plantstore_store::destinations::Signing;
use rand::RngCore;
use sha2::Sha256;

const PREFIX: &str = "whsec_";

/// A new endpoint secret: `whsec_` and the base64 of 24 random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; 24];
    rand::rng().fill_bytes(&mut key);
    format!("{PREFIX}{}", STANDARD.encode(key))
}

/// `v1,` and the base64 HMAC-SHA256, keyed by the secret's bytes, of `id.timestamp.body`;
/// `None` when the stored secret is not `whsec_` and base64.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    Some(Key::of(secret)?.sign(id, timestamp, body))
}

/// An endpoint's secret, decoded and keyed once for all of its events.
pub(super) struct Key(Hmac<Sha256>);

impl Key {
    pub(super) fn of(secret: &str) -> Option<Self> {
        let key = STANDARD
            .decode(secret.strip_prefix(PREFIX).unwrap_or(secret))
            .ok()?;
        Hmac::<Sha256>::new_from_slice(&key).ok().map(Self)
    }

    pub(super) fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = self.0.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// What an endpoint's requests are signed with: its secret and, during a rotation's
/// overlap, the one before it, so a receiver that still holds the old secret verifies too.
pub(super) struct Signer {
    current: Option<Key>,
    previous: Option<Key>,
}

impl Signer {
    pub(super) fn new(signing: &Signing) -> Self {
        Self {
            current: Key::of(&signing.secret),
            previous: signing.previous_secret.as_deref().and_then(Key::of),
        }
    }

    /// The `webhook-signature` header: `v1,<new>`, then ` v1,<old>` during an overlap (a
    /// receiver accepts any one of the space-separated signatures that verifies).
    pub(super) fn header(&self, id: &str, timestamp: i64, body: &[u8]) -> Result<String, String> {
        let current = self
            .current
            .as_ref()
            .ok_or("the endpoint's stored secret is not whsec_ and base64")?;
        let mut header = current.sign(id, timestamp, body);
        if let Some(previous) = &self.previous {
            header.push(' ');
            header.push_str(&previous.sign(id, timestamp, body));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector of the Standard Webhooks reference libraries.
    #[test]
    fn signs_as_the_reference_libraries_do() {
        let signature = sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(
            signature.as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
    }
}
