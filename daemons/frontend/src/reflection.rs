//! Server reflection over a set of descriptors that grows: every service on the front-end's port, and the result
//! type of every filter, including a plugin loaded after the front-end started (a filter built while the tree
//! runs and opened with CreateStream). Its descriptors are registered before the stream opens, so grpcurl
//! prints its first result typed.
//!
//! tonic-reflection builds a service from a fixed set; [`LiveReflection`] keeps the latest one built and hands
//! each call to it, and [`Reflection::add_filter`] builds a new one when a filter brings files it did not have.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use prost::Message;
use prost_types::FileDescriptorSet;
use tonic::server::NamedService;
use tower_service::Service;

/// A service that answers with whichever reflection service was built last.
#[derive(Clone)]
pub struct LiveReflection<S> {
    current: Arc<RwLock<S>>,
}

impl<S> LiveReflection<S> {
    fn new(service: S) -> Self {
        Self {
            current: Arc::new(RwLock::new(service)),
        }
    }

    fn replace(&self, service: S) {
        *self.current.write().expect("reflection service") = service;
    }
}

impl<S, B> Service<http::Request<B>> for LiveReflection<S>
where
    S: Service<http::Request<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<S::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The generated reflection servers are always ready; the one that takes the call is picked in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let mut service = self.current.read().expect("reflection service").clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(req).await
        })
    }
}

impl<S: NamedService> NamedService for LiveReflection<S> {
    const NAME: &'static str = S::NAME;
}

/// Descriptors for reflection beyond Canopy's own: the files filters brought, each once.
#[derive(Default)]
struct Extra {
    seen: HashSet<String>,
    files: FileDescriptorSet,
}

impl Extra {
    /// Canopy's own files and health's are registered already: a filter that exports them adds nothing.
    fn new() -> Self {
        let own = FileDescriptorSet::decode(canopy_proto::FILE_DESCRIPTOR_SET).unwrap_or_default();
        let mut seen: HashSet<String> = own.file.iter().map(|f| f.name().to_string()).collect();
        seen.insert("grpc/health/v1/health.proto".into());
        Extra {
            seen,
            files: FileDescriptorSet::default(),
        }
    }

    /// Adds a filter's files; returns whether any was new.
    fn add(&mut self, filter: &str, descriptors: &[u8]) -> bool {
        let Ok(set) = FileDescriptorSet::decode(descriptors) else {
            tracing::warn!(filter = %filter, "the filter's descriptors do not decode; its results stay untyped");
            return false;
        };
        let mut added = false;
        for f in set.file {
            if self.seen.insert(f.name().to_string()) {
                self.files.file.push(f);
                added = true;
            }
        }
        added
    }
}

/// Server reflection (v1 and v1alpha) that learns the result types of filters as they load.
pub trait Reflection: Send + Sync {
    /// Registers the descriptors a filter exports; a filter whose files are all known changes nothing.
    fn add_filter(&self, filter: &str, descriptors: &[u8]) -> Result<(), tonic_reflection::server::Error>;
}

struct Registry<V1, V1Alpha> {
    extra: Mutex<Extra>,
    v1: LiveReflection<V1>,
    v1alpha: LiveReflection<V1Alpha>,
    build: fn(&FileDescriptorSet) -> Result<(V1, V1Alpha), tonic_reflection::server::Error>,
}

impl<V1: Send + Sync, V1Alpha: Send + Sync> Reflection for Registry<V1, V1Alpha> {
    fn add_filter(&self, filter: &str, descriptors: &[u8]) -> Result<(), tonic_reflection::server::Error> {
        let mut extra = self.extra.lock().expect("reflection descriptors");
        if !extra.add(filter, descriptors) {
            return Ok(());
        }
        let (v1, v1alpha) = (self.build)(&extra.files)?;
        self.v1.replace(v1);
        self.v1alpha.replace(v1alpha);
        tracing::info!(filter = %filter, "the filter's result types are registered for reflection");
        Ok(())
    }
}

/// Canopy's own files, health's, and the filters' (decoded, so the builder borrows nothing).
fn builder(extra: FileDescriptorSet) -> tonic_reflection::server::Builder<'static> {
    let b = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(canopy_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    if extra.file.is_empty() {
        b
    } else {
        b.register_file_descriptor_set(extra)
    }
}

fn build(
    extra: &FileDescriptorSet,
) -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection + use<>,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection + use<>,
        >,
    ),
    tonic_reflection::server::Error,
> {
    Ok((
        builder(extra.clone()).build_v1()?,
        builder(extra.clone()).build_v1alpha()?,
    ))
}

/// The reflection services to serve, and the handle that grows them. `filters` are the filters known at start
/// (name and exported descriptors).
#[allow(clippy::type_complexity)]
pub fn services(
    filters: &[(String, Vec<u8>)],
) -> Result<
    (
        Arc<dyn Reflection>,
        LiveReflection<
            tonic_reflection::server::v1::ServerReflectionServer<
                impl tonic_reflection::server::v1::ServerReflection,
            >,
        >,
        LiveReflection<
            tonic_reflection::server::v1alpha::ServerReflectionServer<
                impl tonic_reflection::server::v1alpha::ServerReflection,
            >,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let mut extra = Extra::new();
    for (name, descriptors) in filters {
        extra.add(name, descriptors);
    }
    let (v1, v1alpha) = build(&extra.files)?;
    let (v1, v1alpha) = (LiveReflection::new(v1), LiveReflection::new(v1alpha));
    let registry = Registry {
        extra: Mutex::new(extra),
        v1: v1.clone(),
        v1alpha: v1alpha.clone(),
        build,
    };
    Ok((Arc::new(registry), v1, v1alpha))
}
