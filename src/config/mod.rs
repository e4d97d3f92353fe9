//! Every setting, read once at start from flags, then the environment, then `.env`: the
//! groups of settings here, each value's type and parser in `values.rs`.

mod values;

use std::{net::SocketAddr, time::Duration};

use clap::{ArgAction, builder::BoolishValueParser};

pub use values::{
    AdminListen, Backend, CorsOrigins, DatabaseUrl, LogFormat, RateLimit, Retention, Secret,
    parse_duration,
};

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

impl Config {
    /// Every setting at its default, whatever the environment says: what the binary runs
    /// with when nothing is set, for tests and tools that build a config of their own.
    pub fn defaults() -> Self {
        use clap::{Args, FromArgMatches};
        let command = Self::augment_args(clap::Command::new("plantstore"))
            .mut_args(|arg| arg.env(None::<&str>));
        let matches = command.get_matches_from(["plantstore"]);
        // The defaults are literals of this module, so they parse (its test says so).
        Self::from_arg_matches(&matches).unwrap_or_else(|err| panic!("a default is invalid: {err}"))
    }
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

    #[command(flatten)]
    pub connections: ConnectionConfig,

    /// How long in-flight requests may finish after SIGTERM or Ctrl-C
    #[arg(long, env = "PLANTSTORE_SHUTDOWN_GRACE", default_value = "10s",
          value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// After SIGTERM or Ctrl-C, go on serving this long while /readyz answers 503 and every
    /// answer closes its connection, so a load balancer drains the instance first
    #[arg(long, env = "PLANTSTORE_SHUTDOWN_DELAY", default_value = "0s",
          value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    #[command(flatten)]
    pub jwt: JwtConfig,

    #[command(flatten)]
    pub webhooks: DeliveryConfig,

    /// Base URL of an OTLP/HTTP collector, such as http://localhost:4318: the request and
    /// store spans go to its /v1/traces (unset or empty: nothing is exported)
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        help_heading = "Telemetry options"
    )]
    pub otlp_endpoint: Option<String>,

    /// Requests per second per token; over it the answer is 429 (`off`, empty or unset: no limit)
    #[arg(
        long,
        env = "PLANTSTORE_RATE_LIMIT",
        default_value = "off",
        help_heading = "Server options"
    )]
    pub rate_limit: RateLimit,

    /// How long after a delete a retry with the same Idempotency-Key from the same caller
    /// is answered 204 again (Idempotent-Replayed: true) instead of 404
    #[arg(long, env = "PLANTSTORE_IDEMPOTENCY_TTL", default_value = "24h",
          value_parser = parse_duration, help_heading = "Deletion log options")]
    pub idempotency_ttl: Duration,

    /// How long the deletion log keeps an entry: older ones are pruned by the running
    /// service, in small batches, once no destination still needs them; at least
    /// PLANTSTORE_IDEMPOTENCY_TTL (`off`, empty or unset: kept until `plantstore deletions
    /// prune`)
    #[arg(
        long,
        env = "PLANTSTORE_DELETION_RETENTION",
        default_value = "off",
        help_heading = "Deletion log options"
    )]
    pub deletion_retention: Retention,

    /// Origins whose web pages may call the service from a browser: `*`, or a comma list
    /// such as https://shop.example,http://localhost:3000 (`off`, empty or unset: none)
    #[arg(
        long,
        env = "PLANTSTORE_CORS_ALLOWED_ORIGINS",
        default_value = "off",
        help_heading = "Server options"
    )]
    pub cors_allowed_origins: CorsOrigins,

    /// A second address, such as 127.0.0.1:9090, for /healthz, /readyz and /metrics,
    /// which then leave the public one (empty or unset: they stay on the public address)
    #[arg(
        long,
        env = "PLANTSTORE_ADMIN_LISTEN",
        default_value = "",
        hide_default_value = true,
        help_heading = "Server options"
    )]
    pub admin_listen: AdminListen,
}

/// The limits every client connection is held to.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ConnectionConfig {
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
}

/// Delivery of deletion events to every destination: the endpoints `plantstore webhooks
/// add` registers and the streams `plantstore streams add` does.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Deletion event delivery options (webhooks and streams)")]
pub struct DeliveryConfig {
    /// One delivery attempt's limit: a 2xx within it delivers the event
    #[arg(long, env = "PLANTSTORE_WEBHOOK_TIMEOUT", default_value = "10s",
          value_parser = parse_duration)]
    pub webhook_timeout: Duration,

    /// The shortest wait before an event's next attempt; waits double from it, with
    /// jitter, up to PLANTSTORE_WEBHOOK_RETRY_MAX
    #[arg(long, env = "PLANTSTORE_WEBHOOK_RETRY_MIN", default_value = "1s",
          value_parser = parse_duration)]
    pub webhook_retry_min: Duration,

    /// The longest wait before an event's next attempt (a Retry-After above it is cut to it)
    #[arg(long, env = "PLANTSTORE_WEBHOOK_RETRY_MAX", default_value = "1h",
          value_parser = parse_duration)]
    pub webhook_retry_max: Duration,
}

