"""What starts runs: the sync sensor and cron schedules, the webhook sensor, and fleets'
per-target partitions and sensor."""
