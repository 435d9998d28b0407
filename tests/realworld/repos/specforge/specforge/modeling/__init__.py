# copied from sgl-project/SpecForge@a6b6b0230009d15ec2a97a57384e6f53f0f96946: specforge/modeling/__init__.py
"""Draft and target modeling implementations.

Import concrete types from their owning modules; this package does not maintain
the pre-runtime aggregate model API.
"""
