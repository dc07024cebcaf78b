"""The two JetStream objects of the edge layout (deploy/nats/leaf.conf), made once per Pi:

``leaf``  on the Pi's own server: the stream that keeps the Pi's readings while the uplink is
          down (``TESLA_EDGE``, subjects ``edge.<domain>.<subject>.*.raw``, file storage);
``hub``   on the hub cluster: the readings stream the gateways made sources that stream from
          the Pi's domain, renamed into the same partition subjects as the readings the hub
          receives itself (the stream's own partition transform, reused), so the gateways see
          no difference.

Both are idempotent. Needs only nats-py (the ``cluster`` extra). Run as
``python deploy/nats/edge_streams.py leaf|hub --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from typing import Any

import nats
import nats.errors

EDGE_STREAM = "TESLA_EDGE"
_NS = 1_000_000_000
# Each goes into subjects ($JS.<domain>.API..., edge.<domain>.<subject>.*.raw): one token (a
# name) or dotted tokens (the subject), never a wildcard, as [cluster] checks its own.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
_SUBJECT = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


class EdgeSetupError(Exception):
    """A stream cannot be made or found as the layout needs."""


async def _request(nc: Any, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await nc.request(subject, json.dumps(body).encode(), timeout=10)
    document = json.loads(reply.data)
    error = document.get("error")
    if error:
        raise EdgeSetupError(f"{subject}: {error.get('description', error)}")
    return dict(document)


def edge_subjects(domain: str, subject: str) -> str:
    """What the leaf's mapping turns ``<subject>.<id>.raw`` into."""
    return f"edge.{domain}.{subject}.*.raw"


async def make_leaf_stream(server: str, domain: str, subject: str, max_age_h: float) -> str:
    """The Pi's stream; returns what the server did (created / already there)."""
    nc = await nats.connect(servers=[server], connect_timeout=5)
    try:
        body = {
            "name": EDGE_STREAM,
            "subjects": [edge_subjects(domain, subject)],
            "retention": "limits",
            "storage": "file",
            "num_replicas": 1,
            "max_age": int(max_age_h * 3600 * _NS),
            "discard": "old",
        }
        try:
            await _request(nc, f"$JS.{domain}.API.STREAM.CREATE.{EDGE_STREAM}", body)
        except EdgeSetupError as exc:
            if "already in use" not in str(exc):
                raise
            return "already there"
        return "created"
    finally:
        await nc.close()


async def add_hub_source(server: str, domain: str, subject: str, stream: str) -> str:
    """Make the hub's readings stream source the Pi's stream; returns what changed."""
    nc = await nats.connect(servers=[server], connect_timeout=5)
    try:
        try:
            info = await _request(nc, f"$JS.API.STREAM.INFO.{stream}", {})
        except EdgeSetupError as exc:
            raise EdgeSetupError(
                f"{exc}: the gateways make {stream} when they start in cluster mode; start one "
                "first (or pass --stream if [cluster] readings_stream is not the default)"
            ) from exc
        config = dict(info["config"])
        transform = config.get("subject_transform") or {}
        if "dest" not in transform:
            raise EdgeSetupError(f"{stream} has no partition transform: not a readings stream")
        source = {
            "name": EDGE_STREAM,
            "external": {"api": f"$JS.{domain}.API"},
            "subject_transforms": [
                {"src": edge_subjects(domain, subject), "dest": transform["dest"]}
            ],
        }
        sources = [dict(s) for s in config.get("sources") or []]
        if any((s.get("external") or {}).get("api") == f"$JS.{domain}.API" for s in sources):
            return "already sourced"
        config["sources"] = [*sources, source]
        await _request(nc, f"$JS.API.STREAM.UPDATE.{stream}", config)
        return "source added"
    finally:
        await nc.close()


def _matching(pattern: re.Pattern[str], what: str) -> Any:
    """An argparse type: the value if ``pattern`` matches all of it, else a usage error."""

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}")
        return value

    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=("leaf", "hub"))
    parser.add_argument("--server", required=True, help="a NATS URL of that side")
    parser.add_argument(
        "--domain",
        required=True,
        type=_matching(_NAME, "a JetStream domain (letters, digits, _ and -)"),
        help="the Pi's JetStream domain",
    )
    parser.add_argument(
        "--subject",
        default="sensors",
        type=_matching(_SUBJECT, "a subject prefix (such tokens joined by dots)"),
        help="[cluster] readings_subject",
    )
    parser.add_argument(
        "--stream",
        default="TESLA_READINGS",
        type=_matching(_NAME, "a stream name (letters, digits, _ and -)"),
        help="[cluster] readings_stream",
    )
    parser.add_argument(
        "--max-age-h", type=float, default=7 * 24.0, help="how long the Pi keeps readings"
    )
    args = parser.parse_args(argv)
    try:
        if args.side == "leaf":
            done = asyncio.run(
                make_leaf_stream(args.server, args.domain, args.subject, args.max_age_h)
            )
        else:
            done = asyncio.run(add_hub_source(args.server, args.domain, args.subject, args.stream))
    except (EdgeSetupError, OSError, nats.errors.Error) as exc:
        print(f"edge_streams {args.side}: {exc}", file=sys.stderr)
        return 1
    print(f"edge_streams {args.side} {args.domain}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
