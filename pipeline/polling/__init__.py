"""When to poll what: slots and jitter, the adaptive envelope, probe decisions, pauses and the
polling schedule the runs record. Decisions only: the sensors that act on them are in triggers/."""
