SELECT channel, state, failures, probes, probe_at, last_error, changed_at FROM channel_circuits
ORDER BY channel
