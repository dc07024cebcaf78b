"""``make cluster-demo``: gateways in cluster mode on the demo's data, one killed mid-run."""
