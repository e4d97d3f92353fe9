//! libpq's several hosts in one URL (what `pg_autoctl show uri` prints), read into one set
//! of connect options per host: sqlx reads one host only.

use std::str::FromStr;

use percent_encoding::percent_decode_str;
use sqlx::postgres::PgConnectOptions;

const DEFAULT_PORT: u16 = 5432;

/// Which server of the list a session may use (`target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionAttrs {
    /// The first that accepts a connection.
    Any,
    /// One whose sessions may write (`transaction_read_only` is off).
    ReadWrite,
    /// One not in recovery (`pg_is_in_recovery()` is false).
    Primary,
}

#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// `host:port` (or the socket folder), never with credentials.
    pub(crate) name: String,
    pub(crate) options: PgConnectOptions,
}

#[derive(Debug, Clone)]
pub(crate) struct HostList {
    pub(crate) hosts: Vec<Host>,
    pub(crate) attrs: SessionAttrs,
}

/// A host as written: a name, an IPv6 address without its brackets, or a socket folder.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Address {
    Tcp(String, u16),
    /// A folder and the port that names its socket file (`.s.PGSQL.<port>`).
    Socket(String, u16),
}

impl HostList {
    /// The error never repeats the URL: it may hold a password.
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(scheme, _)| {
                scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
            })
            .ok_or_else(|| "it must start with postgres:// or postgresql://".to_owned())?;
        let rest = rest.split('#').next().unwrap_or_default();
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
        let (userinfo, host_list) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };

        let mut attrs = SessionAttrs::Any;
        let mut query_hosts = None;
        let mut query_ports = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "target_session_attrs" => attrs = session_attrs(&decode(value)?)?,
                "host" => query_hosts = Some(decode(value)?),
                "port" => query_ports = Some(decode(value)?),
                _ => kept.push(pair),
            }
        }

        let addresses = match query_hosts {
            Some(hosts) if host_list.is_empty() => from_query(&hosts, query_ports.as_deref())?,
            Some(_) => return Err("it names hosts both before the path and in host=".to_owned()),
            None => from_authority(host_list, query_ports.as_deref())?,
        };
        // sqlx reads everything but the host from a URL with one placeholder host.
        let base = format!(
            "{scheme}://{}placeholder/{path}{}{}",
            userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
            if kept.is_empty() { "" } else { "?" },
            kept.join("&"),
        );
        let options = PgConnectOptions::from_str(&base).map_err(|err| err.to_string())?;
        let hosts = addresses
            .into_iter()
            .map(|address| match address {
                Address::Tcp(host, port) => Host {
                    name: if host.contains(':') {
                        format!("[{host}]:{port}")
                    } else {
                        format!("{host}:{port}")
                    },
                    options: options.clone().host(&host).port(port),
                },
                Address::Socket(folder, port) => Host {
                    name: format!("{folder}/.s.PGSQL.{port}"),
                    options: options.clone().socket(&folder).port(port),
                },
            })
            .collect();
        Ok(HostList { hosts, attrs })
    }
}

fn session_attrs(value: &str) -> Result<SessionAttrs, String> {
    match value {
        "any" => Ok(SessionAttrs::Any),
        "read-write" => Ok(SessionAttrs::ReadWrite),
        "primary" => Ok(SessionAttrs::Primary),
        other => Err(format!(
            "target_session_attrs={other} is not supported: the service writes, so use read-write, primary or any"
        )),
    }
}

fn decode(text: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| "a percent-encoded part is not UTF-8".to_owned())
}

fn port(text: &str, position: usize) -> Result<u16, String> {
    text.parse::<u16>()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| format!("host {position} has an invalid port number"))
}

/// `db1:5432,[::1]:5433,%2Fvar%2Frun%2Fpostgresql`; a host without a port takes the one
/// `port=` gives, else 5432. An empty list is localhost, as for libpq.
fn from_authority(list: &str, ports: Option<&str>) -> Result<Vec<Address>, String> {
    let default = ports.map_or(Ok(DEFAULT_PORT), |text| port(text, 1))?;
    list.split(',')
        .enumerate()
        .map(|(index, entry)| {
            let position = index + 1;
            let (host, port_text) = match entry.strip_prefix('[') {
                Some(bracketed) => {
                    let (host, after) = bracketed
                        .split_once(']')
                        .ok_or_else(|| format!("host {position} opens a [ it never closes"))?;
                    let port_text = match after {
                        "" => None,
                        _ => Some(
                            after
                                .strip_prefix(':')
                                .ok_or_else(|| format!("host {position} has text after its ]"))?,
                        ),
                    };
                    (host.to_owned(), port_text)
                }
                None => match entry.rsplit_once(':') {
                    Some((host, port)) => (decode(host)?, Some(port)),
                    None => (decode(entry)?, None),
                },
            };
            let port = port_text.map_or(Ok(default), |text| port(text, position))?;
            Ok(address(&host, port))
        })
        .collect()
}

