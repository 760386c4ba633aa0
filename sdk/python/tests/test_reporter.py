from __future__ import annotations

import json
import math
import sys
import time

from conftest import NatsServer, make_certificates, wait_for

from trainyard import Reporter, WorkerEnv, read_checkpoint
from trainyard.messages import finite_metrics


def env_for(server: NatsServer, **overrides: object) -> WorkerEnv:
    fields = dict(
        namespace="ml.team",
        job="bert.v2",
        attempt=2,
        worker_index=0,
        num_workers=1,
        nats_url=server.url,
        epochs=3,
    )
    fields.update(overrides)
    return WorkerEnv(**fields)  # type: ignore[arg-type]


def test_progress_reaches_the_worker_stream_as_a_valid_envelope(nats_server: NatsServer) -> None:
    with Reporter(env_for(nats_server), gpu_metrics=False) as reporter:
        reporter.progress(1, step=100, metrics={"loss": 0.5, "accuracy": 0.75})
        assert reporter.flush(10)

    [report] = nats_server.stored_reports()
    assert report["type"] == "worker.progress"
    assert report["schemaVersion"] == 1
    assert report["entity"] == {"namespace": "ml.team", "name": "bert.v2", "uid": ""}
    assert report["source"] == "worker-0"
    assert report["id"][14] == "7", "envelope ids are UUID v7"
    assert report["payload"] == {
        "workerIndex": 0,
        "attempt": 2,
        "epoch": 1,
        "step": 100,
        "totalEpochs": 3,
        "metrics": {"loss": 0.5, "accuracy": 0.75},
    }


def test_a_worker_connects_with_its_job_token_when_the_server_requires_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = NatsServer(tmp_path / "jetstream", token="token-of-bert")
    server.start()
    try:
        server.provision_worker_stream()
        with Reporter(env_for(server, nats_token="token-of-bert"), gpu_metrics=False) as reporter:
            reporter.progress(1, step=100, metrics={"loss": 0.5})
            assert reporter.flush(10)
        assert [r["payload"]["epoch"] for r in server.stored_reports()] == [1]

        # Without the token the server refuses the worker and nothing arrives.
        refused = Reporter(env_for(server), gpu_metrics=False, publish_timeout=0.5)
        refused.progress(2, step=200, metrics={"loss": 0.4})
        assert not refused.flush(2)
        refused.close(1)
        assert [r["payload"]["epoch"] for r in server.stored_reports()] == [1]
    finally:
        server.stop()


def test_a_worker_verifies_a_tls_server_with_the_ca_file_it_is_given(tmp_path) -> None:  # type: ignore[no-untyped-def]
    certificates = make_certificates(tmp_path / "tls")
    server = NatsServer(tmp_path / "jetstream", token="token-of-bert", certificates=certificates)
    server.start()
    try:
        server.provision_worker_stream()
        assert server.url.startswith("tls://")
        env = env_for(
            server, nats_token="token-of-bert", nats_ca_file=str(certificates / "ca.crt")
        )
        with Reporter(env, gpu_metrics=False) as reporter:
            reporter.progress(1, step=100, metrics={"loss": 0.5})
            assert reporter.flush(10)
        assert [r["payload"]["epoch"] for r in server.stored_reports()] == [1]

        # Without the installation's CA the server's certificate is not trusted
        # and nothing arrives; nor with a CA file that is none.
        not_a_ca = tmp_path / "not-a-ca.crt"
        not_a_ca.write_text("token-of-bert")
        for ca_file in (None, str(not_a_ca)):
            refused = Reporter(
                env_for(server, nats_token="token-of-bert", nats_ca_file=ca_file),
                gpu_metrics=False,
                publish_timeout=0.5,
            )
            refused.progress(2, step=200, metrics={"loss": 0.4})
            assert not refused.flush(2)
            refused.close(1)
        assert [r["payload"]["epoch"] for r in server.stored_reports()] == [1]
    finally:
        server.stop()


def test_non_finite_metrics_are_encoded_as_json_numbers(nats_server: NatsServer) -> None:
    with Reporter(env_for(nats_server), gpu_metrics=False) as reporter:
        reporter.progress(
            1, metrics={"loss": float("nan"), "grad_norm": float("inf"), "lr": -math.inf, "ok": 1}
        )
        assert reporter.flush(10)

    [report] = nats_server.stored_reports()
    assert report["payload"]["metrics"] == {
        "grad_norm": sys.float_info.max,
        "lr": -sys.float_info.max,
        "ok": 1.0,
    }


