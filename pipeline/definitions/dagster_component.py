"""A Dagster Component, so changewatch's assets join a team's own code location.

In a components project (``dg init`` / ``create-dagster``), a folder under ``defs/`` holding

.. code-block:: yaml

    # defs/changewatch/defs.yaml
    type: changewatch.pipeline.definitions.dagster_component.ChangewatchComponent
    attributes:
      config_path: watches.yaml     # relative to this folder

loads the watches file's sources, watches, digests, sensor and schedules next to the team's
own definitions. Without components, ``build_definitions(load_config(path))`` gives the same
``Definitions`` to merge by hand.
"""

# No `from __future__ import annotations`: Dagster resolves the YAML schema from real annotations.
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.watches_file import load_config

__all__ = ["ChangewatchComponent"]


@dataclass
class ChangewatchComponent(dg.Component, dg.Resolvable):
    """The sources, watches and digests of one changewatch watches file.

    The warehouse comes from ``$CHANGEWATCH_WAREHOUSE_URL`` at run time, as everywhere else
    (it may carry a password, so it is never a YAML value). The definitions bring the
    resources ``warehouse`` and ``judges``: a team's own resources must not use those keys.
    """

    config_path: str
    """The watches file; a relative path resolves next to the ``defs.yaml``."""

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        path = Path(self.config_path)
        if not path.is_absolute():
            path = context.path / path
        # ConfigError names file, line and key; Dagster shows it as the load error.
        return build_definitions(load_config(path))
