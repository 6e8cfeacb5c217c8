//! The HTTP endpoint a daemon serves with `metrics_listen`: `GET /metrics`, the node's figures in the
//! OpenMetrics text format Prometheus scrapes, and `GET /health`, 200 while the node serves and 503 once it has
//! finished or is draining. Read-only: a scrape renders the node's latest snapshot and changes nothing.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

/// The content type of the OpenMetrics text format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoint serves: the metrics text of the moment, and whether the node serves.
#[derive(Clone)]
pub struct Exporter {
    pub render: Arc<dyn Fn() -> String + Send + Sync>,
    pub healthy: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Exporter {
    fn router(self) -> Router {
        let metrics = {
            let render = self.render.clone();
            move || {
                let render = render.clone();
                async move { ([(header::CONTENT_TYPE, OPENMETRICS)], render()) }
            }
        };
        let health = {
            let healthy = self.healthy.clone();
            move || {
                let healthy = healthy.clone();
                async move {
                    if healthy() {
                        (StatusCode::OK, "serving\n").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not serving\n").into_response()
                    }
                }
            }
        };
        Router::new()
            .route("/metrics", get(metrics))
            .route("/health", get(health))
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_rendered_text_and_the_health_of_the_moment() {
        let healthy = Arc::new(AtomicBool::new(true));
        let exporter = Exporter {
            render: Arc::new(|| "canopy_up 1\n# EOF\n".to_string()),
            healthy: {
                let h = healthy.clone();
                Arc::new(move || h.load(Ordering::Relaxed))
            },
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(exporter.serve(listener, async {
            let _ = stopped.await;
        }));
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains(OPENMETRICS), "{metrics}");
        assert!(metrics.ends_with("canopy_up 1\n# EOF\n"), "{metrics}");
        assert!(get(addr, "/health").await.starts_with("HTTP/1.1 200"));
        healthy.store(false, Ordering::Relaxed);
        let health = get(addr, "/health").await;
        assert!(
            health.starts_with("HTTP/1.1 503") && health.ends_with("not serving\n"),
            "{health}"
        );
        assert!(get(addr, "/nothing").await.starts_with("HTTP/1.1 404"));
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
