"""The `channels_open` check on `notifications`: each channel open, paused or disabled.

The circuits themselves live in the warehouse (channels/circuit.py); this only shows them in
the Dagster UI after each delivery pass, with the last error, so a paused or disabled channel
is seen where the runs are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg
from changewatch.channels.circuit import Circuit

__all__ = ["CHANNELS_CHECK", "channels_check", "channels_check_spec"]

CHANNELS_CHECK = "channels_open"


def channels_check_spec(asset: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        CHANNELS_CHECK,
        asset=asset,
        description=(
            "Fails while a channel is not open. Paused (WARN): its sends kept failing; its "
            "notifications wait and a probe on the retry schedule reopens it once the "
            "receiver answers. Disabled (ERROR): the receiver answered 410 Gone; nothing is "
            "sent there until `changewatch resume --channel NAME`."
        ),
    )


def channels_check(channels: Sequence[str], circuits: Mapping[str, Circuit]) -> dg.AssetCheckResult:
    """The check's result: one metadata entry per channel, its state and last error."""
    states = {name: circuits.get(name, Circuit(name)) for name in channels}
    # Channels no longer configured but still on record are shown too: their rows wait.
    states |= {name: c for name, c in circuits.items() if name not in states}
    shut = [c for c in states.values() if c.state != "open"]
    disabled = any(c.state == "disabled" for c in shut)
    return dg.AssetCheckResult(
        check_name=CHANNELS_CHECK,
        passed=not shut,
        severity=dg.AssetCheckSeverity.ERROR if disabled else dg.AssetCheckSeverity.WARN,
        metadata={name: c.line() for name, c in sorted(states.items())},
        description="; ".join(c.line() for c in shut) if shut else "every channel is open",
    )
