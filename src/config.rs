//! Every setting, read once at start from flags, then the environment, then `.env`.

use std::{
    convert::Infallible, fmt, net::SocketAddr, num::NonZeroU32, str::FromStr, time::Duration,
};

use clap::{ArgAction, builder::BoolishValueParser};

/// The settings every command reads: the database, how to reach it, how to log. Each
/// flag also reads the environment variable it names, and may come before or after the
/// command.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Which database: sqlite://FILE?mode=rwc, or postgres://USER:PASSWORD@HOST/DATABASE
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://plantstore.db?mode=rwc",
        hide_env_values = true,
        hide_default_value = true,
        global = true
    )]
    pub database_url: DatabaseUrl,

    /// Apply migrations at start (false: only check that the schema is there)
    #[arg(long, env = "PLANTSTORE_MIGRATE", default_value_t = true, action = ArgAction::Set,
          value_parser = BoolishValueParser::new(), global = true)]
    pub migrate: bool,

    /// Tracing filter, such as `info` or `plantstore=debug`
    #[arg(long = "log", env = "RUST_LOG", default_value = "info", global = true)]
    pub log_filter: String,

    /// Log line format
    #[arg(long, env = "PLANTSTORE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Longest wait for a database connection before answering 503
    #[arg(long, env = "PLANTSTORE_DB_ACQUIRE_TIMEOUT", default_value = "3s",
          value_parser = parse_duration, global = true)]
    pub db_acquire_timeout: Duration,

    /// Most database connections this instance opens
    #[arg(long, env = "PLANTSTORE_DB_MAX_CONNECTIONS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..), global = true)]
    pub db_max_connections: u32,

    #[command(flatten)]
    pub serve: ServeConfig,
}

/// The settings only the server reads, given to `serve` (or with no command at all).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Server options")]
pub struct ServeConfig {
    /// Address to serve on
    #[arg(long, env = "PLANTSTORE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// One deadline per request, covering queueing, getting a connection, waiting for a
    /// row lock and the statement; past it the answer is 503
    #[arg(long, env = "PLANTSTORE_REQUEST_TIMEOUT", default_value = "5s",
          value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Closes a client connection that sent nothing for this long while the server waited
    /// for it (an idle keep-alive, or a request header that stopped halfway)
    #[arg(long, env = "PLANTSTORE_IDLE_TIMEOUT", default_value = "60s",
          value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Longest a request's headers may take to arrive, counted from the connection's start
    /// or the request's first byte; past it the answer is 408 and the connection closes
    #[arg(long, env = "PLANTSTORE_HEADER_TIMEOUT", default_value = "10s",
          value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// Most client connections open at once; past it, new ones wait until one closes
    #[arg(long, env = "PLANTSTORE_MAX_CONNECTIONS", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// How long in-flight requests may finish after SIGTERM or Ctrl-C
    #[arg(long, env = "PLANTSTORE_SHUTDOWN_GRACE", default_value = "10s",
          value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    #[command(flatten)]
    pub jwt: JwtConfig,

    /// Base URL of an OTLP/HTTP collector, such as http://localhost:4318: the request and
    /// store spans go to its /v1/traces (unset or empty: nothing is exported)
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Requests per second per token; over it the answer is 429 (`off`, empty or unset: no limit)
    #[arg(long, env = "PLANTSTORE_RATE_LIMIT", default_value = "off")]
    pub rate_limit: RateLimit,

    /// How long after a delete a retry with the same Idempotency-Key from the same caller
    /// is answered 204 again (Idempotent-Replayed: true) instead of 404
    #[arg(long, env = "PLANTSTORE_IDEMPOTENCY_TTL", default_value = "24h",
          value_parser = parse_duration)]
    pub idempotency_ttl: Duration,

    /// Origins whose web pages may call the service from a browser: `*`, or a comma list
    /// such as https://shop.example,http://localhost:3000 (`off`, empty or unset: none)
    #[arg(long, env = "PLANTSTORE_CORS_ALLOWED_ORIGINS", default_value = "off")]
    pub cors_allowed_origins: CorsOrigins,

    /// A second address, such as 127.0.0.1:9090, for /healthz, /readyz and /metrics,
    /// which then leave the public one (empty or unset: they stay on the public address)
    #[arg(
        long,
        env = "PLANTSTORE_ADMIN_LISTEN",
        default_value = "",
        hide_default_value = true
    )]
    pub admin_listen: AdminListen,
}

/// JWT bearer tokens from an identity provider, beside the service's own tokens: one key
/// source (a shared secret, a public key, or a JWKS URL) and the claims every JWT must
/// carry. With no key source, only the service's own tokens are accepted.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "JWT options")]
pub struct JwtConfig {
    /// HS256 secret: JWTs signed with it are accepted
    #[arg(long, env = "PLANTSTORE_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<Secret>,

