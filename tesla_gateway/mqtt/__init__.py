"""The gateway's MQTT client: broker config, errors, topic types, the supervised connection."""
