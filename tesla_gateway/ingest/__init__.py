"""From a validated reading to an admitted one: clock sanity, sequence, ingest log, rejects."""
