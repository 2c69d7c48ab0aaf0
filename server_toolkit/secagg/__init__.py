"""Secure aggregation on the server: the protocol driver (``protocol``), the methods it
serves and how a method's round becomes a sum in global coordinates (``aggregate``), its MQTT
grid (``mqtt_grid``) and an in-process driver of the same code paths (``inprocess``)."""
