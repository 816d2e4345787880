"""The toolchains made of this library (edgellm-ort, edgellm-torch-cuda): driver in ``driver``, the export host stage
in ``host_stages``."""

from edgefarm.toolchains.edgellm import driver as driver  # registers the drivers
