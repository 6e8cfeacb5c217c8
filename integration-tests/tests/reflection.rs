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
        streams: vec!["stats".into(), "classify".into()],
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

    // `grpcurl -d '{"streamNames": ["stats", "classify"]}' localhost:7400 canopy.v1.Frontend/Subscribe`
    let subscribe = methods.iter().find(|m| m.name() == "Subscribe").unwrap().clone();
    let mut de = serde_json::Deserializer::from_str(r#"{"streamNames": ["stats", "classify"]}"#);
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
    while seen.len() < 2 {
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
            }
            other => panic!("unexpected filter {other}"),
        }
        seen.insert(filter);
    }
}
