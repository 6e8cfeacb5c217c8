//! The kmeans filter's results as tables: clusters with their representatives and spreads, their ranks as
//! ranges (and a row per rank through `cluster_members`), their centroids per dimension with event names, and
//! every k's fit.

use canopy_proto::filters::v1::{KmeansCluster, KmeansFit, KmeansResult, Metric, RankRange, RankRef};
use canopy_store::{ClusterRow, Select, Store, StoreError, StoreReader};
use prost::Message;
use rusqlite::Connection;

fn result() -> KmeansResult {
    let range = |first, last| RankRange {
        app: "sim".into(),
        first,
        last,
    };
    KmeansResult {
        k: 2,
        clusters: vec![
            KmeansCluster {
                cluster: 0,
                size: 4,
                ranks: vec![range(0, 2), range(5, 5)],
                representative: Some(RankRef {
                    app: "sim".into(),
                    rank: 1,
                }),
                centroid: vec![1.5, 2.5],
                rms: 0.5,
                max_distance: 1.0,
                sum_squares: 1.0,
            },
            KmeansCluster {
                cluster: 1,
                centroid: vec![9.0, 9.0],
                ..Default::default()
            },
        ],
        fit: 1.0,
        iterations: 3,
        converged: true,
        refit: true,
        fits: vec![
            KmeansFit {
                k: 1,
                fit: 40.0,
                iterations: 2,
                converged: true,
            },
            KmeansFit {
                k: 2,
                fit: 1.0,
                iterations: 3,
                converged: true,
            },
        ],
        dims: vec![7, 11],
        lo: vec![0.0, 0.0],
        hi: vec![3.0, 4.0],
        names: vec!["solve".into(), String::new()],
        ranks: 4,
        metric: Metric::Exclusive as i32,
        scheme: "all".into(),
    }
}

#[test]
fn a_kmeans_result_becomes_clusters_ranks_centroids_and_fits() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::create(dir.path()).unwrap();
    store.put_names(&[(7, "solve".to_string())]).unwrap();
    store
        .write_filter_tables(
            2,
            5,
            "canopy.filters.v1.KmeansResult",
            &result().encode_to_vec(),
            false,
        )
        .unwrap();
    let reader = StoreReader::open(store.path()).unwrap();
    let rows = reader.clusters(Select::all()).unwrap();
    assert_eq!(
        rows,
        [
            ClusterRow {
                stream_id: 2,
                round: 5,
                cluster: 0,
                size: 4,
                ranks: "sim:0-2,5".into(),
                representative_app: Some("sim".into()),
                representative_rank: Some(1),
                rms: 0.5,
                max_distance: 1.0,
                sum_squares: 1.0,
                late: false,
            },
            ClusterRow {
                stream_id: 2,
                round: 5,
                cluster: 1,
                size: 0,
                ranks: String::new(),
                representative_app: None,
                representative_rank: None,
                rms: 0.0,
                max_distance: 0.0,
                sum_squares: 0.0,
                late: false,
            },
        ]
    );
    let conn = Connection::open(store.path()).unwrap();
    let strings = |sql: &str| -> Vec<String> {
        let mut st = conn.prepare(sql).unwrap();
        st.query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(
        strings("SELECT cluster || ' ' || app || ':' || rank FROM cluster_members ORDER BY cluster, rank"),
        ["0 sim:0", "0 sim:1", "0 sim:2", "0 sim:5"]
    );
    assert_eq!(
        strings(
            "SELECT cluster || ' ' || event || ' ' || metric || ' ' || unit || ' ' || value
             FROM cluster_centroids_named ORDER BY cluster, event_id"
        ),
        [
            "0 solve exclusive us 1.5",
            "0 000000000000000b exclusive us 2.5",
            "1 solve exclusive us 9.0",
            "1 000000000000000b exclusive us 9.0"
        ]
    );
    assert_eq!(
        strings(
            "SELECT k || ' ' || fit || ' ' || iterations || ' ' || converged || ' ' || chosen || ' ' || refit FROM kmeans_fits ORDER BY k"
        ),
        ["1 40.0 2 1 0 1", "2 1.0 3 1 1 1"]
    );
    // A cluster whose centroid does not span the dimensions is refused whole, naming it.
    let mut torn = result();
    torn.clusters[1].centroid.pop();
    let err = store
        .write_filter_tables(
            2,
            6,
            "canopy.filters.v1.KmeansResult",
            &torn.encode_to_vec(),
            false,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Invalid {
                what: "KmeansResult",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .ends_with("cluster 1 has 1 centroid values for 2 dimensions"),
        "{err}"
    );
}
