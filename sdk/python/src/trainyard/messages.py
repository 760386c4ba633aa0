"""Envelopes and subjects of the worker contract (docs/messages.md in the repository).

The services decode metrics as finite JSON numbers: a `NaN` or `Infinity` literal
(what `json.dumps` writes by default) makes the whole report undecodable. Reports
built here therefore encode ±Infinity as ±`sys.float_info.max`, which still orders
correctly when a metric is minimised or maximised, and leave NaN metrics out.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Dict, Mapping, Optional, Tuple

SUBJECT_ROOT = "trainyard"
SCHEMA_VERSION = 1
PROGRESS = "worker.progress"
CHECKPOINT = "worker.checkpoint"
_KIND = {PROGRESS: "progress", CHECKPOINT: "checkpoint"}


def token(name: str) -> str:
    """A Kubernetes name as one subject token (names may hold `.`, tokens may not)."""
    return name.replace(".", "_")


def report_subject(message_type: str, namespace: str, job: str) -> str:
    return f"{SUBJECT_ROOT}.worker.{_KIND[message_type]}.{token(namespace)}.{token(job)}"


def command_filter(namespace: str, job: str) -> str:
    """Every command to one job: `trainyard.commands.<kind>.<ns>.<job>`."""
    return f"{SUBJECT_ROOT}.commands.*.{token(namespace)}.{token(job)}"


def worker_inbox_prefix(namespace: str, job: str) -> str:
    """The reply inbox a job's workers may use: `_INBOX.worker.<ns>.<job>`."""
    return f"_INBOX.worker.{token(namespace)}.{token(job)}"


def uuid7() -> str:
    """A UUID v7 (time-ordered), as envelope ids must be."""
    ms = time.time_ns() // 1_000_000
    raw = bytearray(ms.to_bytes(6, "big") + secrets.token_bytes(10))
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def finite_metrics(metrics: Optional[Mapping[str, Any]]) -> Tuple[Dict[str, float], list]:
    """Metrics the services accept, and the names of those left out.

    Values must be real numbers (bool, int, float, or anything with `__float__`,
    such as a NumPy scalar or a 0-d tensor moved to the CPU). NaN is left out;
    ±Infinity becomes the largest finite float of that sign.
    """
    accepted: Dict[str, float] = {}
    dropped = []
    for name, value in (metrics or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            dropped.append(str(name))
            continue
        if math.isnan(number):
            dropped.append(str(name))
            continue
        if math.isinf(number):
            number = math.copysign(sys.float_info.max, number)
        accepted[str(name)] = number
    return accepted, dropped


@dataclass(frozen=True)
class Report:
    """One encoded message, ready to publish (and to publish again: same id)."""

    subject: str
    message_id: str
    body: bytes
    message_type: str


def build_report(
    message_type: str,
    namespace: str,
    job: str,
    source: str,
    payload: Mapping[str, Any],
) -> Report:
    message_id = uuid7()
    envelope = {
        "id": message_id,
        "type": message_type,
        "schemaVersion": SCHEMA_VERSION,
        "source": source,
        "time": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
        "entity": {"namespace": namespace, "name": job, "uid": ""},
        "correlationId": message_id,
        "payload": dict(payload),
    }
    # allow_nan=False: a non-finite number that slipped past finite_metrics fails
    # here, in the caller's process, rather than in every service that reads it.
    body = json.dumps(envelope, allow_nan=False, separators=(",", ":")).encode()
    return Report(report_subject(message_type, namespace, job), message_id, body, message_type)
