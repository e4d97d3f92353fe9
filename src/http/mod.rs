//! The HTTP layer: the route table, every layer a response passes, and the servers.

mod cross_origin;
mod document;
mod error;
mod front_door;
pub mod idempotency_key;
mod ops;
mod plants;
mod request_id;
mod routes;

use std::{future::Future, sync::Arc, time::Duration};

use poem::{
    Endpoint, EndpointExt, IntoResponse, PathPattern, Request, Response, Route, Server,
    error::ResponseError, http::Method, listener::TcpAcceptor, middleware::CatchPanic,
    web::Redirect,
};

pub use document::{DocumentError, Documents, document, yaml};

use crate::{
    config::{CorsOrigins, ServeConfig},
    connection_limits::CappedAcceptor,
    state::AppState,
};
use cross_origin::CrossOrigin;
use error::ApiError;
use front_door::LayerContext;

/// The whole public HTTP app the binary serves; tests serve this very value. With
/// `PLANTSTORE_ADMIN_LISTEN` set, the ops endpoints are served there, not here.
pub fn build(
    state: AppState,
    documents: &Documents,
    config: &ServeConfig,
) -> impl Endpoint<Output = Response> + use<> {
    let mut routes = documents.routes();
    if config.admin_listen.0.is_none() {
        routes = ops::mount(routes);
    }
    let routes = routes.nest("/", document::service()).around(root_to_docs);
    layered(
        routes,
        state,
        Arc::clone(&documents.route_facts),
        config.cors_allowed_origins.clone(),
        config.request_timeout,
    )
}

/// The app of `PLANTSTORE_ADMIN_LISTEN`: the ops endpoints alone, in the same layers.
pub fn build_admin(
    state: AppState,
    config: &ServeConfig,
) -> impl Endpoint<Output = Response> + use<> {
    layered(
        ops::mount(Route::new()),
        state,
        Arc::default(),
        CorsOrigins::Off,
        config.request_timeout,
    )
}

/// `routes` in the layers of `build`, for a route table of its own (a test's).
pub fn with_layers<E: Endpoint + 'static>(
    routes: E,
    state: AppState,
    config: &ServeConfig,
) -> impl Endpoint<Output = Response> + use<E> {
    let cors = config.cors_allowed_origins.clone();
    layered(routes, state, Arc::default(), cors, config.request_timeout)
}

/// `routes` in every layer a request passes, outermost first: the front door, CORS, the
/// answer (state, `request_timeout`, errors), and panics as a 500 `Error`.
fn layered<E: Endpoint + 'static>(
    routes: E,
    state: AppState,
    route_facts: Arc<routes::RouteFacts>,
    cors: CorsOrigins,
    request_timeout: Duration,
) -> impl Endpoint<Output = Response> + use<E> {
    let context = Arc::new(LayerContext {
        state,
        routes: route_facts,
        request_timeout,
    });
    let door = Arc::clone(&context);
    let answered = routes
        .with(CatchPanic::new().with_handler(|_| {
            tracing::error!("handler panicked");
            ApiError::Internal.as_response()
        }))
        .around(move |inner, req| front_door::answer(inner, req, Arc::clone(&context)));
    CrossOrigin::new(answered, cors)
        .around(move |inner, req| front_door::front_door(inner, req, Arc::clone(&door)))
}

/// Serves the public app on `acceptor`, and the ops endpoints on `admin`, until `stop()`
/// resolves and the grace period ends; only a listener that fails ends it sooner.
pub(crate) async fn serve<Stop: Future<Output = ()>>(
    acceptor: TcpAcceptor,
    admin: Option<TcpAcceptor>,
    state: AppState,
    documents: &Documents,
    config: &ServeConfig,
    stop: impl Fn() -> Stop,
) -> std::io::Result<()> {
    let grace = Some(config.shutdown_grace);
    let public = Server::new_with_acceptor(CappedAcceptor::new(
        acceptor,
        config.connections,
        front_door::refused_head_answer,
    ))
    .run_with_graceful_shutdown(build(state.clone(), documents, config), stop(), grace);
    let admin = async {
        let Some(admin) = admin else { return Ok(()) };
        Server::new_with_acceptor(admin)
            .run_with_graceful_shutdown(build_admin(state, config), stop(), grace)
            .await
    };
    tokio::try_join!(public, admin).map(drop)
}

/// `/` leads a browser to Swagger UI. In front of the router, because the operations
/// nested at `/` own that path there.
async fn root_to_docs<E: Endpoint>(next: Arc<E>, req: Request) -> poem::Result<Response> {
    if req.uri().path() != "/" {
        return next.call(req).await.map(IntoResponse::into_response);
    }
    // Named here, as the router names the routes it matched.
    let route = PathPattern("/".into());
    match *req.method() {
        Method::GET | Method::HEAD => {
            let mut response = Redirect::see_other("/docs").into_response();
            response.set_data(route);
            Ok(response)
        }
        _ => {
            let allow = "GET".into();
            let mut err = poem::Error::from(ApiError::MethodNotAllowed { allow });
            err.set_data(route);
            Err(err)
        }
    }
}