def test_finite_metrics_accepts_numeric_scalars_and_names_what_it_drops() -> None:
    class Scalar:  # a NumPy scalar or a CPU tensor converts the same way
        def __float__(self) -> float:
            return 0.25

    accepted, dropped = finite_metrics({"a": Scalar(), "b": True, "c": "text", "d": math.nan})
    assert accepted == {"a": 0.25, "b": 1.0}
    assert sorted(dropped) == ["c", "d"]


def test_subject_tokens_replace_dots_in_names(nats_server: NatsServer) -> None:
    seen = []

    async def capture() -> None:
        import nats

        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        sub = await js.subscribe("trainyard.worker.>")
        msg = await sub.next_msg(timeout=10)
        seen.append(msg.subject)
        await nc.close()

    with Reporter(env_for(nats_server), gpu_metrics=False) as reporter:
        reporter.progress(1)
        assert reporter.flush(10)
        nats_server.run(capture())
    assert seen == ["trainyard.worker.progress.ml_team.bert_v2"]


def test_a_nats_outage_does_not_stop_training_and_reports_arrive_after_reconnect(
    nats_server: NatsServer,
) -> None:
    reporter = Reporter(env_for(nats_server, epochs=20), gpu_metrics=False, publish_timeout=0.5)
    reporter.progress(1, metrics={"loss": 1.0})
    assert reporter.flush(10)

    nats_server.stop()
    started = time.monotonic()
    for epoch in range(2, 12):
        reporter.progress(epoch, metrics={"loss": 1.0 / epoch})
    # Reporting during the outage returned at once: training went on.
    assert time.monotonic() - started < 1.0
    time.sleep(1.0)
    assert reporter.stats.pending == 10

    nats_server.start()
    assert reporter.flush(30), reporter.stats
    reporter.close()

    epochs = [r["payload"]["epoch"] for r in nats_server.stored_reports()]
    assert epochs == list(range(1, 12)), "every report stored once, in order"
    assert reporter.stats.dropped == 0


def test_a_reporter_started_while_nats_is_down_delivers_once_it_is_up(
    nats_server: NatsServer,
) -> None:
    nats_server.stop()
    reporter = Reporter(env_for(nats_server), gpu_metrics=False, publish_timeout=0.5)
    reporter.progress(1)
    time.sleep(0.5)
    nats_server.start()
    assert reporter.flush(30), reporter.stats
    reporter.close()
    assert [r["payload"]["epoch"] for r in nats_server.stored_reports()] == [1]


def test_a_full_buffer_drops_the_oldest_progress_and_keeps_checkpoints(
    nats_server: NatsServer, caplog
) -> None:  # type: ignore[no-untyped-def]
    nats_server.stop()
    reporter = Reporter(
        env_for(nats_server), gpu_metrics=False, buffer_size=3, publish_timeout=0.5
    )
    reporter.report_checkpoint("/ckpt/checkpoint-epoch-1", epoch=1)
    for epoch in range(1, 6):
        reporter.progress(epoch)
    assert reporter.stats.dropped == 3
    assert "report buffer full" in caplog.text

    nats_server.start()
    assert reporter.flush(30), reporter.stats
    reporter.close()
    stored = [(r["type"], r["payload"]["epoch"]) for r in nats_server.stored_reports()]
    assert stored == [("worker.checkpoint", 1), ("worker.progress", 4), ("worker.progress", 5)]


def test_close_gives_up_after_its_timeout_while_nats_is_down(nats_server: NatsServer) -> None:
    nats_server.stop()
    reporter = Reporter(env_for(nats_server), gpu_metrics=False, publish_timeout=0.5)
    reporter.progress(1)
    started = time.monotonic()
    reporter.close(timeout=1.0)
    assert time.monotonic() - started < 5.0
    assert reporter.stats.pending == 1


