use serde_json::json;
use trainyard_contracts::worker::ProgressReported;
use trainyard_contracts::{ContractError, EntityRef, Envelope, Incoming, Payload, catalog, decode};

fn progress() -> Envelope<ProgressReported> {
    Envelope::new(
        "test",
        EntityRef::new("ml", "bert", "uid-1"),
        ProgressReported {
            worker_index: 0,
            attempt: 0,
            epoch: 3,
            total_epochs: Some(10),
            step: 300,
            metrics: [("loss".to_string(), 0.5)].into(),
        },
    )
}

#[test]
fn envelope_round_trips_with_all_metadata() {
    let sent = progress();
    assert_eq!(sent.id.get_version_num(), 7, "ids are UUID v7");
    let back: Envelope<ProgressReported> =
        decode(&sent.to_json().expect("encodes")).expect("decodes");
    assert_eq!(back, sent);
    assert_eq!(back.subject(), "trainyard.worker.progress.ml.bert");
}

#[test]
fn caused_by_keeps_the_correlation_chain() {
    let first = progress();
    let second = progress().caused_by(&first);
    let third = progress().caused_by(&second);
    assert_eq!(third.correlation_id, first.id);
    assert_eq!(third.causation_id, Some(second.id));
}

#[test]
fn unknown_fields_are_tolerated() {
    let mut value = serde_json::to_value(progress()).expect("encodes");
    value["futureHeader"] = json!("x");
    value["payload"]["futurePayloadField"] = json!({"nested": true});
    let bytes = serde_json::to_vec(&value).expect("encodes");
    let back: Envelope<ProgressReported> = decode(&bytes).expect("unknown fields are ignored");
    assert_eq!(back.payload.epoch, 3);
}

#[test]
fn unknown_version_is_rejected_with_a_clear_error() {
    let mut value = serde_json::to_value(progress()).expect("encodes");
    value["schemaVersion"] = json!(2);
    let bytes = serde_json::to_vec(&value).expect("encodes");
    let err = decode::<ProgressReported>(&bytes).expect_err("version 2 is unknown");
    assert!(matches!(
        err,
        ContractError::UnsupportedVersion {
            found: 2,
            supported: 1,
            ..
        }
    ));
    let text = err.to_string();
    assert!(
        text.contains("worker.progress") && text.contains("schemaVersion 2"),
        "{text}"
    );
}

#[test]
fn malformed_bytes_and_wrong_types_are_errors_not_panics() {
    for bytes in [
        &b"not json"[..],
        b"{}",
        b"[1,2]",
        b"{\"id\":\"nope\"}",
        &[0xff, 0xfe],
    ] {
        let err = Incoming::decode(bytes).expect_err("malformed");
        assert_eq!(err.category(), "malformed");
    }
    let incoming = Incoming::decode(&progress().to_json().expect("encodes")).expect("decodes");
    let err = incoming
        .payload::<trainyard_contracts::worker::CheckpointReported>()
        .expect_err("a progress report is not a checkpoint report");
    assert_eq!(err.category(), "wrong_type");

    let mut value = serde_json::to_value(progress()).expect("encodes");
    value["payload"]["epoch"] = json!("three");
    let err = decode::<ProgressReported>(&serde_json::to_vec(&value).expect("encodes"))
        .expect_err("bad field");
    assert_eq!(err.category(), "invalid_payload");
}

#[test]
fn every_catalog_example_decodes_as_its_type() {
    let entries = catalog::all().expect("every example matches its type");
    assert_eq!(entries.len(), 39);
    let mut types: Vec<&str> = entries.iter().map(|e| e.message_type).collect();
    types.sort();
    types.dedup();
    assert_eq!(types.len(), entries.len(), "message types are unique");
    for entry in &entries {
        let bytes = serde_json::to_vec(&entry.example).expect("encodes");
        let incoming = Incoming::decode(&bytes).expect("decodes");
        assert_eq!(incoming.header.message_type, entry.message_type);
        assert!(entry.subject.starts_with("trainyard."), "{}", entry.subject);
    }
    assert_eq!(ProgressReported::TYPE, "worker.progress");
}

#[test]
fn message_reference_page_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/messages.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = catalog::markdown().expect("renders");
    assert!(
        committed == generated,
        "docs/messages.md is out of date: run `cargo run -p trainyard-contracts --bin messages-doc`"
    );
}

/// The Python worker library's encoding of non-finite metrics (sdk/python's golden
/// file, which its own tests compare with what it writes): NaN left out, ±Infinity
/// as ±f64::MAX, a plain JSON number every service decodes.
#[test]
fn python_library_envelope_with_non_finite_metrics_decodes() {
    let golden = include_str!("../../../sdk/python/tests/golden/worker-progress-non-finite.json");
    let envelope: Envelope<ProgressReported> = decode(golden.as_bytes()).expect("decodes");
    assert_eq!(envelope.payload.metrics.get("grad_norm"), Some(&f64::MAX));
    assert_eq!(envelope.payload.metrics.get("neg"), Some(&f64::MIN));
    assert!(!envelope.payload.metrics.contains_key("loss"));
    assert_eq!(envelope.subject(), "trainyard.worker.progress.ml.bert");
    // What `json.dumps` writes by default, and why the library does not.
    let nan = golden.replace("1.7976931348623157e+308", "NaN");
    assert!(decode::<ProgressReported>(nan.as_bytes()).is_err());
}

/// Python's `json.dumps` writes NaN and Infinity as bare literals, which are
/// not JSON: such a worker report is read (the literals as non-finite
/// metrics), not dead-lettered, and nothing else in it is lost.
#[test]
fn a_report_with_bare_nan_and_infinity_is_read_with_everything_else_in_it() {
    let mut sent = progress();
    sent.payload.metrics = [
        ("accuracy".to_string(), 0.5),
        ("grad_norm".to_string(), 1.0),
        ("loss".to_string(), 2.0),
        ("lr".to_string(), 3.0),
    ]
    .into();
    let text = String::from_utf8(sent.to_json().expect("encodes"))
        .expect("utf-8")
        .replace("\"grad_norm\":1.0", "\"grad_norm\":Infinity")
        .replace("\"loss\":2.0", "\"loss\":NaN")
        .replace("\"lr\":3.0", "\"lr\":-Infinity");
    assert!(text.contains(":NaN"), "{text}");
    let back: Envelope<ProgressReported> =
        decode(text.as_bytes()).expect("read, not dead-lettered");
    let report = back.payload;
    assert_eq!((report.epoch, report.step), (3, 300));
    assert!(report.metrics["loss"].is_nan());
    assert_eq!(report.metrics["grad_norm"], f64::INFINITY);
    assert_eq!(report.metrics["lr"], f64::NEG_INFINITY);
    assert_eq!(report.metrics["accuracy"], 0.5);
    assert_eq!(back.id, sent.id);
}
