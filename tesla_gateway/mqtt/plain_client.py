"""paho's client through its public API only: the fallback when the fast path cannot run.

Every message goes through paho's own decoder (``on_message``), every publish through ``publish``
and every acknowledgement through ``ack``: slower than
:class:`tesla_gateway.mqtt.fast_path.LeanClient`
(a per-message object and a wake-up of paho's thread each) but indifferent to paho's insides.
Chosen with ``client: plain`` in the broker config, or by itself when
:func:`tesla_gateway.mqtt.fast_path.contract_holds` is false.
"""

from __future__ import annotations

from collections.abc import Sequence

from paho.mqtt import client as paho

__all__ = ["PlainClient"]


class PlainClient(paho.Client):
    """paho's client with the two helpers :class:`MqttConnection` needs, in public API terms."""

    def ack_many(self, mids: Sequence[int]) -> None:
        """PUBACK several QoS 1 messages, one ``ack`` each."""
        for mid in mids:
            self.ack(mid, 1)

    def close_sockets(self) -> None:
        """Close the connection's socket and paho's wake-up socket pair now.

        paho closes them in its finaliser. Left to the garbage collector, a client in a
        reference cycle may have its sockets finalised first ('unclosed socket' warnings) and
        holds two descriptors per dead client until a collection runs. Running paho's own
        finaliser now closes them without naming paho's private attributes, in paho's order:
        the loop's socket callbacks (``loop_io``) are told before the descriptor is closed.
        """
        paho.Client.__del__(self)
