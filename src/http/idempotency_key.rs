//! The `Idempotency-Key` request header (draft-ietf-httpapi-idempotency-key-header).

use std::sync::Arc;

use poem::{Request, RequestBody, error::ResponseError, http::StatusCode};
use poem_openapi::{
    ApiExtractor, ApiExtractorType, ExtractParamOptions,
    registry::{MetaParamIn, MetaSchema, MetaSchemaRef},
};

pub const HEADER: &str = "Idempotency-Key";
/// The response header that marks a repeated 204.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";
pub const MAX_LEN: usize = 255;

/// What `parse` accepts, as a JSON Schema pattern: a bare key (not starting with a space or
/// a quote), or a quoted string of 1 to 255 characters with `"` and `\` escaped.
pub const PATTERN: &str = r#"^(?:[!#-~][ -~]{0,254}|"(?:[ !#-\[\]-~]|\\["\\]){1,255}")$"#;

/// A header that is not one valid key (the HTTP layer answers it with a 400 `Error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the Idempotency-Key header is not a valid key")]
pub struct InvalidKey;

impl ResponseError for InvalidKey {
    fn status(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }
}

/// The `Idempotency-Key` parameter: poem-openapi's `Header<String>` would take a non-text
/// value as no header, and the first of several; this reads all, and documents the rules.
#[derive(Debug)]
pub(super) struct IdempotencyKey(pub Option<Arc<str>>);

impl<'a> ApiExtractor<'a> for IdempotencyKey {
    const TYPES: &'static [ApiExtractorType] = &[ApiExtractorType::Parameter];

    type ParamType = ();
    type ParamRawType = ();

    fn param_in() -> Option<MetaParamIn> {
        Some(MetaParamIn::Header)
    }

    /// No example: Swagger UI would fill it in, and every Try it out would share one key.
    fn param_schema_ref() -> Option<MetaSchemaRef> {
        Some(MetaSchemaRef::Inline(Box::new(MetaSchema {
            min_length: Some(1),
            // The longest key, quoted with every character escaped.
            max_length: Some(2 * MAX_LEN + 2),
            pattern: Some(PATTERN.to_owned()),
            ..MetaSchema::new("string")
        })))
    }

    /// None without the header; `InvalidKey` when it is sent twice or is not a valid key.
    async fn from_request(
        request: &'a Request,
        _body: &mut RequestBody,
        _options: ExtractParamOptions<()>,
    ) -> poem::Result<Self> {
        let mut values = request.headers().get_all(HEADER).iter();
        let Some(value) = values.next() else {
            return Ok(Self(None));
        };
        if values.next().is_some() {
            return Err(InvalidKey.into());
        }
        let text = value.to_str().map_err(|_not_ascii| InvalidKey)?;
        Ok(Self(Some(parse(text)?)))
    }
}

/// The key in a header value: the draft's quoted string (`"abc"`, with `\"` and `\\`
/// escapes) or the bare characters, which name the same key; else `InvalidKey`.
pub fn parse(value: &str) -> Result<Arc<str>, InvalidKey> {
    let key = match value.strip_prefix('"') {
        Some(quoted) => unquote(quoted).ok_or(InvalidKey)?,
        None => value.to_owned(),
    };
    let printable = key.bytes().all(|b| (b' '..=b'~').contains(&b));
    if key.is_empty() || key.len() > MAX_LEN || !printable {
        return Err(InvalidKey);
    }
    Ok(key.into())
}

/// A quoted string's inside, up to an unescaped closing quote, which must end the value.
fn unquote(quoted: &str) -> Option<String> {
    let mut key = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return chars.next().is_none().then_some(key),
            '\\' => match chars.next()? {
                escaped @ ('"' | '\\') => key.push(escaped),
                _ => return None,
            },
            c => key.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        assert_eq!(parse("abc-123").ok().as_deref(), Some("abc-123"));
        assert_eq!(parse("\"abc-123\"").ok().as_deref(), Some("abc-123"));
        assert_eq!(
            parse(r#""a \"b\" \\c""#).ok().as_deref(),
            Some(r#"a "b" \c"#)
        );
        assert_eq!(parse("a b").ok().as_deref(), Some("a b"));
        assert_eq!(parse(&"k".repeat(255)).ok().map(|k| k.len()), Some(255));
    }

    #[test]
    fn anything_else_is_refused() {
        for value in [
            "",
            "\"\"",
            "\"abc",
            "\"ab\"c\"",
            "\"a\\bc\"",
            "\"abc\"x",
            "tab\there",
            "caf\u{e9}",
            "\u{7f}",
            &"k".repeat(256),
        ] {
            assert!(parse(value).is_err(), "{value:?}");
        }
    }
}
