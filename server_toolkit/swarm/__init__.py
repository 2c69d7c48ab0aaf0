"""The device swarm: thousands of protocol-level devices for load tests (``fedsdk-server swarm``).

=============  ===========================================================================
module         concept
=============  ===========================================================================
``device``     one simulated device's protocol state (hello, task, pull, result, serve)
``link``       its MQTT connection: a device's ``MqttLink`` on a shared epoll loop
``shard``      one process: a slice of the devices, connected at a given rate
``runner``     the swarm: several processes and their summed ``counters``
=============  ===========================================================================
"""

from .counters import Counters
from .runner import Swarm, SwarmConfig, swarm_ids

__all__ = ["Counters", "Swarm", "SwarmConfig", "swarm_ids"]
