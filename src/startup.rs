//! Start and stop: open the database, bind, serve, shut down gracefully.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use poem::listener::{Acceptor, Listener, TcpAcceptor, TcpListener};
use tokio::sync::watch;

use crate::{
    auth::{jwt::JwtVerifier, tokens},
    config::{Config, ServeConfig},
    database,
    delivery::Deliveries,
    health,
    http::{self, Documents},
    retention::Pruning,
    state::AppState,
    telemetry::Metrics,
};

/// How long stopping waits, once the servers are done, for the background work to save and
/// release its leases and the pool to close: a database that does not answer would hold the
/// stop for ever, and delivery and the leases are built to survive an exit like a crash.
const BACKGROUND_ON_STOP: Duration = Duration::from_secs(10);

/// A bound instance: building it does all that can fail at start, so running only serves.
pub struct Application {
    acceptor: TcpAcceptor,
    address: SocketAddr,
    admin: Option<(TcpAcceptor, SocketAddr)>,
    documents: Documents,
    config: ServeConfig,
    state: AppState,
    initial_token: Option<String>,
    deliveries: Deliveries,
    retention: Option<Pruning>,
}

impl Application {
    pub async fn build(config: &Config) -> anyhow::Result<Self> {
        let documents = Documents::render().context("cannot render the OpenAPI document")?;
        let metrics = Arc::new(Metrics::new().context("cannot set up metrics")?);
        let store = database::open(config, Some(metrics.batch_sizes())).await?;
        let (acceptor, address) = bind(config.serve.listen).await?;
        let admin = match config.serve.admin_listen.0 {
            Some(admin) => Some(bind(admin).await?),
            None => None,
        };
        // Only once the port is ours: a start that fails to bind must not use up the one
        // chance to show the initial token.
        let initial_token = tokens::ensure_initial(store.as_ref())
            .await
            .context("cannot create the initial token")?;
        let jwt = JwtVerifier::from_config(&config.serve.jwt).await?;
        let owner: Arc<str> = lease_owner(address).into();
        let deliveries = Deliveries {
            store: Arc::clone(&store),
            config: config.serve.webhooks.clone(),
            metrics: Arc::clone(&metrics),
            owner: Arc::clone(&owner),
        };
        metrics.settings(
            config.serve.request_timeout,
            config.serve.deletion_retention.0,
        );
        let retention = config.serve.deletion_retention.0.map(|kept| Pruning {
            store: Arc::clone(&store),
            kept,
            owner,
            metrics: Arc::clone(&metrics),
        });
        let state = AppState::new(store, &config.serve, metrics, jwt);
        Ok(Self {
            acceptor,
            address,
            admin,
            documents,
            config: config.serve.clone(),
            state,
            initial_token,
            deliveries,
            retention,
        })
    }

    /// The address actually bound (port 0 in the settings becomes a real port).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The address of the ops endpoints' own listener, when `PLANTSTORE_ADMIN_LISTEN` is set.
    pub fn admin_address(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(_, address)| *address)
    }

    /// The token made because the database had none, to be shown once.
    pub fn initial_token(&self) -> Option<&str> {
        self.initial_token.as_deref()
    }

    /// Serves until `shutdown`, then drains for the shutdown delay, stops accepting, lets
    /// in-flight requests finish and closes the pool; both servers stop together.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let store = Arc::clone(&self.state.store);
        let draining = self.state.draining.clone();
        let delay = self.config.shutdown_delay;
        let upkeep = tokio::spawn(Arc::clone(&self.state.metrics).fold_histograms());
        let samples = tokio::spawn(health::sample(self.state.clone()));
        // Stops the background work that holds leases, which each gives back on stopping.
        let (halt, halted) = watch::channel(false);
        let retention = self
            .retention
            .map(|retention| tokio::spawn(retention.run(once_set(&halted))));
        let deliveries = tokio::spawn(self.deliveries.run(once_set(&halted)));
        let (stop, stopped) = watch::channel(false);
        let when_stopped = || once_set(&stopped);
        let servers = http::serve(
            self.acceptor,
            self.admin.map(|(acceptor, _)| acceptor),
            self.state,
            &self.documents,
            &self.config,
            when_stopped,
        );
        tokio::pin!(servers);
        let served = tokio::select! {
            // Only a listener that failed ends a server before the signal.
            served = &mut servers => served,
            () = shutdown => {
                draining.start();
                if !delay.is_zero() {
                    tracing::info!(
                        delay_ms = delay.as_millis() as u64,
                        "draining: /readyz answers 503 while requests are still served"
                    );
                }
                tokio::select! {
                    served = &mut servers => served,
                    () = tokio::time::sleep(delay) => {
                        let _ = stop.send(true);
                        servers.await
                    }
                }
            }
        };
        upkeep.abort();
        samples.abort();
        let _ = halt.send(true);
        let background = async {
            let _ = deliveries.await;
            if let Some(retention) = retention {
                let _ = retention.await;
            }
            store.close().await;
        };
        if tokio::time::timeout(BACKGROUND_ON_STOP, background)
            .await
            .is_err()
        {
            tracing::warn!(
                waited_ms = BACKGROUND_ON_STOP.as_millis() as u64,
                "stopping without the database's answer: progress not saved is delivered again by the next instance"
            );
        }
        served
    }
}

/// Resolves once `flag` is set, or its sender is gone (which also means stop).
fn once_set(flag: &watch::Receiver<bool>) -> impl Future<Output = ()> + use<> {
    let mut flag = flag.clone();
    async move {
        let _ = flag.wait_for(|set| *set).await;
    }
}

/// This instance's name in leases: its host and the address it serves, which no other has.
fn lease_owner(address: SocketAddr) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host} {address}")
}

async fn bind(address: SocketAddr) -> anyhow::Result<(TcpAcceptor, SocketAddr)> {
    let acceptor = TcpListener::bind(address)
        .into_acceptor()
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    let bound = acceptor
        .local_addr()
        .first()
        .and_then(|addr| addr.as_socket_addr().copied())
        .context("the listener has no socket address")?;
    Ok((acceptor, bound))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => signal.recv().await,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutdown requested; finishing in-flight requests");
}
