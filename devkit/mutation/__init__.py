"""Mutation testing of the modules that hold the gateway's promises (``make mutation``)."""
