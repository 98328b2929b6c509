-- A channel's circuit as the last send left it; written with that send's outcome, so the two
-- never disagree. Keyed by the channel: writing the same state again is a no-op.
INSERT INTO channel_circuits (channel, state, failures, probes, probe_at, last_error, changed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (channel) DO UPDATE SET
    state = EXCLUDED.state,
    failures = EXCLUDED.failures,
    probes = EXCLUDED.probes,
    probe_at = EXCLUDED.probe_at,
    last_error = EXCLUDED.last_error,
    changed_at = EXCLUDED.changed_at
