//! Where a destination's events go, made once per lease: each kind behind the one interface
//! the delivery loop uses to send an event and hand over what to save with the position.

use std::sync::Arc;

use plantstore_store::{
    Store,
    destinations::{DestinationKind, Event, Lease, StoredMessage},
};
use tokio::sync::watch;

use super::{attempt::Attempt, signature::Signer, stream::StreamPublisher, webhook::WebhookClient};
use crate::config::DeliveryConfig;

/// Where a running webhook delivery takes its endpoint's secrets from.
pub(super) type SecretsFeed = watch::Sender<Arc<Signer>>;

pub(super) enum Destination {
    Webhook(WebhookClient),
    Stream(Box<StreamPublisher>),
}

impl Destination {
    /// The error says why the stored URL cannot be used, without the URL. A webhook comes
    /// with where its secrets are fed, so a rotation reaches the running delivery.
    pub(super) fn new(
        lease: &Lease,
        config: &DeliveryConfig,
        store: &Arc<dyn Store>,
    ) -> Result<(Self, Option<SecretsFeed>), String> {
        match &lease.kind {
            DestinationKind::Webhook(webhook) => {
                let (feed, signer) = watch::channel(Arc::new(Signer::new(&webhook.secrets)));
                let client = WebhookClient::new(&webhook.url, webhook.http2, config, signer)?;
                Ok((Destination::Webhook(client), Some(feed)))
            }
            DestinationKind::Stream(target) => {
                let publisher = StreamPublisher::new(
                    lease.endpoint_id,
                    target.clone(),
                    config.webhook_timeout,
                    store,
                )?;
                Ok((Destination::Stream(Box::new(publisher)), None))
            }
        }
    }

    pub(super) async fn send(&self, event: &Event) -> Attempt {
        match self {
            Destination::Webhook(client) => client.post(event).await,
            Destination::Stream(publisher) => publisher.publish(event).await,
        }
    }

    /// The messages a stream stored since the last save, to be saved with the position.
    pub(super) fn unsaved(&self) -> Vec<StoredMessage> {
        match self {
            Destination::Webhook(_) => Vec::new(),
            Destination::Stream(publisher) => publisher.unsaved(),
        }
    }

    pub(super) fn has_unsaved(&self) -> bool {
        match self {
            Destination::Webhook(_) => false,
            Destination::Stream(publisher) => publisher.has_unsaved(),
        }
    }

    /// The report carrying `saved` was saved.
    pub(super) fn saved(&self, saved: &[StoredMessage]) {
        if let Destination::Stream(publisher) = self {
            publisher.saved(saved);
        }
    }
}
