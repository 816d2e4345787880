"""Checkpoint layer: hostile-input safetensors headers, sharded indexes, weight reconciliation, inventory.

Inspection reads headers only; ``Checkpoint.load_tensor`` reads data, and only after validation.
"""

from edgellm.checkpoint.checkpoint import Checkpoint
from edgellm.checkpoint.header import (
    DTYPE_BITS,
    MAX_HEADER_BYTES,
    SafetensorsHeader,
    TensorInfo,
    read_header,
    scan_header,
    scan_header_stream,
)
from edgellm.checkpoint.index import INDEX_FILE, SINGLE_FILE, read_index
from edgellm.checkpoint.inventory import build_inventory, name_patterns, write_json_atomic
from edgellm.checkpoint.reconcile import Reconciliation, reconcile
from edgellm.checkpoint.survey import inspect_checkpoint

__all__ = [
    "DTYPE_BITS",
    "INDEX_FILE",
    "MAX_HEADER_BYTES",
    "SINGLE_FILE",
    "Checkpoint",
    "Reconciliation",
    "SafetensorsHeader",
    "TensorInfo",
    "build_inventory",
    "inspect_checkpoint",
    "name_patterns",
    "read_header",
    "read_index",
    "reconcile",
    "scan_header",
    "scan_header_stream",
    "write_json_atomic",
]