def test_commands_set_stop_and_checkpoint_requests(nats_server: NatsServer) -> None:
    with Reporter(
        env_for(nats_server, checkpoint_dir="/unused", checkpoint_frequency=5), gpu_metrics=False
    ) as reporter:
        assert reporter.wait_connected(10)
        assert not reporter.checkpoint_due(1)
        nats_server.publish(
            "trainyard.commands.checkpoint-now.ml_team.bert_v2",
            {"reason": "spot reclaim", "deadline": "2026-01-01T00:00:00Z"},
        )
        assert wait_for(lambda: reporter.checkpoint_due(1))
        nats_server.publish("trainyard.commands.stop.ml_team.other", {"reason": "not ours"})
        nats_server.publish("trainyard.commands.stop.ml_team.bert_v2", {"reason": "early stop"})
        assert wait_for(lambda: reporter.stop_requested)
        assert reporter.stop_reason == "early stop"


def test_frequency_auto_follows_the_advised_interval_from_env_then_from_commands(
    nats_server: NatsServer, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    env = env_for(
        nats_server,
        checkpoint_dir=str(tmp_path),
        checkpoint_auto=True,
        checkpoint_interval_seconds=600.0,
    )
    with Reporter(env, gpu_metrics=False) as reporter:
        assert reporter.wait_connected(10)
        start = time.monotonic()
        assert reporter.checkpoint_interval_seconds == 600.0
        assert not reporter.checkpoint_due(1, now=start + 599)
        assert reporter.checkpoint_due(1, now=start + 601)
        nats_server.publish(
            "trainyard.commands.checkpoint-interval.ml_team.bert_v2", {"intervalSeconds": 120.0}
        )
        assert wait_for(lambda: reporter.checkpoint_interval_seconds == 120.0)
        assert reporter.checkpoint_due(1, now=start + 121)
        with reporter.checkpoint(1, step=100) as ckpt:
            ckpt.write_json("state.json", {"w": 1})
        saved_at = time.monotonic()
        assert not reporter.checkpoint_due(2, now=saved_at + 60), "the interval restarts at a save"
        assert reporter.checkpoint_due(2, now=saved_at + 121)
        nats_server.publish(
            "trainyard.commands.checkpoint-interval.ml_team.bert_v2", {"intervalSeconds": -1}
        )
        nats_server.publish(
            "trainyard.commands.checkpoint-interval.ml_team.other", {"intervalSeconds": 5.0}
        )
        nats_server.publish("trainyard.commands.stop.ml_team.bert_v2", {"reason": "done"})
        assert wait_for(lambda: reporter.stop_requested)
        assert reporter.checkpoint_interval_seconds == 120.0, "bad or foreign advice is ignored"


def test_frequency_auto_without_advice_checkpoints_every_epoch(nats_server: NatsServer) -> None:
    env = env_for(nats_server, checkpoint_dir="/unused", checkpoint_auto=True)
    with Reporter(env, gpu_metrics=False) as reporter:
        assert reporter.checkpoint_interval_seconds is None
        assert reporter.checkpoint_due(1) and reporter.checkpoint_due(2)


def test_checkpoint_is_saved_atomically_with_its_manifest_and_reported(
    nats_server: NatsServer, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    env = env_for(nats_server, checkpoint_dir=str(tmp_path), checkpoint_frequency=2)
    with Reporter(env, gpu_metrics=False) as reporter:
        assert reporter.checkpoint_due(2) and not reporter.checkpoint_due(3)
        with reporter.checkpoint(2, step=200, metrics={"loss": 0.1}) as ckpt:
            ckpt.write_json("state.json", {"w": 1.5})
            ckpt.write_bytes("weights/layer0.bin", b"\x00" * 1000)
        assert reporter.flush(10)

    directory = tmp_path / "checkpoint-epoch-2"
    manifest = json.loads((directory / "trainyard-manifest.json").read_text())
    assert manifest["format"] == "trainyard.checkpoint/v1"
    assert (manifest["epoch"], manifest["step"]) == (2, 200)
    assert [f["path"] for f in manifest["files"]] == ["state.json", "weights/layer0.bin"]
    assert read_checkpoint(directory).files[1].size_bytes == 1000

    [report] = nats_server.stored_reports()
    payload = report["payload"]
    assert report["type"] == "worker.checkpoint"
    assert payload["uri"] == str(directory)
    assert (payload["epoch"], payload["step"], payload["metrics"]) == (2, 200, {"loss": 0.1})
    assert payload["sizeBytes"] == sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    assert len(payload["sha256"]) == 64 and payload["saveSeconds"] >= 0