/// `?host=db1,db2&port=5432,5433`: one port for all, or one per host.
fn from_query(hosts: &str, ports: Option<&str>) -> Result<Vec<Address>, String> {
    let hosts: Vec<&str> = hosts.split(',').collect();
    let ports = match ports {
        Some(text) => text
            .split(',')
            .enumerate()
            .map(|(index, p)| port(p, index + 1))
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![DEFAULT_PORT],
    };
    if ports.len() != 1 && ports.len() != hosts.len() {
        let (n, hosts) = (ports.len(), hosts.len());
        return Err(format!("port= gives {n} ports for {hosts} hosts"));
    }
    Ok(hosts
        .into_iter()
        .zip(ports.iter().cycle())
        .map(|(host, port)| address(host, *port))
        .collect())
}

/// An empty host is localhost, one that starts with `/` a socket folder.
fn address(host: &str, port: u16) -> Address {
    match host {
        "" => Address::Tcp("localhost".into(), port),
        folder if folder.starts_with('/') => Address::Socket(folder.to_owned(), port),
        _ => Address::Tcp(host.to_owned(), port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(url: &str) -> Vec<String> {
        HostList::parse(url)
            .map(|list| list.hosts.into_iter().map(|h| h.name).collect())
            .unwrap_or_else(|err| vec![format!("error: {err}")])
    }

    fn attrs(url: &str) -> Option<SessionAttrs> {
        HostList::parse(url).ok().map(|list| list.attrs)
    }

    /// The connection URIs of libpq's documentation (34.1.1), each with what it names.
    #[test]
    fn libpq_s_documented_examples() {
        assert_eq!(names("postgresql://"), ["localhost:5432"]);
        assert_eq!(names("postgresql://localhost"), ["localhost:5432"]);
        assert_eq!(names("postgresql://localhost:5433"), ["localhost:5433"]);
        assert_eq!(names("postgresql://localhost/mydb"), ["localhost:5432"]);
        assert_eq!(names("postgresql://user@localhost"), ["localhost:5432"]);
        assert_eq!(
            names("postgresql://user:secret@localhost"),
            ["localhost:5432"]
        );
        assert_eq!(
            names("postgresql://other@localhost/otherdb?connect_timeout=10&application_name=myapp"),
            ["localhost:5432"]
        );
        let several = "postgresql://host1:123,host2:456/somedb?target_session_attrs=any&application_name=myapp";
        assert_eq!(names(several), ["host1:123", "host2:456"]);
        assert_eq!(attrs(several), Some(SessionAttrs::Any));
        assert_eq!(
            names("postgresql:///mydb?host=localhost&port=5433"),
            ["localhost:5433"]
        );
        assert_eq!(
            names("postgresql://[2001:db8::1234]/database"),
            ["[2001:db8::1234]:5432"]
        );
        assert_eq!(
            names("postgresql:///dbname?host=/var/lib/postgresql"),
            ["/var/lib/postgresql/.s.PGSQL.5432"]
        );
        assert_eq!(
            names("postgresql://%2Fvar%2Flib%2Fpostgresql/dbname"),
            ["/var/lib/postgresql/.s.PGSQL.5432"]
        );
    }

    #[test]
    fn each_host_has_its_port_or_the_default_and_ipv6_keeps_its_colons() {
        assert_eq!(
            names(
                "postgres://app:pw@db1,db2:5433,[::1]:5434,[fe80::1]/shop?target_session_attrs=primary"
            ),
            ["db1:5432", "db2:5433", "[::1]:5434", "[fe80::1]:5432"]
        );
        assert_eq!(
            attrs("postgres://db1,db2/shop?target_session_attrs=primary"),
            Some(SessionAttrs::Primary)
        );
        assert_eq!(
            names("postgres:///shop?host=db1,db2&port=6001,6002"),
            ["db1:6001", "db2:6002"]
        );
        assert_eq!(
            names("postgres:///shop?host=db1,db2&port=6001"),
            ["db1:6001", "db2:6001"]
        );
        assert_eq!(
            names("postgres:///shop?host=/run/postgresql&port=5433"),
            ["/run/postgresql/.s.PGSQL.5433"]
        );
        assert_eq!(names("PostgreSQL://db1,db2/shop"), ["db1:5432", "db2:5432"]);
    }

    #[test]
    fn the_password_is_percent_decoded_and_never_in_an_error() {
        let list = HostList::parse("postgres://app:p%40ss%2Cword@db1,db2/shop").expect("parses");
        assert_eq!(list.hosts.len(), 2);
        for url in [
            "postgres://app:hunter2@db1:5432,db2:99999/shop",
            "postgres://app:hunter2@db1:x/shop",
            "postgres://app:hunter2@[::1/shop",
            "postgres://app:hunter2@db1,db2/shop?target_session_attrs=standby",
            "postgres://app:hunter2@/shop?host=a,b,c&port=1,2",
            "mysql://app:hunter2@db1/shop",
        ] {
            let err = HostList::parse(url).expect_err(url).to_string();
            assert!(!err.contains("hunter2"), "{url}: {err}");
            assert!(!err.is_empty());
        }
    }
}
