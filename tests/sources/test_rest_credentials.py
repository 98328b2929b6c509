"""A source's credentials go only to its own host, whatever a pagination link says."""

from __future__ import annotations

import pytest
from apiserver import ApiServer, Reply
from changewatch.sources.errors import FetchError
from changewatch.sources.rest import RestSource, RestSourceConfig


def test_link_to_another_host_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CW_TEST_REST_TOKEN", "s3cret-token")
    with ApiServer() as api, ApiServer() as elsewhere:
        api.queue(
            "/items",
            Reply.json([{"id": 1}], Link=f'<{elsewhere.url("/steal")}>; rel="next"'),
        )
        config = RestSourceConfig.model_validate(
            {
                "name": "items",
                "type": "rest",
                "table": "items",
                "base_url": api.base_url,
                "path": "/items",
                "paginator": {"type": "link_header"},
                "primary_key": "id",
                "columns": {"id": "bigint"},
                "auth": {"type": "bearer", "token_env": "CW_TEST_REST_TOKEN"},
            }
        )
        with pytest.raises(FetchError, match="another host") as error:
            RestSource(config).fetch(cursor=None)
        assert "s3cret" not in str(error.value)
        assert elsewhere.paths() == []
