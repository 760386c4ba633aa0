"""`Reporter`: progress, metrics and checkpoints to Trainyard, without ever stopping training.

Reports are encoded in the caller's thread and queued; a background thread owns the
NATS connection and publishes them to JetStream in order, each with its message id as
`Nats-Msg-Id`, so a publish retried after a lost acknowledgement is stored once. While
NATS is unreachable reports wait in a bounded buffer and are retried with backoff;
when the buffer is full the oldest progress report is dropped (checkpoint reports are
kept) with a warning. No method called from the training loop raises because of NATS.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import math
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Deque, Dict, Iterator, Mapping, Optional

from .checkpoint import CheckpointError, CheckpointWriter, SavedCheckpoint
from .env import WorkerEnv
from .gpu import GpuSampler
from .messages import (
    CHECKPOINT,
    PROGRESS,
    Report,
    build_report,
    command_filter,
    finite_metrics,
    worker_inbox_prefix,
)

log = logging.getLogger("trainyard")

_WARN_EVERY_SECONDS = 30.0
_MAX_BACKOFF_SECONDS = 5.0


@dataclass(frozen=True)
class ReporterStats:
    delivered: int
    dropped: int
    pending: int


class _Throttle:
    """Logs one warning per key every `_WARN_EVERY_SECONDS`: an outage of an hour is a
    few lines in the training log, not thousands."""

    def __init__(self) -> None:
        self._last: Dict[str, float] = {}

    def warn(self, key: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -_WARN_EVERY_SECONDS) >= _WARN_EVERY_SECONDS:
            self._last[key] = now
            log.warning(message, *args)


class Reporter:
    """Reports one worker's training to Trainyard.

    ```python
    import trainyard

    with trainyard.Reporter() as reporter:
        for epoch in range(1, reporter.env.epochs + 1):
            loss = train_one_epoch()
            reporter.progress(epoch, metrics={"loss": loss})
    ```

    Everything is read from the environment the planner sets (see `WorkerEnv`).
    Commands to the job arrive in the background: `stop_requested` turns true on a
    stop, `checkpoint_due(epoch)` on a checkpoint-now request, and with
    `checkpoint.frequency: auto` the advised interval follows each
    checkpoint-interval command.
    """

    def __init__(
        self,
        env: Optional[WorkerEnv] = None,
        *,
        buffer_size: int = 1024,
        gpu_metrics: bool = True,
        publish_timeout: float = 5.0,
    ) -> None:
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.env = env if env is not None else WorkerEnv.from_environ()
        self._buffer_size = buffer_size
        self._publish_timeout = publish_timeout
        self._gpu = GpuSampler() if gpu_metrics else None
        self._source = f"worker-{self.env.worker_index}"
        self._buffer: Deque[Report] = deque()
        self._changed = threading.Condition()
        self._delivered = 0
        self._dropped = 0
        self._closing = False
        self._close_deadline = 0.0
        self._stop = threading.Event()
        self._stop_reason: Optional[str] = None
        self._checkpoint_now = threading.Event()
        self._interval_seconds: Optional[float] = self.env.checkpoint_interval_seconds
        self._last_checkpoint_at = time.monotonic()
        self._throttle = _Throttle()
        self._loop = asyncio.new_event_loop()
        self._wake: Optional[asyncio.Event] = None
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainyard-reporter", daemon=True)
        self._thread.start()
        atexit.register(self._close_at_exit)

    # --- what the training loop calls -------------------------------------------------

    def progress(
        self,
        epoch: int,
        *,
        step: int = 0,
        metrics: Optional[Mapping[str, Any]] = None,
        total_epochs: Optional[int] = None,
    ) -> None:
        """Reports the epochs completed so far and their metrics (GPU utilisation added
        when a GPU is visible). Returns at once."""
        values = dict(self._gpu.sample()) if self._gpu is not None else {}
        values.update(metrics or {})
        payload: Dict[str, Any] = {
            "workerIndex": self.env.worker_index,
            "attempt": self.env.attempt,
            "epoch": int(epoch),
            "step": int(step),
            "metrics": self._metrics(values),
        }
        total = total_epochs if total_epochs is not None else self.env.epochs
        if total is not None:
            payload["totalEpochs"] = int(total)
        self._enqueue(PROGRESS, payload)

    def report_checkpoint(
        self,
        uri: str,
        *,
        epoch: int,
        step: int = 0,
        size_bytes: int = 0,
        metrics: Optional[Mapping[str, Any]] = None,
        sha256: Optional[str] = None,
        save_seconds: Optional[float] = None,
    ) -> None:
        """Reports a checkpoint written elsewhere (an object store, a framework's saver)."""
        payload: Dict[str, Any] = {
            "workerIndex": self.env.worker_index,
            "attempt": self.env.attempt,
            "epoch": int(epoch),
            "step": int(step),
            "uri": uri,
            "sizeBytes": int(size_bytes),
            "metrics": self._metrics(metrics),
        }
        if sha256 is not None:
            payload["sha256"] = sha256
        if save_seconds is not None:
            payload["saveSeconds"] = round(float(save_seconds), 6)
        self._enqueue(CHECKPOINT, payload)
        self._checkpoint_now.clear()
        self._last_checkpoint_at = time.monotonic()

    def report_saved(self, saved: SavedCheckpoint) -> None:
        """Reports a checkpoint saved with `CheckpointWriter` or `seal_checkpoint`."""
        self.report_checkpoint(
            saved.uri,
            epoch=saved.epoch,
            step=saved.step,
            size_bytes=saved.size_bytes,
            metrics=saved.metrics,
            sha256=saved.sha256,
            save_seconds=saved.save_seconds,
        )

    @contextlib.contextmanager
    def checkpoint(
        self,
        epoch: int,
        *,
        step: int = 0,
        metrics: Optional[Mapping[str, Any]] = None,
    ) -> Iterator[CheckpointWriter]:
        """Saves `CHECKPOINT_DIR/checkpoint-epoch-<epoch>` atomically, then reports it.

        ```python
        if reporter.checkpoint_due(epoch):
            with reporter.checkpoint(epoch, step=step, metrics=metrics) as ckpt:
                torch.save(model.state_dict(), ckpt.file("model.pt"))
        ```
        """
        writer = CheckpointWriter(self.checkpoint_path(epoch), epoch=epoch, step=step, metrics=metrics)
        with writer:
            yield writer
        self.report_saved(writer.saved)

    def checkpoint_path(self, epoch: int) -> Path:
        if not self.env.checkpoint_dir:
            raise CheckpointError(
                "CHECKPOINT_DIR is not set: enable spec.checkpoint on the TrainingJob "
                "(or set CHECKPOINT_DIR when running outside Trainyard)"
            )
        return Path(self.env.checkpoint_dir) / f"checkpoint-epoch-{int(epoch)}"

    def checkpoint_due(self, epoch: int, *, now: Optional[float] = None) -> bool:
        """True on the chief when a checkpoint is configured and a checkpoint-now
        command arrived, or: with `checkpoint.frequency: auto` and advice, the advised
        interval has passed since the last reported checkpoint (or the start; `now` is
        a `time.monotonic()` reading, the current one by default), so it may be asked
        every step; otherwise the epoch is a multiple of `CHECKPOINT_FREQUENCY`
        (every epoch with `auto` until the first advice)."""
        if not (self.env.is_chief and self.env.checkpoint_dir):
            return False
        if self._checkpoint_now.is_set():
            return True
        interval = self._interval_seconds
        if self.env.checkpoint_auto and interval is not None:
            at = time.monotonic() if now is None else now
            return at - self._last_checkpoint_at >= interval
        return epoch % self.env.checkpoint_frequency == 0

    @property
    def checkpoint_interval_seconds(self) -> Optional[float]:
        """The checkpoint-manager's latest advised seconds between saves, when known."""
        return self._interval_seconds

    @property
    def checkpoint_requested(self) -> bool:
        """A checkpoint-now command arrived and no checkpoint was reported since."""
        return self._checkpoint_now.is_set()

    @property
    def stop_requested(self) -> bool:
        """A stop command arrived (early stop, success policy met, user request)."""
        return self._stop.is_set()

    @property
    def stop_reason(self) -> Optional[str]:
        return self._stop_reason

    @property
    def resume_from(self) -> Optional[str]:
        """The checkpoint this start resumes from (`RESUME_FROM`), if any."""
        return self.env.resume_from

    @property
    def stats(self) -> ReporterStats:
        with self._changed:
            return ReporterStats(self._delivered, self._dropped, len(self._buffer))

    def wait_connected(self, timeout: float) -> bool:
        """True once the connection to NATS is up (commands can arrive from then on)."""
        return self._connected.wait(timeout)

    def flush(self, timeout: float = 10.0) -> bool:
        """Waits until every queued report is stored; False if some are still queued."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._changed.wait(remaining)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Delivers what is queued (for up to `timeout` seconds) and disconnects."""
        with self._changed:
            if self._closing:
                return
            self._closing = True
            self._close_deadline = time.monotonic() + timeout
        atexit.unregister(self._close_at_exit)
        self._wake_up()
        self._thread.join(timeout + self._publish_timeout + 1.0)
        pending = self.stats.pending
        if pending:
            log.warning("trainyard: %d report(s) not delivered before close", pending)

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------

    def _close_at_exit(self) -> None:
        self.close(timeout=5.0)

    def _metrics(self, metrics: Optional[Mapping[str, Any]]) -> Dict[str, float]:
        accepted, dropped = finite_metrics(metrics)
        for name in dropped:
            self._throttle.warn(
                f"metric:{name}", "trainyard: metric %r is NaN or not a number; not reported", name
            )
        return accepted

    def _enqueue(self, message_type: str, payload: Mapping[str, Any]) -> None:
        try:
            report = build_report(
                message_type, self.env.namespace, self.env.job, self._source, payload
            )
        except (TypeError, ValueError) as error:
            self._throttle.warn("encode", "trainyard: report not encodable, dropped: %s", error)
            return
        with self._changed:
            if self._closing:
                self._throttle.warn("closed", "trainyard: reporter closed; report dropped")
                return
            if len(self._buffer) >= self._buffer_size:
                # The head may be in flight: never drop it, its delivery is under way.
                victim = next(
                    (r for i, r in enumerate(self._buffer) if i > 0 and r.message_type == PROGRESS),
                    None,
                )
                self._dropped += 1
                self._throttle.warn(
                    "full",
                    "trainyard: report buffer full (%d); NATS unreachable? dropping reports",
                    self._buffer_size,
                )
                if victim is None:
                    return
                self._buffer.remove(victim)
            self._buffer.append(report)
        self._wake_up()

    def _wake_up(self) -> None:
        def wake() -> None:
            if self._wake is not None:
                self._wake.set()

        try:
            self._loop.call_soon_threadsafe(wake)
        except RuntimeError:  # the loop has ended: nothing left to wake
            pass

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except Exception:
            log.exception("trainyard: reporter stopped; further reports are not delivered")
        finally:
            self._loop.close()
            with self._changed:
                self._changed.notify_all()

    def _should_exit(self) -> bool:
        with self._changed:
            return self._closing and (
                not self._buffer or time.monotonic() >= self._close_deadline
            )

    async def _main(self) -> None:
        import nats
        from nats.aio.client import Client

        self._wake = asyncio.Event()
        nc: Optional[Client] = None
        backoff = 0.1
        try:
            while not self._should_exit():
                if nc is None:
                    try:
                        nc = await self._connect(nats)
                        self._connected.set()
                        backoff = 0.1
                    except Exception as error:
                        self._throttle.warn(
                            "connect", "trainyard: cannot reach NATS at %s (%s); retrying",
                            self.env.nats_url, error,
                        )
                        backoff = await self._pause(backoff)
                        continue
                with self._changed:
                    report = self._buffer[0] if self._buffer else None
                if report is None:
                    self._wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=0.5)
                    continue
                try:
                    await nc.jetstream().publish(
                        report.subject,
                        report.body,
                        timeout=self._timeout(),
                        headers={"Nats-Msg-Id": report.message_id},
                    )
                except Exception as error:
                    self._throttle.warn(
                        "publish", "trainyard: report not stored yet (%s); retrying",
                        error or type(error).__name__,
                    )
                    backoff = await self._pause(backoff)
                    continue
                backoff = 0.1
                with self._changed:
                    if self._buffer and self._buffer[0] is report:
                        self._buffer.popleft()
                    self._delivered += 1
                    self._changed.notify_all()
        finally:
            if nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), timeout=2.0)

    def _timeout(self) -> float:
        with self._changed:
            if not self._closing:
                return self._publish_timeout
            remaining = self._close_deadline - time.monotonic()
        return max(0.1, min(self._publish_timeout, remaining))

    async def _pause(self, backoff: float) -> float:
        await asyncio.sleep(min(backoff, max(0.05, self._timeout())))
        return min(backoff * 2, _MAX_BACKOFF_SECONDS)

    async def _connect(self, nats: Any) -> Any:
        async def quiet(*_: Any) -> None:
            return None

        # With unlimited reconnects nats-py retries even the first connect forever; the
        # timeout hands control back so a closing reporter is not held up.
        credentials: dict = {}
        if self.env.nats_token:
            # The job's token admits this worker to its own job's subjects and
            # its own reply inbox, where JetStream's acknowledgements arrive.
            credentials = {
                "token": self.env.nats_token,
                "inbox_prefix": worker_inbox_prefix(self.env.namespace, self.env.job),
            }
        if self.env.nats_ca_file:
            credentials["tls"] = self._tls_context()
        connecting = nats.connect(
            self.env.nats_url,
            name=f"trainyard-worker {self.env.namespace}/{self.env.job}/{self.env.worker_index}",
            **credentials,
            connect_timeout=2,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=quiet,
            disconnected_cb=quiet,
            reconnected_cb=quiet,
            closed_cb=quiet,
        )
        nc = await asyncio.wait_for(connecting, timeout=max(2.0, self._timeout()))
        await nc.subscribe(command_filter(self.env.namespace, self.env.job), cb=self._on_command)
        # The server has the subscription once a flush returns: only then is the
        # reporter connected, and a command sent from then on is heard.
        await nc.flush(timeout=max(2.0, self._timeout()))
        return nc

    def _tls_context(self) -> ssl.SSLContext:
        """Verifies the server with the installation's CA (and its host name)."""
        try:
            return ssl.create_default_context(cafile=self.env.nats_ca_file)
        except (OSError, ssl.SSLError) as error:
            raise ConnectionError(
                f"TRAINYARD_NATS_CA_FILE={self.env.nats_ca_file!r} is no readable PEM CA bundle: {error}"
            ) from error

    async def _on_command(self, msg: Any) -> None:
        kind = msg.subject.split(".")[2]
        if kind == "stop":
            try:
                reason = json.loads(msg.data)["payload"].get("reason")
            except (ValueError, KeyError, TypeError, AttributeError):
                reason = None
            self._stop_reason = reason or "stop requested"
            self._stop.set()
            log.warning("trainyard: stop requested: %s", self._stop_reason)
        elif kind == "checkpoint-now":
            self._checkpoint_now.set()
        elif kind == "checkpoint-interval":
            try:
                seconds = float(json.loads(msg.data)["payload"]["intervalSeconds"])
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("trainyard: unreadable checkpoint-interval command ignored")
                return
            if math.isfinite(seconds) and seconds > 0:
                self._interval_seconds = seconds
                log.info("trainyard: checkpoints every %.0f s (advised)", seconds)
