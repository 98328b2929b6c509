"""What a deployment on several hosts cannot share: files that channels and digests write.

On one host a file channel's JSON lines and a digest's ``output_dir`` land where the user
reads them. Where Dagster's storage is PostgreSQL (``$DAGSTER_PG_URL``, as on several hosts),
each run writes on whichever host ran it, so the lines of one channel end up split over the
workers' disks. ``changewatch validate`` says so, naming each, and what to use instead; it
does not refuse, since one host with PostgreSQL (deploy/docker-compose.yml) shares a volume.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from changewatch.channels.config import FileChannelConfig
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from changewatch.pipeline.webhooks.webhook_inbox import DAGSTER_PG_ENV

__all__ = ["local_file_warnings"]


def local_file_warnings(
    config: ChangewatchConfig, environ: Mapping[str, str] | None = None
) -> list[str]:
    """One line per file channel and digest folder that runs on several hosts would split
    over their disks; none where Dagster's storage is not PostgreSQL (one host)."""
    environ = os.environ if environ is None else environ
    if not environ.get(DAGSTER_PG_ENV):
        return []
    where = "on the disk of whichever host runs it (Dagster's storage is PostgreSQL)"
    instead = "use a webhook, email or chat channel, or a folder every host mounts"
    lines = [
        f"channel {channel.name!r} writes {channel.path} {where}: {instead}"
        for channel in config.channels
        if isinstance(channel, FileChannelConfig)
    ]
    lines += [
        f"digest {digest.name!r} writes {digest.output_dir} {where}: {instead}"
        for digest in config.digests
        if digest.output_dir is not None
    ]
    return lines
