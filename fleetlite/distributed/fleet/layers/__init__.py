"""Paddle's ``fleet.layers``: ``mpu`` (the tensor-parallel layers under their Paddle import path)."""
