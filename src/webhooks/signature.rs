//! Standard Webhooks signing: endpoint secrets and the `webhook-signature` header.

use base64::{Engine, engine::general_purpose::STANDARD};
use hmac::{Hmac, KeyInit, Mac};
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
#[derive(Clone)]
pub(super) struct Key(Hmac<Sha256>);

impl Key {
    /// `None` when the stored secret is not `whsec_` and base64.
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

    #[test]
    fn a_new_secret_signs() {
        let secret = new_secret();
        assert!(secret.starts_with("whsec_"));
        assert!(sign(&secret, "deletion_1", 1, b"{}").is_some());
    }
}
