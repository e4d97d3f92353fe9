//! Each setting's value: what text it accepts, and how it shows (secrets never do).

use std::{fmt, net::SocketAddr, num::NonZeroU32, str::FromStr, time::Duration};

/// A secret setting: `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Self(text)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Empty reads as off, so `PLANTSTORE_RATE_LIMIT=` in a compose file means what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit(pub Option<NonZeroU32>);

impl FromStr for RateLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" | "off" => Ok(Self(None)),
            number => number
                .parse::<NonZeroU32>()
                .map(|rate| Self(Some(rate)))
                .map_err(|_| {
                    "write a whole number of requests per second, such as 100, or off".into()
                }),
        }
    }
}

/// `PLANTSTORE_DELETION_RETENTION`; empty reads as off, as for the rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention(pub Option<Duration>);

impl FromStr for Retention {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" | "off" => Ok(Self(None)),
            duration => match parse_duration(duration)? {
                zero if zero.is_zero() => {
                    Err("write a duration above zero, such as 90d, or off".into())
                }
                kept => Ok(Self(Some(kept))),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CorsOrigins {
    /// No CORS at all: a preflight is a 405 like any other OPTIONS.
    #[default]
    Off,
    Any,
    /// Origins as browsers send them (`scheme://host[:port]`), lower-cased.
    Only(Vec<String>),
}

impl CorsOrigins {
    pub fn allows(&self, origin: &str) -> bool {
        match self {
            CorsOrigins::Off => false,
            CorsOrigins::Any => true,
            CorsOrigins::Only(origins) => origins.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        }
    }
}

impl FromStr for CorsOrigins {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" | "off" => Ok(Self::Off),
            "*" => Ok(Self::Any),
            list => list
                .split(',')
                .map(str::trim)
                .filter(|origin| !origin.is_empty())
                .map(origin)
                .collect::<Result<Vec<_>, _>>()
                .map(Self::Only),
        }
    }
}

/// One origin of the list, as a browser's `Origin` header spells it.
fn origin(text: &str) -> Result<String, String> {
    let bare = text.strip_suffix('/').unwrap_or(text);
    let host = bare
        .strip_prefix("http://")
        .or_else(|| bare.strip_prefix("https://"));
    match host {
        Some(host) if !host.is_empty() && !host.contains(['/', '?', '#', '*', '@', ' ']) => {
            Ok(bare.to_ascii_lowercase())
        }
        _ => Err(format!(
            "'{text}' is not an origin: write * or origins like https://shop.example or http://localhost:3000, separated by commas"
        )),
    }
}

/// Empty is none, so `PLANTSTORE_ADMIN_LISTEN=` in a compose file means what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdminListen(pub Option<SocketAddr>);

impl FromStr for AdminListen {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" => Ok(Self(None)),
            address => address
                .parse()
                .map(|address| Self(Some(address)))
                .map_err(|_| "write an address such as 127.0.0.1:9090 or 0.0.0.0:9090".into()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// `DATABASE_URL`, which may hold a password: never shown, nor echoed in an error.
#[derive(Clone)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn backend(&self) -> Result<Backend, String> {
        let Some((scheme, _)) = self.0.split_once(':') else {
            return Err(
                "DATABASE_URL is not a URL: write sqlite://FILE or postgres://USER@HOST/DATABASE"
                    .into(),
            );
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => Ok(Backend::Sqlite),
            "postgres" | "postgresql" => Ok(Backend::Postgres),
            other => Err(format!(
                "DATABASE_URL has the unknown scheme '{other}': use sqlite:, postgres:// or postgresql://"
            )),
        }
    }