    /// Path of a PEM public key (RSA for RS256, P-256 for ES256): JWTs it verifies are accepted
    #[arg(long, env = "PLANTSTORE_JWT_PUBLIC_KEY")]
    pub jwt_public_key: Option<std::path::PathBuf>,

    /// JWKS URL of an identity provider: fetched at start, fetched again for an unknown
    /// key id (at most every 10 s)
    #[arg(long, env = "PLANTSTORE_JWKS_URL")]
    pub jwks_url: Option<String>,

    /// The `iss` every JWT must carry
    #[arg(long, env = "PLANTSTORE_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// An `aud` every JWT must carry
    #[arg(long, env = "PLANTSTORE_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// A scope every JWT must carry (in `scope`, space-separated, or the `scp` array),
    /// such as plants:delete; without it the answer is 403
    #[arg(long, env = "PLANTSTORE_JWT_REQUIRED_SCOPE")]
    pub jwt_required_scope: Option<String>,
}

impl JwtConfig {
    /// The settings with every empty value taken as unset.
    pub fn without_empty_values(&self) -> Self {
        let text = |value: &Option<String>| value.clone().filter(|v| !v.trim().is_empty());
        Self {
            jwt_secret: self.jwt_secret.clone().filter(|s| !s.expose().is_empty()),
            jwt_public_key: self
                .jwt_public_key
                .clone()
                .filter(|path| !path.as_os_str().is_empty()),
            jwks_url: text(&self.jwks_url),
            jwt_issuer: text(&self.jwt_issuer),
            jwt_audience: text(&self.jwt_audience),
            jwt_required_scope: text(&self.jwt_required_scope),
        }
    }
}

/// A secret setting: `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for Secret {
    type Err = Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `PLANTSTORE_RATE_LIMIT`: a positive number of requests per second, or off. Empty reads
/// as off, so `PLANTSTORE_RATE_LIMIT=` in a compose file or `.env` does what it looks like.
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

/// `PLANTSTORE_CORS_ALLOWED_ORIGINS`: which browser origins may call the service.
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
    /// Whether a request's `Origin` header names an allowed origin.
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
            "" | "off" => return Ok(Self::Off),
            "*" => return Ok(Self::Any),
            _ => {}
        }
        text.split(',')
            .map(str::trim)
            .filter(|origin| !origin.is_empty())
            .map(origin)
            .collect::<Result<Vec<_>, _>>()
            .map(Self::Only)
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

/// `PLANTSTORE_ADMIN_LISTEN`: an address, or none when empty, so that
/// `PLANTSTORE_ADMIN_LISTEN=` in a compose file or `.env` does what it looks like.
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

/// `DATABASE_URL`, which may hold a password: `Debug` and `Display` never show it, and
/// a bad value is reported without echoing it.
#[derive(Clone)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The backend the URL's scheme names.
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

    /// The URL with any password replaced by `***`. Built to be safe on malformed input
    /// too (it is shown in the very error that says the URL is bad): without `://` only
    /// the scheme shows; the user info ends at the last `@` anywhere, since a password
    /// may hold `/`, `?` or `#` unencoded (masking too much of an odd URL is harmless);
    /// and every query parameter named like a password is masked.
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
        let (main, query) = rest
            .split_once('?')
            .map_or((rest, None), |(m, q)| (m, Some(q)));
        let Some(query) = query else {
            return format!("{scheme}://{credentials}{main}");
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

impl FromStr for DatabaseUrl {
    type Err = Infallible;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        Ok(Self(url.to_owned()))
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
        DatabaseUrl(text.to_owned())
    }

    #[test]
    fn the_scheme_picks_the_backend() {
        assert_eq!(url("sqlite://x.db?mode=rwc").backend(), Ok(Backend::Sqlite));
        assert_eq!(url("sqlite::memory:").backend(), Ok(Backend::Sqlite));
        assert_eq!(url("postgres://u@h/d").backend(), Ok(Backend::Postgres));
        assert_eq!(url("PostgreSQL://u@h/d").backend(), Ok(Backend::Postgres));
        assert!(
            url("mysql://u@h/d")
                .backend()
                .is_err_and(|e| e.contains("'mysql'"))
        );
        assert!(url("plantstore.db").backend().is_err());
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
    fn cors_origins_read_as_off_any_or_a_list() {
        assert_eq!("".parse(), Ok(CorsOrigins::Off));
        assert_eq!("off".parse(), Ok(CorsOrigins::Off));
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
        assert!(list.allows("http://localhost:3000"));
        assert!(list.allows("https://SHOP.example"));
        assert!(!list.allows("http://localhost:3001"));
        assert!(!CorsOrigins::Off.allows("http://localhost:3000"));
        for bad in [
            "shop.example",
            "https://shop.example/app",
            "https://*.example",
            "ftp://x",
        ] {
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
        assert!("9090".parse::<AdminListen>().is_err());
    }

    #[test]
    fn durations_read_like_the_spec() {
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert!(parse_duration("soon").is_err());
    }
}
