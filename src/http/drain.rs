//! Draining before a shutdown: while it lasts, every HTTP/1 answer closes its connection,
//! so keep-alive connections end between requests, never under one.

use poem::{
    Endpoint, IntoResponse, Middleware, Request, Response, Result,
    http::{HeaderValue, Version, header},
};

use crate::state::Draining;

pub(super) struct CloseWhileDraining(pub Draining);

impl<E: Endpoint> Middleware<E> for CloseWhileDraining {
    type Output = CloseWhileDrainingEndpoint<E>;

    fn transform(&self, inner: E) -> Self::Output {
        CloseWhileDrainingEndpoint {
            inner,
            draining: self.0.clone(),
        }
    }
}

pub(super) struct CloseWhileDrainingEndpoint<E> {
    inner: E,
    draining: Draining,
}

impl<E: Endpoint> Endpoint for CloseWhileDrainingEndpoint<E> {
    type Output = Response;

    async fn call(&self, req: Request) -> Result<Self::Output> {
        // HTTP/2 has no such header; its connections end with the server's GOAWAY.
        let http1 = req.version() <= Version::HTTP_11;
        let mut response = self.inner.call(req).await?.into_response();
        if http1 && self.draining.is_on() {
            // hyper reads the header and closes the connection once this answer is sent.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Ok(response)
    }
}
