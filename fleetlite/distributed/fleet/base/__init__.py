"""Paddle's ``fleet.base``: the hybrid-parallel topology (:mod:`.topology`)."""

from . import topology
from .topology import CommunicateTopology, HybridCommunicateGroup, ParallelMode

__all__ = ["topology", "CommunicateTopology", "HybridCommunicateGroup", "ParallelMode"]