    /// The URL with its password; only for handing to the database driver.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password as `***`, safe on malformed input (the error about a bad
    /// URL shows it): the user info ends at the last `@`, as a password may hold `/`, `?`
    /// or `#` unencoded, and query parameters named like a password are masked.
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            let scheme = self.0.split(':').next().unwrap_or_default();
            return format!("{scheme}:***");
        };
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((userinfo, after)) => match userinfo.split_once(':') {
                Some((user, _password)) if !user.contains(['/', '?', '#']) => {
                    (format!("{user}:***@"), after)
                }
                // A user name alone, or an `@` past the host: nothing to show safely.
                _ if userinfo.contains(['/', '?', '#', '=', '&']) => ("***@".to_owned(), after),
                _ => (format!("{userinfo}@"), after),
            },
            None => (String::new(), rest),
        };
        let Some((main, query)) = rest.split_once('?') else {
            return format!("{scheme}://{credentials}{rest}");
        };
        let query: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.to_ascii_lowercase().contains("password") => {
                    format!("{key}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        format!("{scheme}://{credentials}{main}?{}", query.join("&"))
    }
}

impl From<String> for DatabaseUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl")
            .field(&self.redacted())
            .finish()
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Reads a DURATION such as `90d`, `12h`, `5s` or `500ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|err| format!("{err} (write it like 90d, 12h or 5s)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> DatabaseUrl {
        DatabaseUrl::from(text.to_owned())
    }

    #[test]
    fn the_scheme_picks_the_backend() {
        assert_eq!(url("sqlite://x.db?mode=rwc").backend(), Ok(Backend::Sqlite));
        assert_eq!(url("sqlite::memory:").backend(), Ok(Backend::Sqlite));
        assert_eq!(url("postgres://u@h/d").backend(), Ok(Backend::Postgres));
        assert_eq!(url("PostgreSQL://u@h/d").backend(), Ok(Backend::Postgres));
    }

    #[test]
    fn passwords_never_show() {
        let secret = url("postgres://app:hunter2@db:5432/plants?sslmode=require");
        assert_eq!(
            secret.to_string(),
            "postgres://app:***@db:5432/plants?sslmode=require"
        );
        assert!(!format!("{secret:?}").contains("hunter2"));
        let in_query = url("postgres://db/plants?user=app&password=hunter2&sslmode=require");
        assert_eq!(
            in_query.to_string(),
            "postgres://db/plants?user=app&password=***&sslmode=require"
        );
        // Found by fuzz/run config: unencoded `?`, `/` or `@` in a password.
        let odd = url("postgres://app:pa?ss/w@rd@db/plants");
        assert_eq!(odd.to_string(), "postgres://app:***@db/plants");
        let at_in_query = url("postgres://db/plants?password=hunter2@x");
        assert!(!at_in_query.to_string().contains("hunter2"));
    }

    #[test]
    fn an_empty_rate_limit_is_off() {
        assert_eq!("".parse(), Ok(RateLimit(None)));
        assert_eq!("off".parse(), Ok(RateLimit(None)));
        assert_eq!("100".parse(), Ok(RateLimit(NonZeroU32::new(100))));
        assert!("0".parse::<RateLimit>().is_err());
        assert!("fast".parse::<RateLimit>().is_err());
    }

    #[test]
    fn a_retention_is_off_or_a_duration_above_zero() {
        assert_eq!("".parse(), Ok(Retention(None)));
        assert_eq!("off".parse(), Ok(Retention(None)));
        assert_eq!(
            "90d".parse(),
            Ok(Retention(Some(Duration::from_secs(90 * 86_400))))
        );
        assert!("0s".parse::<Retention>().is_err());
        assert!("forever".parse::<Retention>().is_err());
    }

    #[test]
    fn cors_origins_read_as_off_any_or_a_list() {
        assert_eq!("".parse(), Ok(CorsOrigins::Off));
        assert_eq!(" * ".parse(), Ok(CorsOrigins::Any));
        let list: CorsOrigins = "https://Shop.example/, http://localhost:3000"
            .parse()
            .expect("two origins");
        assert_eq!(
            list,
            CorsOrigins::Only(vec![
                "https://shop.example".into(),
                "http://localhost:3000".into()
            ])
        );
        assert!(list.allows("https://SHOP.example"));
        for bad in ["https://shop.example/app", "https://*.example", "ftp://x"] {
            let err = bad.parse::<CorsOrigins>().expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn an_empty_admin_address_is_none() {
        assert_eq!("".parse(), Ok(AdminListen(None)));
        assert_eq!(
            "127.0.0.1:9090".parse(),
            Ok(AdminListen(Some(
                "127.0.0.1:9090".parse().expect("address")
            )))
        );
    }
}