/// A parse error about a value that came from the environment, naming the variable the
/// user set rather than the flag clap names; any other error as it is.
pub fn name_the_variable(
    err: clap::Error,
    command: &mut clap::Command,
    given: &[std::ffi::OsString],
) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        err.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return err;
    }
    let Some(ContextValue::String(invalid)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let flag = invalid
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_start_matches("--");
    let on_command_line = given.iter().filter_map(|arg| arg.to_str()).any(|arg| {
        arg.strip_prefix("--")
            .and_then(|arg| arg.strip_prefix(flag))
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('='))
    });
    let arg = std::iter::once(&*command)
        .chain(command.get_subcommands())
        .flat_map(|command| command.get_arguments())
        .find(|arg| arg.get_long() == Some(flag));
    let Some((arg, variable)) = arg.and_then(|arg| Some((arg, arg.get_env()?))) else {
        return err;
    };
    if on_command_line {
        return err;
    }
    let value = match err.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(value)) if !arg.is_hide_env_values_set() => {
            format!(" '{value}'")
        }
        _ => String::new(),
    };
    let reason = std::error::Error::source(&err)
        .map(|reason| format!(": {reason}"))
        .unwrap_or_default();
    let message = format!(
        "invalid value{value} for {}{reason}",
        variable.to_string_lossy()
    );
    command.error(ErrorKind::ValueValidation, message)
}

impl ServeConfig {
    /// The checks that span settings (each value's own are its parser's), in one line
    /// naming what to change.
    pub fn check(&self) -> Result<(), String> {
        self.jwt.check()?;
        self.webhooks.check()?;
        match self.deletion_retention {
            Retention(Some(kept)) if kept < self.idempotency_ttl => Err(format!(
                "PLANTSTORE_DELETION_RETENTION ({}) must be at least PLANTSTORE_IDEMPOTENCY_TTL ({}): a retry within the TTL is answered from the log entry",
                humantime::format_duration(kept),
                humantime::format_duration(self.idempotency_ttl)
            )),
            _ => Ok(()),
        }
    }
}

impl DeliveryConfig {
    fn check(&self) -> Result<(), String> {
        if self.webhook_retry_min.is_zero() || self.webhook_retry_min > self.webhook_retry_max {
            return Err(
                "PLANTSTORE_WEBHOOK_RETRY_MIN must be above zero and at most PLANTSTORE_WEBHOOK_RETRY_MAX"
                    .into(),
            );
        }
        if self.webhook_timeout.is_zero() {
            return Err("PLANTSTORE_WEBHOOK_TIMEOUT must be above zero".into());
        }
        Ok(())
    }
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

/// The shortest HS256 secret accepted (RFC 7518: at least the hash's size).
const MIN_JWT_SECRET_BYTES: usize = 32;

impl JwtConfig {
    fn check(&self) -> Result<(), String> {
        let set = self.without_empty_values();
        let sources = u8::from(set.jwt_secret.is_some())
            + u8::from(set.jwt_public_key.is_some())
            + u8::from(set.jwks_url.is_some());
        if sources > 1 {
            return Err("set one of PLANTSTORE_JWT_SECRET, PLANTSTORE_JWT_PUBLIC_KEY and PLANTSTORE_JWKS_URL, not several".into());
        }
        match set.jwt_secret {
            Some(secret) if secret.expose().len() < MIN_JWT_SECRET_BYTES => Err(format!(
                "PLANTSTORE_JWT_SECRET must be at least {MIN_JWT_SECRET_BYTES} bytes"
            )),
            _ => Ok(()),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_parse_and_are_what_the_docs_say() {
        let config = Config::defaults();
        assert_eq!(config.serve.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.serve.request_timeout, Duration::from_secs(5));
        assert_eq!(
            config.serve.webhooks.webhook_retry_max,
            Duration::from_secs(3600)
        );
        assert!(config.serve.webhooks.check().is_ok());
        assert_eq!(config.serve.deletion_retention, Retention(None));
        assert!(config.serve.check().is_ok());
    }
}
