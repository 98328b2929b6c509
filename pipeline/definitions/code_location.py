"""The code location: ``workspace.yaml`` loads ``defs`` from here.

The watches file is read and validated while this module loads, so a bad file fails the code
location with a message naming file, line and key, before anything runs or writes.
"""

from __future__ import annotations

from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.watches_file import load_config

defs = build_definitions(load_config())
