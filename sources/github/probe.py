"""The GitHub source's change probe: each repository's most recently updated issue.

``sort=updated&direction=desc&per_page=1`` answers with one issue, which is another as soon
as any issue or pull request is created or updated; asked conditionally, an unchanged
repository costs a 304, which GitHub does not charge to the rate limit. (A deleted issue does
not show; the sync cannot see one either, except in a ``reconcile`` sweep.)
"""

from __future__ import annotations

from changewatch.sources.github.config import GitHubSourceConfig
from changewatch.sources.github.source import HEADERS
from changewatch.sources.probe import ProbeRequest
from changewatch.sources.rest.auth import credentials
from changewatch.sources.rest.config import BearerAuth

__all__ = ["github_probe_requests"]


def github_probe_requests(config: GitHubSourceConfig) -> list[ProbeRequest]:
    """One request per repository, keyed by the repository ("owner/name")."""
    auth = BearerAuth(type="bearer", token_env=config.token_env) if config.token_env else None
    auth_headers, _ = credentials(auth)
    return [
        ProbeRequest(
            key=repo,
            url=f"{config.base_url}/repos/{repo}/issues",
            params={"state": "all", "sort": "updated", "direction": "desc", "per_page": 1},
            headers={**HEADERS, **auth_headers},
            secrets=tuple(auth_headers),
        )
        for repo in config.repos or ()
    ]
