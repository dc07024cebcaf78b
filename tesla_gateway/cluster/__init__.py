"""Cluster mode: gateways as one service over a partitioned NATS JetStream stream of readings."""
